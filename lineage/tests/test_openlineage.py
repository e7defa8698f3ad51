"""OpenLineage in (the stock openlineage-python client against POST /api/v1/lineage) and out
(RunEvents for training jobs sent to OPENLINEAGE_URL)."""

from __future__ import annotations

import json

import pytest
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.serde import Serde
from openlineage.client.transport.http import ApiKeyTokenProvider, HttpConfig, HttpTransport
from openlineage.client.uuid import generate_new_uuid

from lineage.models import Node
from lineage.openlineage import CONSUMER
from lineage.projection import project
from lineage.queries import traverse
from lineage.tests.conftest import _Collector
from lineage.tests.helpers import group, record
from workspaces.events import Ref
from workspaces.models import ConsumerCursor, Event, Role
from workspaces.outbox import consume
from workspaces.testing.factories import make_member, make_workspace, token_for

URL = "/api/v1/lineage"


def ol_client(url: str, key: str) -> OpenLineageClient:
    config = HttpConfig(url=url, auth=ApiKeyTokenProvider({"apiKey": key}), retry={"total": 0})
    return OpenLineageClient(transport=HttpTransport(config))


def run_event(namespace: str, output: str, state=RunState.COMPLETE) -> RunEvent:
    return RunEvent(
        eventType=state,
        eventTime="2026-11-01T00:00:00Z",
        run=Run(runId=str(generate_new_uuid())),
        job=Job(namespace=namespace, name="spark.build_user_stats"),
        producer="https://github.com/apache/spark",
        inputs=[],
        outputs=[OutputDataset(namespace=namespace, name=output)],
    )


@pytest.mark.django_db(transaction=True)
def test_stock_client_event_appears_upstream_of_the_feature_group(live_server):
    workspace = make_workspace(slug="feed-ctr")
    developer = make_member(workspace, Role.DEVELOPER)
    users = group(workspace, "user_stats", ["ctr"], actor=developer)
    late_name = "late_group"

    client = ol_client(live_server.url, token_for(developer))
    client.emit(run_event("feed-ctr", "user_stats"))
    client.emit(run_event("feed-ctr", late_name))  # its group is registered afterwards
    late = group(workspace, late_name, ["x"], actor=developer)
    project()

    recorded = Event.objects.for_workspace(workspace).filter(verb="lineage.openlineage.complete")
    assert recorded.count() == 2
    assert recorded.first().actor_id == developer.pk
    for grp in (users, late):
        node = Node.objects.for_workspace(workspace).get(kind="feature_group", object_id=grp.pk)
        up = traverse(workspace=workspace, node=node, direction="upstream", depth=2)
        labels = {(n["kind"], n["label"]) for n in up["nodes"]}
        assert ("external_dataset", f"feed-ctr/{grp.name}") in labels
        assert ("external_job", "feed-ctr/spark.build_user_stats") in labels
        assert {
            "src": next(n["key"] for n in up["nodes"] if n["kind"] == "external_dataset"),
            "dst": node.key,
            "type": "derived_from",
            "active": True,
        } in up["edges"]


@pytest.mark.django_db
def test_intake_checks_role_namespace_and_body(workspace, members, client_for):
    viewer = client_for(members[Role.VIEWER])
    developer = client_for(members[Role.DEVELOPER])
    outsider = client_for(members["outsider"])
    body = json.loads(Serde.to_json(run_event(workspace.slug, "t")))
    before = Event.objects.unscoped().count()
    assert viewer.post(URL, body, format="json").status_code == 403
    ignored = outsider.post(URL, body, format="json")
    assert ignored.status_code == 200 and ignored.json()["status"] == "ignored"
    assert Event.objects.unscoped().count() == before
    bad = developer.post(URL, {"eventType": "COMPLETE", "job": {"name": 3}}, format="json")
    assert bad.status_code == 400 and bad.json()["attr"] == "job"
    bad = developer.post(URL, {**body, "outputs": [{"name": "no namespace"}]}, format="json")
    assert bad.status_code == 400 and bad.json()["attr"] == "outputs"
    bad = developer.post(URL, {**body, "eventType": [None, None]}, format="json")  # was a 500
    assert bad.status_code == 400 and bad.json()["attr"] == "eventType"
    assert developer.post(URL, body, format="json").status_code == 201
    assert client_for(None).post(URL, body, format="json").status_code == 401


@pytest.mark.django_db
def test_training_jobs_are_sent_as_run_events(
    workspace, settings, collector, django_capture_on_commit_callbacks
):
    url, received = collector
    settings.OPENLINEAGE_URL = url
    settings.OPENLINEAGE_API_KEY = "secret-key"
    job = Ref("training_job", 7, "job-7")
    data = Ref("dataset", 3, "clicks v1", role="input")
    record(workspace, "training.job.pending", [job, data])
    record(workspace, "training.job.running", [job, data])
    record(
        workspace,
        "serving.model_version.registered",
        [
            Ref("training_job", 7, "job-7", role="input"),
            Ref("model_version", 9, "m", role="output"),
        ],
    )
    record(workspace, "training.job.succeeded", [job, data])
    # The export is a consumer of the log: it waits for the projection (outputs come from it).
    consume(CONSUMER)
    assert received == []
    with django_capture_on_commit_callbacks(execute=True):
        project()
    consume(CONSUMER)
    assert consume(CONSUMER).applied == 0  # each state is sent once
    events = [body for _, _, body in received]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    assert {p for p, _, _ in received} == {"/api/v1/lineage"}
    assert {a for _, a, _ in received} == {"Bearer secret-key"}
    namespace = f"rankops/{workspace.slug}"
    job_of = events[0]["job"]
    assert (job_of["namespace"], job_of["name"]) == (namespace, "training_job/job-7")
    assert events[0]["run"]["runId"] == events[1]["run"]["runId"]
    assert [d["name"] for d in events[1]["inputs"]] == ["datasets/clicks v1"]
    assert [d["name"] for d in events[1]["outputs"]] == ["models/m"]


