"""Request middleware: health probes answered before host checks, and the body size limit."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


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
