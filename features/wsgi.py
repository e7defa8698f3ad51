"""The online feature server's WSGI entry point: ``features.wsgi:application``.

Run it with granian (``granian --interface wsgi features.wsgi:application``, the compose service
``features-online``) behind the route ``/api/v1/workspaces/{ws}/online-features/``. It is the
whole Django application, except that warm online lookups (see ``features.fastpath``) are
answered before Django's request handler: no request signals beyond the ones a lookup needs, no
middleware chain, no URL resolution. What the middleware in front of the fast path does for such
a request is done here too, so the answer is byte for byte the one ``config.wsgi`` gives:

- ``SecurityMiddleware``: its HTTPS redirect (the request goes to Django when it would redirect)
  and its response headers;
- ``RequestBodyLimitMiddleware``: a body over the limit goes to Django, which answers 413.

Whatever the fast path leaves aside goes to Django, marked so that the fast-path middleware does
not try a second time.
"""

from __future__ import annotations

import gc
import io
import logging
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_application = get_wsgi_application()

from django.conf import settings  # noqa: E402
from django.core import signals  # noqa: E402
from django.core.handlers.wsgi import WSGIRequest  # noqa: E402
from django.db import connections  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.middleware.security import SecurityMiddleware  # noqa: E402

from features.fastpath import DECLINED, ROUTE, OnlineLookupMiddleware  # noqa: E402
from workspaces.middleware import (  # noqa: E402
    REQUEST_ID_HEADER,
    begin_request_id,
    body_limit_for,
)

logger = logging.getLogger("features.wsgi")


def _not_used(request):  # pragma: no cover - the middlewares below are only asked for answers
    raise AssertionError("features.wsgi calls the middleware methods directly")


lookup = OnlineLookupMiddleware(_not_used)
security = SecurityMiddleware(_not_used)


def _fast(environ) -> HttpResponse | None:
    """The answer to a warm lookup, or None to leave the request to Django."""
    if environ.get("REQUEST_METHOD") != "POST" or "HTTP_AUTHORIZATION" not in environ:
        return None
    path = environ.get("PATH_INFO", "")
    match = ROUTE.match(path)
    if match is None:
        return None
    try:
        if int(environ.get("CONTENT_LENGTH") or 0) > body_limit_for(path):
            return None
    except ValueError:
        return None
    request = WSGIRequest(environ)
    if security.process_request(request) is not None:
        return None
    try:
        response = lookup.answer(request, match["ws"])
    finally:
        # The warm path reads no database; a first lookup or a token's last-used stamp does.
        # While this thread holds a connection, every request ends as Django's handler ends
        # one (request_finished gives back a connection past its age or broken).
        if any(c.connection is not None for c in connections.all(initialized_only=True)):
            signals.request_finished.send(sender=__name__)
        body = getattr(request, "_body", None)
        if body is not None:  # read: Django gets the bytes again if it answers after all
            environ["wsgi.input"] = io.BytesIO(body)
    if response is None:
        return None
    response = security.process_response(request, response)
    response[REQUEST_ID_HEADER] = begin_request_id(environ)
    return response


def application(environ, start_response):
    try:
        response = _fast(environ)
    except Exception:
        logger.exception("online lookup fast path failed on %s", environ.get("PATH_INFO"))
        response = None
    if response is None:
        if environ.get("REQUEST_METHOD") == "POST" and ROUTE.match(environ.get("PATH_INFO", "")):
            environ[DECLINED] = True
        return django_application(environ, start_response)
    start_response(f"{response.status_code} {response.reason_phrase}", list(response.items()))
    return [response.content]


# Everything imported so far lives as long as the process: keep it out of the collector's
# generations so that a full collection does not walk it on a request's time (gc.freeze). Not in
# a test run, which imports this module halfway and would never collect what was alive then.
if settings.WSGI_GC_FREEZE:
    gc.freeze()