@pytest.mark.django_db
def test_nothing_is_sent_without_a_url(workspace, settings, django_capture_on_commit_callbacks):
    settings.OPENLINEAGE_URL = ""
    from lineage.openlineage import emit_run_events

    record(workspace, "training.job.running", [Ref("training_job", 7, "job-7")])
    with django_capture_on_commit_callbacks(execute=True):
        project()
    assert consume(CONSUMER).applied >= 1  # passed, nothing to send
    assert emit_run_events([("anything", [])]) == 0


@pytest.mark.django_db
def test_a_failing_lineage_server_gets_the_event_again_later(workspace, settings, collector):
    url, received = collector
    settings.OPENLINEAGE_URL = url
    _Collector.failures = [503]
    job = Ref("training_job", 8, "job-8")
    running = record(workspace, "training.job.running", [job])
    project()
    run = consume(CONSUMER)
    assert run.failed and received == []
    cursor = ConsumerCursor.objects.get(name=CONSUMER)
    assert cursor.last_event_id < running.pk and cursor.failures == 1
    run = consume(CONSUMER)
    assert not run.failed
    assert [body["eventType"] for _, _, body in received] == ["START"]
    assert ConsumerCursor.objects.get(name=CONSUMER).last_event_id >= running.pk


@pytest.mark.django_db(transaction=True)
def test_gzip_events_of_a_mapped_namespace_land_with_their_facets(live_server, settings):
    from openlineage.client.facet_v2 import schema_dataset
    from openlineage.client.transport.http import HttpCompression

    workspace = make_workspace(slug="feed-gz")
    developer = make_member(workspace, Role.DEVELOPER)
    users = group(workspace, "user_stats", ["ctr"], actor=developer)
    settings.OPENLINEAGE_NAMESPACES = {"default": workspace.slug}  # Airflow's namespace
    config = HttpConfig(
        url=live_server.url,
        auth=ApiKeyTokenProvider({"apiKey": token_for(developer)}),
        retry={"total": 0},
        compression=HttpCompression.GZIP,
    )
    client = OpenLineageClient(transport=HttpTransport(config))
    event = run_event("default", "user_stats")
    fields = [schema_dataset.SchemaDatasetFacetFields(name="ctr", type="double")]
    event.outputs[0].facets = {"schema": schema_dataset.SchemaDatasetFacet(fields=fields)}
    client.emit(event)
    late = group(workspace, "late_stats", ["x"], actor=developer)
    client.emit(run_event("default", "late_stats"))
    project()

    recorded = Event.objects.for_workspace(workspace).filter(verb="lineage.openlineage.complete")
    assert recorded.count() == 2
    kept = recorded.order_by("id").first().payload["facets"]["datasets"]["default/user_stats"]
    assert [(f["name"], f["type"]) for f in kept["schema"]["fields"]] == [("ctr", "double")]
    assert kept["schema"]["_producer"] and kept["schema"]["_schemaURL"]
    for grp in (users, late):
        node = Node.objects.for_workspace(workspace).get(kind="feature_group", object_id=grp.pk)
        up = traverse(workspace=workspace, node=node, direction="upstream", depth=2)
        assert ("external_dataset", f"default/{grp.name}") in {
            (n["kind"], n["label"]) for n in up["nodes"]
        }


@pytest.mark.django_db
def test_spec_invalid_and_broken_gzip_events_are_refused(workspace, members, client_for):
    import gzip

    developer = client_for(members[Role.DEVELOPER])
    body = json.loads(Serde.to_json(run_event(workspace.slug, "t")))
    for key in ("producer", "schemaURL"):
        refused = developer.post(URL, {**body, key: "not a uri"}, format="json")
        assert refused.status_code == 400 and refused.json()["attr"] == key
    # What only the whole spec catches (lineage/openlineage_spec): a facet that is no facet, a
    # run id that is no UUID, a dataset without a name; 400 naming where.
    job = {**body["job"], "facets": {"sql": "SELECT 1"}}
    refused = developer.post(URL, {**body, "job": job}, format="json")
    assert refused.status_code == 400 and refused.json()["attr"] == "job.facets.sql"
    assert "Not an OpenLineage event" in refused.json()["detail"]
    run = {**body["run"], "runId": "run-1"}
    refused = developer.post(URL, {**body, "run": run}, format="json")
    assert refused.status_code == 400 and refused.json()["attr"].startswith("run"), refused.json()
    nameless = {**body, "outputs": [{"namespace": workspace.slug}]}
    refused = developer.post(URL, nameless, format="json")
    assert refused.status_code == 400 and refused.json()["attr"].startswith("outputs")
    assert not Event.objects.for_workspace(workspace).filter(verb__startswith="lineage.").exists()
    broken = developer.generic(
        "POST", URL, b"not gzip", content_type="application/json", HTTP_CONTENT_ENCODING="gzip"
    )
    assert broken.status_code == 400
    packed = gzip.compress(json.dumps(body).encode())
    accepted = developer.generic(
        "POST", URL, packed, content_type="application/json", HTTP_CONTENT_ENCODING="gzip"
    )
    assert accepted.status_code == 201, accepted.content
