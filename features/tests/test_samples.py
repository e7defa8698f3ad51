"""Training samples (F6): the point-in-time join against a brute-force reference, the datasets
API (coverage, consumers, versions, time windows, bad inputs) and the one-call sample stream."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from features import registry, samples
from features.ingestion import batch_ingest
from features.models import Consumer, Dataset, DatasetStatus, EntityKind, Feature
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
INGEST_NOW = T0 + timedelta(days=10)
_names = itertools.count(1)


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path) -> Path:
    # Each test its own store: SQLite reuses rolled-back ids, which would reuse offline paths.
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    return Path(settings.ARTIFACT_ROOT)


def register(workspace, name, keys, features, entity=EntityKind.USER):
    return registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name=name,
        entity=entity,
        entity_keys=keys,
        features=features,
        online=False,
    )


def ingest(actor, group, rows):
    body = json.dumps({"rows": rows}, default=lambda t: t.isoformat()).encode()
    return batch_ingest(actor=actor, group=group, body=body, format="json", now=INGEST_NOW)


def event_count() -> int:
    return Event.objects.unscoped().count()


# --- (a) the point-in-time join against a brute-force reference ------------------------------

# Seven ticks across midnight, so batches split into two date partitions and times tie often.
BASE = datetime(2025, 6, 1, 23, 59, 57, tzinfo=UTC)
USERS = ["u0", "u1", "u2"]
ITEMS = ["i0", "i1"]
tick = st.integers(0, 6)
maybe_int = st.none() | st.integers(-5, 5)
maybe_float = st.none() | st.floats(-100, 100, allow_nan=False, allow_infinity=False)
label_row = st.fixed_dictionaries(
    {"user_id": st.sampled_from(USERS), "item_id": st.sampled_from(ITEMS), "t": tick}
    | {"clicked": maybe_int}
)
user_row = st.fixed_dictionaries(
    {"user_id": st.sampled_from(USERS), "t": tick, "age": maybe_int, "score": maybe_float}
)
item_row = st.fixed_dictionaries(
    {"item_id": st.sampled_from(ITEMS), "t": tick, "price": maybe_float}
)
pair_row = st.fixed_dictionaries(
    {"user_id": st.sampled_from(USERS), "item_id": st.sampled_from(ITEMS), "t": tick}
    | {"affinity": maybe_float}
)


def batches(row, max_batches=3):
    return st.lists(st.lists(row, min_size=1, max_size=4), max_size=max_batches)


windows = st.tuples(st.none() | tick, st.none() | tick).filter(
    lambda w: w[0] is None or w[1] is None or w[0] < w[1]
)


def _at(t: int) -> datetime:
    return BASE + timedelta(seconds=t)


def _store(actor, group, batch_list, fields):
    """Ingest each batch; returns (batch id, position in batch, row) in ingestion order."""
    stored = []
    for rows in batch_list:
        payload = [
            {**{f: row[f] for f in fields}, "event_time": _at(row["t"]).isoformat()} for row in rows
        ]
        batch = ingest(actor, group, payload).batch
        stored.extend((batch.pk, position, row) for position, row in enumerate(rows))
    return stored


def _latest(stored, keys, label):
    """Brute force: the feature row at or before the label's time with the largest
    (time, batch, position); None when there is none."""
    candidates = [
        (row["t"], batch, position, row)
        for batch, position, row in stored
        if row["t"] <= label["t"] and all(row[k] == label[k] for k in keys)
    ]
    return max(candidates, key=lambda c: c[:3])[3] if candidates else None


@pytest.mark.one_backend  # the join runs in DuckDB on offline files
@hypothesis_settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    label_batches=batches(label_row, max_batches=2),
    user_batches=batches(user_row),
    item_batches=batches(item_row, max_batches=2),
    pair_batches=batches(pair_row, max_batches=2),
    window=windows,
)
@example(  # the tie rules, spelled out: whatever the random draws cover, these always run
    label_batches=[
        [
            {"user_id": "u0", "item_id": "i0", "t": 1, "clicked": 1},
            {"user_id": "u0", "item_id": "i1", "t": 2, "clicked": 0},
            {"user_id": "u1", "item_id": "i0", "t": 0, "clicked": None},
        ]
    ],
    user_batches=[
        [  # two rows for u0 at t=1 in one batch: the last one counts
            {"user_id": "u0", "t": 1, "age": 1, "score": None},
            {"user_id": "u0", "t": 1, "age": 2, "score": 0.5},
        ],
        [{"user_id": "u0", "t": 2, "age": None, "score": 1.5}],
        [{"user_id": "u0", "t": 2, "age": 7, "score": None}],  # same time, later batch: counts
    ],
    item_batches=[[{"item_id": "i0", "t": 5, "price": 1.0}]],  # after every label: unseen
    pair_batches=[],
    window=(None, None),
)
def test_point_in_time_join_matches_brute_force(
    workspace, members, label_batches, user_batches, item_batches, pair_batches, window
):
    actor = members[Role.DEVELOPER]
    n = next(_names)
    labels = register(
        workspace,
        f"impressions_{n}",
        ["user_id", "item_id"],
        [{"name": "clicked", "dtype": "int"}],
        EntityKind.LABEL,
    )
    users = register(
        workspace,
        f"users_{n}",
        ["user_id"],
        [{"name": "age", "dtype": "int"}, {"name": "score", "dtype": "float"}],
    )
    items = register(workspace, f"items_{n}", ["item_id"], [{"name": "price", "dtype": "float"}])
    pairs = register(
        workspace, f"pairs_{n}", ["user_id", "item_id"], [{"name": "affinity", "dtype": "float"}]
    )
    stored_labels = _store(actor, labels, label_batches, ["user_id", "item_id", "clicked"])
    sources = [
        (users, ["user_id"], _store(actor, users, user_batches, ["user_id", "age", "score"])),
        (items, ["item_id"], _store(actor, items, item_batches, ["item_id", "price"])),
        (
            pairs,
            ["user_id", "item_id"],
            _store(actor, pairs, pair_batches, ["user_id", "item_id", "affinity"]),
        ),
    ]
    features = {users: ["age", "score"], items: ["price"], pairs: ["affinity"]}
    start, end = window

    dataset = samples.dataset_create(
        actor=actor,
        workspace=workspace,
        name=f"sample_{n}",
        label_group=labels,
        label_columns=["clicked"],
        feature_refs=[f"{g.name}:{f}" for g, names in features.items() for f in names],
        start_time=None if start is None else _at(start),
        end_time=None if end is None else _at(end),
    )

    assert dataset.status == DatasetStatus.READY, dataset.error
    in_window = sorted(
        (
            (row["t"], batch, position, row)
            for batch, position, row in stored_labels
            if (start is None or row["t"] >= start) and (end is None or row["t"] < end)
        ),
        key=lambda c: c[:3],
    )
    expected = []
    for _, _, _, label in in_window:
        row = {
            "user_id": label["user_id"],
            "item_id": label["item_id"],
            "event_time": _at(label["t"]),
            "clicked": label["clicked"],
        }
        for group, keys, stored in sources:
            found = _latest(stored, keys, label)
            for feature in features[group]:
                row[f"{group.name}__{feature}"] = None if found is None else found[feature]
        expected.append(row)

    table = pq.read_table(samples.dataset_file(dataset))
    assert table.column_names == samples.dataset_columns(dataset)
    if expected:
        assert table.column_names == list(expected[0])
    assert table.to_pylist() == expected
    assert dataset.row_count == len(expected)
    for group, names in features.items():
        for feature in names:
            column = f"{group.name}__{feature}"
            present = sum(row[column] is not None for row in expected)
            share = present / len(expected) if expected else None
            assert dataset.coverage[f"{group.name}:{feature}"] == share


# --- (b) the datasets API ------------------------------------------------------------------


@pytest.fixture
def scene(workspace, members):
    """Impressions with click labels, a user group and an item group, with hand-made data."""
    developer = members[Role.DEVELOPER]
    impressions = register(
        workspace,
        "impressions",
        ["user_id", "item_id"],
        [{"name": "clicked", "dtype": "int"}, {"name": "dwell", "dtype": "float"}],
        EntityKind.LABEL,
    )
    users = register(
        workspace,
        "users",
        ["user_id"],
        [{"name": "age", "dtype": "int"}, {"name": "segment", "dtype": "string"}],
    )
    items = register(workspace, "items", ["item_id"], [{"name": "price", "dtype": "float"}])
    register(workspace, "sessions", ["session_id"], [{"name": "length", "dtype": "int"}])
    hour = timedelta(hours=1)
    ingest(
        developer,
        users,
        [
            {"user_id": "u1", "event_time": T0, "age": 30, "segment": "a"},
            {"user_id": "u2", "event_time": T0, "age": None, "segment": "b"},
            {"user_id": "u1", "event_time": T0 + 2 * hour, "age": 31, "segment": "a"},
        ],
    )
    ingest(
        developer,
        items,
        [
            {"item_id": "i1", "event_time": T0, "price": 9.5},
            {"item_id": "i2", "event_time": T0 + 2 * hour, "price": 20.0},
        ],
    )
    ingest(
        developer,
        impressions,
        [
            {"user_id": "u1", "item_id": "i1", "event_time": T0 - hour, "clicked": 0},
            {"user_id": "u1", "item_id": "i1", "event_time": T0 + hour, "clicked": 1},
            {"user_id": "u2", "item_id": "i1", "event_time": T0 + hour, "clicked": 0},
            {"user_id": "u3", "item_id": "i2", "event_time": T0 + hour, "clicked": 1},
            {"user_id": "u1", "item_id": "i2", "event_time": T0 + 3 * hour, "clicked": 0},
        ],
    )
    return {"impressions": impressions, "users": users, "items": items}


def create_body(**overrides):
    body = {
        "name": "clicks",
        "label_source": "impressions",
        "label_columns": ["clicked"],
        "features": ["users:age", "items:price"],
    }
    return body | overrides


def url(workspace, rest=""):
    return f"/api/v1/workspaces/{workspace.slug}/{rest}"


@pytest.fixture
def build(eager_celery, django_capture_on_commit_callbacks):
    """POST a dataset through the API, then run its queued build as a worker would (eagerly,
    after the commit); returns the 202 response and the dataset as the API shows it after."""

    def post(client, workspace, body):
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(url(workspace, "datasets/"), body, format="json")
        assert response.status_code == 202, response.content
        return response, client.get(response["Location"]).json()

    return post


def test_create_dataset_joins_point_in_time_with_coverage(
    workspace, members, scene, client_for, artifact_root, build
):
    client = client_for(members[Role.DEVELOPER])
    response, body = build(client, workspace, create_body())

    # The request only queues the build: 202, the dataset building, where to poll it.
    queued = response.json()
    assert response["Location"] == url(workspace, f"datasets/{queued['id']}/")
    assert (queued["status"], queued["row_count"], queued["progress"]) == ("building", 0, 0.0)
    assert (queued["rows_total"], queued["rows_done"]) == (None, 0)
    assert body["id"] == queued["id"]
    assert body["status"] == "ready"
    assert (body["rows_total"], body["rows_done"], body["progress"]) == (5, 5, 1.0)
    assert body["version"] == 1
    assert body["row_count"] == 5
    assert body["coverage"] == {"users:age": pytest.approx(2 / 5), "items:price": 3 / 5}
    assert body["path"] == f"datasets/ws={workspace.pk}/clicks/v=1/data"
    assert (body["partitions_total"], body["partitions_done"]) == (1, 1)
    assert body["columns"] == [
        *("user_id", "item_id", "event_time", "clicked"),
        *("users__age", "items__price"),
    ]
    assert str(artifact_root) not in json.dumps(body)

    rows = pq.read_table(artifact_root / body["path"]).to_pylist()
    hour = timedelta(hours=1)
    features = ("users__age", "items__price")
    assert [
        tuple(r[c] for c in ("user_id", "item_id", "event_time", "clicked", *features))
        for r in rows
    ] == [
        ("u1", "i1", T0 - hour, 0, None, None),  # before any feature value
        ("u1", "i1", T0 + hour, 1, 30, 9.5),  # not the later age 31
        ("u2", "i1", T0 + hour, 0, None, 9.5),  # the latest value is null
        ("u3", "i2", T0 + hour, 1, None, None),  # no rows for u3; i2's price comes later
        ("u1", "i2", T0 + 3 * hour, 0, 31, 20.0),
    ]

    detail = client.get(url(workspace, f"datasets/{body['id']}/"))
    assert detail.status_code == 200
    assert detail.json() == body
    listed = client.get(url(workspace, "datasets/")).json()
    assert [d["id"] for d in listed["results"]] == [body["id"]]

    consumers = Consumer.objects.for_workspace(workspace).filter(
        kind="dataset", object_id=str(body["id"])
    )
    assert {(c.group.name, c.feature_name, c.live) for c in consumers} == {
        ("users", "age", True),
        ("items", "price", True),
        ("impressions", "clicked", True),
    }
    verbs = list(
        Event.objects.for_workspace(workspace)
        .filter(verb__startswith="dataset.")
        .order_by("id")
        .values_list("verb", flat=True)
    )
    assert verbs == ["dataset.created", "dataset.built"]
    built = Event.objects.for_workspace(workspace).get(verb="dataset.built")
    assert built.resources["rows"] == 5
    part = artifact_root / body["path"] / "part-00000.parquet"
    assert built.resources["bytes"] == part.stat().st_size
    assert built.payload["partitions"] == 1


def test_retiring_a_feature_a_dataset_uses_is_a_conflict(
    workspace, members, scene, client_for, build
):
    _response, created = build(client_for(members[Role.DEVELOPER]), workspace, create_body())
    assert created["status"] == "ready"

    response = client_for(members[Role.MAINTAINER]).patch(
        url(workspace, "feature-groups/users/features/age/"), {"status": "retired"}, format="json"
    )

    assert response.status_code == 409, response.content
    assert "dataset clicks v1" in response.json()["detail"]
    assert (
        Feature.objects.for_workspace(workspace).get(group__name="users", name="age").status
        == "active"
    )


def test_a_sample_over_three_days_is_three_parts_and_downloads_as_one_file(
    workspace, members, scene, client_for, build, settings
):
    """A part per label day (``OFFLINE_PARTITION_ROWS=0``): the parts hold their days' rows in
    order, training's reader takes the folder, and ``file/`` answers one Parquet file."""
    from training.data import read_table

    settings.OFFLINE_PARTITION_ROWS = 0
    day = timedelta(days=1)
    ingest(
        members[Role.DEVELOPER],
        scene["impressions"],
        [
            {"user_id": "u2", "item_id": "i2", "event_time": T0 + day, "clicked": 1},
            {"user_id": "u1", "item_id": "i1", "event_time": T0 + 2 * day, "clicked": 0},
        ],
    )
    client = client_for(members[Role.DEVELOPER])
    _, body = build(client, workspace, create_body())
    assert (body["row_count"], body["partitions_total"], body["partitions_done"]) == (7, 3, 3)
    dataset = Dataset.objects.for_workspace(workspace).get(pk=body["id"])
    folder = samples.dataset_file(dataset)
    parts = samples.sample_files(folder)
    assert [p.name for p in parts] == [f"part-0000{i}.parquet" for i in range(3)]
    assert [pq.read_metadata(p).num_rows for p in parts] == [5, 1, 1]
    whole = samples.dataset_table(folder)
    assert whole.column("event_time").to_pylist() == sorted(whole.column("event_time").to_pylist())
    assert body["columns"] == whole.column_names
    assert (
        read_table(folder, ["clicked"]).column("clicked").to_pylist()
        == whole.column("clicked").to_pylist()
    )

    response = client.get(url(workspace, f"datasets/{body['id']}/file/"))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/vnd.apache.parquet"
    downloaded = pq.read_table(pa.BufferReader(b"".join(response.streaming_content)))
    assert downloaded.equals(pq.read_table(folder))


