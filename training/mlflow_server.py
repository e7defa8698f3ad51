"""The platform as an MLflow tracking server: MLflow's own server app behind the platform's auth.

``MLFLOW_TRACKING_URI=http://<host>/mlflow`` with ``MLFLOW_TRACKING_TOKEN=<platform API token>``
is all a stock ``mlflow`` client needs (runs, params, metrics, artifacts, logged models, the model
registry, and the UI for a signed-in browser). Nothing of MLflow's REST API is written here: the
request goes to ``mlflow.server.app`` (the Flask app ``mlflow server`` runs) called as a WSGI app,
with the platform's tracking store as its backend (``MLFLOW_TRACKING_URI`` when that is a database
URI) and ``MLFLOW_ARTIFACT_ROOT`` served through the ``mlflow-artifacts`` routes
(``--serve-artifacts``), so a remote client uploads and downloads through this same address.

Which workspace. A token narrowed to one workspace (or a user in one workspace) uses
``/mlflow``; anyone else names it: ``/mlflow/w/<slug>``. Reads need the viewer role, writes the
developer role. The browser UI uses the session; its state-changing requests must come from this
origin (MLflow's UI cannot send Django's CSRF token, so the ``Origin`` header stands in for it).

Isolation. MLflow's names are global, so each workspace gets a namespace in them; the names the
platform already uses are that namespace, so the runs of the platform's own training jobs and the
versions its registry mirrors show up for their workspace:

* experiments are stored as ``rankops/<slug>/<name>``; the workspace's ``Default`` is
  ``rankops/<slug>`` (the experiment training jobs log to), and ``experiment_id`` ``0`` (the stock
  client's default) means it. Names are rewritten on the way in (create, get-by-name, rename,
  search filters) and back on the way out;
* registered models are stored as ``<slug>.<name>`` (the registry mirror's names), likewise;
* every experiment, run and logged-model id in a request (body, query or path, at any depth) must
  belong to one of the workspace's experiments, and artifact paths must lie under ``<slug>/``;
  anything else answers MLflow's ``RESOURCE_DOES_NOT_EXIST`` 404, exactly like a missing one;
* list and search answers are filtered to the workspace (a page may come back shorter than
  ``max_results``; its ``next_page_token`` still pages on);
* experiments keep their artifacts under ``MLFLOW_ARTIFACT_ROOT/<slug>`` (a client may not choose
  another location), and artifact URIs in answers read ``mlflow-artifacts:/<slug>/...``;
* only the routes listed in ``ROUTES`` pass (tracking, logged models, registry, artifacts, the UI's
  pages); MLflow's other services (traces, prompts, datasets, gateway, GraphQL, webhooks, jobs)
  answer ``ENDPOINT_NOT_FOUND``, since their ids cannot be checked here.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions

from workspaces.api.authentication import ApiTokenAuthentication
from workspaces.api.errors import error_body
from workspaces.models import ApiToken, Workspace
from workspaces.selectors import workspace_access, workspaces_visible_to

EXPERIMENT_PREFIX = "rankops"
DEFAULT_EXPERIMENT = "Default"
# Routes by kind, as MLflow's Flask app names them without the /api/2.0 (or /ajax-api/2.0, 3.0)
# prefix. Reads are GET plus the searches MLflow sends as POST; every other write needs developer.
EXPERIMENT_ROUTES = {
    "/mlflow/experiments/create",
    "/mlflow/experiments/delete",
    "/mlflow/experiments/delete-experiment-tag",
    "/mlflow/experiments/get",
    "/mlflow/experiments/get-by-name",
    "/mlflow/experiments/restore",
    "/mlflow/experiments/search",
    "/mlflow/experiments/set-experiment-tag",
    "/mlflow/experiments/update",
}
RUN_ROUTES = {
    "/mlflow/runs/create",
    "/mlflow/runs/delete",
    "/mlflow/runs/delete-tag",
    "/mlflow/runs/get",
    "/mlflow/runs/log-batch",
    "/mlflow/runs/log-inputs",
    "/mlflow/runs/log-metric",
    "/mlflow/runs/log-model",
    "/mlflow/runs/log-parameter",
    "/mlflow/runs/outputs",
    "/mlflow/runs/restore",
    "/mlflow/runs/search",
    "/mlflow/runs/set-tag",
    "/mlflow/runs/update",
    "/mlflow/metrics/get-history",
    "/mlflow/metrics/get-history-bulk",
    "/mlflow/metrics/get-history-bulk-interval",
    "/mlflow/artifacts/list",
    "/get-artifact",
}
LOGGED_MODEL_ROUTES = {
    "/mlflow/logged-models",
    "/mlflow/logged-models/<model_id>",
    "/mlflow/logged-models/<model_id>/artifacts/directories",
    "/mlflow/logged-models/<model_id>/artifacts/files",
    "/mlflow/logged-models/<model_id>/params",
    "/mlflow/logged-models/<model_id>/tags",
    "/mlflow/logged-models/<model_id>/tags/<tag_key>",
    "/mlflow/logged-models/search",
}
REGISTRY_ROUTES = {
    "/mlflow/registered-models/alias",
    "/mlflow/registered-models/create",
    "/mlflow/registered-models/delete",
    "/mlflow/registered-models/delete-tag",
    "/mlflow/registered-models/get",
    "/mlflow/registered-models/get-latest-versions",
    "/mlflow/registered-models/rename",
    "/mlflow/registered-models/search",
    "/mlflow/registered-models/set-tag",
    "/mlflow/registered-models/update",
    "/mlflow/model-versions/create",
    "/mlflow/model-versions/delete",
    "/mlflow/model-versions/delete-tag",
    "/mlflow/model-versions/get",
    "/mlflow/model-versions/get-download-uri",
    "/mlflow/model-versions/search",
    "/mlflow/model-versions/set-tag",
    "/mlflow/model-versions/transition-stage",
    "/mlflow/model-versions/update",
    "/model-versions/get-artifact",
}
ARTIFACT_ROUTES = {
    "/mlflow-artifacts/artifacts",
    "/mlflow-artifacts/artifacts/<path:artifact_path>",
    "/mlflow-artifacts/mpu/abort/<path:artifact_path>",
    "/mlflow-artifacts/mpu/complete/<path:artifact_path>",
    "/mlflow-artifacts/mpu/create/<path:artifact_path>",
}
PLAIN_ROUTES = {"/mlflow/server-info", "/health", "/version", "/", "/static-files/<path:path>"}
# The UI's run page reads through GraphQL: these top-level fields only, their inputs checked
# like the REST ones (run, experiment ids); the rest of MLflow's schema is refused.
GRAPHQL_FIELDS = {
    "mlflowGetRun",
    "mlflowGetExperiment",
    "mlflowListArtifacts",
    "mlflowGetMetricHistoryBulkInterval",
    "mlflowSearchRuns",
}
ROUTES = (
    EXPERIMENT_ROUTES
    | RUN_ROUTES
    | LOGGED_MODEL_ROUTES
    | REGISTRY_ROUTES
    | ARTIFACT_ROUTES
    | PLAIN_ROUTES
    | {"/graphql"}
)
READ_POSTS = {
    "/mlflow/experiments/search",
    "/mlflow/runs/search",
    "/mlflow/logged-models/search",
    "/mlflow/registered-models/get-latest-versions",
    "/graphql",
}
API_PREFIX = re.compile(r"^/(?:ajax-)?api/[0-9]+\.[0-9]+(?=/)")
# Ids that name an experiment, a run or a logged model, wherever they appear in a request.
EXPERIMENT_KEYS = {"experiment_id", "experiment_ids"}
RUN_KEYS = {"run_id", "run_uuid", "run_ids", "source_run_id"}
MODEL_KEYS = {"model_id", "model_ids"}
NAME_FILTER = re.compile(
    r"(?P<field>\b(?:attributes\.)?name)\s*(?P<op>!=|=|\bI?LIKE\b)\s*"
    r"(?P<quote>['\"])(?P<value>(?:(?!(?P=quote)).)*)(?P=quote)",
    re.IGNORECASE,
)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


class MlflowRefusal(Exception):
    """A request the mount answers itself: MLflow's error fields (``error_code``, ``message``)
    inside the platform's error body, so the stock client and the platform's readers parse it."""

    def __init__(self, status: int, error_code: str, message: str, attr: str | None = None):
        super().__init__(message)
        self.status, self.error_code, self.message, self.attr = status, error_code, message, attr

    def response(self) -> JsonResponse:
        """The refusal as an HTTP answer both kinds of reader understand."""
        codes = {
            400: "invalid",
            401: "not_authenticated",
            403: "permission_denied",
            409: "conflict",
        }
        body = error_body(
            status_code=self.status,
            code=codes.get(self.status, "not_found" if self.status == 404 else "unavailable"),
            detail=self.message,
            attr=self.attr,
            error_code=self.error_code,
            message=self.message,
        )
        response = JsonResponse(body, status=self.status)
        if self.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="mlflow"'
        return response


def not_found(what: str) -> MlflowRefusal:
    """The one answer for another workspace's object and for a missing one."""
    return MlflowRefusal(404, "RESOURCE_DOES_NOT_EXIST", f"No such {what} in this workspace.")


