"""The one resolver of references to a workspace's objects (``workspaces.selectors.
workspace_object``): by object, id or name, another workspace's object answered exactly like a
missing one, a reference of the wrong type refused naming the field."""

import pytest
from django.core.exceptions import ValidationError

from experiments.models import Layer
from workspaces.exceptions import ReferenceNotFound
from workspaces.selectors import workspace_object

pytestmark = pytest.mark.django_db


@pytest.fixture
def layers(workspace, other_workspace):
    mine = Layer.objects.create(workspace=workspace, name="default", salt="s1")
    theirs = Layer.objects.create(workspace=other_workspace, name="default", salt="s2")
    return mine, theirs


def test_resolves_by_object_id_and_name(workspace, layers):
    mine, _ = layers
    for ref in (mine, mine.pk, "default"):
        assert workspace_object(Layer, workspace=workspace, ref=ref, attr="layer") == mine


def test_another_workspaces_object_is_not_found_like_a_missing_one(workspace, layers):
    _, theirs = layers
    for ref, message in (
        (theirs, "no layer 'default'"),
        (theirs.pk, f"no layer {theirs.pk}"),
        ("missing", "no layer 'missing'"),
    ):
        with pytest.raises(ReferenceNotFound) as caught:
            workspace_object(Layer, workspace=workspace, ref=ref, attr="layer")
        assert caught.value.attr == "layer"
        assert caught.value.detail == message


@pytest.mark.parametrize("ref", [None, "", True, 1.5, ["default"]])
def test_a_reference_of_the_wrong_type_names_the_field(workspace, layers, ref):
    with pytest.raises(ValidationError) as caught:
        workspace_object(Layer, workspace=workspace, ref=ref, attr="layer")
    assert not isinstance(caught.value, ReferenceNotFound)
    assert caught.value.message_dict == {"layer": ["give a layer id or name"]}


def test_by_id_only_refuses_a_name_and_a_queryset_keeps_its_narrowing(workspace, layers):
    mine, _ = layers
    with pytest.raises(ValidationError) as caught:
        workspace_object(
            Layer, workspace=workspace, ref="default", attr="layer_id", name_field=None
        )
    assert caught.value.message_dict == {"layer_id": ["give a layer id"]}
    narrowed = Layer.objects.exclude(pk=mine.pk)
    with pytest.raises(ReferenceNotFound):
        workspace_object(narrowed, workspace=workspace, ref=mine.pk, attr="layer")
