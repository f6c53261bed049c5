"""Exceptions: every error answer of the gateway is problem+json, raised as an APIError."""

from __future__ import annotations

import json
from typing import Any, Optional

from .models import Problem


class SandgateError(Exception):
    """Base of every exception this package raises."""


class APIError(SandgateError):
    """The gateway answered an error: ``status``, ``code``, ``title``, ``detail`` and, for a
    400 or 422, ``errors`` (each a FieldError naming the field) from its problem+json."""

    def __init__(self, status: int, problem: Problem, retry_after: Optional[float] = None):
        self.status = status
        self.problem = problem
        self.code = problem.code
        self.title = problem.title
        self.detail = problem.detail
        self.errors = problem.errors or []
        self.retry_after = retry_after
        super().__init__(f"{status} {problem.code or ''}: {problem.detail or problem.title or ''}".strip())


class BadRequestError(APIError):
    """400 or 422: the request is invalid; ``errors`` lists every problem."""


class AuthenticationError(APIError):
    """401: missing, malformed, expired or revoked credentials."""


class PermissionDeniedError(APIError):
    """403: a token for another sandbox, or a scope too low."""


class NotFoundError(APIError):
    """404: an unknown sandbox, file, port, session or command."""


class ConflictError(APIError):
    """409: the wrong state (paused, stopped, already attached, not supported)."""


class PayloadTooLargeError(APIError):
    """413: the body is larger than allowed."""


class RateLimitError(APIError):
    """429: a concurrency limit or a quota; ``retry_after`` says when to try again."""


class UnavailableError(APIError):
    """503: over capacity or the backend is unreachable; ``retry_after`` says when."""


class TakenOverError(SandgateError):
    """Another client attached to the terminal with takeover (close 4001); not re-dialled."""


class StreamError(SandgateError):
    """A stream (command output, terminal) broke more times in a row than allowed."""


_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: BadRequestError,
    429: RateLimitError,
    503: UnavailableError,
}


def from_response(status: int, body: bytes, headers: Any = None) -> APIError:
    """The exception for an error answer (a body that is not problem+json is kept as detail)."""
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError
        problem = Problem.from_dict(data)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        problem = Problem(status=status, title=text[:200], detail=text)
    retry = None
    if headers is not None and headers.get("retry-after"):
        try:
            retry = float(headers.get("retry-after"))
        except ValueError:
            pass
    return _BY_STATUS.get(status, APIError)(status, problem, retry)