# ---------------------------------------------------------------------------------------------
# MLflow's server app, configured once per process


app_lock = threading.Lock()
server_state: dict[str, Any] = {}


def backend_store_uri() -> str:
    """The store the mounted server writes: the platform's own tracking store. A platform that
    tracks to a remote MLflow server (``http(s)://``) has no store to mount."""
    uri = str(settings.MLFLOW_TRACKING_URI)
    if uri.startswith(("http://", "https://", "databricks")):
        raise MlflowRefusal(
            503,
            "TEMPORARILY_UNAVAILABLE",
            "The platform tracks to a remote MLflow server; set MLFLOW_TRACKING_URI to a database "
            "URI (sqlite:/// or postgresql+psycopg://) to serve MLflow from the platform.",
        )
    return uri


def serves_mlflow() -> bool:
    """Whether ``/mlflow`` has a store to mount (the platform's tracking URI is a database)."""
    try:
        backend_store_uri()
    except MlflowRefusal:
        return False
    return True


def ui_path(workspace_slug: str) -> str:
    """Where a browser opens a workspace's MLflow UI on the platform ("" when it has none), for
    the pages that link runs."""
    return f"/mlflow/w/{workspace_slug}" if serves_mlflow() else ""


def run_ui_url(workspace_slug: str, run_id: str) -> str:
    """A run's page in the MLflow UI a browser reaches: ``MLFLOW_UI_URL`` when set, else the
    platform's own; "" without a run or a UI."""
    ui = str(getattr(settings, "MLFLOW_UI_URL", "") or "").rstrip("/") or ui_path(workspace_slug)
    return f"{ui}/#/runs/{run_id}" if ui and run_id else ""


