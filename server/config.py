"""Every process option of ``s1omni serve`` in one typed object, with the reference's defaults
(vllm-project/semantic-router:src/model-runtime/vllm_srun/config.py ``ServeConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .profiles import EXACT
from .scheduler import Limits

DEFAULT_PORT = 8000


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_request_bytes: int = 8 << 20
    limits: Limits = field(default_factory=Limits)
    # How long a request's body may take to arrive, from its headers to its last byte; then 400.
    body_timeout_s: float = 30.0
    # How long SIGTERM waits for requests in flight before the process stops anyway.
    drain_timeout_s: float = 30.0
    # The profiles requests may choose: exact, then those ``s1omni serve --profiles`` enabled (``profiles.enabled``).
    profiles: tuple[str, ...] = (EXACT.name,)
    # Copies of the model loaded side by side, each with its own worker thread (``s1omni.server.scheduler``).
    instances: int = 1
