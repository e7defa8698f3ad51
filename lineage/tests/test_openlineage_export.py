"""OpenLineage export of every job kind, checked against the OpenLineage JSON schema: the spec
and the facets the export writes are vendored in ``lineage/openlineage_spec/`` (see its NOTICE),
and each sent event validates against ``OpenLineage.json`` and each of its facets against its
facet's schema.
Intake and export join on one graph: a feature group that an external job's dataset feeds is
exported under that dataset's namespace and name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from lineage.openlineage import CONSUMER
from lineage.projection import project
from lineage.tests.helpers import build_scene, record
from workspaces.events import Ref
from workspaces.models import Role
from workspaces.outbox import consume
from workspaces.testing.factories import make_member, make_workspace

SPEC = Path(__file__).parents[1] / "openlineage_spec"
SCHEMAS = {path.name: json.loads(path.read_text()) for path in SPEC.glob("*.json")}
REGISTRY = Registry().with_resources(
    (schema["$id"], Resource.from_contents(schema)) for schema in SCHEMAS.values()
)


def validate(schema: dict, instance: dict) -> None:
    """``instance`` against ``schema``, whose references resolve to the vendored files only."""
    validator = Draft202012Validator(
        schema,
        registry=REGISTRY,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def airflow_wrote_users(workspace) -> None:
    """An Airflow job (namespace "default", mapped to the workspace) writes the "users" table,
    as intake records it."""
    record(
        workspace,
        "lineage.openlineage.complete",
        [
            Ref("external_job", "x1", "default/airflow.build_users"),
            Ref("external_dataset", "e1", "default/users", role="output"),
        ],
    )


def facets_of(event: dict) -> list[dict]:
    found = [*event["run"].get("facets", {}).values(), *event["job"].get("facets", {}).values()]
    for dataset in [*event.get("inputs", []), *event.get("outputs", [])]:
        found += dataset.get("facets", {}).values()
        found += dataset.get("outputFacets", {}).values()
    return found


@pytest.mark.django_db
def test_every_exported_event_validates_and_names_the_datasets_intake_joins_on(
    workspace,
    settings,
    collector,
    django_capture_on_commit_callbacks,
):
    url, received = collector
    settings.OPENLINEAGE_URL = url
    settings.OPENLINEAGE_NAMESPACES = {"default": workspace.slug}
    actor = make_member(workspace, Role.MAINTAINER)
    airflow_wrote_users(workspace)
    scene = build_scene(workspace, actor)
    failed = Ref("training_job", 999, "job-999")
    record(workspace, "training.job.running", [failed], actor=actor)
    record(workspace, "training.job.failed", [failed], actor=actor, payload={"error": "OOM"})
    record(
        workspace,
        "feature_group.materialized",
        [Ref.to(scene["users"], role="output")],
        payload={"name": "users", "rows_written": 1},
    )
    with django_capture_on_commit_callbacks(execute=True):
        project()
    consume(CONSUMER)
    events = [body for _, _, body in received]
    namespace = f"rankops/{workspace.slug}"

    jobs = {(e["job"]["name"], e["eventType"]) for e in events}
    assert {
        (f"training_job/job-{scene['job']}", "START"),
        (f"training_job/job-{scene['job']}", "COMPLETE"),
        ("training_job/job-999", "FAIL"),
        ("deploy/ctr-prod", "COMPLETE"),
        ("materialize/users", "COMPLETE"),
    } <= jobs, jobs
    for event in events:
        validate(SCHEMAS["OpenLineage.json"], event)
        for facet in facets_of(event):  # each against the definition its _schemaURL names
            validate({"$ref": facet["_schemaURL"]}, facet)
        assert event["job"]["namespace"] == namespace
        kinds = {f["_schemaURL"].split("#")[0].rsplit("/", 1)[-1] for f in facets_of(event)}
        assert {"JobTypeJobFacet.json", "OwnershipJobFacet.json"} <= kinds

    by_job = {(e["job"]["name"], e["eventType"]): e for e in events}
    # The failed job says why; its type and owner are on every job.
    fail = by_job[("training_job/job-999", "FAIL")]
    assert fail["run"]["facets"]["errorMessage"]["message"] == "OOM"
    owners = fail["job"]["facets"]["ownership"]["owners"]
    assert {"name": f"workspace:{workspace.slug}", "type": "TEAM"} in owners
    assert fail["job"]["facets"]["jobType"]["jobType"] == "TRAINING"
    # A job's states are one run.
    start = by_job[(f"training_job/job-{scene['job']}", "START")]
    done = by_job[(f"training_job/job-{scene['job']}", "COMPLETE")]
    assert start["run"]["runId"] == done["run"]["runId"]
    assert [(d["namespace"], d["name"]) for d in done["outputs"]] == [
        (namespace, "models/ctr-model v1")
    ]
    # The deployment read the model version and serves it.
    deploy = by_job[("deploy/ctr-prod", "COMPLETE")]
    assert [d["name"] for d in deploy["inputs"]] == ["models/ctr-model v1"]
    assert [d["name"] for d in deploy["outputs"]] == ["deployments/ctr-prod"]
    # The materialised "users" group is the Airflow job's dataset: one graph with intake's.
    materialized = by_job[("materialize/users", "COMPLETE")]
    (users,) = materialized["outputs"]
    assert (users["namespace"], users["name"]) == ("default", "users")
    assert users["outputFacets"]["outputStatistics"]["rowCount"] == 1
    columns = [f["name"] for f in users["facets"]["schema"]["fields"]]
    assert columns == ["age", "ctr"]
    # The sample build: the groups it joined in (users under intake's name), the sample out.
    build = by_job[("build/clicks v1", "COMPLETE")]
    read = {(d["namespace"], d["name"]) for d in build["inputs"]}
    assert read == {("default", "users"), (namespace, "impressions")}
    assert [d["name"] for d in build["outputs"]] == ["datasets/clicks v1"]
    assert build["job"]["facets"]["jobType"]["jobType"] == "SAMPLE_BUILD"


def test_the_vendored_spec_is_the_one_the_client_writes():
    from openlineage.client.event_v2 import RunEvent

    assert RunEvent._get_schema().split("#")[0] == SCHEMAS["OpenLineage.json"]["$id"]


@pytest.mark.django_db
def test_the_marquez_read_answers_the_graph_under_the_exported_names(
    workspace, settings, client_for, django_capture_on_commit_callbacks
):
    settings.OPENLINEAGE_NAMESPACES = {"default": workspace.slug}
    actor = make_member(workspace, Role.MAINTAINER)
    airflow_wrote_users(workspace)
    scene = build_scene(workspace, actor)
    with django_capture_on_commit_callbacks(execute=True):
        project()
    viewer = client_for(make_member(workspace, Role.VIEWER))
    answer = viewer.get("/api/v1/lineage", {"nodeId": "dataset:default:users", "depth": 6})
    assert answer.status_code == 200, answer.content
    graph = {node["id"]: node for node in answer.json()["graph"]}
    namespace = f"rankops/{workspace.slug}"
    airflow, users = "job:default:airflow.build_users", "dataset:default:users"
    job = f"job:{namespace}:training_job/job-{scene['job']}"
    sample = f"dataset:{namespace}:datasets/clicks v1"
    model = f"dataset:{namespace}:models/ctr-model v1"
    assert {airflow, users, sample, job, model} <= set(graph), sorted(graph)
    assert {"origin": airflow, "destination": users} in graph[users]["inEdges"]
    assert {"origin": users, "destination": sample} in graph[users]["outEdges"]
    assert {"origin": job, "destination": model} in graph[model]["inEdges"]
    assert graph[job]["type"] == "JOB" and graph[users]["data"]["namespace"] == "default"
    # The same graph from one of our own names, with a smaller depth.
    mine = viewer.get("/api/v1/lineage", {"nodeId": sample, "depth": 1})
    assert mine.status_code == 200
    assert {n["id"] for n in mine.json()["graph"]} >= {sample, users, job}

    # Bad input names its field; another workspace's member gets 404.
    for params, attr in (
        ({"nodeId": "table:x:y"}, "nodeId"),
        ({"nodeId": sample, "depth": 0}, "depth"),
        ({"nodeId": sample, "depth": "deep"}, "depth"),
    ):
        refused = viewer.get("/api/v1/lineage", params)
        assert refused.status_code == 400 and refused.json()["attr"] == attr, refused.json()
    missing = viewer.get("/api/v1/lineage", {"nodeId": f"dataset:{namespace}:nope"})
    assert missing.status_code == 404
    other = make_workspace(slug="ol-other")
    outsider = client_for(make_member(other, Role.MAINTAINER))
    assert outsider.get("/api/v1/lineage", {"nodeId": sample}).status_code == 404
