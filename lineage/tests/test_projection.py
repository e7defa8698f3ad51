"""The projection: incremental == rebuilt, rules per verb, holes in the ids, the commit hook."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from lineage import projection
from lineage.models import Cursor, Edge, EdgeType, Node
from lineage.projection import project, rebuild, register_rule
from lineage.reach import reach_bulk_rebuild
from lineage.tests.helpers import build_scene, record, snapshot
from workspaces.events import Ref
from workspaces.models import Event, Role

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


def edge_keys(workspace, *, active=True):
    return {
        (e.src.key, e.type, e.dst.key)
        for e in Edge.objects.for_workspace(workspace)
        .filter(active=active)
        .select_related("src", "dst")
    }


def test_scene_links_feature_group_to_experiment(workspace, members):
    scene = build_scene(workspace, members[Role.DEVELOPER])
    project()
    users = f"feature_group:{scene['users'].pk}"
    dataset = f"dataset:{scene['dataset'].pk}"
    edges = edge_keys(workspace)
    assert (users, "consumes", dataset) in edges
    assert (dataset, "consumes", f"training_job:{scene['job']}") in edges
    assert (f"training_job:{scene['job']}", "produces", f"model_version:{scene['model']}") in edges
    assert (
        f"model_version:{scene['model']}",
        "deployed_as",
        f"deployment:{scene['deployment']}",
    ) in edges
    assert (
        f"deployment:{scene['deployment']}",
        "tested_in",
        f"experiment:{scene['experiment']}",
    ) in edges
    # Feature-level use: the group's features consumed by the dataset.
    assert (f"feature:{scene['users'].pk}:age", "consumes", dataset) in edges
    job = Node.objects.for_workspace(workspace).get(kind="training_job", object_id=scene["job"])
    assert job.status == "succeeded"
    assert job.owner_name == members[Role.DEVELOPER].username


def test_rebuild_gives_exactly_the_incremental_graph(workspace, other_workspace, members):
    actor = members[Role.DEVELOPER]
    # Incrementally, in several uneven steps while the platform works.
    scene = build_scene(workspace, actor)
    project(limit=7)
    project(limit=1)
    from features import registry

    registry.consumer_release(
        actor=actor, workspace=workspace, kind="deployment", object_id=scene["deployment"]
    )
    record(
        workspace,
        "serving.deployment.retired",
        [Ref("deployment", scene["deployment"], "ctr-prod")],
    )
    record(
        workspace,
        "scheduler.job.over_quota",
        [Ref("training_job", scene["job"], "job")],
        payload={"reason": "gpus 2 > quota 1"},
    )
    project()
    record(other_workspace, "dataset.created", [Ref("dataset", 1, "x")])
    project()
    incremental = snapshot()
    assert incremental["edges"] and incremental["usage"] and incremental["audit"]
    assert any(not e[3] for e in incremental["edges"]), "the released use is kept, ended"

    assert incremental["reach"]
    assert rebuild() == Event.objects.unscoped().count()
    assert snapshot() == incremental

    # The precomputed impact equals a from-scratch walk over the live edges.
    for ws in (workspace, other_workspace):
        reach_bulk_rebuild(ws.pk)
    assert snapshot()["reach"] == incremental["reach"]

    # The management command does the same.
    call_command("lineage_rebuild", stdout=io.StringIO())
    assert snapshot() == incremental


def test_projection_resumes_from_its_cursor(workspace):
    record(workspace, "dataset.created", [Ref("dataset", 1, "d1")])
    assert project() >= 1
    assert project() == 0
    last = Cursor.objects.get(name=projection.CURSOR).last_event_id
    record(workspace, "dataset.created", [Ref("dataset", 2, "d2")])
    assert project() == 1
    assert Cursor.objects.get(name=projection.CURSOR).last_event_id > last


def test_a_young_hole_in_the_ids_waits_and_an_old_one_is_passed(workspace):
    project()
    last = Event.objects.unscoped().order_by("-id").first().pk
    # Event last + 1 is still committing somewhere (or rolled back): only last + 2 is visible.
    with transaction.atomic():
        event = Event(id=last + 2, workspace=workspace, verb="dataset.created", actor_name="x")
        event.save()
        event.refs.model(event=event, kind="dataset", object_id="2", label="kept").save()
    # The hole may be a transaction still committing: a fresh event after it waits.
    assert project(gap_wait=60) == 0
    assert not Node.objects.for_workspace(workspace).filter(object_id="2").exists()
    # Once the event after the hole is older than the wait, the cursor passes the hole (and
    # remembers it: test_late_events).
    assert project(gap_wait=0) == 1
    assert Node.objects.for_workspace(workspace).filter(object_id="2").exists()


def test_a_registered_rule_extends_the_graph_for_a_new_verb(workspace):
    calls = []

    @register_rule("notebook.*.exported")
    def notebook_rule(event, refs, p):
        calls.append(event.verb)

    try:
        record(
            workspace,
            "notebook.report.exported",
            [
                Ref("model_version", 5, "m5", role="input"),
                Ref("report", 9, "weekly report", role="output"),
            ],
        )
        project()
    finally:
        projection._RULES[:] = [r for r in projection._RULES if r.rule is not notebook_rule]
    assert calls == ["notebook.report.exported"]
    # The default rule still linked the new kind, typed from the kinds.
    assert edge_keys(workspace) == {("model_version:5", EdgeType.DERIVED_FROM, "report:9")}


def test_edge_types_can_be_registered_per_pair_of_kinds(workspace):
    projection.register_edge_type("model_version", "report", EdgeType.RELATED)
    try:
        record(
            workspace,
            "notebook.report.exported",
            [Ref("model_version", 5, "m5", role="input"), Ref("report", 9, "r", role="output")],
        )
        project()
    finally:
        del projection._EDGE_TYPES[("model_version", "report")]
    assert edge_keys(workspace) == {("model_version:5", EdgeType.RELATED, "report:9")}


def test_retired_objects_are_not_live(workspace):
    record(workspace, "serving.model_version.registered", [Ref("model_version", 3, "m3")])
    record(workspace, "serving.model_version.retired", [Ref("model_version", 3, "m3")])
    project()
    node = Node.objects.for_workspace(workspace).get(kind="model_version", object_id="3")
    assert (node.live, node.status) == (False, "retired")


def test_platform_kinds_stay_out_of_the_graph(workspace, members):
    project()
    assert not Node.objects.for_workspace(workspace).filter(kind__in=["workspace", "user"]).exists()


def test_each_transaction_queues_the_projection_once_after_commit(workspace):
    connection = transaction.get_connection()

    def queued() -> int:
        return sum(
            func is projection._enqueue_projection for _, func, _ in connection.run_on_commit
        )

    with transaction.atomic():
        record(workspace, "dataset.created", [Ref("dataset", 1, "a")])
        record(workspace, "dataset.built", [Ref("dataset", 1, "a", role="output")])
        record(workspace, "dataset.built", [Ref("dataset", 1, "a", role="output")])
        assert queued() == 1


def test_events_keep_their_time_in_the_graph(workspace):
    event = record(workspace, "dataset.created", [Ref("dataset", 1, "a")])
    project()
    node = Node.objects.for_workspace(workspace).get(kind="dataset")
    assert node.first_seen_at == event.created_at
    assert abs(node.first_seen_at - timezone.now()) < timedelta(minutes=1)


def test_demo_step_projects_what_the_earlier_steps_recorded(workspace):
    from workspaces.demo import demo_steps

    step = next(s for s in demo_steps() if s.name == "lineage")
    assert step.order == 50
    record(workspace, "dataset.created", [Ref("dataset", 1, "demo")])
    out = io.StringIO()
    step.run("http://127.0.0.1:8000", out)
    assert "lineage: projected" in out.getvalue()
    assert Node.objects.for_workspace(workspace).filter(kind="dataset").exists()


def test_release_and_rollback_move_the_deployment_between_versions(workspace):
    def mv(pk, role):
        return Ref("model_version", pk, f"m{pk}", role=role)

    dep = Ref("deployment", 1, "prod", role="output")
    record(workspace, "serving.deployment.created", [mv(1, "input"), dep])
    record(workspace, "serving.deployment.released", [mv(2, "input"), dep, mv(1, "related")])
    project()
    assert edge_keys(workspace) == {("model_version:2", "deployed_as", "deployment:1")}
    assert edge_keys(workspace, active=False) == {
        ("model_version:1", "deployed_as", "deployment:1")
    }
    record(
        workspace,
        "serving.deployment.rolled_back",
        [Ref("deployment", 1, "prod"), mv(2, "related"), mv(1, "related")],
    )
    project()
    assert edge_keys(workspace) == {("model_version:1", "deployed_as", "deployment:1")}
    before = snapshot()
    rebuild()
    assert snapshot() == before
