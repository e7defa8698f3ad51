"""The inference gateway: the lean hot path (plain Django views, orjson, models in memory).

``POST /api/v1/workspaces/{ws}/predict/``::

    {"request_id": "r-1", "deployment": "ranker", "user": "u42" | {"user_id": "u42"},
     "context": {...}, "candidates": ["i1", "i2", ...] | [{"item_id": "i1"}, ...]}
    -> {"request_id", "deployment", "model", "version", "version_id", "experiment", "arm",
        "scores": [...]}

The gateway fetches the online features itself (user features once, item features for all
candidates, context features from ``context``), routes the user to a version (production or an
experiment arm), scores all candidates in one batch and logs the prediction before answering.

``POST /v2/models/{name}/infer`` (Open Inference Protocol v2 JSON) scores raw feature inputs with
one deployment's production version. ``name`` is workspace-qualified: ``<workspace>.<deployment>``
(for example ``feed-pctr.ranker``). Token auth (``Authorization: Token <key>``) as for the REST API.
"""

from __future__ import annotations

import time
import uuid

import orjson
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf_exceptions

from serving import oip, replicas
from serving.inference import MODELS, context_refusal, serving_columns
from serving.metrics import CANDIDATES, DEPLOYMENT_NAMES, FALLBACKS, LATENCY, REQUESTS
from serving.predlog import predlog_write
from serving.routing import TABLES, route, table_version_ids
from workspaces.api.authentication import ApiTokenAuthentication
from workspaces.exceptions import ConflictError
from workspaces.selectors import workspace_access

MAX_CANDIDATES = 1000
MAX_BODY = 1024 * 1024
# OIP infer: 10,000 rows of a few hundred inputs, as the README documents (10 MiB).
MAX_INFER_BODY = 10 * 1024 * 1024
READ_PERMISSION = "view_workspace"
_auth = ApiTokenAuthentication()


def _prepare(table: dict) -> None:
    """Load and warm every version a new table routes to before it takes traffic."""
    MODELS.ensure(table_version_ids(table))


TABLES.prepare = _prepare


def _json(body: dict, status: int = 200) -> HttpResponse:
    return HttpResponse(orjson.dumps(body), status=status, content_type="application/json")


def error_response(
    status: int, code: str, detail: str, attr: str | None = None, errors=None
) -> HttpResponse:
    """The API's error envelope (``workspaces.api.errors.error_body``: the same ``type`` per
    status as every other endpoint), with the list of errors the gateway's clients read."""
    from workspaces.api.errors import error_body

    body = error_body(
        status_code=status,
        code=code,
        detail=detail,
        attr=attr,
        errors=errors or [{"code": code, "detail": detail, "attr": attr}],
    )
    return _json(body, status)


class _Refused(Exception):
    def __init__(self, response: HttpResponse) -> None:
        self.response = response


def _access(request, slug: str):
    try:
        found = _auth.authenticate(request)
    except drf_exceptions.AuthenticationFailed as exc:
        raise _Refused(error_response(401, "authentication_failed", str(exc.detail))) from exc
    if found is None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            response = error_response(
                401, "not_authenticated", "Authentication credentials were not provided."
            )
            response["WWW-Authenticate"] = 'Token realm="api"'
            raise _Refused(response)
        token = None
    else:
        user, token = found
    try:
        workspace, perms = workspace_access(user=user, slug=slug, token=token)
    except Http404 as exc:
        raise _Refused(error_response(404, "not_found", "No such workspace.")) from exc
    if READ_PERMISSION not in perms:
        raise _Refused(error_response(403, "permission_denied", "You do not have permission."))
    return workspace


def _body(request) -> dict:
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > MAX_BODY:
        raise _Refused(error_response(413, "too_large", f"body over {MAX_BODY} bytes"))
    try:
        data = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise _Refused(error_response(400, "parse_error", "body is not valid JSON")) from exc
    if not isinstance(data, dict):
        raise _Refused(error_response(400, "invalid", "the body must be a JSON object"))
    return data


def _unit(user) -> str:
    if isinstance(user, dict):
        return "|".join(str(user[k]) for k in sorted(user))
    return str(user)


def _key_ok(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (str, int)):
        return len(str(value)) <= 200
    if isinstance(value, dict):
        return 0 < len(value) <= 8 and all(
            isinstance(k, str)
            and isinstance(v, (str, int))
            and not isinstance(v, bool)
            and len(str(v)) <= 200
            for k, v in value.items()
        )
    return False


