"""The lineage page found by name: what a name resolves to, the graph the page embeds (its kinds
in left-to-right columns), unknown names, other workspaces, and the empty workspace."""

from __future__ import annotations

import json
import re

import pytest

from features import registry
from lineage.tests.helpers import build_scene, group, record
from workspaces.events import Ref
from workspaces.models import Role

pytestmark = pytest.mark.django_db
PAGE = "/w/{ws}/lineage/"
COLUMNS = ["feature_group", "dataset", "training_job", "model_version", "deployment", "experiment"]


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


@pytest.fixture
def scene(workspace, members):
    return build_scene(workspace, members[Role.DEVELOPER])


@pytest.fixture
def viewer(client, members):
    client.force_login(members[Role.VIEWER])
    return client


def embedded_graph(response) -> dict:
    match = re.search(
        r'<script id="lineage-data" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    assert match, "the page embeds no graph"
    return json.loads(match.group(1))


@pytest.mark.parametrize(
    ("params", "kind", "name"),
    [
        ({"q": "ctr-model"}, "model_version", "ctr-model v1"),  # a model: its newest version
        ({"kind": "model", "name": "CTR-model v1"}, "model_version", "ctr-model v1"),
        ({"q": "clicks v1"}, "dataset", "clicks v1"),
        ({"q": "ctr-prod"}, "deployment", "ctr-prod"),
        ({"q": "users", "kind": "feature group"}, "feature_group", "users"),
    ],
)
def test_a_name_finds_its_node(viewer, workspace, scene, params, kind, name):
    response = viewer.get(PAGE.format(ws=workspace.slug), params)
    assert response.status_code == 200
    graph = embedded_graph(response)
    root = next(n for n in graph["nodes"] if n["key"] == graph["root"])
    assert (root["kind"], root["label"]) == (kind, name)


def test_an_internal_id_still_works_and_turns_readable(viewer, workspace, scene):
    key = f"experiment:{scene['experiment']}"
    page = PAGE.format(ws=workspace.slug)
    for params in ({"q": key}, {"node": key}):
        response = viewer.get(page, params, follow=True)
        assert response.redirect_chain == [(f"{page}?kind=experiment&q=ctr-ab", 302)]
        assert embedded_graph(response)["root"] == key


def test_a_shared_name_shows_the_newest_and_lists_the_others(viewer, workspace, scene):
    older, newer = 7001, 7002
    for job_id in (older, newer):
        record(workspace, "training.job.pending", [Ref("training_job", job_id, "nightly")])
    page = PAGE.format(ws=workspace.slug)
    response = viewer.get(page, {"kind": "job", "q": "nightly"})
    assert embedded_graph(response)["root"] == f"training_job:{newer}"
    assert f'href="{page}?node=training_job%3A{older}"' in response.content.decode()
    # The older one by its id: no redirect, its name alone would find the newer.
    response = viewer.get(page, {"node": f"training_job:{older}"})
    assert response.status_code == 200
    assert embedded_graph(response)["root"] == f"training_job:{older}"


def test_a_kind_alone_centres_on_its_newest(viewer, workspace, scene):
    page = PAGE.format(ws=workspace.slug)
    response = viewer.get(page, {"kind": "dataset"})
    assert embedded_graph(response)["root"] == f"dataset:{scene['dataset'].pk}"
    response = viewer.get(page, {"kind": "external_dataset"})
    assert response.status_code == 404
    assert "No external datasets in this workspace's lineage yet." in response.content.decode()


def test_the_graph_columns_run_from_features_to_experiments(viewer, workspace, scene):
    response = viewer.get(PAGE.format(ws=workspace.slug), {"q": "ctr-model v1"})
    nodes = embedded_graph(response)["nodes"]
    rank = {n["kind"]: n["rank"] for n in nodes}
    assert set(COLUMNS) <= set(rank), rank
    assert [rank[k] for k in COLUMNS] == sorted({rank[k] for k in COLUMNS})
    assert len({rank[k] for k in COLUMNS}) == len(COLUMNS)  # one column per kind
    # Each node links to the page centred on it by name, and to its own page.
    by_kind = {n["kind"]: n for n in nodes}
    assert (
        by_kind["deployment"]["page"] == f"/w/{workspace.slug}/lineage/?kind=deployment&q=ctr-prod"
    )
    assert by_kind["model_version"]["url"] == f"/w/{workspace.slug}/models/ctr-model/v1/"
    assert by_kind["experiment"]["url"] == f"/w/{workspace.slug}/experiments/ctr-ab/"


def test_an_unknown_name_says_so_and_suggests(viewer, workspace, scene):
    response = viewer.get(PAGE.format(ws=workspace.slug), {"q": "ctr-modle"})
    assert response.status_code == 404
    text = response.content.decode()
    assert "Nothing called “ctr-modle” in this workspace." in text
    assert f'href="/w/{workspace.slug}/lineage/?kind=model_version&amp;q=ctr-model+v1"' in text
    assert 'id="lineage-data"' not in text


def test_an_unknown_kind_names_the_kinds(viewer, workspace, scene):
    response = viewer.get(PAGE.format(ws=workspace.slug), {"kind": "banana", "q": "ctr-prod"})
    assert response.status_code == 400
    assert "There is no kind called “banana”" in response.content.decode()


def test_every_node_the_page_draws_links_to_a_page_centred_on_it(viewer, workspace, members, scene):
    """Kinds the platform emits beside the main columns (a workspace's sample stream, a
    registered model, an experiment layer) and a producer's own kind: each node's link names
    its kind, and the page it opens is centred on that node (these answered 400, "no kind
    called sample_stream", when only the kind tables were asked)."""
    actor = members[Role.DEVELOPER]
    registry.consumer_register(
        actor=actor,
        group=scene["users"],
        kind="sample_stream",
        object_id=workspace.slug,
        label=f"{workspace.slug} sample stream",
        feature_name="age",
    )
    for verb, source, made in (
        (
            "serving.registered_model.created",
            Ref("registered_model", 7001, "ctr-model", role="input"),
            Ref("model_version", scene["model"], "ctr-model v1", role="output"),
        ),
        (
            "experiments.layer.created",
            Ref("experiment", scene["experiment"], "ctr-ab", role="input"),
            Ref("experiment_layer", 7002, "homepage layer", role="output"),
        ),
        (
            "producer.report.written",
            Ref("deployment", scene["deployment"], "ctr-prod", role="input"),
            Ref("weekly_report", 7003, "ctr weekly", role="output"),
        ),
    ):
        record(workspace, verb, [source, made], actor=actor)
    page = PAGE.format(ws=workspace.slug)
    drawn = [
        node
        for centre in ({"q": "ctr-prod"}, {"q": "users", "kind": "feature group"})
        for node in embedded_graph(viewer.get(page, centre))["nodes"]
    ]
    kinds = {n["kind"] for n in drawn}
    assert {"sample_stream", "registered_model", "experiment_layer", "weekly_report"} <= kinds
    for node in drawn:
        response = viewer.get(node["page"])
        assert response.status_code == 200, (node["page"], response.status_code)
        graph = embedded_graph(response)
        assert graph["root"] == node["key"], node["page"]
    # The suggestion box names them by kind as well, and a kind the workspace has never held
    # is still refused with the kinds to choose from.
    found = viewer.get(f"{page}suggest/", {"q": "weekly", "kind": "weekly_report"}).json()
    assert [r["name"] for r in found["results"]] == ["ctr weekly"]
    response = viewer.get(page, {"kind": "monthly_report", "q": "ctr weekly"})
    assert response.status_code == 400


def test_another_workspaces_names_are_never_found(viewer, workspace, other_workspace, scene):
    group(other_workspace, "secret_stats", ["x"])
    page = PAGE.format(ws=workspace.slug)
    response = viewer.get(page, {"q": "secret_stats"})
    assert response.status_code == 404
    assert "q=secret_stats" not in response.content.decode()  # not suggested either
    suggested = viewer.get(f"{page}suggest/", {"q": "secret"}).json()["results"]
    assert suggested == []
    assert (
        viewer.get(PAGE.format(ws=other_workspace.slug), {"q": "secret_stats"}).status_code == 404
    )


def test_suggestions_by_part_of_a_name(viewer, workspace, scene):
    found = viewer.get(f"{PAGE.format(ws=workspace.slug)}suggest/", {"q": "ctr"}).json()
    names = {(r["name"], r["kind"]) for r in found["results"]}
    assert {("ctr-model v1", "model_version"), ("ctr-prod", "deployment")} <= names
    assert ("ctr-ab", "experiment") in names
    assert all("ctr" in r["name"] for r in found["results"])


def test_an_empty_workspace_says_what_to_do_next(viewer, workspace):
    response = viewer.get(PAGE.format(ws=workspace.slug))
    assert response.status_code == 200
    text = response.content.decode()
    assert "No lineage in this workspace yet" in text
    assert f'href="/w/{workspace.slug}/features/new-group/"' in text