def artifact_root_uri() -> str:
    """``MLFLOW_ARTIFACT_ROOT`` as a URI (a local folder becomes ``file://``), without a slash."""
    root = str(settings.MLFLOW_ARTIFACT_ROOT)
    return root.rstrip("/") if "://" in root else Path(root).as_uri().rstrip("/")


def mlflow_app():
    """MLflow's Flask app, configured from the platform's settings before its first import (the
    server reads its stores from these variables). Its own host/CORS middleware stays off: Django
    checks hosts, and the view checks authentication and origin."""
    with app_lock:
        if "app" not in server_state:
            from mlflow.server import constants

            os.environ[constants.BACKEND_STORE_URI_ENV_VAR] = backend_store_uri()
            os.environ[constants.SERVE_ARTIFACTS_ENV_VAR] = "true"
            os.environ[constants.ARTIFACTS_DESTINATION_ENV_VAR] = str(settings.MLFLOW_ARTIFACT_ROOT)
            os.environ[constants.ARTIFACT_ROOT_ENV_VAR] = "mlflow-artifacts:/"
            os.environ["MLFLOW_SERVER_DISABLE_SECURITY_MIDDLEWARE"] = "true"
            from mlflow.server import app, handlers

            with _process_uris_kept():
                # MLflow's server sets the process-wide tracking and registry URIs (and their
                # environment variables, which child processes inherit) to the backend store
                # when it first opens each store; opened here, once, they are put back, so that
                # the platform's other MLflow clients and its subprocesses keep their own.
                handlers._get_tracking_store()
                handlers._get_model_registry_store()
            _lookups_read_the_store()
            server_state["app"] = app
            server_state["handlers"] = handlers
        return server_state["app"]


def _lookups_read_the_store() -> None:
    """Point MLflow's process-wide tracking URI, in this process's memory only, at the store the
    server writes. MLflow's registry store resolves a ``models:/m-<id>`` source (and a version's
    ``model_id``) with a bare ``MlflowClient()``, which reads that URI (a TODO in its code says
    so): where nothing in the process had set it, the stock client's
    ``mlflow.register_model("models:/m-...")`` (and ``log_model(registered_model_name=...)``)
    answered 500, the logged model looked for in MLflow's default store. ``make run`` did; the
    suite passed only because an earlier test set the URI. The platform's own MLflow clients name
    their URIs; no environment variable changes, so subprocesses (user code included) inherit
    nothing, and the registry URI stays as it was."""
    from mlflow.tracking._tracking_service import utils as tracking_utils

    tracking_utils._tracking_uri = backend_store_uri()  # type: ignore[assignment]


