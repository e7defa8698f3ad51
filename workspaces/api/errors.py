"""One error body for the whole API: ``{"type", "code", "detail", "attr"}``.

``errors`` carries every field error when a request has several; ``detail`` and ``attr`` are the
first of them. A 5xx body also carries ``request_id``, the ``X-Request-ID`` of the response and of
the server's log lines about it. A service the request needs being down (Redis as the cache or the
broker, the database) answers 503 ``service_unavailable``; any other unhandled exception under
/api/ answers 500 ``server_error`` (``workspaces.middleware.RequestIdMiddleware``), never an HTML
page.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError
from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.http import Http404, HttpRequest, JsonResponse
from kombu.exceptions import OperationalError as BrokerOperationalError
from redis import exceptions as redis_exceptions
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from workspaces.access_cache import AccessCacheUnavailable
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.scoping import UnscopedQueryError

logger = logging.getLogger(__name__)

TYPES_BY_STATUS = {
    400: "validation_error",
    401: "authentication_error",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
    503: "service_unavailable",
}
# Seconds a client is asked to wait before retrying a 503.
RETRY_AFTER_SECONDS = 5
# What a service being down raises, and the code each answers with (the first match wins).
UNAVAILABLE = (
    (AccessCacheUnavailable, "cache_unavailable"),
    (redis_exceptions.ConnectionError, "cache_unavailable"),
    (redis_exceptions.TimeoutError, "cache_unavailable"),
    (redis_exceptions.ReadOnlyError, "cache_unavailable"),
    (BrokerOperationalError, "broker_unavailable"),
    (DatabaseOperationalError, "database_unavailable"),
    (DatabaseInterfaceError, "database_unavailable"),
)
UNAVAILABLE_DETAILS = {
    "cache_unavailable": "The cache is unavailable; retry shortly.",
    "broker_unavailable": "The task queue is unavailable; retry shortly.",
    "database_unavailable": "The database is unavailable; retry shortly.",
}


def error_body(
    *, status_code: int, code: str, detail: str, attr: str | None = None, **extra: Any
) -> dict[str, Any]:
    body = {
        "type": TYPES_BY_STATUS.get(status_code, "server_error"),
        "code": code,
        "detail": detail,
        "attr": attr,
    }
    body.update(extra)
    return body


def unavailable_code(exc: BaseException) -> str | None:
    """The 503 code when ``exc`` says a service the request needs is down, else None."""
    for kind, code in UNAVAILABLE:
        if isinstance(exc, kind):
            return code
    return None


def request_id_of(request: Any) -> str | None:
    """The request id the middleware gave this (Django or DRF) request."""
    request = getattr(request, "_request", request)
    return getattr(request, "request_id", None)


def unavailable_body(*, code: str, request_id: str | None) -> dict[str, Any]:
    return error_body(
        status_code=503, code=code, detail=UNAVAILABLE_DETAILS[code], request_id=request_id
    )


def server_error_body(*, request_id: str | None) -> dict[str, Any]:
    return error_body(
        status_code=500,
        code="server_error",
        detail="Internal error; quote the request id when reporting it.",
        request_id=request_id,
    )


def uncaught_exception_response(request: HttpRequest, exc: BaseException | None) -> JsonResponse:
    """The envelope for an exception Django caught outside a DRF view (middleware, rendering)."""
    request_id = request_id_of(request)
    code = unavailable_code(exc) if exc is not None else None
    if code is not None:
        response = JsonResponse(unavailable_body(code=code, request_id=request_id), status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    return JsonResponse(server_error_body(request_id=request_id), status=500)


def _flatten(detail: Any, prefix: str | None = None) -> list[dict[str, Any]]:
    """Field errors as a flat list of {attr, code, detail}, nested fields joined with dots."""
    if isinstance(detail, dict):
        items: list[dict[str, Any]] = []
        for key, value in detail.items():
            name = None if key in ("non_field_errors", "__all__") else str(key)
            attr = f"{prefix}.{name}" if prefix and name else (name or prefix)
            items.extend(_flatten(value, attr))
        return items
    if isinstance(detail, list):
        items = []
        for index, value in enumerate(detail):
            if isinstance(value, (dict, list)):
                attr = f"{prefix}.{index}" if prefix else str(index)
                items.extend(_flatten(value, attr))
            else:
                items.extend(_flatten(value, prefix))
        return items
    code = getattr(detail, "code", "invalid")
    return [{"attr": prefix, "code": code, "detail": str(detail)}]


def _django_validation_to_drf(exc: DjangoValidationError) -> exceptions.ValidationError:
    if hasattr(exc, "error_dict"):
        return exceptions.ValidationError(dict(exc.message_dict))
    return exceptions.ValidationError(exc.messages)


def error_envelope_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    unavailable = unavailable_code(exc)
    if unavailable is not None:
        request_id = request_id_of(context.get("request"))
        logger.warning("%s: %s: %s", unavailable, type(exc).__name__, exc)
        set_rollback()
        return Response(
            unavailable_body(code=unavailable, request_id=request_id),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, ConflictError):
        return Response(
            error_body(
                status_code=409,
                code="conflict",
                detail=str(exc),
                attr=exc.attr,
                **getattr(exc, "extra", {}),
            ),
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, ReferenceNotFound):  # before ValidationError: it is one
        return Response(
            error_body(status_code=404, code="not_found", detail=exc.detail, attr=exc.attr),
            status=status.HTTP_404_NOT_FOUND,
        )
    if isinstance(exc, DjangoValidationError):
        exc = _django_validation_to_drf(exc)
    if isinstance(exc, DataError):
        # A value the database cannot store (PostgreSQL: a NUL character in text or JSON).
        return Response(
            error_body(
                status_code=400,
                code="invalid",
                detail="The body holds a value the database cannot store (a NUL character?).",
            ),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, RequestDataTooBig):
        return Response(
            error_body(status_code=413, code="too_large", detail=str(exc)),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, SuspiciousOperation):
        # TooManyFieldsSent, TooManyFilesSent and the like, raised while DRF parses the body.
        return Response(
            error_body(status_code=400, code="bad_request", detail=str(exc)),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, UnscopedQueryError):
        # A programming error: fail closed and loudly, never leak other tenants' rows.
        logger.error("unscoped query blocked: %s", exc)
        return Response(
            error_body(
                status_code=500,
                code="unscoped_query",
                detail="Internal error.",
                request_id=request_id_of(context.get("request")),
            ),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    if isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)

    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        first = errors[0] if errors else {"attr": None, "code": "invalid", "detail": "Invalid."}
        response.data = error_body(
            status_code=400,
            code=first["code"],
            detail=first["detail"],
            attr=first["attr"],
            errors=errors,
        )
        return response
    detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
    code = str(getattr(detail, "code", None) or getattr(exc, "default_code", "error"))
    # An exception that knows its field (a policy limit: 413 on ``rows``) names it.
    attr = getattr(exc, "attr", None)
    response.data = error_body(
        status_code=response.status_code,
        code=code,
        detail=str(detail),
        attr=attr if isinstance(attr, str) else None,
    )
    return response