def test_a_later_version_of_the_same_name_increments(workspace, members, scene, client_for, build):
    client = client_for(members[Role.DEVELOPER])
    _, first = build(client, workspace, create_body())
    _, second = build(client, workspace, create_body(features=["users:segment"]))
    _, other = build(client, workspace, create_body(name="other"))

    assert (first["version"], second["version"], other["version"]) == (1, 2, 1)
    assert second["path"].endswith("/clicks/v=2/data")
    assert second["coverage"] == {"users:segment": 3 / 5}
    names = client.get(url(workspace, "datasets/?name=clicks")).json()["results"]
    assert [(d["name"], d["version"]) for d in names] == [("clicks", 2), ("clicks", 1)]


def test_start_and_end_time_filter_labels(
    workspace, members, scene, client_for, artifact_root, build
):
    client = client_for(members[Role.DEVELOPER])
    hour = timedelta(hours=1)
    _response, body = build(
        client,
        workspace,
        # end is exclusive: the label at exactly T0 + 3h is left out, as is the one before T0
        create_body(start_time=T0.isoformat(), end_time=(T0 + 3 * hour).isoformat()),
    )

    assert body["row_count"] == 3
    rows = pq.read_table(artifact_root / body["path"]).to_pylist()
    assert {r["event_time"] for r in rows} == {T0 + hour}
    assert body["coverage"] == {"users:age": 1 / 3, "items:price": 2 / 3}


