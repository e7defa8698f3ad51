"""The group's field limits live in the service (``features.registry``): the API, the form and a
direct service call refuse the same values, naming the field; the list's filters are a FilterSet
(an unknown value is a 400 naming the filter, not an empty page)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from features import registry
from features.forms import FeatureGroupCreateForm
from features.models import Lifecycle
from features.tests.factories import make_group

pytestmark = pytest.mark.django_db


def groups_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/feature-groups/"


@pytest.mark.parametrize(
    ("fields", "attr"),
    [
        ({"freshness_sla_seconds": registry.MIN_FRESHNESS_SLA_S - 1}, "freshness_sla_seconds"),
        ({"freshness_sla_seconds": registry.MAX_FRESHNESS_SLA_S + 1}, "freshness_sla_seconds"),
        ({"description": "x" * (registry.MAX_GROUP_DESCRIPTION_CHARS + 1)}, "description"),
        ({"tags": ["t"] * (registry.MAX_TAGS + 1)}, "tags"),
        ({"tags": ["x" * (registry.MAX_TAG_CHARS + 1)]}, "tags.0"),
    ],
)
def test_the_update_service_refuses_what_the_api_refuses(workspace, members, fields, attr):
    group = make_group(workspace, name="user_profile")
    with pytest.raises(ValidationError) as caught:
        registry.feature_group_update(actor=members["maintainer"], group=group, **fields)
    assert attr in caught.value.message_dict


@pytest.mark.parametrize(
    ("fields", "attr"),
    [
        ({"freshness_sla_seconds": registry.MIN_FRESHNESS_SLA_S - 1}, "freshness_sla_seconds"),
        ({"description": "x" * (registry.MAX_GROUP_DESCRIPTION_CHARS + 1)}, "description"),
        ({"tags": ["t"] * (registry.MAX_TAGS + 1)}, "tags"),
    ],
)
def test_the_api_refuses_the_same_limits(client_for, workspace, members, fields, attr):
    make_group(workspace, name="user_profile")
    response = client_for(members["maintainer"]).patch(
        f"{groups_url(workspace)}user_profile/", fields, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == attr


def test_the_limits_themselves_are_accepted(workspace, members):
    group = make_group(workspace, name="user_profile")
    group = registry.feature_group_update(
        actor=members["maintainer"],
        group=group,
        description="x" * registry.MAX_GROUP_DESCRIPTION_CHARS,
        tags=["x" * registry.MAX_TAG_CHARS] * registry.MAX_TAGS,
        freshness_sla_seconds=registry.MIN_FRESHNESS_SLA_S,
    )
    assert group.freshness_sla_seconds == registry.MIN_FRESHNESS_SLA_S


def test_the_forms_freshness_meets_the_services_limit(workspace, members):
    group = make_group(workspace, name="user_profile")
    form = FeatureGroupCreateForm(
        data={
            "name": "ad_profile",
            "entity": "item",
            "entity_keys": "ad_id",
            "freshness_sla_hours": "0.01",  # 36 s: the form let it through before
            "description": "",
        }
    )
    assert form.is_valid(), form.errors
    seconds = form.service_arguments()["freshness_sla_seconds"]
    with pytest.raises(ValidationError) as caught:
        registry.feature_group_update(
            actor=members["maintainer"], group=group, freshness_sla_seconds=seconds
        )
    assert "freshness_sla_seconds" in caught.value.message_dict


def test_list_filters_by_status_and_refuses_an_unknown_one(client_for, workspace, members):
    make_group(workspace, name="live_group")
    make_group(workspace, name="draft_group", status=Lifecycle.DRAFT)
    client = client_for(members["viewer"])
    found = client.get(groups_url(workspace), {"status": "draft"}).json()
    assert [g["name"] for g in found["results"]] == ["draft_group"]
    response = client.get(groups_url(workspace), {"status": "sleeping"})
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == "status"
