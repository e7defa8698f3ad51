"""The gateway's WSGI entry point: ``gunicorn serving.wsgi`` (instead of ``config.wsgi``).

The same Django application, except that token-authenticated ``POST`` requests to the two hot
routes (``/api/v1/workspaces/{ws}/predict/`` and ``/v2/models/{name}/infer``) go straight to their
views, skipping the middleware chain (sessions, CSRF, messages, ...) that only browser pages need.
The views do their own token authentication, workspace access check, body limit (1 MiB) and
error envelopes, so the answers are the same either way; everything else goes to Django as usual.
"""

from __future__ import annotations

import os
import re

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_application = get_wsgi_application()

from django.core import signals  # noqa: E402
from django.core.handlers.wsgi import WSGIRequest  # noqa: E402

from serving import gateway  # noqa: E402
from workspaces import access_cache  # noqa: E402
from workspaces.api.errors import (  # noqa: E402
    RETRY_AFTER_SECONDS,
    UNAVAILABLE_DETAILS,
    unavailable_code,
)
from workspaces.middleware import REQUEST_ID_HEADER, begin_request_id  # noqa: E402

PREDICT = re.compile(r"^/api/v1/workspaces/(?P<ws>[a-z0-9-]+)/predict/$")
INFER = re.compile(r"^/v2/models/(?P<name>[^/]+)/infer$")


def _route(environ) -> tuple | None:
    if environ.get("REQUEST_METHOD") != "POST" or not environ.get("HTTP_AUTHORIZATION"):
        return None
    path = environ.get("PATH_INFO", "")
    match = PREDICT.match(path)
    if match:
        return gateway.predict, {"ws": match["ws"]}
    match = INFER.match(path)
    if match:
        return gateway.oip_infer, {"name": match["name"]}
    return None


def application(environ, start_response):
    target = _route(environ)
    if target is None:
        return django_application(environ, start_response)
    view, kwargs = target
    request_id = begin_request_id(environ)
    signals.request_started.send(sender=__name__, environ=environ)
    try:
        with access_cache.generation_pinned():
            response = view(WSGIRequest(environ), **kwargs)
    except Exception as exc:
        import logging

        down = unavailable_code(exc)
        if down:
            response = gateway.error_response(503, down, UNAVAILABLE_DETAILS[down])
            response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        else:
            logging.getLogger("serving.gateway").exception(
                "gateway error on %s", environ["PATH_INFO"]
            )
            response = gateway.error_response(500, "error", "Internal error.")
    finally:
        signals.request_finished.send(sender=__name__)
    response[REQUEST_ID_HEADER] = request_id
    start_response(
        f"{response.status_code} {response.reason_phrase}",
        [*response.items(), ("Content-Length", str(len(response.content)))],
    )
    return [response.content]