def test_create_ignores_fields_it_does_not_take(workspace, members, scene, client_for, build):
    _response, body = build(
        client_for(members[Role.DEVELOPER]),
        workspace,
        create_body(
            version=99, status="failed", row_count=7, rows_done=9, path="/etc/passwd", workspace=1
        ),
    )
    assert (body["version"], body["status"], body["row_count"]) == (1, "ready", 5)
    assert body["path"].startswith(f"datasets/ws={workspace.pk}/clicks/")


def _more_groups(workspace):
    """A retired group."""
    group = registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="old_users",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[{"name": "age", "dtype": "int"}],
    )
    registry.feature_group_set_status(actor=None, group=group, status="retired")


BAD_INPUTS = {
    "unknown label column": ({"label_columns": ["nope"]}, "label_columns.0", "no column 'nope'"),
    "key as label column": ({"label_columns": ["user_id"]}, "label_columns.0", "no column"),
    "duplicate label column": (
        {"label_columns": ["clicked", "clicked"]},
        "label_columns.1",
        "duplicate",
    ),
    "malformed ref": ({"features": ["users.age"]}, "features.0", "group:feature"),
    "retired group": ({"features": ["old_users:age"]}, "features.0", "retired"),
    "label source lacks a join key": (
        {"features": ["users:age", "sessions:length"]},
        "features.1",
        "session_id",
    ),
    "duplicate ref": ({"features": ["users:age", "users:age"]}, "features.1", "users__age"),
    "no features": ({"features": []}, "features", None),
    "no label columns": ({"label_columns": []}, "label_columns", None),
    "bad name": ({"name": "Bad Name"}, "name", None),
    "path in name": ({"name": "../../etc"}, "name", None),
    "end before start": (
        {"start_time": "2025-06-02T00:00:00Z", "end_time": "2025-06-01T00:00:00Z"},
        "end_time",
        "after",
    ),
    "time without zone is not a time": ({"start_time": "yesterday"}, "start_time", None),
    "features not a list": ({"features": "users:age"}, "features", None),
}
# References to what the workspace does not have: 404 naming the field (another workspace's
# object answers the same, test_another_workspaces_groups_are_not_found).
NOT_FOUND = {
    "unknown feature": ({"features": ["users:nope"]}, "features.0", "no feature 'users:nope'"),
    "unknown group": ({"features": ["ghost:age"]}, "features.0", "no feature group 'ghost'"),
    "unknown version": ({"features": ["users@v7:age"]}, "features.0", "no version 7"),
    "unknown label source": ({"label_source": "ghost"}, "label_source", "no feature group"),
}


