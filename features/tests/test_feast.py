"""Feast interoperability (features.feast): a registry dump imports as feature groups, and the
Feast-shaped online read answers what ``online-features/`` answers. The stock Feast client's
end-to-end run is in test_feast_stock_client.py."""

from __future__ import annotations

import copy
import json

import pytest

from features import ingestion
from features.models import FeatureGroup, FeatureGroupVersion
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member, make_workspace


def dump(*views: dict, entities: list[dict] | None = None) -> dict:
    """A registry in the shape `feast registry-dump` prints (protobuf's JSON mapping)."""
    return {
        "project": "shop",
        "entities": entities
        if entities is not None
        else [
            {"spec": {"name": "__dummy", "joinKey": "__dummy_id"}},
            {"spec": {"name": "user_id", "joinKey": "user_id", "valueType": "INT64"}},
            {"spec": {"name": "merchant", "joinKey": "merchant_id", "valueType": "STRING"}},
        ],
        "featureViews": list(views),
    }


def view(name: str = "user_stats", entities=("user_id",), features=None, **spec) -> dict:
    return {
        "spec": {
            "name": name,
            "entities": list(entities),
            "features": features
            or [
                {"name": "age", "valueType": "INT64"},
                {"name": "ctr", "valueType": "DOUBLE"},
                {"name": "city", "valueType": "STRING"},
                {"name": "recent_cats", "valueType": "STRING_LIST"},
                {"name": "emb", "valueType": "FLOAT_LIST", "vectorLength": 4},
            ],
            "ttl": "172800s",
            "online": True,
            "tags": {"team": "growth"},
            "batchSource": {
                "name": f"{name}_source",
                "type": "BATCH_FILE",
                "timestampField": "ts",
                "fileOptions": {"uri": "s3://bucket/users.parquet"},
            },
            **spec,
        }
    }


def import_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/feast/import/"


def online_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/feast/get-online-features"


@pytest.fixture
def developer(workspace):
    return make_member(workspace, Role.DEVELOPER)


def post_import(client_for, workspace, user, registry, **extra):
    return client_for(user).post(
        import_url(workspace), {"registry": registry, **extra}, format="json"
    )


def test_a_registry_dump_becomes_feature_groups(client_for, workspace, developer):
    response = post_import(client_for, workspace, developer, dump(view()))
    assert response.status_code == 201, response.content
    assert response.json()["feature_groups"] == [
        {
            "name": "user_stats",
            "outcome": "created",
            "version": 1,
            "entity": "user",
            "entity_keys": ["user_id"],
            "event_time_column": "ts",
            "features": 5,
        }
    ]
    group = FeatureGroup.objects.get(workspace=workspace, name="user_stats")
    assert group.entity_keys == ["user_id"] and group.event_time_column == "ts"
    assert group.freshness_sla_seconds == 172800 and group.online
    assert group.tags == ["feast", "team=growth"]
    assert "Feast project 'shop'" in group.description
    assert "s3://bucket/users.parquet" in group.description
    specs = {s["name"]: (s["dtype"], s["dimension"]) for s in group.versions.get().features}
    assert specs == {
        "age": ("int", None),
        "ctr": ("float", None),
        "city": ("string", None),
        "recent_cats": ("categorical_list", None),
        "emb": ("embedding", 4),
    }
    event = Event.objects.get(workspace=workspace, verb="feature_group.feast_imported")
    assert event.payload == {"project": "shop", "outcomes": {"user_stats": "created"}}


def test_importing_again_is_idempotent_and_a_changed_view_gets_a_new_version(
    client_for, workspace, developer
):
    assert post_import(client_for, workspace, developer, dump(view())).status_code == 201
    again = post_import(client_for, workspace, developer, dump(view()))
    assert again.json()["feature_groups"][0]["outcome"] == "unchanged"
    changed = view(features=[{"name": "age", "valueType": "INT64"}])
    response = post_import(client_for, workspace, developer, dump(changed))
    assert response.status_code == 201, response.content
    assert response.json()["feature_groups"][0] | {"features": 1} == {
        "name": "user_stats",
        "outcome": "new_version",
        "version": 2,
        "entity": "user",
        "entity_keys": ["user_id"],
        "event_time_column": "ts",
        "features": 1,
    }
    group = FeatureGroup.objects.get(workspace=workspace, name="user_stats")
    assert group.current_version == 2
    assert [s["name"] for s in group.versions.get(version=2).features] == ["age"]


def test_other_keys_for_an_existing_group_are_a_conflict_and_nothing_is_written(
    client_for, workspace, developer
):
    assert post_import(client_for, workspace, developer, dump(view())).status_code == 201
    rekeyed = view(entities=["merchant"])
    response = post_import(
        client_for,
        workspace,
        developer,
        dump(view(name="fresh_view"), rekeyed),
        entity_kinds={"merchant": "item"},
    )
    assert response.status_code == 409, response.content
    assert "featureViews.1.spec.entities" in json.dumps(response.json())
    assert "keyed by user_id" in json.dumps(response.json())
    assert not FeatureGroup.objects.filter(workspace=workspace, name="fresh_view").exists()


