"""Errors: those a command reports, and the codes shared by planning, the scheduler and the HTTP layer.

A command's failures are ``S1omniError`` subclasses, one per kind of cause; library code raises
them with a message that names what is wrong and what to do, and only the CLI
(``s1omni.cli.main``) turns them into a line on stderr and an exit code.

Request-level errors carry an HTTP status and become ``{"error": {"code", "message"}}``.
Item-level errors are answered in place inside a 200 response as ``{"type", "error"[, "message"]}``
and never fail sibling questions (vllm-project/semantic-router:src/model-runtime/vllm_srun/errors.py).
"""

from __future__ import annotations

from typing import Any

INVALID_QUESTION = "invalid_question"
INVALID_INPUT = "invalid_input"
MAX_LENGTH_EXCEEDED = "max_length_exceeded"
SCAN_BUDGET_EXCEEDED = "scan_budget_exceeded"
INVALID_MODEL_OUTPUT = "invalid_model_output"
DEADLINE_EXCEEDED = "deadline_exceeded"
UNAVAILABLE = "unavailable"

ITEM_CODES = frozenset(
    {
        INVALID_QUESTION,
        INVALID_INPUT,
        MAX_LENGTH_EXCEEDED,
        SCAN_BUDGET_EXCEEDED,
        INVALID_MODEL_OUTPUT,
        DEADLINE_EXCEEDED,
        UNAVAILABLE,
    }
)

REQUEST_STATUS = {
    "invalid_request": 400,
    "model_not_found": 404,
    "request_too_large": 413,
    "unsupported_surface": 422,
    "overloaded": 429,
    "internal_error": 500,
    "not_ready": 503,
}


class RequestError(Exception):
    """A request-level failure: a stable code, its HTTP status and a message for the caller."""

    def __init__(self, code: str, message: str):
        if code not in REQUEST_STATUS:
            raise ValueError(f"unknown request error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return REQUEST_STATUS[self.code]

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


class QuestionError(ValueError):
    """A question that cannot be answered; its code is returned in its answer."""

    def __init__(self, code: str, message: str = ""):
        if code not in ITEM_CODES:
            raise ValueError(f"unknown item error code {code!r}")
        super().__init__(message or code)
        self.code = code


def item_error(kind: str | None, code: str, message: str = "") -> dict[str, Any]:
    """A failed question's answer: its type, the code and, when known, why."""
    answer: dict[str, Any] = {"type": kind, "error": code}
    if message and message != code:
        answer["message"] = message
    return answer


class S1omniError(Exception):
    """A failure a user can act on; its message says what is wrong and, where it helps, what to do."""


class UsageError(S1omniError, ValueError):
    """Options that cannot go together, or a value outside what the command takes."""


class InputError(S1omniError, ValueError):
    """A path, file or directory the command was given is refused (an output directory included)."""


class PackageError(InputError):
    """A member package (or engine) failed verification; nothing from it was loaded."""


class EnvironmentMissing(S1omniError, RuntimeError):
    """The machine lacks what this run needs: a GPU, a library, an execution provider."""


class GateMissed(S1omniError):
    """An engine missed its member's gates, or a model failed its golden request."""