def written() -> tuple[int, int, int]:
    return event_count(), Dataset.objects.unscoped().count(), Consumer.objects.unscoped().count()


@pytest.mark.parametrize(("overrides", "attr", "says"), BAD_INPUTS.values(), ids=BAD_INPUTS)
def test_bad_inputs_answer_400_and_write_nothing(
    workspace, members, scene, client_for, artifact_root, overrides, attr, says
):
    _more_groups(workspace)
    client = client_for(members[Role.DEVELOPER])
    before = written()

    response = client.post(url(workspace, "datasets/"), create_body(**overrides), format="json")

    assert response.status_code == 400, response.content
    assert response.json()["attr"] == attr
    if says:
        assert says in response.json()["detail"]
    assert written() == before
    assert not (artifact_root / "datasets").exists()


@pytest.mark.parametrize(("overrides", "attr", "says"), NOT_FOUND.values(), ids=NOT_FOUND)
def test_unknown_references_answer_404_naming_the_field_and_write_nothing(
    workspace, members, scene, client_for, artifact_root, overrides, attr, says
):
    client = client_for(members[Role.DEVELOPER])
    before = written()

    response = client.post(url(workspace, "datasets/"), create_body(**overrides), format="json")

    assert response.status_code == 404, response.content
    assert response.json()["type"] == "not_found"
    assert response.json()["attr"] == attr
    assert says in response.json()["detail"]
    assert written() == before
    assert not (artifact_root / "datasets").exists()


