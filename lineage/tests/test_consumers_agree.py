"""The graph's consumers of a feature group agree with the feature registry's Consumer rows."""

from __future__ import annotations

import pytest

from features import registry
from features.models import Consumer
from lineage.models import Node
from lineage.projection import canonical_kind, project
from lineage.queries import consumers_of
from lineage.tests.helpers import build_scene
from workspaces.models import Role

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


def registry_view(workspace, group, feature_name=None):
    rows = Consumer.objects.for_workspace(workspace).filter(group=group, live=True)
    if feature_name is not None:
        rows = rows.filter(feature_name=feature_name)
    return {(canonical_kind(c.kind), c.object_id) for c in rows}


def graph_view(workspace, kind, object_id):
    node = Node.objects.for_workspace(workspace).filter(kind=kind, object_id=object_id).first()
    if node is None:
        return set()
    return {(n.kind, n.object_id) for n in consumers_of(workspace=workspace, node=node)}


def assert_agree(workspace, groups):
    project()
    for group in groups:
        assert graph_view(workspace, "feature_group", str(group.pk)) == registry_view(
            workspace, group
        ), group.name
        for feature in group.feature_set.all():
            assert graph_view(workspace, "feature", f"{group.pk}:{feature.name}") == registry_view(
                workspace, group, feature.name
            ), str(feature)


def test_graph_and_registry_agree_on_consumers_through_a_lifecycle(workspace, members):
    actor = members[Role.DEVELOPER]
    scene = build_scene(workspace, actor)
    groups = [scene["users"], scene["labels"], scene["unused"]]
    assert_agree(workspace, groups)
    assert registry_view(workspace, scene["users"])  # there is something to agree on

    registry.consumer_release(
        actor=actor, workspace=workspace, kind="deployment", object_id=scene["deployment"]
    )
    assert_agree(workspace, groups)

    registry.consumer_register(
        actor=actor,
        group=scene["unused"],
        kind="experiment",
        object_id="77",
        label="exp 77",
        feature_name="x",
    )
    registry.consumer_release(
        actor=actor, workspace=workspace, kind="model", object_id=scene["model"]
    )
    assert_agree(workspace, groups)
    assert registry_view(workspace, scene["unused"]) == {("experiment", "77")}
