"""What the HTTP tests share: a ``s1omni serve`` subprocess and readers of its answers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

S1OMNI = Path(sys.executable).with_name("s1omni")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
START_TIMEOUT_S = 180
SERVER_TIMING = re.compile(
    r"parse;dur=(\d+\.\d{3}), tokenize;dur=(\d+\.\d{3}), queue;dur=(\d+\.\d{3}), forward;dur=(\d+\.\d{3}), "
    r"heads;dur=(\d+\.\d{3}), post;dur=(\d+\.\d{3}), serialize;dur=(\d+\.\d{3}), total;dur=(\d+\.\d{3})"
)


def tls_client_hello() -> bytes:
    """The first bytes a TLS client sends (its ClientHello), made by Python's own TLS."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:  # it waits for the server's hello
        return outgoing.read()
    raise AssertionError("a TLS handshake completed without a server")


# Requests h11 refuses before the app sees them, and h11's reason (server/process.py).
FRAMING_ERRORS = {
    "two Content-Length": (
        b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ",
        "conflicting Content-Length headers",
    ),
    "bad chunk size": (
        b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        "illegal chunk header",
    ),
    "no Host": (b"POST /v1/systemone HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", "Missing mandatory Host: header"),
    "TLS hello": (tls_client_hello(), "illegal request line"),
}
FRAMING_PREFIX = "the request is not valid HTTP/1.1: "


class Server:
    """A ``s1omni serve`` subprocess; its log is kept to explain a failure."""

    def __init__(self, home: Path, *args: str):
        self.log_path = home / f"serve-{time.monotonic_ns()}.log"
        env = {**os.environ, "S1OMNI_HOME": str(home)}
        env.pop("S1OMNI_REGISTRY", None)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(S1OMNI), "serve", *args, "--port", "0"], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.url = self._listening()
        self.client = httpx.Client(base_url=self.url, timeout=120)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def _listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = LISTENING.search(self.log())
            if found:
                return f"http://127.0.0.1:{found.group(1)}"
            if self.process.poll() is not None:
                raise AssertionError(f"s1omni serve exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"s1omni serve did not listen within {START_TIMEOUT_S} s:\n{self.log()}")

    def wait_status(self, status: str) -> dict:
        """Poll ``/health`` until it reports ``status``; its body."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            body = self.client.get("/health").json()
            if body["status"] == status:
                return body
            if body["status"] == "failed" or self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"/health never said {status!r} (last {body}):\n{self.log()}")

    def post(self, body: object, path: str = "/v1/systemone") -> httpx.Response:
        return self.client.post(path, json=body)

    def metrics(self) -> str:
        return self.client.get("/metrics").text

    def stop(self) -> int:
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@dataclass(frozen=True)
class Exchange:
    """One response read off a raw socket: status code, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        assert self.headers.get("content-type") == "application/json", self.headers
        return json.loads(self.body)


def exchange(server: Server, data: bytes, *, until_closed: bool = False, timeout: float = 60) -> Exchange:
    """Send ``data`` on a fresh connection as a naive client does (all of it, then read) and read
    one response; with ``until_closed`` also read on until the server closes, which must be an
    orderly close with nothing more sent (a reset raises ``ConnectionResetError``)."""
    with connect(server, timeout) as connection:
        connection.sendall(data)
        return read_response(connection, until_closed=until_closed)


def connect(server: Server, timeout: float = 60) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_response(connection: socket.socket, *, until_closed: bool = False) -> Exchange:
    """One response read off ``connection`` (see ``exchange``)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(65536)
        assert chunk, f"the connection closed before a response came: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = connection.recv(65536)
        assert chunk, "the connection closed inside the response body"
        body += chunk
    if until_closed:
        while chunk := connection.recv(65536):
            body += chunk
        assert len(body) == length, f"more than one response: {body!r}"
    return Exchange(int(status_line.split()[1]), headers, body[:length])


def stages(response: httpx.Response) -> dict[str, float]:
    """The response's Server-Timing stages in ms; fails unless the header is complete and well formed."""
    header = response.headers.get("server-timing", "")
    found = SERVER_TIMING.fullmatch(header)
    assert found, f"malformed Server-Timing {header!r}"
    names = ("parse", "tokenize", "queue", "forward", "heads", "post", "serialize", "total")
    return dict(zip(names, map(float, found.groups()), strict=True))


def error(response: httpx.Response, status: int, code: str) -> str:
    """Check a request-level error (status, body shape, Server-Timing); its message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"] and list(body["error"]) == ["code", "message"], body
    assert body["error"]["code"] == code, body
    stages(response)
    return body["error"]["message"]


def detail(response: httpx.Response, status: int) -> str:
    """Check an OmniJev refusal (status, a ``{"detail": str}`` body, Server-Timing); its detail."""
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["detail"] and isinstance(body["detail"], str), body
    stages(response)
    return body["detail"]


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition, its labels in any order (0 when absent)."""
    for found in re.finditer(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", text, re.MULTILINE):
        if dict(LABEL.findall(found.group(1) or "")) == labels:
            return float(found.group(2))
    return 0.0