def _validate_predict(data: dict) -> tuple[str, str, object, dict, list]:
    request_id = data.get("request_id")
    if request_id is None:
        request_id = uuid.uuid4().hex
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= 100:
        raise ValidationError({"request_id": "give a string of 1-100 characters"})
    deployment = data.get("deployment")
    if not isinstance(deployment, str) or not 1 <= len(deployment) <= 63:
        raise ValidationError({"deployment": "give the deployment name"})
    user = data.get("user")
    if not _key_ok(user):
        raise ValidationError(
            {"user": "give the user's entity key (a string or an object of keys)"}
        )
    context = data.get("context") or {}
    if not isinstance(context, dict) or len(context) > 200:
        raise ValidationError({"context": "give an object of at most 200 values"})
    candidates = data.get("candidates")
    if not isinstance(candidates, list) or not 1 <= len(candidates) <= MAX_CANDIDATES:
        raise ValidationError({"candidates": f"give 1-{MAX_CANDIDATES} candidate items"})
    for i, item in enumerate(candidates):
        if not _key_ok(item):
            raise ValidationError({f"candidates.{i}": "give an item key (string or object)"})
    return request_id, deployment, user, context, candidates


def _keys_of(value, names: list[str]) -> dict:
    if isinstance(value, dict):
        return value
    return {names[0]: value} if len(names) == 1 else {}


def _key_rows(plan, user, candidates: list, context: dict) -> list[dict]:
    """Per candidate, the entity keys the request names: the context's scalar values, the user's
    keys and the candidate's (a bare key is the entity's one key column)."""
    scalars = {k: v for k, v in context.items() if isinstance(v, (str, int, float, bool))}
    user_keys = _keys_of(user, plan.keys.get("user") or ["user_id"])
    item_names = plan.keys.get("item") or ["item_id"]
    return [{**scalars, **user_keys, **_keys_of(item, item_names)} for item in candidates]


def _count_error(workspace_id: int, deployment: str) -> None:
    key = f"serving:errors:{workspace_id}:{deployment}:{int(time.time() // 60)}"
    try:
        if not cache.add(key, 1, timeout=7200):
            cache.incr(key)
    except ValueError:
        pass


def _score(ws: str, table: dict, loaded, columns: dict[str, list], n: int, request_id: str):
    """The version's scores for ``n`` rows: from the deployment's replicas when the table names
    them for this version (``serving.replicas``), else (or when none answers, a fallback counted
    for workspace ``ws`` and the table's deployment) in process."""
    remote = table.get("remote")
    if remote is not None and remote["version_id"] == loaded.version_id:
        scores = replicas.score(remote, loaded, columns, n, request_id)
        if scores is not None:
            return scores
        # The table names a real deployment: count it by name even before its first answer.
        DEPLOYMENT_NAMES.remember(ws, table["deployment"])
        FALLBACKS.labels(ws, table["deployment"]).inc()
    return loaded.predict(columns, n)


@csrf_exempt
def predict(request, ws: str) -> HttpResponse:
    started = time.perf_counter()
    if request.method != "POST":
        return error_response(405, "method_not_allowed", f'Method "{request.method}" not allowed.')
    deployment = ""
    workspace = None
    try:
        workspace = _access(request, ws)
        data = _body(request)
        request_id, deployment, user, context, candidates = _validate_predict(data)
        table = TABLES.get(workspace.pk, deployment)
        if table.get("stopped"):
            raise ConflictError(f"deployment '{deployment}' is stopped", attr="deployment")
        unit_id = _unit(user)
        version_id, experiment, arm = route(table, unit_id)
        loaded = MODELS.get(version_id)
        n = len(candidates)
        entities = {"user": [user], "item": candidates}
        for entity in loaded.plan.lookups:
            if entity not in entities and entity in context:
                entities[entity] = [context[entity]]
        key_rows = _key_rows(loaded.plan, user, candidates, context)
        refusal = context_refusal(loaded.plan, context, key_rows)
        if refusal:
            raise ValidationError({"context": refusal})
        columns = serving_columns(
            workspace=workspace,
            plan=loaded.plan,
            entities=entities,
            context=context,
            n=n,
            key_rows=key_rows,
        )
        scores = _score(ws, table, loaded, columns, n, request_id)
        latency_ms = (time.perf_counter() - started) * 1000
        predlog_write(
            {
                "w": workspace.pk,
                "r": request_id,
                "u": unit_id,
                "d": table["deployment_id"],
                "dn": deployment,
                "v": version_id,
                "e": experiment,
                "a": arm,
                "n": n,
                "l": latency_ms,
                "t": time.time(),
            }
        )
    except _Refused as refused:
        return refused.response
    except ValidationError as exc:
        if workspace is not None and deployment:
            REQUESTS.labels(ws, deployment, "", "invalid").inc()
        errors = getattr(exc, "message_dict", {"non_field_errors": exc.messages})
        attr, messages = next(iter(errors.items()))
        status = 404 if attr == "deployment" and "no deployment" in messages[0] else 400
        return error_response(
            status,
            "invalid" if status == 400 else "not_found",
            messages[0],
            attr,
            [{"code": "invalid", "detail": m, "attr": a} for a, ms in errors.items() for m in ms],
        )
    except ConflictError as exc:
        return error_response(409, "conflict", str(exc), exc.attr)
    except Exception:
        if workspace is not None:
            REQUESTS.labels(ws, deployment, "", "error").inc()
            _count_error(workspace.pk, deployment)
        raise
    REQUESTS.labels(ws, deployment, str(loaded.number), "ok").inc()
    LATENCY.labels(ws, deployment).observe(latency_ms / 1000)
    CANDIDATES.labels(ws, deployment).inc(n)
    return _json(
        {
            "request_id": request_id,
            "deployment": deployment,
            "model": loaded.model_name,
            "version": loaded.number,
            "version_id": version_id,
            "experiment": experiment,
            "arm": arm,
            "scores": scores.tolist(),
        }
    )