@contextmanager
def _process_uris_kept() -> Iterator[None]:
    """Restore MLflow's process-wide tracking and registry URIs, and the variables naming them,
    as they were before the block."""
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    saved_env = {name: os.environ.get(name) for name in names}
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri, registry_utils._registry_uri = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def tracking_store():
    """The mounted server's own tracking store (one SQL engine per process)."""
    mlflow_app()
    return server_state["handlers"]._get_tracking_store()


# ---------------------------------------------------------------------------------------------
# The workspace's namespace in MLflow's names


@dataclass
class Namespace:
    """One workspace's share of MLflow: its experiment names, model names and artifact folder,
    and the ownership answers already looked up for this request."""

    workspace: Workspace
    owned_experiments: set[str] = field(default_factory=set)
    foreign_experiments: set[str] = field(default_factory=set)

    @property
    def slug(self) -> str:
        """The workspace's slug: the namespace's name in every rewritten name and path."""
        return self.workspace.slug

    @property
    def default_experiment_name(self) -> str:
        """The stored name of the workspace's Default (the name training jobs log to)."""
        return f"{EXPERIMENT_PREFIX}/{self.slug}"

    def experiment_stored(self, name: str) -> str:
        """The stored name of the workspace's experiment called ``name``."""
        if name == DEFAULT_EXPERIMENT:
            return self.default_experiment_name
        return f"{self.default_experiment_name}/{name}"

    def experiment_visible(self, stored: str) -> str | None:
        """The name the workspace sees, or None for another workspace's experiment."""
        if stored == self.default_experiment_name:
            return DEFAULT_EXPERIMENT
        prefix = self.default_experiment_name + "/"
        return stored[len(prefix) :] if stored.startswith(prefix) else None

    def model_stored(self, name: str) -> str:
        """The stored name of a registered model (the registry mirror's ``<slug>.<name>``)."""
        return f"{self.slug}.{name}"

    def model_visible(self, stored: str) -> str | None:
        """The model's name as the workspace sees it, or None for another workspace's."""
        prefix = f"{self.slug}."
        return stored[len(prefix) :] if stored.startswith(prefix) else None

    @property
    def artifact_location(self) -> str:
        """Where every experiment of the workspace keeps its artifacts (training jobs' too)."""
        return f"{artifact_root_uri()}/{self.slug}"

    def default_experiment_id(self) -> str:
        """The workspace's ``Default`` experiment (the one training jobs log to), created with
        the artifact location training jobs give it when nobody has logged there yet."""
        from mlflow.exceptions import MlflowException

        store = tracking_store()
        found = store.get_experiment_by_name(self.default_experiment_name)
        if found is None:
            try:
                return str(
                    store.create_experiment(
                        self.default_experiment_name, artifact_location=self.artifact_location
                    )
                )
            except MlflowException:  # another request created it just now
                found = store.get_experiment_by_name(self.default_experiment_name)
                if found is None:
                    raise
        self.owned_experiments.add(str(found.experiment_id))
        return str(found.experiment_id)

    def check_experiment(self, experiment_id: str) -> None:
        """404 unless the experiment is one of the workspace's."""
        if experiment_id in self.owned_experiments:
            return
        from mlflow.exceptions import MlflowException

        try:
            experiment = tracking_store().get_experiment(str(experiment_id))
        except MlflowException as exc:
            raise not_found("experiment") from exc
        if self.experiment_visible(experiment.name) is None:
            self.foreign_experiments.add(str(experiment_id))
            raise not_found("experiment")
        self.owned_experiments.add(str(experiment_id))

    def owns_experiment(self, experiment_id: Any) -> bool:
        """check_experiment as a yes/no, for filtering answers."""
        try:
            self.check_experiment(str(experiment_id))
        except MlflowRefusal:
            return False
        return True

    def check_run(self, run_id: str) -> None:
        """404 unless the run lives in one of the workspace's experiments."""
        from mlflow.exceptions import MlflowException

        try:
            run = tracking_store().get_run(str(run_id))
        except MlflowException as exc:
            raise not_found("run") from exc
        if not self.owns_experiment(run.info.experiment_id):
            raise not_found("run")

    def check_logged_model(self, model_id: str) -> None:
        """404 unless the logged model (MLflow 3's ``m-...``) is in the workspace's experiments."""
        from mlflow.exceptions import MlflowException

        try:
            model = tracking_store().get_logged_model(str(model_id))
        except MlflowException as exc:
            raise not_found("logged model") from exc
        if not self.owns_experiment(model.experiment_id):
            raise not_found("logged model")

    def check_artifact_path(self, path: str) -> None:
        """Artifact paths of the mlflow-artifacts routes lie under ``<slug>/``."""
        parts = [part for part in unquote(path or "").split("/") if part not in ("", ".")]
        if not parts or parts[0] != self.slug or ".." in parts:
            raise not_found("artifact")

    def check_source(self, source: str) -> None:
        """A model version's source: a run, a logged model or an artifact path of this
        workspace (a local path elsewhere would let a version read another's files)."""
        if not source:
            return
        location = urlsplit(source)
        rest = f"{location.netloc}{location.path}".strip("/")
        if location.scheme == "runs":
            self.check_run(rest.partition("/")[0])
        elif location.scheme == "models" and rest.startswith("m-"):
            self.check_logged_model(rest.partition("/")[0])
        elif location.scheme == "mlflow-artifacts":
            self.check_artifact_path(location.path)
        elif source.startswith(self.artifact_location + "/"):
            tail = source[len(self.artifact_location) + 1 :]
            self.check_artifact_path(f"{self.slug}/{tail}")
        else:
            raise MlflowRefusal(
                400,
                "INVALID_PARAMETER_VALUE",
                "source must be a runs:/, models:/m-... or mlflow-artifacts:/ URI of this "
                "workspace",
                attr="source",
            )