@pytest.mark.parametrize(
    ("registry", "extra", "field", "says"),
    [
        (
            dump(view(features=[{"name": "raw", "valueType": "BYTES"}])),
            {},
            "featureViews.0.spec.features.0.valueType",
            "INT64",
        ),
        (
            dump(view(features=[{"name": "emb", "valueType": "FLOAT_LIST"}])),
            {},
            "featureViews.0.spec.features.0.vectorLength",
            "vector_length",
        ),
        (dump(view(entities=["merchant"])), {}, "entity_kinds.merchant", "user, item"),
        (
            dump(view(entities=["merchant"])),
            {"entity_kinds": {"merchant": "shop"}},
            "entity_kinds",
            "shop",
        ),
        (dump(view(name="UserStats")), {}, "featureViews.0.spec.name", "UserStats"),
        (dump(view(entities=["__dummy"])), {}, "featureViews.0.spec.entities", "entity-less"),
        (dump(view(entities=["ghost"])), {}, "featureViews.0.spec.entities", "ghost"),
        (dump(view(), view()), {}, "featureViews.1.spec.name", "twice"),
        (
            dump(view(features=[{"name": "ts", "valueType": "INT64"}])),
            {},
            "featureViews.0.spec.features.0.name",
            "key or time column",
        ),
        ({"entities": []}, {}, "registry", "registry-dump"),
        (dump(view()), {"dry_run": "yes"}, "dry_run", "true or false"),
    ],
)
def test_what_cannot_be_imported_is_refused_naming_the_field(
    client_for, workspace, developer, registry, extra, field, says
):
    response = post_import(client_for, workspace, developer, registry, **extra)
    assert response.status_code == 400, response.content
    body = json.dumps(response.json())
    assert field in body and says in body, body
    assert not FeatureGroup.objects.filter(workspace=workspace).exists()


def test_a_dry_run_reports_without_writing(client_for, workspace, developer):
    response = post_import(client_for, workspace, developer, dump(view()), dry_run=True)
    assert response.status_code == 200, response.content
    assert response.json()["dry_run"] is True
    assert response.json()["feature_groups"][0]["outcome"] == "created"
    assert not FeatureGroup.objects.filter(workspace=workspace).exists()
    assert not FeatureGroupVersion.objects.filter(workspace=workspace).exists()


def test_viewers_cannot_import(client_for, workspace):
    viewer = make_member(workspace, Role.VIEWER)
    assert post_import(client_for, workspace, viewer, dump(view())).status_code == 403


def push(workspace, actor, name: str, rows: list[dict]) -> None:
    group = FeatureGroup.objects.get(workspace=workspace, name=name)
    ingestion.batch_ingest(
        actor=actor, group=group, body=json.dumps({"rows": rows}).encode(), format="json"
    )


def imported_with_rows(client_for, workspace, developer):
    features = [
        {"name": "age", "valueType": "INT64"},
        {"name": "ctr", "valueType": "DOUBLE"},
        {"name": "city", "valueType": "STRING"},
    ]
    assert (
        post_import(client_for, workspace, developer, dump(view(features=features))).status_code
        == 201
    )
    push(
        workspace,
        developer,
        "user_stats",
        [
            {"user_id": 1, "ts": "2026-11-01T00:00:00Z", "age": 31, "ctr": 0.25, "city": "a"},
            {"user_id": 2, "ts": "2026-11-01T00:00:00Z", "age": 42, "ctr": None, "city": "b"},
        ],
    )


