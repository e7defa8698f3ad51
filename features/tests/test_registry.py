"""Registry: registration, schema versions, lifecycle, consumers and the 409 on retiring."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from features import registry
from features.lookup import online_lookup
from features.models import Consumer, Feature, FeatureGroup, FeatureGroupVersion, Lifecycle
from features.tests.factories import USER_FEATURES, make_group, user_row
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member


def groups_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/feature-groups/"


def test_register_through_the_api(client_for, workspace, members):
    response = client_for(members["developer"]).post(
        groups_url(workspace),
        {
            "name": "ad_profile",
            "entity": "item",
            "entity_key": "ad_id",
            "features": [
                {"name": "price", "dtype": "float", "description": "List price."},
                {"name": "category", "dtype": "categorical"},
                {"name": "vec", "dtype": "embedding", "dimension": 16},
            ],
            "freshness_sla": 3600,
            "tags": ["ads"],
            "producer": members["maintainer"].username,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["entity_keys"] == ["ad_id"]
    assert body["freshness_sla_seconds"] == 3600
    assert body["producer"] == members["maintainer"].username
    assert [v["version"] for v in body["versions"]] == [1]
    assert [f["name"] for f in body["feature_set"]] == ["category", "price", "vec"]
    event = Event.objects.for_workspace(workspace).get(verb="feature_group.registered")
    assert event.payload["features"][2] == {
        "name": "vec",
        "dtype": "embedding",
        "dimension": 16,
        "description": "",
    }


@pytest.mark.parametrize(
    ("body", "attr"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"entity": "planet"}, "entity"),
        ({"features": []}, "features"),
        ({"features": [{"name": "x", "dtype": "tensor"}]}, "features.0.dtype"),
        ({"features": [{"name": "x", "dtype": "embedding"}]}, "features.0.dimension"),
        (
            {"features": [{"name": "x", "dtype": "int"}, {"name": "x", "dtype": "int"}]},
            "features.1.name",
        ),
        ({"features": [{"name": "user_id", "dtype": "int"}]}, "features.0.name"),
        ({"entity_key": "Bad-Key"}, "entity_keys.0"),
        ({"features": [{"name": "file_row_number", "dtype": "int"}]}, "features.0.name"),
        ({"producer": "nobody"}, "producer"),
    ],
)
def test_bad_registrations_name_the_field_and_write_nothing(
    client_for, workspace, members, body, attr
):
    valid = {
        "name": "g",
        "entity": "user",
        "entity_key": "user_id",
        "features": [{"name": "age", "dtype": "int"}],
    }
    response = client_for(members["developer"]).post(
        groups_url(workspace), {**valid, **body}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == attr
    assert not FeatureGroup.objects.for_workspace(workspace).exists()
    assert not Event.objects.for_workspace(workspace).filter(verb__startswith="feature").exists()


def test_duplicate_name_is_409(client_for, workspace, members):
    make_group(workspace, name="user_profile")
    response = client_for(members["developer"]).post(
        groups_url(workspace),
        {
            "name": "user_profile",
            "entity": "user",
            "entity_key": "user_id",
            "features": [{"name": "age", "dtype": "int"}],
        },
        format="json",
    )
    assert response.status_code == 409
    assert "user_profile" in response.json()["detail"]


def test_same_name_in_another_workspace_is_independent(workspace, other_workspace):
    make_group(workspace, name="user_profile")
    make_group(other_workspace, name="user_profile")
    assert (
        FeatureGroup.objects.for_workspace(other_workspace).filter(name="user_profile").count() == 1
    )


def test_schema_change_makes_a_new_version_and_old_data_stays_readable(
    client_for, workspace, members
):
    group = make_group(workspace, name="user_profile")
    client = client_for(members["developer"])
    url = f"{groups_url(workspace)}user_profile/"
    client.post(f"{url}batches/", {"rows": [user_row(1)]}, format="json")
    consumer_owner = make_member(workspace, Role.DEVELOPER)
    registry.consumer_register(
        actor=None,
        group=group,
        kind="model",
        object_id="m-1",
        label="ctr-model v3",
        owner=consumer_owner,
    )
    new_schema = [*USER_FEATURES[:2], {"name": "spend_30d", "dtype": "float"}]
    response = client.patch(url, {"features": new_schema}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["current_version"] == 2
    assert [f["name"] for f in response.json()["features"]] == ["age", "ctr_7d", "spend_30d"]
    client.post(
        f"{url}batches/",
        {"rows": [{"user_id": "u1", "event_time": "2026-11-03T00:00:00Z", "spend_30d": 9.5}]},
        format="json",
    )
    pinned = online_lookup(
        workspace=workspace,
        entities=["u1"],
        features=["user_profile@v1:age", "user_profile:spend_30d", "user_profile:age"],
    )
    assert pinned["rows"] == [[21, 9.5, None]]
    event = Event.objects.for_workspace(workspace).get(verb="feature_group.versioned")
    assert event.payload["added"] == ["spend_30d"]
    assert event.payload["removed"] == ["city", "emb", "is_new"]
    assert event.payload["consumers"] == ["model ctr-model v3"]
    assert FeatureGroupVersion.objects.for_workspace(workspace).filter(group=group).count() == 2
    assert client.patch(url, {"features": new_schema}, format="json").status_code == 400


def test_retiring_a_consumed_feature_is_409_naming_the_consumer(client_for, workspace, members):
    group = make_group(workspace, name="user_profile")
    registry.consumer_register(
        actor=None,
        group=group,
        kind="dataset",
        object_id="7",
        label="clicks-nov v1",
        feature_name="ctr_7d",
    )
    client = client_for(members["maintainer"])
    url = f"{groups_url(workspace)}user_profile/features/ctr_7d/"
    response = client.patch(url, {"status": "retired"}, format="json")
    assert response.status_code == 409
    assert "dataset clicks-nov v1" in response.json()["detail"]
    assert (
        Feature.objects.for_workspace(workspace).get(group=group, name="ctr_7d").status == "active"
    )
    # The whole group is blocked too; another feature of it is not.
    group_url = f"{groups_url(workspace)}user_profile/"
    assert client.patch(group_url, {"status": "retired"}, format="json").status_code == 409
    assert client.delete(group_url).status_code == 409
    other = client.patch(
        f"{groups_url(workspace)}user_profile/features/age/", {"status": "retired"}, format="json"
    )
    assert other.status_code == 200
    # Once the consumer is released, retiring works.
    registry.consumer_release(actor=None, workspace=workspace, kind="dataset", object_id="7")
    assert client.patch(url, {"status": "retired"}, format="json").status_code == 200


def test_a_released_consumer_registered_again_is_recorded_again(workspace):
    group = make_group(workspace, name="user_profile")
    args = {"actor": None, "group": group, "kind": "dataset", "object_id": "7", "label": "d v1"}

    def registered_events():
        return Event.objects.filter(workspace=workspace, verb="feature_consumer.registered").count()

    registry.consumer_register(**args)
    registry.consumer_register(**args)  # still live: nothing new to record
    assert registered_events() == 1
    registry.consumer_release(actor=None, workspace=workspace, kind="dataset", object_id="7")
    registry.consumer_register(**args)
    assert registered_events() == 2
    assert Consumer.objects.for_workspace(workspace).get(kind="dataset", object_id="7").live


def test_developers_cannot_retire(client_for, workspace, members):
    make_group(workspace, name="user_profile")
    response = client_for(members["developer"]).patch(
        f"{groups_url(workspace)}user_profile/", {"status": "retired"}, format="json"
    )
    assert response.status_code == 403
    assert FeatureGroup.objects.for_workspace(workspace).get().status == "active"


def test_lifecycle_moves(workspace):
    group = make_group(workspace, status=Lifecycle.DRAFT)
    registry.feature_group_set_status(actor=None, group=group, status="active")
    registry.feature_group_set_status(actor=None, group=group, status="deprecated")
    registry.feature_group_set_status(actor=None, group=group, status="retired")
    with pytest.raises(ConflictError, match="cannot go from retired"):
        registry.feature_group_set_status(actor=None, group=group, status="active")
    verbs = list(
        Event.objects.for_workspace(workspace)
        .filter(verb__startswith="feature_group.")
        .order_by("id")
        .values_list("verb", flat=True)
    )
    assert verbs == [
        "feature_group.registered",
        "feature_group.active",
        "feature_group.deprecated",
        "feature_group.retired",
    ]


def test_consumers_cannot_use_retired_features(workspace):
    group = make_group(workspace)
    feature = Feature.objects.for_workspace(workspace).get(group=group, name="age")
    registry.feature_set_status(actor=None, feature=feature, status="retired")
    with pytest.raises(ConflictError, match="retired"):
        registry.consumer_register(
            actor=None, group=group, kind="model", object_id="1", label="m", feature_name="age"
        )
    with pytest.raises(ValidationError):
        registry.consumer_register(
            actor=None, group=group, kind="model", object_id="1", label="m", feature_name="nope"
        )
    assert not Consumer.objects.for_workspace(workspace).exists()


def test_upgrade_links_successor_and_tells_consumers(client_for, workspace, members):
    old = make_group(workspace, name="user_profile")
    make_group(workspace, name="user_profile_v2")
    registry.consumer_register(
        actor=None, group=old, kind="experiment", object_id="e1", label="exp-42"
    )
    response = client_for(members["developer"]).patch(
        f"{groups_url(workspace)}user_profile/", {"successor": "user_profile_v2"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["successor"] == "user_profile_v2"
    event = Event.objects.for_workspace(workspace).get(verb="feature_group.upgraded")
    assert event.payload["consumers"] == ["experiment exp-42"]
    kinds = {(r.role, r.kind) for r in event.refs.all()}
    assert ("related", "experiment") in kinds and ("output", "feature_group") in kinds


def test_successor_in_another_workspace_is_not_found(
    client_for, workspace, other_workspace, members
):
    make_group(workspace, name="user_profile")
    make_group(other_workspace, name="theirs")
    response = client_for(members["developer"]).patch(
        f"{groups_url(workspace)}user_profile/", {"successor": "theirs"}, format="json"
    )
    assert response.status_code == 404
    assert response.json()["attr"] == "successor"
    assert FeatureGroup.objects.for_workspace(workspace).get(name="user_profile").successor is None


def test_list_search_and_query_bound(client_for, workspace, members, django_assert_max_num_queries):
    for index in range(25):
        make_group(workspace, name=f"group_{index:02d}")
    client = client_for(members["viewer"])
    with django_assert_max_num_queries(10):
        body = client.get(groups_url(workspace), {"limit": 100}).json()
    assert body["count"] == 25
    assert body["results"][0]["features"][0]["name"] == "age"
    found = client.get(groups_url(workspace), {"search": "group_1"}).json()
    assert [g["name"] for g in found["results"]] == [f"group_1{i}" for i in range(10)]


def test_a_patch_refused_in_its_last_part_writes_none_of_its_earlier_parts(
    client_for, workspace, members
):
    group = make_group(workspace, name="user_profile", description="before")
    client = client_for(members["maintainer"])
    url = f"{groups_url(workspace)}user_profile/"
    new_schema = [*USER_FEATURES[:2], {"name": "spend_30d", "dtype": "float"}]
    response = client.patch(
        url,
        {"description": "after", "features": new_schema, "successor": "no_such_group"},
        format="json",
    )
    assert response.status_code == 404 and response.json()["attr"] == "successor"
    group.refresh_from_db()
    assert (group.description, group.current_version) == ("before", 1)
    assert FeatureGroupVersion.objects.for_workspace(workspace).filter(group=group).count() == 1
    assert not Event.objects.for_workspace(workspace).filter(verb="feature_group.versioned")