# ---------------------------------------------------------------------------------------------
# Open Inference Protocol v2


def _oip_target(request, name: str):
    slug, dot, deployment = name.partition(".")
    if not dot or not slug or not deployment:
        raise _Refused(
            error_response(404, "not_found", "model names are '<workspace>.<deployment>'")
        )
    workspace = _access(request, slug)
    try:
        table = TABLES.get(workspace.pk, deployment)
    except ValidationError as exc:
        raise _Refused(error_response(404, "not_found", f"no deployment '{deployment}'")) from exc
    return workspace, deployment, table


def oip_error(status: int, code: str, detail: str, attr: str | None = None) -> HttpResponse:
    """The protocol's error body (``{"error": "<message>"}``, what tritonclient reads) inside
    the API's envelope, so either kind of client finds its field."""
    response = error_response(status, code, detail, attr)
    return _with_error(response)


def _with_error(response: HttpResponse) -> HttpResponse:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response
    if isinstance(body, dict) and "error" not in body:
        body["error"] = str(body.get("detail") or body.get("code") or response.status_code)
        response.content = orjson.dumps(body)
    return response


def _oip_version(loaded, version: str | None) -> None:
    if version is not None and version != str(loaded.number):
        raise _Refused(
            oip_error(
                404, "not_found", f"version {version} is not served (it serves {loaded.number})"
            )
        )


@csrf_exempt
def oip_infer(request, name: str, version: str | None = None) -> HttpResponse:
    started = time.perf_counter()
    if request.method != "POST":
        return oip_error(405, "method_not_allowed", f'Method "{request.method}" not allowed.')
    try:
        workspace, deployment, table = _oip_target(request, name)
        if table.get("stopped"):
            return oip_error(409, "conflict", f"deployment '{deployment}' is stopped", "deployment")
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > MAX_INFER_BODY:
            return oip_error(413, "too_large", f"body over {MAX_INFER_BODY} bytes")
        header, binary = oip.split_binary(
            request.body, request.headers.get("Inference-Header-Content-Length")
        )
        try:
            payload = orjson.loads(header)
        except orjson.JSONDecodeError:
            return oip_error(400, "parse_error", "the body (its JSON header) is not valid JSON")
        loaded = MODELS.get(table["production"])
        _oip_version(loaded, version)
        columns, n, request_id = oip.decode_inputs(payload, binary)
        oip.check_outputs(payload)
        columns = oip.check_against(columns, n, loaded.oip_inputs)
        scores = _score(workspace.slug, table, loaded, columns, n, request_id)
    except _Refused as refused:
        return _with_error(refused.response)
    except ValueError as exc:
        return oip_error(400, "invalid", str(exc), "inputs")
    REQUESTS.labels(workspace.slug, deployment, str(loaded.number), "ok").inc()
    LATENCY.labels(workspace.slug, deployment).observe(time.perf_counter() - started)
    body, raw = oip.encode_outputs(
        name, str(loaded.number), request_id, scores, binary=oip.wants_binary(payload)
    )
    if not raw:
        return _json(body)
    head = orjson.dumps(body)
    response = HttpResponse(head + raw, content_type="application/octet-stream")
    response["Inference-Header-Content-Length"] = str(len(head))
    return response


def oip_server(request) -> HttpResponse:
    """Server metadata (``GET /v2``): name, version and the extensions spoken."""
    return _json(oip.SERVER)


def oip_live(request) -> HttpResponse:
    return _json({"live": True})


def oip_ready(request) -> HttpResponse:
    from django.db import connection

    try:
        connection.ensure_connection()
    except Exception:  # noqa: BLE001
        return _json({"ready": False, "error": "the database is not answering"}, 503)
    return _json({"ready": True})


def oip_model(request, name: str, version: str | None = None) -> HttpResponse:
    try:
        _, _, table = _oip_target(request, name)
        loaded = MODELS.get(table["production"])
        _oip_version(loaded, version)
    except _Refused as refused:
        return _with_error(refused.response)
    return _json(
        {
            "name": name,
            "versions": [str(loaded.number)],
            "platform": "pytorch",
            "inputs": loaded.oip_inputs,
            "outputs": oip.OUTPUTS,
        }
    )


def oip_model_ready(request, name: str, version: str | None = None) -> HttpResponse:
    try:
        _, _, table = _oip_target(request, name)
        if table.get("stopped"):
            return _json(
                {"name": name, "ready": False, "error": "the deployment is stopped"}, 503
            )  # a stopped deployment serves none
        loaded = MODELS.get(table["production"])
        _oip_version(loaded, version)
    except _Refused as refused:
        return _with_error(refused.response)
    return _json({"name": name, "ready": True})


_ = settings  # settings read lazily by helpers