def test_another_workspaces_groups_are_not_found(
    workspace, other_workspace, members, scene, client_for, artifact_root
):
    register(
        other_workspace,
        "foreign_labels",
        ["user_id", "item_id"],
        [{"name": "clicked", "dtype": "int"}],
        EntityKind.LABEL,
    )
    register(other_workspace, "foreign_users", ["user_id"], [{"name": "age", "dtype": "int"}])
    client = client_for(members[Role.DEVELOPER])
    before = (event_count(), Dataset.objects.unscoped().count())

    as_label = client.post(
        url(workspace, "datasets/"), create_body(label_source="foreign_labels"), format="json"
    )
    as_feature = client.post(
        url(workspace, "datasets/"), create_body(features=["foreign_users:age"]), format="json"
    )

    assert as_label.status_code == 404
    assert (as_label.json()["attr"], as_label.json()["detail"]) == (
        "label_source",
        "no feature group 'foreign_labels'",
    )
    assert as_feature.status_code == 404
    assert as_feature.json()["attr"] == "features.0"
    assert "no feature group 'foreign_users'" in as_feature.json()["detail"]
    assert (event_count(), Dataset.objects.unscoped().count()) == before
    assert not (artifact_root / "datasets").exists()


def test_another_workspaces_dataset_is_not_found(
    workspace, other_workspace, members, scene, client_for
):
    created = client_for(members[Role.DEVELOPER]).post(
        url(workspace, "datasets/"), create_body(), format="json"
    )
    stranger = make_member(other_workspace, Role.ADMIN)
    response = client_for(stranger).get(url(other_workspace, f"datasets/{created.json()['id']}/"))
    assert response.status_code == 404


def test_dataset_list_queries_do_not_grow(
    workspace, members, scene, client_for, django_assert_max_num_queries
):
    client = client_for(members[Role.DEVELOPER])
    for name in ("a_set", "b_set", "c_set", "d_set"):
        assert client.post(url(workspace, "datasets/"), create_body(name=name), format="json")
    with django_assert_max_num_queries(8):
        response = client.get(url(workspace, "datasets/"))
    assert response.json()["count"] == 4


def test_build_is_idempotent_and_a_failure_is_recorded(
    workspace, members, scene, monkeypatch, artifact_root
):
    ready = samples.dataset_create(
        actor=members[Role.DEVELOPER],
        workspace=workspace,
        name="clicks",
        label_group=scene["impressions"],
        label_columns=["clicked"],
        feature_refs=["users:age"],
    )
    before = event_count()
    assert samples.dataset_build(ready.pk).status == DatasetStatus.READY
    assert event_count() == before  # a redelivered build changes nothing

    def broken(dataset):
        raise OSError(f"disk full writing {artifact_root}/datasets/x")

    monkeypatch.setattr(samples, "_write_file", broken)
    failed = samples.dataset_create(
        actor=members[Role.DEVELOPER],
        workspace=workspace,
        name="clicks",
        label_group=scene["impressions"],
        label_columns=["clicked"],
        feature_refs=["users:age"],
    )

    assert failed.status == DatasetStatus.FAILED
    assert "disk full" in failed.error
    assert str(artifact_root) not in failed.error
    assert Event.objects.for_workspace(workspace).filter(verb="dataset.failed").count() == 1
    assert not Consumer.objects.for_workspace(workspace).filter(
        kind="dataset", object_id=str(failed.pk), live=True
    )
    assert Consumer.objects.for_workspace(workspace).filter(
        kind="dataset", object_id=str(ready.pk), live=True
    )