# ---------------------------------------------------------------------------------------------
# Requests in


def route_of(app, path: str, method: str) -> tuple[str, dict[str, str]]:
    """The MLflow route a path reaches, without its API version prefix, and its path values."""
    from werkzeug.exceptions import HTTPException

    adapter = app.url_map.bind("localhost")
    try:
        rule, values = adapter.match(path, method=method, return_rule=True)
    except HTTPException as exc:
        raise MlflowRefusal(404, "ENDPOINT_NOT_FOUND", "No such MLflow endpoint here.") from exc
    return API_PREFIX.sub("", rule.rule), values


def walk_ids(value: Any, namespace: Namespace, key: str = "") -> Any:
    """Check (and for ``experiment_id`` 0, map) every id in a request, at any depth."""
    if isinstance(value, dict):
        return {k: walk_ids(v, namespace, k) for k, v in value.items()}
    if isinstance(value, list):
        return [walk_ids(item, namespace, key) for item in value]
    if value in (None, "") or not isinstance(value, str | int):
        return value
    text = str(value)
    if key in EXPERIMENT_KEYS:
        if text == "0":
            return namespace.default_experiment_id()
        namespace.check_experiment(text)
    elif key in RUN_KEYS:
        namespace.check_run(text)
    elif key in MODEL_KEYS:
        namespace.check_logged_model(text)
    return value


def filter_in_namespace(filter_string: str, stored, workspace_clause: str) -> str:
    """A search filter with every name literal moved into the workspace's namespace and the
    namespace itself required (the answer is filtered again on the way out)."""

    def move(match: re.Match) -> str:
        quote = match["quote"]
        return f"{match['field']} {match['op']} {quote}{stored(match['value'])}{quote}"

    moved = NAME_FILTER.sub(move, filter_string or "").strip()
    return f"{workspace_clause} AND {moved}" if moved else workspace_clause


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def check_graphql(args: dict[str, Any], namespace: Namespace) -> None:
    """A GraphQL request may only ask the fields in ``GRAPHQL_FIELDS``, and every id in their
    inputs (literal or variable) must be the workspace's; 404 otherwise."""
    import graphql

    variables = args.get("variables") or {}
    if isinstance(variables, str):
        try:
            variables = json.loads(variables)
        except ValueError as exc:
            raise MlflowRefusal(
                400, "MALFORMED_REQUEST", "variables is not JSON", attr="variables"
            ) from exc
    try:
        document = graphql.parse(str(args.get("query") or ""))
    except graphql.GraphQLError as exc:
        raise MlflowRefusal(400, "MALFORMED_REQUEST", exc.message, attr="query") from exc
    refused = MlflowRefusal(404, "ENDPOINT_NOT_FOUND", "This GraphQL query is not served here.")
    for definition in document.definitions:
        if not isinstance(definition, graphql.OperationDefinitionNode):
            raise refused
        for selection in definition.selection_set.selections:
            if not isinstance(selection, graphql.FieldNode):
                raise refused
            if selection.name.value not in GRAPHQL_FIELDS:
                raise refused
            for argument in selection.arguments:
                value = graphql.value_from_ast_untyped(argument.value, variables)
                if isinstance(value, dict):
                    walk_ids({snake_case(k): v for k, v in value.items()}, namespace)


