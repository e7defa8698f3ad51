"""One error body for the whole API: ``{"type", "code", "detail", "attr"}``.

``errors`` carries every field error when a request has several; ``detail`` and ``attr`` are the
first of them.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

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
    if isinstance(exc, ConflictError):
        return Response(
            error_body(status_code=409, code="conflict", detail=str(exc), attr=exc.attr),
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, ReferenceNotFound):  # before ValidationError: it is one
        return Response(
            error_body(status_code=404, code="not_found", detail=exc.detail, attr=exc.attr),
            status=status.HTTP_404_NOT_FOUND,
        )
    if isinstance(exc, DjangoValidationError):
        exc = _django_validation_to_drf(exc)
    if isinstance(exc, RequestDataTooBig):
        return Response(
            error_body(status_code=413, code="too_large", detail=str(exc)),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, UnscopedQueryError):
        # A programming error: fail closed and loudly, never leak other tenants' rows.
        logger.error("unscoped query blocked: %s", exc)
        return Response(
            error_body(status_code=500, code="unscoped_query", detail="Internal error."),
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
    code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
    response.data = error_body(status_code=response.status_code, code=code, detail=str(detail))
    return response