def test_the_feast_shaped_read_answers_what_online_features_answers(
    client_for, workspace, developer
):
    imported_with_rows(client_for, workspace, developer)
    viewer = client_for(make_member(workspace, Role.VIEWER))
    refs = ["user_stats:age", "user_stats:ctr", "user_stats:city"]
    ours = viewer.post(
        f"/api/v1/workspaces/{workspace.slug}/online-features/",
        {"entities": [1, 2, 3], "features": refs},
        format="json",
    )
    feast = viewer.post(
        online_url(workspace), {"features": refs, "entities": {"user_id": [1, 2, 3]}}, format="json"
    )
    assert feast.status_code == 200, feast.content
    body = feast.json()
    assert body["metadata"]["feature_names"] == ["user_id", "age", "ctr", "city"]
    assert body["results"][0]["values"] == [1, 2, 3]
    columns = [r["values"] for r in body["results"][1:]]
    assert [list(row) for row in zip(*columns, strict=True)] == ours.json()["rows"]
    assert body["results"][1]["statuses"] == ["PRESENT", "PRESENT", "NOT_FOUND"]
    assert body["results"][2]["statuses"] == ["PRESENT", "NULL_VALUE", "NOT_FOUND"]
    full = viewer.post(
        online_url(workspace),
        {"features": refs[:1], "entities": {"user_id": [1]}, "full_feature_names": True},
        format="json",
    )
    assert full.json()["metadata"]["feature_names"] == ["user_id", "user_stats__age"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"features": ["user_stats:age"], "entities": {"user_id": []}}, "entities.user_id"),
        ({"features": ["user_stats:age"], "entities": [1]}, "entities"),
        ({"features": ["user_stats:nope"], "entities": {"user_id": [1]}}, "features.0"),
        ({"features": ["user_stats:age"], "entities": {"user_id": [1], "x": [1, 2]}}, "entities"),
        (
            {"feature_service": "svc", "features": [], "entities": {"user_id": [1]}},
            "feature_service",
        ),
        (
            {"features": ["user_stats:age"], "entities": {"user_id": [1]}, "full_feature_names": 1},
            "full_feature_names",
        ),
        ([1, 2], "features"),
    ],
)
def test_a_bad_feast_read_is_refused_naming_the_field(
    client_for, workspace, developer, body, field
):
    imported_with_rows(client_for, workspace, developer)
    response = client_for(developer).post(online_url(workspace), body, format="json")
    assert response.status_code in (400, 404), response.content
    assert field in json.dumps(response.json())


def test_another_workspace_reads_nothing(client_for, workspace, developer):
    imported_with_rows(client_for, workspace, developer)
    other = make_workspace()
    stranger = make_member(other, Role.ADMIN)
    body = {"features": ["user_stats:age"], "entities": {"user_id": [1]}}
    assert client_for(stranger).post(online_url(workspace), body, format="json").status_code == 404
    # in its own workspace, the name is no group of its
    own = client_for(stranger).post(online_url(other), body, format="json")
    assert own.status_code == 404 and "user_stats" in json.dumps(own.json())
    assert (
        client_for(stranger)
        .post(import_url(workspace), {"registry": dump(view())}, format="json")
        .status_code
        == 404
    )


def test_the_import_is_one_transaction(client_for, workspace, developer, monkeypatch):
    """A failure while writing the second view leaves the first unwritten."""
    from features import registry

    real = registry.feature_group_register
    calls = []

    def failing(**kwargs):
        calls.append(kwargs["name"])
        if len(calls) == 2:
            raise RuntimeError("disk gone")
        return real(**kwargs)

    monkeypatch.setattr(registry, "feature_group_register", failing)
    second = copy.deepcopy(view(name="other_stats"))
    with pytest.raises(RuntimeError):
        from features.feast import feast_import

        feast_import(actor=developer, workspace=workspace, document=dump(view(), second))
    assert calls == ["user_stats", "other_stats"]
    assert not FeatureGroup.objects.filter(workspace=workspace).exists()


def page_url(workspace) -> str:
    return f"/w/{workspace.slug}/features/import-feast/"


def test_the_import_page_previews_then_imports(client, workspace, developer):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(developer)
    listing = client.get(f"/w/{workspace.slug}/features/")
    assert page_url(workspace) in listing.content.decode()
    registry = json.dumps(dump(view(entities=["merchant"]))).encode()

    def post(action: str, kinds: str):
        upload = SimpleUploadedFile("registry.json", registry, content_type="application/json")
        return client.post(
            page_url(workspace), {"file": upload, "entity_kinds": kinds, "action": action}
        )

    refused = post("preview", "")
    assert refused.status_code == 400
    assert "say which kind the Feast entity &#x27;merchant&#x27; is" in refused.content.decode()
    preview = post("preview", "merchant=item")
    assert preview.status_code == 200
    assert "would be created" in preview.content.decode()
    assert not FeatureGroup.objects.filter(workspace=workspace).exists()
    done = post("import", "merchant=item")
    assert done.status_code == 201
    assert f"/w/{workspace.slug}/features/groups/user_stats/" in done.content.decode()
    group = FeatureGroup.objects.get(workspace=workspace, name="user_stats")
    assert group.entity == "item" and group.entity_keys == ["merchant_id"]
    bad = client.post(page_url(workspace), {"text": "{not json", "action": "preview"})
    assert bad.status_code == 400 and "This is not JSON" in bad.content.decode()
    lines = client.post(
        page_url(workspace), {"text": "{}", "entity_kinds": "merchant", "action": "preview"}
    )
    assert "write feast_entity=kind" in lines.content.decode()


def test_viewers_are_refused_the_import_page(client, workspace):
    client.force_login(make_member(workspace, Role.VIEWER))
    assert client.get(page_url(workspace)).status_code == 403