def rewrite_request(route: str, args: dict[str, Any], namespace: Namespace) -> dict[str, Any]:
    """The request's fields (JSON body or query values) with names put into the workspace's
    namespace and every id checked; raises MlflowRefusal for what the workspace may not do."""
    if route == "/graphql":
        check_graphql(args, namespace)
        return args
    args = walk_ids(args, namespace)
    if route in ("/mlflow/runs/create", "/mlflow/logged-models") and not args.get("experiment_id"):
        # MLflow would file it under its global experiment 0, which no workspace owns.
        args["experiment_id"] = namespace.default_experiment_id()
    if route == "/mlflow/experiments/delete" and str(args.get("experiment_id")) == (
        namespace.default_experiment_id()
    ):
        raise MlflowRefusal(
            409,
            "INVALID_STATE",
            f"{DEFAULT_EXPERIMENT} holds the workspace's training-job runs; it cannot be deleted",
            attr="experiment_id",
        )
    if route in EXPERIMENT_ROUTES:
        if route == "/mlflow/experiments/search" or args.get("experiment_name") == (
            DEFAULT_EXPERIMENT
        ):
            namespace.default_experiment_id()  # every workspace has its Default
        for key in ("name", "new_name", "experiment_name"):
            if isinstance(args.get(key), str):
                if key != "experiment_name" and args[key] == DEFAULT_EXPERIMENT:
                    raise MlflowRefusal(
                        400,
                        "INVALID_PARAMETER_VALUE",
                        f"{DEFAULT_EXPERIMENT} is the workspace's own experiment; pick another",
                        attr=key,
                    )
                args[key] = namespace.experiment_stored(args[key])
        if route == "/mlflow/experiments/create":
            if args.get("artifact_location"):
                raise MlflowRefusal(
                    400,
                    "INVALID_PARAMETER_VALUE",
                    "artifact_location is chosen by the platform (the workspace's artifact store)",
                    attr="artifact_location",
                )
            args["artifact_location"] = namespace.artifact_location
        if route == "/mlflow/experiments/search":
            args["filter"] = filter_in_namespace(
                str(args.get("filter") or ""),
                namespace.experiment_stored,
                f"name LIKE '{namespace.default_experiment_name}%'",
            )
    elif route in REGISTRY_ROUTES:
        for key in ("name", "new_name"):
            if isinstance(args.get(key), str):
                args[key] = namespace.model_stored(args[key])
        if route.endswith("/search"):
            args["filter"] = filter_in_namespace(
                str(args.get("filter") or ""),
                namespace.model_stored,
                f"name LIKE '{namespace.slug}.%'",
            )
        if route == "/mlflow/model-versions/create":
            namespace.check_source(str(args.get("source") or ""))
    elif route == "/mlflow-artifacts/artifacts" and "path" in args:
        namespace.check_artifact_path(str(args["path"]))
    elif route == "/mlflow-artifacts/artifacts":
        raise not_found("artifact")
    return args


# ---------------------------------------------------------------------------------------------
# Answers out


def rewrite_answer(value: Any, namespace: Namespace, key: str = "") -> Any:
    """An answer with names shown in the workspace's terms, another workspace's objects dropped
    from lists, and the artifact store's local URIs turned into served ``mlflow-artifacts:/``."""
    root = artifact_root_uri() + "/"
    if isinstance(value, str):
        return "mlflow-artifacts:/" + value[len(root) :] if value.startswith(root) else value
    if isinstance(value, list):
        items = [rewrite_answer(item, namespace, key) for item in value]
        return [item for item in items if item is not DROP]
    if not isinstance(value, dict):
        return value
    experiment_keys = ("experiment", "experiments")
    model_keys = (
        "registered_model",
        "registered_models",
        "model_version",
        "model_versions",
        "latest_versions",
        "modelVersions",
    )
    # A GraphQL answer holds only the fields asked for: an object without its name is one the
    # request's checked ids reached (a run's own experiment), kept as it is.
    if key in experiment_keys and isinstance(value.get("name"), str):
        visible = namespace.experiment_visible(value["name"])
        if visible is None:
            return DROP
        value = {**value, "name": visible}
        experiment_id = value.get("experiment_id", value.get("experimentId"))
        if experiment_id is not None:
            namespace.owned_experiments.add(str(experiment_id))
    elif key in model_keys and isinstance(value.get("name"), str):
        visible = namespace.model_visible(value["name"])
        if visible is None:
            return DROP
        value = {**value, "name": visible}
    elif key in ("runs", "models") and isinstance(value.get("info"), dict):
        # Runs and logged models name their experiment (GraphQL answers only what was asked).
        info = value["info"]
        experiment_id = info.get("experiment_id", info.get("experimentId"))
        if experiment_id is not None and not namespace.owns_experiment(experiment_id):
            return DROP
    return {k: rewrite_answer(v, namespace, k) for k, v in value.items()}


