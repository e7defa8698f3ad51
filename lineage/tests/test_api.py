"""The lineage API: traversal, impact, features of a model, models of a feature, unused
features, cost roll-ups and pipeline speed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from lineage import cost
from lineage.models import Node
from lineage.projection import project
from lineage.tests.helpers import build_scene, record
from workspaces.events import Ref
from workspaces.models import Event, Role

pytestmark = pytest.mark.django_db
API = "/api/v1/workspaces/{ws}/lineage/"


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


@pytest.fixture
def scene(workspace, members):
    return build_scene(workspace, members[Role.DEVELOPER])


@pytest.fixture
def viewer(members, client_for):
    return client_for(members[Role.VIEWER])


def get(client, workspace, path="", **params):
    response = client.get(API.format(ws=workspace.slug) + path, params)
    assert response.status_code == 200, response.content[:500]
    return response.json()


def test_downstream_and_upstream_traversal(viewer, workspace, scene):
    group = f"feature_group:{scene['users'].pk}"
    down = get(viewer, workspace, node=group, direction="downstream", depth=6)
    kinds = {n["kind"] for n in down["nodes"]}
    assert {"dataset", "training_job", "model_version", "deployment", "experiment"} <= kinds
    experiment = f"experiment:{scene['experiment']}"
    # Levels are shortest paths: users is consumed directly by the deployment ...
    assert next(n for n in down["nodes"] if n["key"] == experiment)["level"] == 2
    # ... the label group only through dataset, job, model version and deployment.
    labels = get(viewer, workspace, node=f"feature_group:{scene['labels'].pk}", depth=6)
    assert next(n for n in labels["nodes"] if n["key"] == experiment)["level"] == 5
    up = get(viewer, workspace, node=experiment, direction="upstream", depth=6)
    assert group in {n["key"] for n in up["nodes"]}
    assert all(n["level"] <= 0 for n in up["nodes"])
    # Nodes link to their own pages where the kind has one.
    urls = {n["key"]: n["url"] for n in down["nodes"]}
    assert urls[group] == f"/w/{workspace.slug}/features/groups/users/"
    assert (
        urls[f"dataset:{scene['dataset'].pk}"]
        == f"/w/{workspace.slug}/features/datasets/clicks/v1/"
    )
    assert urls[f"model_version:{scene['model']}"] == f"/w/{workspace.slug}/models/ctr-model/v1/"
    assert urls[f"experiment:{scene['experiment']}"] == f"/w/{workspace.slug}/experiments/ctr-ab/"
    # Depth bounds the walk.
    one = get(viewer, workspace, node=group, direction="downstream", depth=1)
    assert {n["kind"] for n in one["nodes"]} <= {
        "feature_group",
        "feature",
        "dataset",
        "model_version",
        "deployment",
    }
    assert "experiment" not in {n["kind"] for n in one["nodes"]}


@pytest.mark.parametrize(
    ("params", "attr"),
    [
        ({"node": "nonsense"}, "node"),
        ({"node": "dataset:1", "direction": "sideways"}, "direction"),
        ({"node": "dataset:1", "depth": "99"}, "depth"),
        ({"node": "dataset:1", "depth": "x"}, "depth"),
    ],
)
def test_bad_queries_are_400(viewer, workspace, scene, params, attr):
    params = {**params}
    if params["node"] == "dataset:1":
        params["node"] = f"dataset:{scene['dataset'].pk}"
    response = viewer.get(API.format(ws=workspace.slug), params)
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == attr


def test_unknown_node_and_other_workspaces_node_are_404(viewer, workspace, other_workspace):
    record(other_workspace, "dataset.created", [Ref("dataset", 5, "theirs")])
    project()
    response = viewer.get(API.format(ws=workspace.slug), {"node": "dataset:5"})
    assert response.status_code == 404


def test_impact_of_retiring_a_feature_names_live_objects_and_owners(
    viewer, workspace, scene, members
):
    body = get(viewer, workspace, "impact/", node=f"feature:{scene['users'].pk}:age")
    assert body["counts"] == {
        "deployment": 1,
        "experiment": 1,
        "model_version": 1,
        "training_job": 1,
    }
    assert body["owners"] == [{"owner": members[Role.DEVELOPER].username, "items": 4}]
    record(workspace, "serving.deployment.retired", [Ref("deployment", scene["deployment"], "d")])
    body = get(viewer, workspace, "impact/", node=f"feature:{scene['users'].pk}:age")
    assert "deployment" not in body["counts"]  # retired: nothing breaks there any more
    # The unused group breaks nothing.
    body = get(viewer, workspace, "impact/", node=f"feature_group:{scene['unused'].pk}")
    assert body["counts"] == {} and body["total"] == 0
    # Depth bounds it: the label group reaches the job in 2 steps, the experiment in 5.
    labels = f"feature_group:{scene['labels'].pk}"
    assert get(viewer, workspace, "impact/", node=labels, depth=2)["counts"] == {"training_job": 1}
    assert get(viewer, workspace, "impact/", node=labels, depth=6)["counts"] == {
        "experiment": 1,
        "model_version": 1,
        "training_job": 1,
    }


def test_precomputed_impact_equals_a_walk(workspace, scene):
    from lineage.queries import downstream_ids, impact
    from lineage.reach import IMPACT_KINDS

    project()
    for node in Node.objects.for_workspace(workspace):
        for depth in (1, 3, 6):
            walked = Node.objects.for_workspace(workspace).filter(
                pk__in=downstream_ids(node.pk, depth), kind__in=IMPACT_KINDS, live=True
            )
            expected = {}
            for n in walked:
                expected[n.kind] = expected.get(n.kind, 0) + 1
            assert impact(workspace=workspace, node=node, depth=depth)["counts"] == expected


def test_features_of_a_model_and_models_of_a_feature(viewer, workspace, scene):
    body = get(viewer, workspace, "features/", node=f"model_version:{scene['model']}")
    keys = {n["key"] for n in body["features"]}
    users = scene["users"].pk
    assert {f"feature_group:{users}", f"feature:{users}:age", f"feature:{users}:ctr"} <= keys
    assert f"feature_group:{scene['unused'].pk}" not in keys
    body = get(viewer, workspace, "models/", node=f"feature:{users}:ctr")
    assert [n["key"] for n in body["models"]] == [f"model_version:{scene['model']}"]


def test_consumers_of_a_group(viewer, workspace, scene):
    body = get(viewer, workspace, "consumers/", node=f"feature_group:{scene['users'].pk}")
    assert {n["key"] for n in body["consumers"]} == {
        f"dataset:{scene['dataset'].pk}",
        f"model_version:{scene['model']}",
        f"deployment:{scene['deployment']}",
    }


def test_unused_features(viewer, workspace, scene):
    project()
    # Nothing is idle for 30 days yet: everything was made just now.
    assert get(viewer, workspace, "unused-features/", days=30)["unused"] == []
    unused = get(viewer, workspace, "unused-features/", days=0)["unused"]
    keys = {n["key"] for n in unused}
    assert f"feature_group:{scene['unused'].pk}" in keys
    assert f"feature:{scene['unused'].pk}:x" in keys
    assert f"feature_group:{scene['users'].pk}" not in keys
    # A group whose last consumer went away is unused from then on.
    from features import registry

    for kind, object_id in (
        ("dataset", scene["dataset"].pk),
        ("model", scene["model"]),
        ("deployment", scene["deployment"]),
    ):
        registry.consumer_release(actor=None, workspace=workspace, kind=kind, object_id=object_id)
    keys = {n["key"] for n in get(viewer, workspace, "unused-features/", days=0)["unused"]}
    assert f"feature_group:{scene['users'].pk}" in keys
    assert f"feature:{scene['users'].pk}:age" in keys
    assert f"feature_group:{scene['users'].pk}" not in {
        n["key"] for n in get(viewer, workspace, "unused-features/", days=1)["unused"]
    }
    # Backdate the unused group: idle for 40 days shows with days=30.
    Node.objects.for_workspace(workspace).filter(label__startswith="unused_stats").update(
        first_seen_at=timezone.now() - timedelta(days=40)
    )
    keys = {n["key"] for n in get(viewer, workspace, "unused-features/", days=30)["unused"]}
    assert f"feature_group:{scene['unused'].pk}" in keys


def test_cost_rolls_up_along_the_graph(viewer, workspace, scene, settings):
    settings.LINEAGE_UNIT_PRICES = {
        "cpu_hours": 1.0,
        "gpu_hours": 10.0,
        "memory_gb_hours": 0.1,
        "storage_gb": 0.5,
    }
    from lineage.projection import rebuild

    rebuild()  # priced at projection time
    job = get(viewer, workspace, "cost/", node=f"training_job:{scene['job']}")
    assert job["total"] == pytest.approx(2 * 1 + 1 * 10 + 8 * 0.1)  # 12.8
    deployment = 4 * 1 + 16 * 0.1 + 1 * 0.5  # 6.1
    model = get(viewer, workspace, "cost/", node=f"model_version:{scene['model']}")
    assert model["total"] == pytest.approx(12.8 + deployment)
    experiment = get(viewer, workspace, "cost/", node=f"experiment:{scene['experiment']}")
    assert experiment["total"] == pytest.approx(12.8 + deployment)
    # Features share the objects downstream of them: the job reads users:age, users:ctr and
    # impressions:clicked (3 features); the deployment reads age (via the model) and users.
    age = get(viewer, workspace, "cost/", node=f"feature:{scene['users'].pk}:age")
    assert age["total"] == pytest.approx(12.8 / 3 + deployment / 3)
    shares = cost.feature_costs(workspace=workspace, kind="feature")
    assert sum(s["cost"] for s in shares.values()) == pytest.approx(12.8 + deployment)
    summary = get(viewer, workspace, "cost/")
    assert summary["total"]["cost"] == pytest.approx(12.8 + deployment)
    assert summary["daily"][0]["cost"] == pytest.approx(12.8 + deployment)
    assert summary["top"][0]["key"] == f"training_job:{scene['job']}"
    (run,) = summary["runs"]["jobs"]
    assert run["state"] == "succeeded" and run["samples"] == 3600
    # From the job's running event to its succeeded event, as the log has them.
    times = dict(
        Event.objects.for_workspace(workspace)
        .filter(verb__in=["training.job.running", "training.job.succeeded"])
        .values_list("verb", "created_at")
    )
    took = times["training.job.succeeded"] - times["training.job.running"]
    assert run["duration_s"] == round(took.total_seconds(), 3)


def test_pipeline_runs_have_duration_and_speed(workspace):
    t = timezone.now()
    run = Ref("pipelinerun", 1, "nightly")
    record(workspace, "training.pipeline.created", [Ref("pipeline", 1, "nightly")])
    started = record(workspace, "training.pipeline_run.started", [run])
    done = record(workspace, "training.pipeline_run.succeeded", [run], payload={"samples": 1000})
    runs = cost.pipeline_runs(workspace=workspace)["pipelines"]
    assert len(runs) == 1
    assert runs[0]["key"] == "pipelinerun:1" and runs[0]["state"] == "succeeded"
    # From the started event to the succeeded one, as the log has them (the log is append-only,
    # so the times are the ones recorded).
    took = (done.created_at - started.created_at).total_seconds()
    assert runs[0]["duration_s"] == round(took, 3)
    assert runs[0]["started_at"] == started.created_at
    assert runs[0]["finished_at"] == done.created_at >= t


def test_template_helpers_link_and_show_cost(workspace, scene):
    from django.template import Context, Template

    project()
    html = Template(
        "{% load lineage_tags %}{% lineage_url ws.slug 'model_version' mid %}"
        "{% lineage_cost_panel ws 'training_job' jid %}"
    ).render(Context({"ws": workspace, "mid": scene["model"], "jid": scene["job"]}))
    assert f"/w/{workspace.slug}/lineage/?node=model_version:{scene['model']}" in html
    assert "rolled up" in html and "CPU-h" in html
