"""The ``categorical_list`` dtype: a row holds a list of categories (a user's recent ad
categories). Pushed as JSON, Parquet or CSV, stored as ``list<string>`` offline and served online
as a JSON list; a bad value is a 400 naming its column; a dataset build carries the lists through
the point-in-time join; drift skips it."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import health, offline_store, samples
from features.ingestion import MAX_LIST_ITEMS, batch_ingest
from features.lookup import online_lookup
from features.models import Batch, Dtype, EntityKind, Feature
from features.tests.factories import make_group
from features.views import example_value

pytestmark = pytest.mark.django_db

FEATURES = [
    {"name": "age", "dtype": "int"},
    {"name": "recent", "dtype": "categorical_list"},
]


@pytest.fixture
def group(workspace, producer):
    return make_group(workspace, actor=producer, name="history", features=FEATURES)


def batches_url(group) -> str:
    return f"/api/v1/workspaces/{group.workspace.slug}/feature-groups/{group.name}/batches/"


def row(index: int, recent, when: str = "2026-11-01T00:00:00Z") -> dict:
    return {"user_id": f"u{index}", "event_time": when, "age": 20 + index, "recent": recent}


def lookup(group, entities):
    return online_lookup(workspace=group.workspace, entities=entities, features=["history:recent"])[
        "rows"
    ]


def test_the_dtype_is_registered_with_its_label(group):
    feature = Feature.objects.for_workspace(group.workspace).get(name="recent")
    assert feature.dtype == Dtype.CATEGORICAL_LIST == "categorical_list"
    assert feature.get_dtype_display() == "List of categories"
    assert example_value({"dtype": "categorical_list"}) == ["a", "b"]


def test_json_lists_of_strings_and_integers_land_offline_and_online(client_for, group, producer):
    rows = [row(0, ["sports", "travel"]), row(1, [7, 8, "7"]), row(2, []), row(3, None)]
    response = client_for(producer).post(batches_url(group), {"rows": rows}, format="json")
    assert response.status_code == 201, response.content
    table = offline_store.read_group(workspace_id=group.workspace_id, group_id=group.pk, version=1)
    assert table.schema.field("recent").type == pa.list_(pa.string())
    by_user = dict(zip(table["user_id"].to_pylist(), table["recent"].to_pylist(), strict=True))
    # Integers are stored as their text: 7 and "7" are one category.
    assert by_user == {"u0": ["sports", "travel"], "u1": ["7", "8", "7"], "u2": [], "u3": None}
    assert lookup(group, ["u0", "u1", "u2", "u3"]) == [
        [["sports", "travel"]],
        [["7", "8", "7"]],
        [[]],
        [None],
    ]


@pytest.mark.parametrize(
    "value",
    [
        "sports",  # a bare string is not a list
        ["sports", None],
        ["sports", 1.5],
        [True],
        [{"a": 1}],
        ["x" * 1001],
        ["a"] * (MAX_LIST_ITEMS + 1),
    ],
)
def test_a_bad_list_is_400_naming_the_column_and_stores_nothing(client_for, group, producer, value):
    rows = [row(0, ["ok"]), row(1, value)]
    response = client_for(producer).post(batches_url(group), {"rows": rows}, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["attr"] == "recent"
    assert body["errors"][0]["row"] == 1
    assert "a list of at most" in body["detail"]
    assert not Batch.objects.for_workspace(group.workspace).exists()


def _parquet(recent: pa.Array) -> bytes:
    table = pa.table(
        {
            "user_id": ["p0", "p1"],
            "event_time": pa.array([1_761_955_200, 1_761_955_260], type=pa.int64()),
            "recent": recent,
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_parquet_lists_of_strings_or_integers_are_taken_and_others_refused(
    client_for, group, producer
):
    client = client_for(producer)

    def upload(raw: bytes):
        return client.generic(
            "POST", batches_url(group), raw, content_type="application/vnd.apache.parquet"
        )

    assert upload(_parquet(pa.array([["a", "b"], None]))).status_code == 201
    assert upload(_parquet(pa.array([[3], [4, 5]], type=pa.list_(pa.int32())))).status_code == 201
    assert lookup(group, ["p0", "p1"]) == [[["3"]], [["4", "5"]]]
    floats = upload(_parquet(pa.array([[1.5], [2.5]])))
    assert floats.status_code == 400
    assert floats.json()["attr"] == "recent"
    null_item = upload(_parquet(pa.array([["a"], ["b", None]])))
    assert null_item.status_code == 400
    assert (null_item.json()["attr"], null_item.json()["errors"][0]["row"]) == ("recent", 1)
    long_item = upload(_parquet(pa.array([["a"], ["x" * 1001]])))
    assert (long_item.status_code, long_item.json()["attr"]) == (400, "recent")
    assert Batch.objects.for_workspace(group.workspace).count() == 2


def test_a_csv_cell_holds_a_json_array(client_for, group, producer):
    client = client_for(producer)
    csv = b'user_id,event_time,recent\nc0,2026-11-02T00:00:00+00:00,"[""a"", 2]"\n'
    response = client.generic("POST", batches_url(group), csv, content_type="text/csv")
    assert response.status_code == 201, response.content
    assert lookup(group, ["c0"]) == [[["a", "2"]]]
    bad = client.generic(
        "POST",
        batches_url(group),
        b"user_id,event_time,recent\nc1,2026-11-02T00:00:00+00:00,not-a-list\n",
        content_type="text/csv",
    )
    assert (bad.status_code, bad.json()["attr"]) == (400, "recent")


def test_a_dataset_carries_the_lists_through_the_point_in_time_join(workspace, producer, settings):
    t0 = datetime(2025, 6, 1, 12, tzinfo=UTC)
    hour = timedelta(hours=1)
    users = make_group(workspace, name="users", features=FEATURES, online=False)
    labels = make_group(
        workspace,
        name="clicks",
        entity=EntityKind.LABEL,
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )

    def ingest(group, rows):
        body = json.dumps({"rows": rows}, default=lambda t: t.isoformat()).encode()
        batch_ingest(actor=producer, group=group, body=body, format="json", now=t0 + 10 * hour)

    ingest(
        users,
        [
            {"user_id": "u1", "event_time": t0, "recent": ["a"]},
            {"user_id": "u1", "event_time": t0 + 2 * hour, "recent": ["a", "b"]},
            {"user_id": "u2", "event_time": t0, "recent": None},
        ],
    )
    ingest(
        labels,
        [
            {"user_id": "u1", "event_time": t0 + hour, "clicked": 1},
            {"user_id": "u1", "event_time": t0 + 3 * hour, "clicked": 0},
            {"user_id": "u2", "event_time": t0 + hour, "clicked": 0},
            {"user_id": "u0", "event_time": t0 + hour, "clicked": 1},
        ],
    )
    dataset = samples.dataset_create(
        actor=producer,
        workspace=workspace,
        name="lists",
        label_group=labels,
        label_columns=["clicked"],
        feature_refs=["users:recent"],
    )
    assert dataset.status == "ready", dataset.error
    table = samples.dataset_table(samples.dataset_file(dataset))
    got = sorted(
        zip(
            table["user_id"].to_pylist(),
            [t.isoformat() for t in table["event_time"].to_pylist()],
            table["users__recent"].to_pylist(),
            strict=True,
        )
    )
    assert got == [
        ("u0", (t0 + hour).isoformat(), None),
        ("u1", (t0 + hour).isoformat(), ["a"]),  # the value as of the label, not the newer one
        ("u1", (t0 + 3 * hour).isoformat(), ["a", "b"]),
        ("u2", (t0 + hour).isoformat(), None),
    ]


def test_drift_measures_the_numeric_features_and_skips_the_lists(group, producer):
    # Nothing to bin in a list of categories: drift reads the numeric ``age`` alone.
    now = datetime(2026, 11, 10, tzinfo=UTC)
    rows = []
    for i in range(40):
        rows.append(row(i, ["a", "b"], when=(now - timedelta(days=3, minutes=i)).isoformat()))
        rows.append(row(100 + i, ["c"], when=(now - timedelta(hours=2, minutes=i)).isoformat()))
    batch_ingest(
        actor=producer,
        group=group,
        body=json.dumps({"rows": rows}).encode(),
        format="json",
        now=now,
    )
    drift = health.measure_drift(group=group, version=group.versions.get(version=1), now=now)
    assert set(drift) == {"age"}
    assert drift["age"] > health.DRIFT_PSI_THRESHOLD  # ages 20-59 against 120-159
