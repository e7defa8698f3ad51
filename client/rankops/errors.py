"""The server's one error envelope (``{"type", "code", "detail", "attr"}``) as typed exceptions.

Every non-2xx answer becomes an :class:`ApiError` subclass chosen by HTTP status, so a script can
``except rankops.Conflict`` and read ``exc.code`` (machine-readable reason) and ``exc.attr`` (the
field or header at fault, or None).
"""

from __future__ import annotations

from typing import Any


class RankOpsError(Exception):
    """Base of everything this package raises."""


class ConfigError(RankOpsError):
    """No server URL or token could be found (environment, profile file or arguments)."""


class TransportError(RankOpsError):
    """The server could not be reached after every retry."""


class TimeoutExpired(RankOpsError):
    """A wait (job, loop, experiment) ran past its deadline."""


class JobFailed(RankOpsError):
    """A waited-on job or loop ended in a state other than success."""

    def __init__(self, message: str, *, state: str, body: dict[str, Any]) -> None:
        super().__init__(message)
        self.state = state
        self.body = body


class ApiError(RankOpsError):
    """A non-2xx answer; carries the envelope's fields and the whole body."""

    status: int = 0

    def __init__(
        self,
        *,
        status: int,
        type: str = "",
        code: str = "",
        detail: str = "",
        attr: str | None = None,
        body: Any = None,
        operation: str = "",
    ) -> None:
        self.status = status
        self.type = type
        self.code = code
        self.detail = detail
        self.attr = attr
        self.body = body
        self.operation = operation
        where = f" [{attr}]" if attr else ""
        super().__init__(f"{status} {code or type}{where}: {detail}".strip())


class BadRequest(ApiError):
    """400: bad input; ``attr`` names the field."""


class Unauthorized(ApiError):
    """401: no or a bad token."""


class Forbidden(ApiError):
    """403: the caller's role does not allow it."""


class NotFound(ApiError):
    """404: missing, or in a workspace the caller cannot see."""


class Conflict(ApiError):
    """409: the write would break something; ``body`` names the conflict (e.g. consumers)."""


class PayloadTooLarge(ApiError):
    """413: the body is over the server's limit."""


class RateLimited(ApiError):
    """429: slow down (retried automatically before it is raised)."""


class ServerError(ApiError):
    """5xx: the server failed (retried automatically where that is safe)."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
}


def error_for(status: int, body: Any, *, operation: str = "") -> ApiError:
    """The typed exception for an answer with ``status`` and (decoded) ``body``."""
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    envelope = body if isinstance(body, dict) else {}
    detail = envelope.get("detail")
    if detail is None:
        detail = body if isinstance(body, str) else ""
    return cls(
        status=status,
        type=str(envelope.get("type", "")),
        code=str(envelope.get("code", "")),
        detail=str(detail)[:2000],
        attr=envelope.get("attr"),
        body=body,
        operation=operation,
    )
