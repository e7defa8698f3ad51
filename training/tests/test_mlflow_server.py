"""The platform as an MLflow tracking server (training.mlflow_server).

The stock ``mlflow`` client runs in a process of its own against the live server over HTTP, with
MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN as a user sets them; the narrower checks (roles,
refusals, the UI) go through Django's test client to the same mounted MLflow app.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from training import mlflow_server
from workspaces.models import Role
from workspaces.testing.factories import TEST_PASSWORD, make_member, make_workspace, token_for

SCRIPT = Path(__file__).with_name("mlflow_stock_client.py")
API = "/api/2.0/mlflow"


def stock_client(base_url: str, token: str, *args: str) -> dict:
    """Run the stock client script; its last line is a JSON report."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MLFLOW_", "DJANGO_", "DATABASE_", "REDIS_"))
    }
    env.update(
        MLFLOW_TRACKING_URI=base_url,
        MLFLOW_TRACKING_TOKEN=token,
        NO_PROXY="127.0.0.1,localhost",
        GIT_PYTHON_REFRESH="quiet",
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def unique(prefix: str) -> str:
    """A slug of its own: the MLflow store may outlive the test database (a PostgreSQL one)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.mark.django_db(transaction=True)
def test_stock_client_logs_a_run_and_a_model_and_another_workspace_sees_none_of_it(
    live_server, tmp_path
):
    acme, rival = make_workspace(slug=unique("acme")), make_workspace(slug=unique("rival"))
    ours = token_for(make_member(acme, Role.DEVELOPER), workspaces=[acme])
    theirs = token_for(make_member(rival, Role.DEVELOPER), workspaces=[rival])

    logged = stock_client(f"{live_server.url}/mlflow", ours, "log", str(tmp_path))
    run_id = logged["run_id"]
    assert logged["searched"] == [run_id]
    assert logged["params"] == {"learning_rate": "0.1"}
    assert logged["metrics"] == [[1, 0.75]]
    assert "note.txt" in logged["artifacts"] and "model" not in logged["artifacts"]
    assert logged["downloaded"] == "logged through the platform"
    assert logged["artifact_uri"] == f"mlflow-artifacts:/{acme.slug}/{run_id}/artifacts"
    assert logged["registered"] == ["1"]
    assert logged["experiments"] == ["Default", "ctr-study"]
    assert logged["named_experiment"][0] == "ctr-study"
    assert logged["predictions"] == logged["expected"]
    # Stored in the platform's own tracking store and artifact root, in the workspace's names.
    store = mlflow_server.tracking_store()
    run = store.get_run(run_id)
    assert store.get_experiment(run.info.experiment_id).name == f"rankops/{acme.slug}"
    assert (
        Path(settings.MLFLOW_ARTIFACT_ROOT) / acme.slug / run_id / "artifacts" / "note.txt"
    ).is_file()
    named = store.get_experiment(logged["named_experiment"][1])
    assert named.name == f"rankops/{acme.slug}/ctr-study"
    registry = mlflow_server.server_state["handlers"]._get_model_registry_store()
    assert registry.get_registered_model(f"{acme.slug}.ranker").name == f"{acme.slug}.ranker"

    seen = stock_client(f"{live_server.url}/mlflow", theirs, "look", run_id)
    assert seen["get_run"] == ["RESOURCE_DOES_NOT_EXIST", 404]
    assert seen["log_param"] == ["RESOURCE_DOES_NOT_EXIST", 404]
    assert seen["default_runs"] == []
    assert seen["experiments"] == ["Default"]
    assert seen["models"] == []
    assert seen["get_model"] == ["RESOURCE_DOES_NOT_EXIST", 404]
    assert "intruder" not in store.get_run(run_id).data.params


@pytest.mark.django_db
def test_a_training_jobs_run_is_the_workspaces_default_experiment(client):
    """The agent logs to ``rankops/<slug>`` in the same store: its runs show under Default."""
    acme = make_workspace(slug=unique("jobs"))
    token = token_for(make_member(acme, Role.VIEWER), workspaces=[acme])
    store = mlflow_server.tracking_store()
    location = (Path(settings.MLFLOW_ARTIFACT_ROOT) / acme.slug).as_uri()
    experiment_id = store.create_experiment(f"rankops/{acme.slug}", artifact_location=location)
    run = store.create_run(experiment_id, "agent", 0, [], "job-1")

    got = client.get(f"/mlflow{API}/runs/get", {"run_id": run.info.run_id}, **bearer(token))
    assert got.status_code == 200, got.content
    assert got.json()["run"]["info"]["artifact_uri"] == (
        f"mlflow-artifacts:/{acme.slug}/{run.info.run_id}/artifacts"
    )
    default = client.get(f"/mlflow{API}/experiments/get", {"experiment_id": "0"}, **bearer(token))
    assert default.json()["experiment"]["name"] == "Default"
    assert default.json()["experiment"]["experiment_id"] == str(experiment_id)
    assert default.json()["experiment"]["artifact_location"] == f"mlflow-artifacts:/{acme.slug}"


@pytest.mark.django_db
def test_roles_tokens_and_workspace_choice(client):
    acme, other = make_workspace(slug=unique("roles")), make_workspace(slug=unique("other"))
    viewer = token_for(make_member(acme, Role.VIEWER), workspaces=[acme])
    create = {"experiment_id": "0", "start_time": 1}

    refused = client.post(
        f"/mlflow{API}/runs/create", create, content_type="application/json", **bearer(viewer)
    )
    assert refused.status_code == 403
    assert refused.json()["error_code"] == "PERMISSION_DENIED"
    assert refused.json()["detail"] == refused.json()["message"]
    # Searches are reads even as POST.
    searched = client.post(
        f"/mlflow{API}/runs/search",
        {"experiment_ids": ["0"]},
        content_type="application/json",
        **bearer(viewer),
    )
    assert searched.status_code == 200, searched.content

    nobody = client.get(f"/mlflow{API}/experiments/search")
    assert nobody.status_code == 401 and nobody.json()["error_code"] == "UNAUTHENTICATED"
    wrong = client.get(f"/mlflow{API}/experiments/search", **bearer("rk_not-a-token"))
    assert wrong.status_code == 401

    # A user in two workspaces names the workspace in the tracking URI.
    both = make_member(acme, Role.DEVELOPER)
    from workspaces import services

    services.membership_grant(actor=None, workspace=other, user=both, role=Role.DEVELOPER)
    broad = token_for(both)
    ambiguous = client.get(f"/mlflow{API}/experiments/search", **bearer(broad))
    assert ambiguous.status_code == 400 and ambiguous.json()["attr"] == "workspace"
    named = client.post(
        f"/mlflow/w/{other.slug}{API}/runs/create",
        create,
        content_type="application/json",
        **bearer(broad),
    )
    assert named.status_code == 200, named.content
    run_id = named.json()["run"]["info"]["run_id"]
    # ... and the run is the other workspace's.
    in_acme = client.get(
        f"/mlflow/w/{acme.slug}{API}/runs/get", {"run_id": run_id}, **bearer(broad)
    )
    assert in_acme.status_code == 404
    # A workspace outside the token's reach is missing, like one that does not exist.
    outside = client.get(f"/mlflow/w/{other.slug}{API}/experiments/search", **bearer(viewer))
    assert outside.status_code == 404


@pytest.mark.django_db
def test_refusals_name_the_field_and_unchecked_services_stay_closed(client):
    acme = make_workspace(slug=unique("refuse"))
    token = token_for(make_member(acme, Role.DEVELOPER), workspaces=[acme])

    located = client.post(
        f"/mlflow{API}/experiments/create",
        {"name": "mine", "artifact_location": "file:///tmp/elsewhere"},
        content_type="application/json",
        **bearer(token),
    )
    assert located.status_code == 400 and located.json()["attr"] == "artifact_location"
    default = client.post(
        f"/mlflow{API}/experiments/create",
        {"name": "Default"},
        content_type="application/json",
        **bearer(token),
    )
    assert default.status_code == 400 and default.json()["attr"] == "name"
    promptlab = client.post(
        f"/mlflow{API}/runs/create-promptlab-run",
        {"experiment_id": "0"},
        content_type="application/json",
        **bearer(token),
    )
    assert promptlab.status_code == 404
    assert promptlab.json()["error_code"] == "ENDPOINT_NOT_FOUND"
    traces = client.get("/mlflow/api/3.0/mlflow/traces/search", **bearer(token))
    assert traces.status_code == 404
    elsewhere = client.get(
        "/mlflow/api/2.0/mlflow-artifacts/artifacts/other-ws/run/artifacts/x.txt",
        **bearer(token),
    )
    assert elsewhere.status_code == 404
    climbing = client.get(
        "/mlflow/api/2.0/mlflow-artifacts/artifacts",
        {"path": f"{acme.slug}/../other-ws"},
        **bearer(token),
    )
    assert climbing.status_code == 404
    source = client.post(
        f"/mlflow{API}/model-versions/create",
        {"name": "m", "source": "/etc"},
        content_type="application/json",
        **bearer(token),
    )
    assert source.status_code == 400 and source.json()["attr"] == "source"
    default_id = client.get(
        f"/mlflow{API}/experiments/get-by-name", {"experiment_name": "Default"}, **bearer(token)
    ).json()["experiment"]["experiment_id"]
    kept = client.post(
        f"/mlflow{API}/experiments/delete",
        {"experiment_id": default_id},
        content_type="application/json",
        **bearer(token),
    )
    assert kept.status_code == 409 and kept.json()["attr"] == "experiment_id"
    # A run without an experiment lands in the workspace's Default, not MLflow's global one.
    homeless = client.post(
        f"/mlflow{API}/runs/create",
        {"start_time": 1},
        content_type="application/json",
        **bearer(token),
    )
    assert homeless.json()["run"]["info"]["experiment_id"] == default_id
    garbled = client.post(
        f"/mlflow{API}/runs/create", b"{not json", content_type="application/json", **bearer(token)
    )
    assert garbled.status_code == 400 and garbled.json()["error_code"] == "MALFORMED_REQUEST"


@pytest.mark.django_db
def test_the_ui_opens_for_a_signed_in_member_and_refuses_cross_origin_writes(client):
    acme = make_workspace(slug=unique("ui"))
    user = make_member(acme, Role.DEVELOPER)

    anonymous = client.get(f"/mlflow/w/{acme.slug}/")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]
    assert client.login(username=user.username, password=TEST_PASSWORD)
    page = client.get(f"/mlflow/w/{acme.slug}/")
    assert page.status_code == 200
    assert b"static-files/static/js/main" in b"".join(page.streaming_content)
    listed = client.get(
        f"/mlflow/w/{acme.slug}/ajax-api/2.0/mlflow/experiments/search", {"max_results": 10}
    )
    assert listed.status_code == 200, b"".join(listed.streaming_content)
    assert [e["name"] for e in listed.json()["experiments"]] == ["Default"]
    forged = client.post(
        f"/mlflow/w/{acme.slug}/ajax-api/2.0/mlflow/experiments/create",
        {"name": "x"},
        content_type="application/json",
        HTTP_ORIGIN="https://evil.example",
    )
    assert forged.status_code == 403
    own = client.post(
        f"/mlflow/w/{acme.slug}/ajax-api/2.0/mlflow/experiments/create",
        {"name": "x"},
        content_type="application/json",
        HTTP_ORIGIN="http://testserver",
    )
    assert own.status_code == 200, own.content


@pytest.mark.django_db
def test_graphql_reads_only_the_workspaces_runs(client):
    """The UI's run page asks through GraphQL; the same ownership rules hold there."""
    acme, rival = make_workspace(slug=unique("gql")), make_workspace(slug=unique("gql-rival"))
    token = token_for(make_member(acme, Role.VIEWER), workspaces=[acme])
    store = mlflow_server.tracking_store()
    ours = store.create_run(
        mlflow_server.Namespace(workspace=acme).default_experiment_id(), "u", 0, [], "ours"
    )
    theirs = store.create_run(
        mlflow_server.Namespace(workspace=rival).default_experiment_id(), "u", 0, [], "theirs"
    )
    query = (
        "query run($id: String) { mlflowGetRun(input: {runId: $id}) "
        "{ run { info { runName artifactUri } experiment { name } } } }"
    )

    def ask(body):
        return client.post(
            "/mlflow/graphql", body, content_type="application/json", **bearer(token)
        )

    got = ask({"query": query, "variables": {"id": ours.info.run_id}})
    assert got.status_code == 200, got.content
    run = got.json()["data"]["mlflowGetRun"]["run"]
    assert run["info"]["runName"] == "ours" and run["experiment"]["name"] == "Default"
    assert run["info"]["artifactUri"].startswith(f"mlflow-artifacts:/{acme.slug}/")
    assert ask({"query": query, "variables": {"id": theirs.info.run_id}}).status_code == 404
    inline = query.replace("($id: String)", "").replace("$id", f'"{theirs.info.run_id}"')
    assert ask({"query": inline}).status_code == 404
    versions = '{ mlflowSearchModelVersions(input: {filter: ""}) { modelVersions { name } } }'
    assert ask({"query": versions}).status_code == 404
    assert ask({"query": "{ mlflowGetRun("}).status_code == 400


def test_mounting_the_server_leaves_the_environment_and_the_registry_uri_as_they_were(
    monkeypatch,
):
    """MLflow's server points the process-wide URIs (and MLFLOW_*_URI, which child processes
    inherit) at the backend store when it opens its stores; the mount puts the variables and the
    registry URI back, so a client built afterwards without a registry URI still registers where
    its tracking URI says. The tracking URI names the backend store in memory: the registry
    store's own lookups of logged models read it (a process that had never set it answered the
    stock client's ``register_model("models:/m-...")`` with a 500)."""
    import mlflow
    from mlflow.server import handlers
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    monkeypatch.setattr(handlers, "_tracking_store", None)
    monkeypatch.setattr(handlers, "_model_registry_store", None)
    monkeypatch.setattr(mlflow_server, "server_state", {})
    monkeypatch.setattr(registry_utils, "_registry_uri", None)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert mlflow.get_tracking_uri() != settings.MLFLOW_TRACKING_URI  # MLflow's own default

    mlflow_server.mlflow_app()
    mlflow_server.tracking_store()

    assert "MLFLOW_REGISTRY_URI" not in os.environ and "MLFLOW_TRACKING_URI" not in os.environ
    assert mlflow.get_tracking_uri() == settings.MLFLOW_TRACKING_URI
    assert registry_utils._registry_uri is None
    client = mlflow.MlflowClient(tracking_uri="http://127.0.0.1:9/mlflow")
    assert client._registry_uri == "http://127.0.0.1:9/mlflow"