DROP = object()


# ---------------------------------------------------------------------------------------------
# The view


def authenticate(request: HttpRequest) -> tuple[Any, ApiToken | None]:
    """The caller: a platform API token (``Authorization: Bearer``, as ``MLFLOW_TRACKING_TOKEN``
    sends it) or the browser's session."""
    try:
        found = ApiTokenAuthentication().authenticate(request)
    except exceptions.AuthenticationFailed as exc:
        raise MlflowRefusal(401, "UNAUTHENTICATED", str(exc.detail)) from exc
    if found is not None:
        user, token = found
        return user, token
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return user, None
    raise MlflowRefusal(
        401, "UNAUTHENTICATED", "Set MLFLOW_TRACKING_TOKEN to a platform API token, or sign in."
    )


def resolve_workspace(
    user: Any, token: ApiToken | None, slug: str | None
) -> tuple[Workspace, frozenset[str]]:
    """The workspace named in the URL, or the only one the token (or user) reaches."""
    if slug is None:
        reachable = list(workspaces_visible_to(user=user, token=token)[:2])
        if len(reachable) != 1:
            raise MlflowRefusal(
                400,
                "INVALID_PARAMETER_VALUE",
                "This token reaches "
                + ("no workspace" if not reachable else "several workspaces")
                + "; use http(s)://<host>/mlflow/w/<workspace-slug> as the tracking URI.",
                attr="workspace",
            )
        slug = reachable[0].slug
    try:
        return workspace_access(user=user, slug=slug, token=token)
    except Http404 as exc:
        raise not_found("workspace") from exc


def needed_permission(route: str, method: str) -> str:
    """The workspace permission a request needs: reading (GET and MLflow's POST searches) is
    the viewer's, every other write the developer's."""
    if method in ("GET", "HEAD", "OPTIONS") or (method == "POST" and route in READ_POSTS):
        return "view_workspace"
    return "develop_in_workspace"


def same_origin(request: HttpRequest) -> bool:
    """A browser's request from the platform's own pages (the session's stand-in for CSRF)."""
    origin = request.META.get("HTTP_ORIGIN")
    if origin is None:
        return request.META.get("HTTP_SEC_FETCH_SITE") == "same-origin"
    return origin == f"{request.scheme}://{request.get_host()}"


def json_args(request: HttpRequest, body: bytes) -> dict[str, Any]:
    """The request's fields, from the query string (MLflow's GETs) or the JSON body; a
    repeated query key becomes a list, as MLflow's handlers read it."""
    if request.method in ("GET", "HEAD", "DELETE") and not body:
        pairs = parse_qsl(request.META.get("QUERY_STRING", ""), keep_blank_values=True)
        args: dict[str, Any] = {}
        for key, value in pairs:
            if key in args:
                args[key] = [*(args[key] if isinstance(args[key], list) else [args[key]]), value]
            else:
                args[key] = value
        return args
    if not body:
        return {}
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise MlflowRefusal(400, "MALFORMED_REQUEST", "The body is not JSON.", attr="body") from exc
    if not isinstance(parsed, dict):
        raise MlflowRefusal(400, "MALFORMED_REQUEST", "The body must be a JSON object.")
    return parsed


def wsgi_environ(
    request: HttpRequest, script_name: str, path: str, query: str, stream: Any, length: int | None
) -> dict[str, Any]:
    """A WSGI environ for MLflow's app from the Django request: the mount point as
    ``SCRIPT_NAME``, the caller's credentials and any client-sent workspace header removed."""
    environ = {
        key: value
        for key, value in request.META.items()
        if key.startswith("HTTP_")
        and key not in ("HTTP_AUTHORIZATION", "HTTP_COOKIE", "HTTP_X_MLFLOW_WORKSPACE")
    }
    environ.update(
        {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": script_name,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": request.META.get("SERVER_NAME", "localhost"),
            "SERVER_PORT": str(request.META.get("SERVER_PORT", "80")),
            "SERVER_PROTOCOL": request.META.get("SERVER_PROTOCOL", "HTTP/1.1"),
            "REMOTE_ADDR": request.META.get("REMOTE_ADDR", ""),
            "CONTENT_TYPE": request.META.get("CONTENT_TYPE", ""),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": request.scheme,
            "wsgi.input": stream,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
    )
    if length is not None:
        environ["CONTENT_LENGTH"] = str(length)
    return environ


def call_app(app, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], Any]:
    """Call a WSGI app in this thread: its status code, headers and body iterable."""
    captured: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
        captured["status"], captured["headers"] = status, headers
        return lambda chunk: None

    body = app(environ, start_response)
    return int(captured["status"].split(" ", 1)[0]), captured["headers"], body


