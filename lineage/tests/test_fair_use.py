"""OpenLineage intake under fair use: bad times and run ids refused, datasets of another
workspace refused, events bigger than the workspace's policy refused (413) and large allowed
events applied in bounded slices that give the same graph as one pass."""

from __future__ import annotations

import uuid

import pytest

from lineage.models import Cursor, Edge, Node
from lineage.openlineage import openlineage_event_record
from lineage.projection import CURSOR, _project_batch, project, rebuild
from workspaces.models import Event, EventRef, Role, WorkspacePolicy
from workspaces.services import membership_grant
from workspaces.testing.factories import make_member, make_workspace

pytestmark = pytest.mark.django_db
URL = "/api/v1/lineage"


def body(namespace: str, *, inputs=(), outputs=("out",), **overrides) -> dict:
    event = {
        "eventType": "COMPLETE",
        "eventTime": "2026-11-01T00:00:00Z",
        "run": {"runId": str(uuid.uuid4())},
        "job": {"namespace": namespace, "name": "spark.job"},
        "producer": "https://example.com/spark",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "inputs": [
            i if isinstance(i, dict) else {"namespace": namespace, "name": i} for i in inputs
        ],
        "outputs": [
            o if isinstance(o, dict) else {"namespace": namespace, "name": o} for o in outputs
        ],
    }
    event.update(overrides)
    return event


@pytest.fixture
def developer(workspace, members, client_for):
    return client_for(members[Role.DEVELOPER])


def _refused(response, status: int, attr: str | None) -> dict:
    assert response.status_code == status, response.content[:300]
    error = response.json()
    assert set(error) >= {"type", "code", "detail", "attr"}
    if attr is not None:
        assert error["attr"] == attr, error
    return error


@pytest.mark.parametrize(
    "event_time",
    [
        "0000-01-01",
        "0000-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "2026-11-01T00:00:00",  # no time zone
        "9999-01-01T00:00:00Z",
        "yesterday",
        12,
        None,
    ],
)
def test_an_event_time_outside_1970_to_now_or_without_zone_is_refused(
    developer, workspace, event_time
):
    before = Event.objects.unscoped().count()
    response = developer.post(URL, body(workspace.slug, eventTime=event_time), format="json")
    _refused(response, 400, "eventTime")
    assert Event.objects.unscoped().count() == before


@pytest.mark.parametrize(
    ("run", "attr"),
    [
        ({"runId": "run-1"}, "run.runId"),
        ({"runId": "0" * 100}, "run.runId"),
        ({"runId": 7}, "run.runId"),
        ({}, "run.runId"),
        ("not an object", "run"),
    ],
)
def test_a_run_id_that_is_no_uuid_is_refused(developer, workspace, run, attr):
    before = Event.objects.unscoped().count()
    response = developer.post(URL, body(workspace.slug, run=run), format="json")
    _refused(response, 400, attr)
    assert Event.objects.unscoped().count() == before


def test_a_run_event_without_run_is_refused(developer, workspace):
    event = body(workspace.slug)
    del event["run"]
    _refused(developer.post(URL, event, format="json"), 400, "run")


def test_a_valid_event_keeps_its_time_and_run(developer, workspace):
    run_id = str(uuid.uuid4())
    response = developer.post(
        URL,
        body(workspace.slug, eventTime="2026-11-01T02:00:00+02:00", run={"runId": run_id}),
        format="json",
    )
    assert response.status_code == 201, response.content
    event = Event.objects.for_workspace(workspace).get(pk=response.json()["event"])
    assert event.payload["run_id"] == run_id
    assert event.payload["event_time"] == "2026-11-01T02:00:00+02:00"


@pytest.mark.parametrize("prefix", ["", "rankops/"])
@pytest.mark.parametrize("key", ["inputs", "outputs"])
def test_datasets_in_another_workspaces_namespace_answer_404(
    developer, workspace, other_workspace, prefix, key
):
    foreign = {"namespace": f"{prefix}{other_workspace.slug}", "name": "user_stats"}
    before = Event.objects.unscoped().count()
    response = developer.post(URL, body(workspace.slug, **{key: [foreign]}), format="json")
    _refused(response, 404, None)
    assert Event.objects.unscoped().count() == before


def test_a_member_of_both_workspaces_is_refused_too(workspace, other_workspace, client_for):
    both = make_member(workspace, Role.DEVELOPER)
    membership_grant(actor=None, workspace=other_workspace, user=both, role=Role.DEVELOPER)
    foreign = {"namespace": other_workspace.slug, "name": "user_stats"}
    response = client_for(both).post(URL, body(workspace.slug, outputs=[foreign]), format="json")
    _refused(response, 404, None)


def test_external_and_own_namespaces_are_accepted(developer, workspace):
    external = {"namespace": "s3://warehouse", "name": "raw/clicks"}
    response = developer.post(
        URL, body(workspace.slug, inputs=[external], outputs=["user_stats"]), format="json"
    )
    assert response.status_code == 201, response.content