def test_groups_without_data_give_typed_empty_columns(workspace, members, scene):
    developer = members[Role.DEVELOPER]
    vectors = [
        {"name": "vec", "dtype": "embedding", "dimension": 2},
        {"name": "tier", "dtype": "categorical"},
    ]
    register(workspace, "empty_users", ["user_id"], vectors)
    embedded = register(workspace, "embedded_users", ["user_id"], vectors)
    ingest(developer, embedded, [{"user_id": "u1", "event_time": T0, "vec": [0.5, -1.0]}])

    dataset = samples.dataset_create(
        actor=developer,
        workspace=workspace,
        name="vectors",
        label_group=scene["impressions"],
        label_columns=["clicked", "dwell"],
        feature_refs=["empty_users:vec", "empty_users:tier", "embedded_users:vec"],
    )

    assert dataset.status == DatasetStatus.READY, dataset.error
    # A plain PyArrow read works (no fixed_size_list with null rows in the file) ...
    stored = pq.read_table(samples.dataset_file(dataset))
    assert stored.schema.field("embedded_users__vec").type == pa.list_(pa.float32())
    assert stored.schema.field("embedded_users__vec").metadata == {b"dimension": b"2"}
    assert stored.column("embedded_users__vec").null_count == 3
    # ... and the dataset reader gives each embedding its fixed size back.
    table = samples.dataset_table(samples.dataset_file(dataset))
    assert table.schema.field("empty_users__vec").type == pa.list_(pa.float32(), 2)
    assert table.schema.field("empty_users__tier").type == pa.string()
    assert table.schema.field("embedded_users__vec").type == pa.list_(pa.float32(), 2)
    assert table.column("empty_users__vec").null_count == 5
    assert table.column("embedded_users__vec").to_pylist() == [
        *(None, [0.5, -1.0], None, None),  # u1 at T0 - 1h, then at T0 + 1h ...
        [0.5, -1.0],
    ]
    assert table.column("dwell").to_pylist() == [None] * 5
    assert dataset.coverage == {
        "empty_users:vec": 0.0,
        "empty_users:tier": 0.0,
        "embedded_users:vec": 2 / 5,
    }


def test_a_label_source_without_data_gives_an_empty_dataset(workspace, members, scene):
    labels = register(
        workspace,
        "no_labels_yet",
        ["user_id", "item_id"],
        [{"name": "clicked", "dtype": "bool"}],
        EntityKind.LABEL,
    )
    dataset = samples.dataset_create(
        actor=members[Role.DEVELOPER],
        workspace=workspace,
        name="nothing",
        label_group=labels,
        label_columns=["clicked"],
        feature_refs=["users:age", "items:price"],
    )
    assert dataset.status == DatasetStatus.READY, dataset.error
    assert (dataset.row_count, dataset.coverage) == (0, {"users:age": None, "items:price": None})
    table = pq.read_table(samples.dataset_file(dataset))
    assert table.num_rows == 0
    assert table.column_names == [
        *("user_id", "item_id", "event_time", "clicked"),
        *("users__age", "items__price"),
    ]
    assert table.schema.field("clicked").type == pa.bool_()


# --- (c) the workspace's default sample stream ---------------------------------------------------


def test_sample_stream_gains_a_feature_in_one_call(workspace, members, scene, client_for):
    client = client_for(members[Role.DEVELOPER])
    path = url(workspace, "sample-stream/features/")

    first = client.post(path, {"feature": "users:age"}, format="json")
    again = client.post(path, {"feature": "users:age"}, format="json")
    second = client.post(path, {"feature": "items:price"}, format="json")

    assert first.status_code == 200, first.content
    assert first.json()["sample_stream"]["features"] == ["users:age"]
    assert again.json()["sample_stream"]["features"] == ["users:age"]
    assert second.json()["sample_stream"]["features"] == ["users:age", "items:price"]
    assert second.json()["model"] == workspace.template["model"]
    workspace.refresh_from_db()
    assert workspace.template["sample_stream"]["features"] == ["users:age", "items:price"]
    assert Event.objects.for_workspace(workspace).filter(verb="workspace.changed").count() == 2
    stream_consumers = Consumer.objects.for_workspace(workspace).filter(kind="sample_stream")
    assert {(c.group.name, c.feature_name, c.object_id) for c in stream_consumers} == {
        ("users", "age", workspace.slug),
        ("items", "price", workspace.slug),
    }

    pinned = client.post(path, {"feature": "users@v1:age"}, format="json")
    assert pinned.json()["sample_stream"]["features"] == ["users@v1:age", "items:price"]

    retire = client_for(members[Role.MAINTAINER]).patch(
        url(workspace, "feature-groups/items/features/price/"),
        {"status": "retired"},
        format="json",
    )
    assert retire.status_code == 409
    assert "sample stream" in retire.json()["detail"]