class BytesInput:
    """A request body already read (and perhaps rewritten), as ``wsgi.input``."""

    def __init__(self, data: bytes) -> None:
        import io

        self.stream = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes of the body (all of it by default)."""
        return self.stream.read(size)

    def readline(self, size: int = -1) -> bytes:
        """One line of the body, as WSGI's input must offer."""
        return self.stream.readline(size)


def proxy(request: HttpRequest, slug: str | None, rest: str) -> HttpResponseBase:
    """Authenticate, scope and forward one request to MLflow's server app."""
    script_name = "/mlflow" if slug is None else f"/mlflow/w/{slug}"
    user, token = authenticate(request)
    workspace, perms = resolve_workspace(user, token, slug)
    if not rest:
        return HttpResponseRedirect(f"{script_name}/")
    app = mlflow_app()
    method = request.method or "GET"
    route, values = route_of(app, rest, method)
    if route not in ROUTES:
        raise MlflowRefusal(
            404, "ENDPOINT_NOT_FOUND", f"{route} is not served through the platform."
        )
    if needed_permission(route, method) not in perms:
        raise MlflowRefusal(
            403, "PERMISSION_DENIED", "This needs the developer role in the workspace."
        )
    unsafe = request.method not in ("GET", "HEAD", "OPTIONS")
    if token is None and unsafe and not same_origin(request):
        raise MlflowRefusal(403, "PERMISSION_DENIED", "Cross-origin request refused.")
    namespace = Namespace(workspace=workspace)
    walk_ids(values, namespace)
    if "artifact_path" in values:
        namespace.check_artifact_path(values["artifact_path"])
    query = request.META.get("QUERY_STRING", "")
    if route in ARTIFACT_ROUTES and route != "/mlflow-artifacts/artifacts":
        # Uploads stream through unread (a model can be larger than any JSON body).
        length = request.META.get("CONTENT_LENGTH")
        environ = wsgi_environ(
            request, script_name, rest, query, request, int(length) if length else None
        )
        rewrite = False
    elif route in ("/", "/static-files/<path:path>", "/health", "/version"):
        environ = wsgi_environ(request, script_name, rest, query, BytesInput(b""), 0)
        rewrite = False
    else:
        body = request.body
        args = rewrite_request(route, json_args(request, body), namespace)
        if request.method in ("GET", "HEAD") or (request.method == "DELETE" and not body):
            query = urlencode(args, doseq=True)
            data = b""
        else:
            data = json.dumps(args).encode()
        environ = wsgi_environ(request, script_name, rest, query, BytesInput(data), len(data))
        if data:
            environ["CONTENT_TYPE"] = "application/json"
        rewrite = True
    status, headers, body_iter = call_app(app, environ)
    content_type = next((v for k, v in headers if k.lower() == "content-type"), "")
    if rewrite and status == 200 and "json" in content_type:
        try:
            raw = b"".join(body_iter)
        finally:
            getattr(body_iter, "close", lambda: None)()
        answer = rewrite_answer(json.loads(raw or b"{}"), namespace)
        response: HttpResponse = HttpResponse(json.dumps(answer), status=status)
        response["Content-Type"] = content_type
        return response
    streamed = StreamingHttpResponse(body_iter, status=status)
    for key, value in headers:
        if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
            streamed[key] = value
    return streamed


@csrf_exempt
def mlflow_endpoint(
    request: HttpRequest, rest: str = "", slug: str | None = None
) -> HttpResponseBase:
    """``/mlflow/<MLflow route>`` and ``/mlflow/w/<slug>/<MLflow route>``: MLflow's tracking
    server for the caller's workspace (see the module docstring for the isolation rules)."""
    rest = rest or ""
    anonymous_browser = (
        "HTTP_AUTHORIZATION" not in request.META
        and not request.user.is_authenticated
        and request.method == "GET"
        and rest in ("", "/")
    )
    if anonymous_browser:
        return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
    try:
        return proxy(request, slug, rest)
    except MlflowRefusal as refusal:
        return refusal.response()
