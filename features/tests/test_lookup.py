"""Online lookups: many entities, many groups, composite keys, versions, bad references."""

from __future__ import annotations

import pytest

from features import ingestion, lookup, registry
from features.models import EntityKind
from features.tests.factories import make_group, user_row
from workspaces.models import Role
from workspaces.testing.factories import make_member


def lookup_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/online-features/"


def push(group, actor, rows):
    import json

    return ingestion.batch_ingest(
        actor=actor, group=group, body=json.dumps({"rows": rows}).encode(), format="json"
    )


@pytest.fixture
def developer(workspace):
    return make_member(workspace, Role.DEVELOPER)


def test_many_entities_across_groups_with_composite_keys(client_for, workspace, developer):
    users = make_group(workspace, name="user_profile")
    pairs = registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="user_ad",
        entity=EntityKind.CONTEXT,
        entity_keys=["user_id", "ad_id"],
        features=[{"name": "clicks", "dtype": "int"}],
    )
    push(users, developer, [user_row(i) for i in range(100)])
    push(
        pairs, developer, [{"user_id": "u3", "ad_id": 9, "event_time": 1_761_955_200, "clicks": 4}]
    )
    entities = [{"user_id": f"u{i}", "ad_id": 9} for i in range(100)] + [
        {"user_id": "zz", "ad_id": 1}
    ]
    response = client_for(make_member(workspace, Role.VIEWER)).post(
        lookup_url(workspace),
        {
            "entities": entities,
            "features": ["user_profile:age", "user_ad:clicks", "user_profile:city"],
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    rows = response.json()["rows"]
    assert len(rows) == 101
    assert rows[3] == [23, 4, "c0"]
    assert rows[4] == [24, None, "c1"]
    assert rows[100] == [None, None, None]


@pytest.mark.parametrize(
    ("body", "status", "attr"),
    [
        ({"entities": [], "features": ["g:age"]}, 400, "entities"),
        ({"entities": ["u1"], "features": []}, 400, "features"),
        ({"entities": ["u1"], "features": ["no-colon"]}, 400, "features.0"),
        ({"entities": ["u1"], "features": ["missing:age"]}, 404, "features.0"),
        ({"entities": ["u1"], "features": ["user_profile:nope"]}, 404, "features.0"),
        ({"entities": ["u1"], "features": ["user_profile@v9:age"]}, 404, "features.0"),
        ({"entities": [["u1"]], "features": ["user_profile:age"]}, 400, "entities.0"),
        ({"entities": [True], "features": ["user_profile:age"]}, 400, "entities.0"),
        ({"entities": ["u"] * 1001, "features": ["user_profile:age"]}, 400, "entities"),
    ],
)
def test_bad_lookups_name_the_field(client_for, workspace, members, body, status, attr):
    make_group(workspace, name="user_profile")
    response = client_for(members["viewer"]).post(lookup_url(workspace), body, format="json")
    assert response.status_code == status, response.content
    assert response.json()["attr"] == attr


def test_another_workspaces_group_is_not_found_by_name(
    client_for, workspace, other_workspace, members
):
    theirs = make_group(other_workspace, name="secret_profile")
    push(theirs, None, [user_row(1)])
    response = client_for(members["admin"]).post(
        lookup_url(workspace),
        {"entities": ["u1"], "features": ["secret_profile:age"]},
        format="json",
    )
    assert response.status_code == 404
    assert response.json()["attr"] == "features.0"
    assert "no feature group" in response.json()["detail"]


def test_lookups_feed_coverage_counters(workspace, developer):
    from features import online_store
    from features.lookup import online_lookup

    group = make_group(workspace, name="user_profile")
    push(group, developer, [user_row(1)])
    online_lookup(
        workspace=workspace, entities=["u1", "u2", "u3", "u1"], features=["user_profile:age"]
    )
    requested, found = online_store.get_online_store().coverage(
        counter=f"{workspace.pk}:{group.pk}", buckets=[online_store.hour_bucket()]
    )
    assert (requested, found) == (4, 2)


def test_cached_registry_follows_a_new_version_at_once(workspace, developer):
    from features.lookup import online_lookup

    group = make_group(workspace, name="user_profile")
    push(group, developer, [user_row(1)])
    first = online_lookup(workspace=workspace, entities=["u1"], features=["user_profile:age"])
    assert first["rows"] == [[21]]
    registry.feature_group_new_version(
        actor=None, group=group, features=[{"name": "age", "dtype": "int"}]
    )
    second = online_lookup(workspace=workspace, entities=["u1"], features=["user_profile:age"])
    assert second["rows"] == [[None]]  # version 2 has no data yet: the live version moved
    pinned = online_lookup(workspace=workspace, entities=["u1"], features=["user_profile@v1:age"])
    assert pinned["rows"] == [[21]]


def test_online_rows_are_stored_as_arrays_in_schema_order(workspace, developer):
    """A stored row holds the version's features by position, not their names."""
    from features import online_store

    group = make_group(workspace, name="user_profile")
    push(group, developer, [user_row(1)])
    version = group.versions.get(version=group.current_version)
    names = [spec["name"] for spec in version.features]
    namespace = online_store.namespace(
        workspace_id=workspace.pk, group_id=group.pk, version=version.version
    )
    (stored,) = online_store.get_online_store().read(
        [online_store.Lookup(namespace=namespace, entities=["u1"], counter="raw")]
    )
    row = user_row(1)
    assert stored == [[row[name] for name in names]]
    assert online_store.row_mapping(stored[0], names) == {name: row[name] for name in names}


def test_rows_stored_as_objects_before_arrays_are_still_served(workspace, developer):
    """Rows written by an earlier release (a JSON object by name) answer by name."""
    from features import online_store

    group = make_group(workspace, name="user_profile")
    push(group, developer, [user_row(1)])  # the group version's namespace is live
    namespace = online_store.namespace(
        workspace_id=workspace.pk, group_id=group.pk, version=group.current_version
    )
    online_store.get_online_store().write(
        namespace=namespace,
        rows=[("u7", 1_900_000_000.0, {"city": "old", "age": 70, "emb": [1.0, 2.0, 3.0]})],
    )
    answer = lookup.online_lookup(
        workspace=workspace,
        entities=["u7", "u1"],
        features=["user_profile:city", "user_profile:is_new", "user_profile:age"],
    )
    assert answer["rows"] == [["old", None, 70], ["c1", False, 21]]