def test_an_event_with_more_datasets_than_the_policy_allows_answers_413(developer, workspace):
    inputs = [f"t{i}" for i in range(50_000)]
    before = (Event.objects.unscoped().count(), EventRef.objects.count())
    response = developer.post(URL, body(workspace.slug, inputs=inputs), format="json")
    error = _refused(response, 413, None)
    assert error["type"] == "too_large"
    assert "inputs+outputs" in error["detail"] and "max_lineage_datasets" in error["detail"]
    assert (Event.objects.unscoped().count(), EventRef.objects.count()) == before


def test_the_limit_is_the_workspaces_own(developer, workspace):
    WorkspacePolicy.objects.create(workspace=workspace, max_lineage_datasets=3)
    refused = developer.post(URL, body(workspace.slug, inputs=["a", "b", "c"]), format="json")
    _refused(refused, 413, None)
    accepted = developer.post(URL, body(workspace.slug, inputs=["a", "b"]), format="json")
    assert accepted.status_code == 201


def _big_event(workspace, n: int) -> Event:
    parsed = {
        "event_type": "COMPLETE",
        "event_time": "2026-11-01T00:00:00+00:00",
        "run_id": str(uuid.uuid4()),
        "job": (workspace.slug, "spark.wide"),
        "inputs": [(workspace.slug, f"in{i}") for i in range(n)],
        "outputs": [(workspace.slug, "out")],
        "producer": "",
    }
    return openlineage_event_record(actor=None, workspace=workspace, parsed=parsed)


def _graph(workspace) -> set:
    return {
        (e.src.kind, e.src.label, e.dst.kind, e.dst.label, e.type)
        for e in Edge.objects.for_workspace(workspace).select_related("src", "dst")
    }


def test_a_large_event_is_applied_in_slices_with_the_same_graph(workspace, settings):
    settings.LINEAGE_REFS_PER_SLICE = 40
    project()
    event = _big_event(workspace, 100)
    after = make_workspace()
    follower = _big_event(after, 1)  # a later event waits for the large one

    assert _project_batch(2000, 0.0, False) == (0, True)
    cursor = Cursor.objects.get(name=CURSOR)
    assert (cursor.partial_event_id, cursor.partial_refs_done) == (event.pk, 40)
    # The job and the first 40 datasets, nothing of the following event.
    assert Node.objects.for_workspace(workspace).filter(kind="external_dataset").count() == 40
    assert not Node.objects.for_workspace(after).exists()

    assert _project_batch(2000, 0.0, False) == (0, True)
    assert _project_batch(2000, 0.0, False) == (1, True)  # 40 + 40 + the last 21 refs
    cursor.refresh_from_db()
    assert (cursor.last_event_id, cursor.partial_event_id) == (event.pk, 0)
    project()
    assert Cursor.objects.get(name=CURSOR).last_event_id == follower.pk
    sliced = _graph(workspace)
    assert len(sliced) == 101  # 100 inputs consumed by the job, which produces one output

    settings.LINEAGE_REFS_PER_SLICE = 100_000
    rebuild()
    assert _graph(workspace) == sliced
    assert Node.objects.for_workspace(after).count() == 3  # its job, input and output


@pytest.fixture
def eager_celery():
    from config.celery import app

    before = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = before


def test_the_task_works_one_budget_then_queues_itself_for_the_rest(
    workspace, settings, eager_celery
):
    from django.core.cache import cache

    from lineage.conf import setting
    from lineage.tasks import project_events, queued_key

    settings.LINEAGE_REFS_PER_SLICE = 40
    settings.LINEAGE_TASK_BUDGET_SECONDS = 0  # one batch or slice per run
    project()
    event = _big_event(workspace, 100)
    cache.delete(queued_key(setting("LINEAGE_QUEUE")))
    runs = []
    original = project_events.run

    def counted():
        runs.append(Cursor.objects.get(name=CURSOR).partial_refs_done)
        return original()

    project_events.run = counted
    try:
        project_events.delay()
    finally:
        project_events.run = original
    # Three slices, each its own run, and a last run that finds nothing left, ending the chain.
    assert runs == [0, 40, 80, 0]
    assert Cursor.objects.get(name=CURSOR).last_event_id == event.pk
    assert len(_graph(workspace)) == 101


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_events_keeps_one_projection_run_in_the_queue(settings):
    from config.celery import app
    from lineage.tests.helpers import record
    from workspaces.events import Ref

    queue = f"test-{uuid.uuid4().hex[:12]}"  # no worker reads it
    settings.LINEAGE_QUEUE = queue
    workspace = make_workspace()
    for index in range(5):  # five transactions, each queueing the projection after commit
        record(workspace, "serving.deployment.created", [Ref("deployment", index, "d")])
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        try:
            assert channel.queue_declare(queue=queue, passive=True).message_count == 1
        finally:
            channel.queue_purge(queue)


def test_a_rebuild_in_the_middle_of_a_large_event_starts_from_scratch(workspace, settings):
    settings.LINEAGE_REFS_PER_SLICE = 40
    project()
    event = _big_event(workspace, 100)
    assert _project_batch(2000, 0.0, False) == (0, True)
    assert Cursor.objects.get(name=CURSOR).partial_event_id == event.pk
    rebuild()
    cursor = Cursor.objects.get(name=CURSOR)
    assert (cursor.last_event_id, cursor.partial_event_id) == (event.pk, 0)
    assert len(_graph(workspace)) == 101
