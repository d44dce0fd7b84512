"""deploy/: the Dockerfile's structure and the Kubernetes manifest's fields, checked without building.

The Dockerfile is read instruction by instruction (continuation lines joined); the manifest is
parsed with PyYAML. Each check is also shown a broken copy, which it must refuse.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from s1omni.server.config import DEFAULT_PORT, ServeConfig

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
ROOT_USERS = {"root", "0", "0:0", "root:root"}


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, comments dropped and continuation lines joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    found = []
    for line in joined.splitlines():
        if line.strip():
            name, _, arguments = line.strip().partition(" ")
            found.append((name.upper(), arguments.strip()))
    return found


def dockerfile_problems(text: str) -> list[str]:
    steps = instructions(text)
    names = [name for name, _ in steps]
    problems = []
    if not names or names[0] != "FROM":
        problems.append("the first instruction is not FROM")
    bases = [arguments for name, arguments in steps if name == "FROM"]
    if not bases or not re.match(r"nvidia/cuda:\S+-runtime-", bases[-1]):
        problems.append("the final stage's base is not a CUDA runtime image")
    users = [arguments for name, arguments in steps if name == "USER"]
    if not users or users[-1] in ROOT_USERS:
        problems.append("the image runs as root")
    elif max(i for i, name in enumerate(names) if name == "USER") > min(
        (i for i, name in enumerate(names) if name in {"ENTRYPOINT", "CMD"}), default=len(names)
    ):
        problems.append("USER comes after the command")
    checks = [arguments for name, arguments in steps if name == "HEALTHCHECK"]
    if len(checks) != 1 or "/health'" not in checks[0] and '/health"' not in checks[0]:
        problems.append("no HEALTHCHECK on /health")
    if not any(name == "RUN" and re.search(r"pip install .*\[gpu\]", arguments) for name, arguments in steps):
        problems.append("the package is not installed with the gpu extra")
    return problems


def test_the_dockerfile_is_a_non_root_cuda_runtime_image_with_a_healthcheck() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert dockerfile_problems(text) == []
    steps = dict(instructions(text))
    command = json.loads(steps["ENTRYPOINT"]) + json.loads(steps["CMD"])
    assert command[:2] == ["s1omni", "serve"]
    port = command[command.index("--port") + 1]
    assert steps["EXPOSE"] == port and f"127.0.0.1:{port}/health" in steps["HEALTHCHECK"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda text: text.replace("USER s1omni", "USER root"), "the image runs as root"),
        (lambda text: text.replace("USER s1omni\n", ""), "the image runs as root"),
        (lambda text: re.sub(r"HEALTHCHECK[^\n]*\\\n[^\n]*\n", "", text), "no HEALTHCHECK on /health"),
        (
            lambda text: text.replace("nvidia/cuda:13.0.1-cudnn-runtime-", "nvidia/cuda:13.0.1-cudnn-devel-"),
            "base is not a CUDA runtime",
        ),
        (lambda text: text.replace("[gpu]", ""), "gpu extra"),
    ],
)
def test_the_dockerfile_check_refuses_a_broken_copy(change: Any, problem: str) -> None:
    broken = change((DEPLOY / "Dockerfile").read_text(encoding="utf-8"))
    assert any(problem in found for found in dockerfile_problems(broken)), dockerfile_problems(broken)


def manifest() -> dict[str, dict[str, Any]]:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text(encoding="utf-8")))
    return {document["kind"]: document for document in documents}


def flag(args: list[str], name: str, default: Any) -> str:
    return args[args.index(name) + 1] if name in args else str(default)


def manifest_problems(objects: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    deployment, service = objects.get("Deployment"), objects.get("Service")
    if deployment is None or service is None:
        return ["a Deployment and a Service are both needed"]
    pod = deployment["spec"]["template"]
    if deployment["spec"]["selector"]["matchLabels"].items() > pod["metadata"]["labels"].items():
        problems.append("the Deployment's selector does not match its pods")
    if service["spec"]["selector"].items() > pod["metadata"]["labels"].items():
        problems.append("the Service selects no pod")
    (container,) = pod["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    args = container.get("args", [])
    if ports.get("http") != int(flag(args, "--port", DEFAULT_PORT)):
        problems.append("the http port is not the one the server listens on")
    for probe, path in (("readinessProbe", "/health"), ("livenessProbe", "/health/live")):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("http", ports.get("http")):
            problems.append(f"{probe} is not GET {path}")
    if container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") != 1:
        problems.append("not one GPU per pod")
    stop = container.get("lifecycle", {}).get("preStop", {})
    command = stop.get("exec", {}).get("command", [])
    sleep = float(command[1]) if command[:1] == ["sleep"] else float(stop.get("sleep", {}).get("seconds", 0))
    if sleep <= 0:
        problems.append("no preStop drain sleep")
    drain = float(flag(args, "--drain-timeout", ServeConfig.drain_timeout_s))
    if pod["spec"].get("terminationGracePeriodSeconds", 30) < sleep + drain:
        problems.append("terminationGracePeriodSeconds is shorter than the preStop sleep and the drain")
    if pod["spec"].get("securityContext", {}).get("runAsNonRoot") is not True:
        problems.append("the pod may run as root")
    target = service["spec"]["ports"][0]["targetPort"]
    if target not in ("http", ports.get("http")):
        problems.append("the Service does not reach the http port")
    return problems


def test_the_manifest_serves_one_gpu_per_pod_with_probes_and_a_drain() -> None:
    objects = manifest()
    assert manifest_problems(objects) == []
    steps = dict(instructions((DEPLOY / "Dockerfile").read_text(encoding="utf-8")))
    assert _container(objects)["args"] == json.loads(steps["CMD"])  # the image's own command, spelled out


def _container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def _set_grace(objects: dict[str, dict[str, Any]]) -> None:
    objects["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30


def _longer_drain(objects: dict[str, dict[str, Any]]) -> None:
    args = _container(objects)["args"]
    args[args.index("--drain-timeout") + 1] = "60"


BREAKS = {
    "readinessProbe is not GET /health": lambda objects: _container(objects)["readinessProbe"]["httpGet"].update(
        path="/health/live"
    ),
    "livenessProbe is not GET /health/live": lambda objects: _container(objects).pop("livenessProbe"),
    "not one GPU per pod": lambda objects: _container(objects)["resources"]["limits"].update({"nvidia.com/gpu": 2}),
    "no preStop drain sleep": lambda objects: _container(objects).pop("lifecycle"),
    "terminationGracePeriodSeconds is shorter": _set_grace,
    "terminationGracePeriodSeconds is shorter than": _longer_drain,
    "the Service selects no pod": lambda objects: objects["Service"]["spec"]["selector"].update(app="other"),
    "the http port is not": lambda objects: _container(objects)["ports"][0].update(containerPort=9000),
    "the pod may run as root": lambda objects: objects["Deployment"]["spec"]["template"]["spec"].pop("securityContext"),
}


@pytest.mark.parametrize("problem", list(BREAKS))
def test_the_manifest_check_refuses_a_broken_copy(problem: str) -> None:
    objects = copy.deepcopy(manifest())
    BREAKS[problem](objects)
    assert any(found.startswith(problem) for found in manifest_problems(objects)), manifest_problems(objects)