@pytest.mark.parametrize(
    ("feature", "status", "says"),
    [
        ("users:nope", 404, "no feature 'users:nope'"),
        ("ghost:age", 404, "no feature group 'ghost'"),
        ("users age", 400, "group:feature"),
        ("", 400, None),
    ],
)
def test_sample_stream_refuses_bad_refs(
    workspace, members, scene, client_for, feature, status, says
):
    client = client_for(members[Role.DEVELOPER])
    before = event_count()
    response = client.post(
        url(workspace, "sample-stream/features/"), {"feature": feature}, format="json"
    )
    assert response.status_code == status
    assert response.json()["attr"] == "feature"
    if says:
        assert says in response.json()["detail"]
    assert event_count() == before


def test_sample_stream_refuses_a_feature_its_label_source_cannot_join(
    workspace, members, scene, client_for
):
    template = {**workspace.template, "sample_stream": {"label_source": "impressions"}}
    workspace.template = template
    workspace.save(update_fields=["template"])
    client = client_for(members[Role.DEVELOPER])

    joined = client.post(url(workspace, "sample-stream/features/"), {"feature": "users:age"})
    refused = client.post(url(workspace, "sample-stream/features/"), {"feature": "sessions:length"})

    assert joined.status_code == 200, joined.content
    assert refused.status_code == 400
    assert "session_id" in refused.json()["detail"]


# --- (c) background builds and their progress ------------------------------------------------


def _create(workspace, members, scene, **extra):
    return samples.dataset_create(
        actor=members[Role.DEVELOPER],
        workspace=workspace,
        name="clicks",
        label_group=scene["impressions"],
        label_columns=["clicked"],
        feature_refs=["users:age", "items:price"],
        **extra,
    )


