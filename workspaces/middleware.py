"""Request middleware: health probes answered before host checks, and the body size limit."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

# Larger limits for specific paths (e.g. producer batch uploads), as (path prefix, bytes).
BODY_LIMIT_OVERRIDES: list[tuple[str, int]] = []


def body_limit_for(path: str) -> int:
    for prefix, limit in BODY_LIMIT_OVERRIDES:
        if path.startswith(prefix):
            return limit
    return settings.API_MAX_BODY_BYTES


class RequestBodyLimitMiddleware:
    """Answer 413 with the API's error body when a request declares a body over the limit."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        declared = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = int(declared)
        except ValueError:
            return JsonResponse(
                {
                    "type": "validation_error",
                    "code": "invalid_content_length",
                    "detail": "Content-Length is not a number.",
                    "attr": None,
                },
                status=400,
            )
        limit = body_limit_for(request.path)
        if length > limit:
            return JsonResponse(
                {
                    "type": "too_large",
                    "code": "too_large",
                    "detail": f"Request body of {length} bytes is over the {limit}-byte limit.",
                    "attr": None,
                },
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
