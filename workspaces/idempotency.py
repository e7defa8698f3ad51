"""``Idempotency-Key`` for every write of the API: a client that retries a write it cannot tell
went through (a timeout, a dropped connection) sends the same key and gets the first answer
again, and nothing is done twice.

``IdempotencyMiddleware`` looks at ``POST``/``PUT``/``PATCH``/``DELETE`` under ``/api/v1/`` that
carry the header. Per caller (a digest of the ``Authorization`` header, else the session's user)
and key, the first request takes a row (``IdempotentRequest``, unique on caller and key: two
at once cannot both take it); its answer (2xx and 4xx, up to ``IDEMPOTENCY_MAX_BYTES``) is
stored in the row. A later request with the key:

* the same method, path and body: the stored answer, with ``Idempotent-Replayed: true``;
* while the first is still running: 409 saying so (retry after it ends);
* another request: 409 naming ``Idempotency-Key``.

A 5xx answer is not kept (the write did not happen; the retry runs it). Rows older than
``IDEMPOTENCY_TTL_S`` (24 h) are forgotten (hourly, ``workspaces.tasks.idempotency_sweep``).
Views that give the key their own meaning (a feature batch's key is the batch's identity in the
offline store) set ``handles_idempotency_key``.

Written here: DRF and Django have no idempotency layer, and the packages that add one keep
answers in a cache (lost on a restart; an acknowledged write would then repeat) rather than the
database the write itself went to.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from workspaces.models import IdempotentRequest

HEADER = "Idempotency-Key"
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
PREFIX = "/api/v1/"


def _ttl() -> timedelta:
    return timedelta(seconds=int(getattr(settings, "IDEMPOTENCY_TTL_S", 24 * 3600)))


def _take(principal: str, key: str, method: str, path: str, digest: str):
    """The new row for this key, or None when a live one holds it.

    An expired row (the hourly sweep has not reached it yet) is replaced here, on the
    conflict path, so a write with a fresh key costs one INSERT and no DELETE."""
    for _ in range(2):
        try:
            with transaction.atomic():
                return IdempotentRequest.objects.create(
                    principal=principal, key=key, method=method, path=path, body_sha256=digest
                )
        except IntegrityError:
            gone, _n = IdempotentRequest.objects.filter(
                principal=principal, key=key, created_at__lt=timezone.now() - _ttl()
            ).delete()
            if not gone:
                return None
    return None


def forget_expired() -> int:
    """Delete the rows past the TTL (the hourly ``workspaces.tasks.idempotency_sweep``)."""
    deleted, _ = IdempotentRequest.objects.filter(created_at__lt=timezone.now() - _ttl()).delete()
    return deleted


def _principal(request: HttpRequest) -> str:
    authorization = request.META.get("HTTP_AUTHORIZATION", "")
    if authorization:
        seed = f"auth:{authorization}"
    else:
        user = getattr(request, "user", None)
        seed = f"session:{user.pk}" if user is not None and user.is_authenticated else ""
    return hashlib.sha256(seed.encode()).hexdigest() if seed else ""


def _conflict(detail: str) -> JsonResponse:
    from workspaces.api.errors import error_body

    body = error_body(status_code=409, code="conflict", detail=detail, attr=HEADER)
    return JsonResponse(body, status=409)


class IdempotencyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        row = getattr(request, "_idempotent_row", None)
        if row is not None:
            self._keep(row, response)
        return response

    def process_view(self, request: HttpRequest, view_func, view_args, view_kwargs):
        key = request.headers.get(HEADER)
        if not key or request.method not in WRITES or not request.path.startswith(PREFIX):
            return None
        view_class = getattr(view_func, "cls", None) or getattr(view_func, "view_class", None)
        if getattr(view_class, "handles_idempotency_key", False):
            return None
        if len(key) > 200 or not key.isprintable() or not key.isascii():
            from workspaces.api.errors import error_body

            body = error_body(
                status_code=400,
                code="invalid",
                detail="give a key of 1-200 printable ASCII characters",
                attr=HEADER,
            )
            return JsonResponse(body, status=400)
        principal = _principal(request)
        if not principal:
            return None  # the view answers 401; nothing to replay
        digest = hashlib.sha256(request.body).hexdigest()
        row = _take(principal, key, request.method, request.path[:500], digest)
        if row is None:
            found = IdempotentRequest.objects.filter(principal=principal, key=key).first()
            if found is None:
                return _conflict("a request with this Idempotency-Key just ended; send it again")
            if not found.done:
                return _conflict("the request with this Idempotency-Key is still running")
            if (found.method, found.path, found.body_sha256) != (
                request.method,
                request.path[:500],
                digest,
            ):
                return _conflict(
                    f"this Idempotency-Key was used for another request ({found.method} "
                    f"{found.path}); use a new key for a new request"
                )
            replay = HttpResponse(
                bytes(found.response), status=found.status, content_type=found.content_type
            )
            replay["Idempotent-Replayed"] = "true"
            return replay
        request._idempotent_row = row  # type: ignore[attr-defined]
        return None

    @staticmethod
    def _keep(row: IdempotentRequest, response: HttpResponse) -> None:
        limit = int(getattr(settings, "IDEMPOTENCY_MAX_BYTES", 1024 * 1024))
        streaming = getattr(response, "streaming", False)
        if response.status_code >= 500 or streaming or len(response.content) > limit:
            IdempotentRequest.objects.filter(pk=row.pk).delete()
            return
        IdempotentRequest.objects.filter(pk=row.pk).update(
            done=True,
            status=response.status_code,
            content_type=response.get("Content-Type", "application/json")[:100],
            response=bytes(response.content),
        )
