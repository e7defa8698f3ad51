"""The hot path of online serving: POST /api/v1/workspaces/{ws}/online-features/ without DRF.

A model server asks for features once per ranking request, so this route's latency is paid on
every prediction. ``OnlineLookupMiddleware`` answers it before the rest of the middleware stack,
URL resolution and DRF's request machinery, for the common case only: a token-authenticated JSON
request whose caller, workspace and feature list were seen before. Then a request costs one
dictionary lookup for everything the slow path would authenticate, authorise and resolve, and
one Redis round trip (``RedisOnlineStore.read`` with a guard) that both checks those cached
answers are still current and reads the rows.

Anything else falls through, untouched, to the DRF view (``OnlineFeaturesViewSet``), which stays
the one definition of the endpoint: its OpenAPI schema, every error answer (400 naming the field,
401, 403, 404 for a workspace the caller cannot see, 413, 415) and session authentication with
CSRF. The fast path never answers an error itself: at the first thing it does not like it steps
aside before anything was read or counted, so the slow path answers exactly as it always did.

Staleness: the cached answers live in ``workspaces.access_cache`` (process-local, dropped when the
shared *access generation* changes, and locally on every write to users, tokens, memberships,
permissions or the feature registry). The slow path reads the generation on every request; the
fast path instead passes the generation its entry was cached under to the Lua read script, which
reads nothing unless the shared generation is still that one, in the same round trip. Without
Redis (the embedded ``make run`` setup) the generation is read from the cache first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import RequestDataTooBig, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from rest_framework.exceptions import APIException

from features import online_store
from features.lookup import LookupPlan, check_entities, lookup_plan, plan_lookups, plan_rows
from workspaces import access_cache
from workspaces.api.authentication import LAST_USED_RESOLUTION, ApiTokenAuthentication
from workspaces.api.parsers import parse_strict_json
from workspaces.api.viewsets import ROLE_PERMISSION
from workspaces.models import ApiToken, Role, hash_token_key
from workspaces.selectors import workspace_access

ROUTE = re.compile(r"^/api/v1/workspaces/(?P<ws>[a-z0-9-]+)/online-features/$")
TOKEN_KEYWORDS = (b"token", b"bearer")
# The answers DRF would render with FastJSONRenderer; anything else (text/html for the browsable
# API, an indent parameter, ...) is left to DRF's content negotiation.
PLAIN_ACCEPTS = ("", "*/*", "application/json")
ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z
# What the online lookup needs (OnlineFeaturesViewSet.action_roles["create"]).
REQUIRED_PERMISSION = ROLE_PERMISSION[Role.VIEWER]
ENTRY = "features-fastpath"
# Set in the WSGI environ by ``features.wsgi`` when the fast path already stepped aside, so that
# the middleware does not try again.
DECLINED = "rankops.fastpath.declined"

# How many lookups the fast path answered in this process (tests read it to see which path ran).
served = 0


@dataclass
class _Entry:
    """What the slow path would work out for one (token, workspace, feature list)."""

    token: ApiToken
    plan: LookupPlan


class _Step(Exception):
    """Leave this request to the DRF view."""


def _peek(key: Hashable) -> tuple[str | None, Any]:
    """(generation, value) of an access-cache entry, without reading the shared generation."""
    return access_cache.peek(key)


def _redis_guard_key() -> str | None:
    """The Redis key of the access generation when the cache and the online store share one
    Redis (the production setup), else None."""
    backend = settings.CACHES["default"]["BACKEND"]
    if not settings.REDIS_URL or not backend.endswith("RedisCache"):
        return None
    if settings.CACHES["default"].get("LOCATION") != settings.REDIS_URL:
        return None
    if settings.ONLINE_STORE_REDIS_URL != settings.REDIS_URL or settings.ONLINE_STORE_REDIS_CLUSTER:
        return None
    return cache.make_key(access_cache.GENERATION_KEY)


class OnlineLookupMiddleware:
    """Answer warm online lookups directly (see the module docstring); pass the rest on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.guard_key = _redis_guard_key()
        self.authentication = ApiTokenAuthentication()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and DECLINED not in request.META:
            match = ROUTE.match(request.path_info)
            if match is not None:
                response = self.answer(request, match.group("ws"))
                if response is not None:
                    return response
        return self.get_response(request)

    def answer(self, request: HttpRequest, slug: str) -> HttpResponse | None:
        """The lookup's answer for workspace ``slug``, or None to leave it to the DRF view."""
        try:
            return self._answer(request, slug)
        except _Step:
            return None

    # --- the request ------------------------------------------------------------------------

    def _answer(self, request: HttpRequest, slug: str) -> HttpResponse:
        meta = request.META
        header = meta.get("HTTP_AUTHORIZATION", "").encode("iso-8859-1").split()
        if len(header) != 2 or header[0].lower() not in TOKEN_KEYWORDS:
            raise _Step
        content_type = meta.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json" or meta.get("QUERY_STRING"):
            raise _Step
        if meta.get("HTTP_ACCEPT", "").strip() not in PLAIN_ACCEPTS:
            raise _Step
        try:
            key = header[1].decode()
            body = _parse(request.body)
        except (UnicodeDecodeError, RequestDataTooBig, ValueError):
            raise _Step from None
        features = body.get("features")
        try:
            entities = check_entities(body.get("entities"))
        except ValidationError:
            raise _Step from None
        if not isinstance(features, list) or not all(type(f) is str for f in features):
            raise _Step
        cache_key = (ENTRY, hash_token_key(key), slug, tuple(features))
        generation, entry = _peek(cache_key)
        if entry is None:
            generation, entry = self._load(request, slug, features, cache_key)
        token = entry.token
        if not token.is_active or not token.user.is_active:
            raise _Step
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        plan = entry.plan
        try:
            lookups = plan_lookups(plan, entities)
        except ValidationError:
            raise _Step from None
        found = self._read(lookups, generation)
        rows = plan_rows(plan, len(entities), found)
        global served
        served += 1
        content = orjson.dumps({"features": plan.features, "rows": rows}, option=ORJSON_OPTIONS)
        response = HttpResponse(content, content_type="application/json")
        # The headers DRF and the middleware after this one would add.
        response["Content-Length"] = str(len(content))
        response["Vary"] = "Accept"
        response["Allow"] = "POST, OPTIONS"
        response["X-Frame-Options"] = getattr(settings, "X_FRAME_OPTIONS", "DENY").upper()
        return response

    def _read(self, lookups: list[online_store.Lookup], generation: str | None) -> list:
        if not generation:
            raise _Step
        store = online_store.get_online_store()
        if self.guard_key is not None and isinstance(store, online_store.RedisOnlineStore):
            found = store.read(lookups, guard=(self.guard_key, generation))
            if found is None:  # the generation moved on: the slow path reloads
                raise _Step
            return found
        if access_cache.current_generation() != generation:
            raise _Step
        return store.read(lookups)

    # --- a first request: what the slow path would do, remembered ------------------------------

    def _load(
        self, request: HttpRequest, slug: str, features: list[str], cache_key: Hashable
    ) -> tuple[str | None, _Entry]:
        """Authenticate, authorise and plan like the DRF view, cached like the slow path's own
        answers: the loader runs after the cache read the generation it files the entry under.
        Any refusal steps aside for the DRF view to answer."""

        def load() -> _Entry:
            try:
                found = self.authentication.authenticate(request)
                if found is None:
                    raise _Step
                user, token = found
                workspace, perms = workspace_access(user=user, slug=slug, token=token)
                if REQUIRED_PERMISSION not in perms:
                    raise _Step
                plan = lookup_plan(workspace=workspace, features=features)
            except (APIException, Http404, ValidationError):
                raise _Step from None
            return _Entry(token=token, plan=plan)

        entry = access_cache.cached(cache_key, load)
        generation, filed = _peek(cache_key)
        if filed is not entry:  # the generation moved on while loading
            raise _Step
        return generation, entry


def _parse(raw: bytes) -> dict[str, Any]:
    """The body as the slow path's strict parser reads it, or ValueError.

    orjson refuses what the strict parser refuses (NaN, infinities, bad UTF-8, deep nesting)
    except duplicate keys, which it lets the last one win. A body whose only object is the
    top-level one with just ``entities`` and ``features``, each named once and without escapes,
    has none; anything else (entity objects for composite keys) goes through the strict parser.
    """
    if raw.count(b"{") == 1 and b"\\" not in raw:
        body = orjson.loads(raw)
        if (
            isinstance(body, dict)
            and body.keys() <= {"entities", "features"}
            and raw.count(b'"entities"') <= 1
            and raw.count(b'"features"') <= 1
        ):
            return body
    body = parse_strict_json(raw)
    if not isinstance(body, dict):
        raise ValueError("not an object")
    return body