def test_a_background_build_is_queued_after_the_commit_and_records_its_progress(
    workspace, members, scene, monkeypatch, eager_celery, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(samples, "READ_BATCH_ROWS", 2)  # several chunks from five rows
    seen, parts = [], []
    record = samples._record_progress

    def spy(dataset_id, **fields):
        record(dataset_id, **fields)
        stored = Dataset.objects.unscoped().get(pk=dataset_id)
        if "rows_done" in fields:
            seen.append((stored.status, stored.rows_total, stored.rows_done))
        else:
            parts.append((stored.partitions_total, stored.partitions_done))

    monkeypatch.setattr(samples, "_record_progress", spy)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        dataset = _create(workspace, members, scene, background=True)
    assert dataset.status == DatasetStatus.BUILDING
    assert (dataset.rows_total, dataset.rows_done, dataset.progress) == (None, 0, 0.0)
    builds = builds_of(queued)
    assert len(builds) == 1 and seen == []  # nothing runs before the commit

    builds[0]()  # the commit: the task is sent (and, eagerly, run)

    assert seen[0] == ("building", 5, 0)  # counted before the join
    assert len(seen) > 2 and seen[-1] == ("building", 5, 5)
    assert [done for _, _, done in seen] == sorted(done for _, _, done in seen)
    assert parts == [(1, 0), (1, 1)]  # five labels on one day: one part
    dataset.refresh_from_db()
    assert (dataset.status, dataset.row_count, dataset.rows_total, dataset.rows_done) == (
        "ready",
        5,
        5,
        5,
    )
    assert dataset.progress == 1.0


def test_a_build_that_cannot_be_queued_fails_with_the_reason(
    workspace, members, scene, monkeypatch, django_capture_on_commit_callbacks
):
    from features import tasks

    def refuse(*args, **kwargs):
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(tasks.dataset_build_task, "apply_async", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        dataset = _create(workspace, members, scene, background=True)

    dataset.refresh_from_db()
    assert dataset.status == DatasetStatus.FAILED
    assert dataset.error == (
        "the build could not be queued (ConnectionRefusedError); create the dataset again"
    )
    assert not Consumer.objects.for_workspace(workspace).filter(
        kind="dataset", object_id=str(dataset.pk), live=True
    )


def test_the_build_task_is_idempotent(workspace, members, scene):
    from features import tasks

    dataset = _create(workspace, members, scene)  # built synchronously (the pipeline's path)
    assert dataset.status == DatasetStatus.READY
    before = event_count()
    assert tasks.dataset_build_task.apply(args=[dataset.pk]).get() == "ready"
    assert tasks.dataset_build_task.apply(args=[10**9]).get() is None
    assert event_count() == before


# --- (d) the preview: counts before anything is built ----------------------------------------


def test_preview_gives_the_builds_row_count_and_coverage_and_writes_nothing(
    workspace, members, scene, artifact_root
):
    before = written()
    preview = samples.dataset_preview(
        workspace=workspace,
        label_group=scene["impressions"],
        label_columns=["clicked"],
        feature_refs=["users:age", "items:price"],
    )
    hour = timedelta(hours=1)
    window = samples.dataset_preview(
        workspace=workspace,
        label_group=scene["impressions"],
        label_columns=["clicked"],
        feature_refs=["users:age", "items:price"],
        start_time=T0,
        end_time=T0 + 3 * hour,
    )

    # The same numbers test_create_dataset_joins_point_in_time_with_coverage gets by building.
    assert (preview.label_rows, preview.sampled_rows, preview.exact) == (5, 5, True)
    assert preview.coverage == {"users:age": pytest.approx(2 / 5), "items:price": 3 / 5}
    assert (window.label_rows, window.coverage) == (
        3,
        {"users:age": pytest.approx(1 / 3), "items:price": pytest.approx(2 / 3)},
    )
    assert written() == before
    assert not (artifact_root / "datasets").exists()


def test_preview_measures_coverage_on_a_bounded_reproducible_sample(workspace, members, scene):
    def preview():
        return samples.dataset_preview(
            workspace=workspace,
            label_group=scene["impressions"],
            label_columns=["clicked"],
            feature_refs=["users:age", "items:price"],
            sample_rows=2,
        )

    first = preview()
    assert (first.label_rows, first.sampled_rows, first.exact) == (5, 2, False)
    assert preview() == first  # the same sample each time


@pytest.mark.parametrize(
    ("overrides", "attr"),
    [
        ({"label_columns": ["nope"]}, "label_columns.0"),
        ({"feature_refs": ["users:age", "sessions:length"]}, "features.1"),
        ({"start_time": T0, "end_time": T0}, "end_time"),
    ],
)
def test_preview_refuses_what_create_refuses(workspace, members, scene, overrides, attr):
    from django.core.exceptions import ValidationError

    arguments = {
        "workspace": workspace,
        "label_group": scene["impressions"],
        "label_columns": ["clicked"],
        "feature_refs": ["users:age"],
    } | overrides
    with pytest.raises(ValidationError) as refused:
        samples.dataset_preview(**arguments)
    assert attr in refused.value.message_dict


def test_the_preview_api_answers_the_numbers_and_writes_nothing(
    workspace, members, scene, client_for, artifact_root
):
    client = client_for(members[Role.DEVELOPER])
    before = written()
    body = create_body()
    del body["name"]

    response = client.post(url(workspace, "datasets/preview/"), body, format="json")
    refused = client.post(
        url(workspace, "datasets/preview/"), create_body(label_columns=["nope"]), format="json"
    )

    assert response.status_code == 200, response.content
    assert response.json() == {
        "label_rows": 5,
        "sampled_rows": 5,
        "exact": True,
        "coverage": {"users:age": pytest.approx(2 / 5), "items:price": 3 / 5},
    }
    assert refused.status_code == 400
    assert refused.json()["attr"] == "label_columns.0"
    assert written() == before
    assert not (artifact_root / "datasets").exists()


def builds_of(callbacks: list) -> list:
    """The on-commit callbacks other than the event-log consumers' drain (queued by every
    transaction that writes events)."""
    return [cb for cb in callbacks if getattr(cb, "__name__", "") != "_enqueue_drain"]


# The engines read and write offline files: the database under the metadata changes nothing here.
@pytest.mark.one_backend
def test_a_build_on_spark_writes_the_same_file_as_on_duckdb(workspace, members, scene, settings):
    """``OFFLINE_ENGINE=spark`` (local mode) builds the same sample as the default engine, and the
    build's event says which engine ran it."""
    from features.offline_engine import spark_stop

    def built(name: str, engine: str) -> tuple[Dataset, pa.Table]:
        settings.OFFLINE_ENGINE = engine
        dataset = samples.dataset_create(
            actor=members[Role.DEVELOPER],
            workspace=workspace,
            name=name,
            label_group=scene["impressions"],
            label_columns=["clicked", "dwell"],
            feature_refs=["users:age", "users:segment", "items:price"],
            start_time=T0 - timedelta(minutes=30),
        )
        assert dataset.status == DatasetStatus.READY, dataset.error
        return dataset, pq.read_table(samples.dataset_file(dataset))

    try:
        on_duckdb, duckdb_table = built("on_duckdb", "duckdb")
        on_spark, spark_table = built("on_spark", "spark")
    finally:
        spark_stop()
    assert spark_table.num_rows == 4  # the label before the window's start is left out
    assert spark_table.to_pylist() == duckdb_table.to_pylist()
    assert on_spark.coverage == on_duckdb.coverage
    engines = {
        event.payload["name"]: event.payload["engine"]
        for event in Event.objects.for_workspace(workspace).filter(verb="dataset.built")
    }
    assert engines == {"on_duckdb": "duckdb", "on_spark": "spark"}
