"""Request middleware: request ids, health probes answered before host checks, the body limit."""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import uuid
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import got_request_exception, request_finished
from django.http import HttpRequest, HttpResponse, JsonResponse

REQUEST_ID_HEADER = "X-Request-ID"
# An incoming id is kept when it is a plain token (a UUID, a trace id); anything else is replaced.
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
API_PREFIX = "/api/"
# The request id of the request this thread (or task) is serving, for log lines.
_current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)
# Where got_request_exception leaves the exception Django caught, on the request.
_UNCAUGHT = "_rankops_uncaught_exception"


def current_request_id() -> str | None:
    """The id of the request being served here, or None outside a request."""
    return _current_request_id.get()


def begin_request_id(meta: Mapping[str, Any]) -> str:
    """The id of the request with this WSGI environ (or ``request.META``): its X-Request-ID when
    that is a sane token, else a new one; log lines name it from now until request_finished.

    For entry points that answer before the middleware chain (``features.wsgi``,
    ``serving.wsgi``): they set the same ``X-Request-ID`` response header with it."""
    incoming = meta.get("HTTP_X_REQUEST_ID", "")
    request_id = incoming if SANE_REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
    _current_request_id.set(request_id)
    return request_id


class RequestIdLogFilter(logging.Filter):
    """Give every log record a ``request_id`` ("-" outside a request) for the formatter."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _current_request_id.get() or "-"
        return True


def _remember_uncaught_exception(sender, request=None, **kwargs) -> None:
    """Django is about to answer 500 for an exception: keep it for RequestIdMiddleware."""
    if request is not None:
        setattr(request, _UNCAUGHT, sys.exc_info()[1])


def _forget_request_id(sender, **kwargs) -> None:
    # Not reset when the middleware returns: Django logs error responses after the middleware
    # chain (django.core.handlers.base.BaseHandler.get_response), and those lines name it too.
    _current_request_id.set(None)


got_request_exception.connect(
    _remember_uncaught_exception, dispatch_uid="rankops-remember-uncaught-exception"
)
request_finished.connect(_forget_request_id, dispatch_uid="rankops-forget-request-id")


class RequestIdMiddleware:
    """Give every request an id: the incoming ``X-Request-ID`` when it is a sane token, else a new
    one. Every response carries it, and so do the server's log lines for the request
    (``RequestIdLogFilter``).

    Outermost in the chain, it also replaces Django's HTML error page for an uncaught exception
    under /api/ with the API's error body: 503 when a service the request needs is down, else 500,
    both with the request id.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = begin_request_id(request.META)
        # the request id rides on the request for the views and the log records.
        request.request_id = request_id  # type: ignore[attr-defined]
        response = self.get_response(request)
        if hasattr(request, _UNCAUGHT) and request.path.startswith(API_PREFIX):
            from workspaces.api.errors import uncaught_exception_response

            response = uncaught_exception_response(request, getattr(request, _UNCAUGHT))
            # Django logged the exception with its traceback already; not again for this body.
            # Django's own flag (django.utils.log.log_response) that it logged this response.
            response._has_been_logged = True  # type: ignore[attr-defined]
        elif (
            response.status_code in (404, 405)
            and request.path.startswith(API_PREFIX)
            and response.get("Content-Type", "").startswith("text/html")
        ):
            # No route under /api/ (Django's HTML page): the API's error body instead.
            from django.http import JsonResponse

            from workspaces.api.errors import error_body

            found = response.status_code == 405
            response = JsonResponse(
                error_body(
                    status_code=response.status_code,
                    code="method_not_allowed" if found else "not_found",
                    detail=f"No API operation answers {request.method} {request.path}."
                    if found
                    else f"No API resource at {request.path}.",
                ),
                status=response.status_code,
            )
        response[REQUEST_ID_HEADER] = request_id
        return response


def body_limit_for(path: str) -> int:
    """The body limit of a path: API_BODY_LIMITS holds (regex, setting name) overrides."""
    for pattern, setting_name in _compiled_overrides():
        if pattern.match(path):
            return getattr(settings, setting_name)
    return settings.API_MAX_BODY_BYTES


@cache
def _compiled_overrides() -> list[tuple[re.Pattern, str]]:
    return [(re.compile(regex), name) for regex, name in settings.API_BODY_LIMITS]


class RequestBodyLimitMiddleware:
    """Answer 413 with the API's error body when a request declares a body over the limit."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        declared = request.META.get("CONTENT_LENGTH") or "0"
        from workspaces.api.errors import error_body

        try:
            length = int(declared)
        except ValueError:
            return JsonResponse(
                error_body(
                    status_code=400,
                    code="invalid_content_length",
                    detail="Content-Length is not a number.",
                ),
                status=400,
            )
        limit = body_limit_for(request.path)
        if length > limit:
            return JsonResponse(
                error_body(
                    status_code=413,
                    code="too_large",
                    detail=f"Request body of {length} bytes is over the {limit}-byte limit.",
                ),
                status=413,
            )
        return self.get_response(request)


class HealthProbeMiddleware:
    """Answer /healthz and /readyz before the host check and the HTTPS redirect.

    Orchestrators probe pods by IP over plain HTTP; those probes must not depend on ALLOWED_HOSTS
    or on TLS termination. The probes expose no data beyond up/down.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in ("/healthz", "/readyz") and request.method in ("GET", "HEAD"):
            from workspaces import health

            view = health.healthz if request.path == "/healthz" else health.readyz
            return view(request)
        return self.get_response(request)
