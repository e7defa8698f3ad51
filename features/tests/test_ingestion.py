"""Producer pushes: validation by row and column, all-or-nothing, idempotency, formats, limits."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import offline_store
from features.lookup import online_lookup
from features.models import Batch, FeatureGroup
from features.tests.factories import user_row
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member


def batches_url(group) -> str:
    return f"/api/v1/workspaces/{group.workspace.slug}/feature-groups/{group.name}/batches/"


def push(client, group, rows, **headers):
    return client.post(batches_url(group), {"rows": rows}, format="json", **headers)


def stored_files(group) -> list[Path]:
    base = offline_store.group_dir(
        workspace_id=group.workspace_id, group_id=group.pk, version=group.current_version
    )
    return sorted(base.rglob("*")) if base.exists() else []


def test_json_batch_lands_offline_and_online_with_its_event(client_for, group, producer):
    response = push(client_for(producer), group, [user_row(i) for i in range(5)])
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["rows"], body["version"], body["replayed"]) == (5, 1, False)
    table = offline_store.read_group(workspace_id=group.workspace_id, group_id=group.pk, version=1)
    assert sorted(table["user_id"].to_pylist()) == [f"u{i}" for i in range(5)]
    looked_up = online_lookup(
        workspace=group.workspace,
        entities=["u3"],
        features=["user_profile:age", "user_profile:emb"],
    )
    assert looked_up["rows"] == [[23, [0.5, 1.5, 3.0]]]
    event = Event.objects.for_workspace(group.workspace).get(verb="feature_batch.ingested")
    assert event.payload["rows"] == 5
    assert event.payload["producer"] == producer.username
    assert event.resources["bytes"] == len(response.wsgi_request.body)
    group.refresh_from_db()
    assert group.last_event_time.isoformat() == "2026-11-01T00:00:00+00:00"


@pytest.mark.parametrize(
    ("overrides", "column", "fragment"),
    [
        ({"age": "thirty"}, "age", "expected an integer"),
        ({"age": 1.5}, "age", "expected an integer"),
        ({"age": True}, "age", "expected an integer"),
        ({"ctr_7d": "x"}, "ctr_7d", "finite number"),
        ({"is_new": 1}, "is_new", "true or false"),
        ({"emb": [1, 2]}, "emb", "list of 3"),
        ({"emb": [1, 2, "x"]}, "emb", "list of 3"),
        ({"user_id": ""}, "user_id", "entity key"),
        ({"user_id": None}, "user_id", "entity key"),
        ({"event_time": "2026-11-01T00:00:00"}, "event_time", "no time zone"),
        ({"event_time": "1969-12-31T23:59:59Z"}, "event_time", "before 1970"),
        ({"event_time": "2999-01-01T00:00:00Z"}, "event_time", "in the future"),
        ({"event_time": "yesterday"}, "event_time", "ISO 8601"),
        ({"surprise": 1}, "surprise", "unknown column"),
    ],
)
def test_one_bad_cell_rejects_the_whole_batch_naming_row_and_column(
    client_for, group, producer, overrides, column, fragment
):
    rows = [user_row(i) for i in range(4)]
    rows[2] = user_row(2, **overrides)
    if overrides.get("user_id") is None and "user_id" in overrides:
        rows[2]["user_id"] = None
    response = push(client_for(producer), group, rows)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["attr"] == column
    assert body["errors"][0]["row"] == 2
    assert fragment in body["detail"]
    assert "row 2" in body["detail"]
    assert not Batch.objects.for_workspace(group.workspace).exists()
    assert stored_files(group) == []
    assert not Event.objects.for_workspace(group.workspace).filter(verb__startswith="feature_batch")
    assert online_lookup(workspace=group.workspace, entities=["u0"], features=["user_profile:age"])[
        "rows"
    ] == [[None]]


def test_errors_list_the_first_problems_of_several_rows(client_for, group, producer):
    rows = [user_row(i, age="bad") for i in range(30)]
    body = push(client_for(producer), group, rows).json()
    assert [e["row"] for e in body["errors"]] == list(range(10))


def test_idempotency_key_stores_a_retried_batch_once(client_for, group, producer):
    client = client_for(producer)
    rows = [user_row(i) for i in range(3)]
    first = push(client, group, rows, HTTP_IDEMPOTENCY_KEY="batch-2026-11-01")
    again = push(client, group, rows, HTTP_IDEMPOTENCY_KEY="batch-2026-11-01")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["replayed"] is True
    assert again.json()["id"] == first.json()["id"]
    assert Batch.objects.for_workspace(group.workspace).count() == 1
    assert len([p for p in stored_files(group) if p.suffix == ".parquet"]) == 1
    ingested = Event.objects.for_workspace(group.workspace).filter(verb="feature_batch.ingested")
    assert ingested.count() == 1


def test_idempotency_key_reused_for_another_body_is_409(client_for, group, producer):
    client = client_for(producer)
    push(client, group, [user_row(1)], HTTP_IDEMPOTENCY_KEY="k")
    response = push(client, group, [user_row(2)], HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 409
    assert response.json()["attr"] == "Idempotency-Key"
    assert Batch.objects.for_workspace(group.workspace).count() == 1


def test_parquet_and_csv_uploads(client_for, group, producer):
    client = client_for(producer)
    table = pa.table(
        {
            "user_id": pa.array([7, 8]),
            "event_time": pa.array([1_761_955_200, 1_761_955_260], type=pa.int64()),
            "age": pa.array([40, 41], type=pa.int32()),
            "ctr_7d": [0.5, 0.25],
            "emb": pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    response = client.generic(
        "POST", batches_url(group), buffer.getvalue(), content_type="application/vnd.apache.parquet"
    )
    assert response.status_code == 201, response.content
    csv = b'user_id,event_time,age,is_new,emb\nu9,2026-11-02T00:00:00+00:00,19,true,"[1,2,3]"\n'
    response = client.generic("POST", batches_url(group), csv, content_type="text/csv")
    assert response.status_code == 201, response.content
    result = online_lookup(
        workspace=group.workspace,
        entities=["7", "u9"],
        features=["user_profile:age", "user_profile:is_new", "user_profile:emb"],
    )
    assert result["rows"] == [[40, None, [1.0, 2.0, 3.0]], [19, True, [1.0, 2.0, 3.0]]]
    upload = io.BytesIO(csv)
    upload.name = "batch.csv"
    response = client.post(batches_url(group), {"file": upload}, format="multipart")
    assert response.status_code == 201, response.content


def test_bad_parquet_is_refused_by_column(client_for, group, producer):
    client = client_for(producer)
    table = pa.table(
        {"user_id": ["a"], "event_time": pa.array([1_761_955_200.0]), "ctr_7d": [float("nan")]}
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    response = client.generic(
        "POST", batches_url(group), buffer.getvalue(), content_type="application/vnd.apache.parquet"
    )
    assert response.status_code == 400
    assert response.json()["attr"] == "ctr_7d"
    garbage = client.generic(
        "POST", batches_url(group), b"not parquet", content_type="application/vnd.apache.parquet"
    )
    assert garbage.status_code == 400
    assert not Batch.objects.for_workspace(group.workspace).exists()


@pytest.mark.parametrize(
    "body",
    [
        b'{"rows": []}',
        b'{"rows": {}}',
        b'{"rows": [1]}',
        b'{"data": []}',
        b"[]",
        b'{"rows": [{"user_id": "u", "event_time": NaN}]}',
    ],
)
def test_malformed_batches_are_400(client_for, group, producer, body):
    response = client_for(producer).generic(
        "POST", batches_url(group), body, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert not Batch.objects.for_workspace(group.workspace).exists()


def test_unsupported_media_type_is_415(client_for, group, producer):
    response = client_for(producer).generic(
        "POST", batches_url(group), b"<xml/>", content_type="application/xml"
    )
    assert response.status_code == 415


def test_a_50_megabyte_json_batch_is_413(client_for, group, producer):
    row = json.dumps(user_row(1)).encode()
    body = b'{"rows": [' + b",".join([row] * (50 * 1024 * 1024 // len(row))) + b"]}"
    assert len(body) > 49 * 1024 * 1024
    response = client_for(producer).generic(
        "POST", batches_url(group), body, content_type="application/json"
    )
    assert response.status_code == 413
    assert response.json()["type"] == "too_large"
    assert not Batch.objects.for_workspace(group.workspace).exists()


def test_viewer_and_anonymous_cannot_push(client_for, group, workspace):
    viewer = make_member(workspace, Role.VIEWER)
    assert push(client_for(viewer), group, [user_row(1)]).status_code == 403
    assert push(client_for(None), group, [user_row(1)]).status_code == 401
    assert not Batch.objects.for_workspace(workspace).exists()


def test_producer_token_of_another_workspace_gets_404(client_for, group, other_workspace):
    stranger = make_member(other_workspace, Role.DEVELOPER)
    assert push(client_for(stranger), group, [user_row(1)]).status_code == 404
    assert not Batch.objects.for_workspace(group.workspace).exists()


def test_retired_group_refuses_batches(client_for, group, producer):
    from features import registry

    registry.feature_group_set_status(actor=None, group=group, status="retired")
    assert push(client_for(producer), group, [user_row(1)]).status_code == 409


def test_latest_value_wins_online_whatever_the_arrival_order(client_for, group, producer):
    client = client_for(producer)
    push(client, group, [user_row(1, when="2026-11-02T00:00:00Z", age=50)])
    push(client, group, [user_row(1, when="2026-11-01T00:00:00Z", age=10)])  # late, older
    result = online_lookup(
        workspace=group.workspace, entities=["u1"], features=["user_profile:age"]
    )
    assert result["rows"] == [[50]]


def test_a_failed_database_write_leaves_no_files(group, producer, monkeypatch):
    from features import ingestion

    def explode(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(ingestion, "touch_ingested", explode)
    body = json.dumps({"rows": [user_row(1)]}).encode()
    with pytest.raises(RuntimeError):
        ingestion.batch_ingest(actor=producer, group=group, body=body, format="json")
    assert [p for p in stored_files(group) if p.is_file()] == []
    assert not Batch.objects.for_workspace(group.workspace).exists()
    assert FeatureGroup.objects.for_workspace(group.workspace).get().last_ingested_at is None
    # The rows were encoded for the online store beside the transaction, and never written.
    looked_up = online_lookup(
        workspace=group.workspace, entities=["u1"], features=["user_profile:age"]
    )
    assert looked_up["rows"] == [[None]]


def test_the_newest_row_of_an_entity_in_one_batch_is_served(client_for, group, producer):
    rows = [
        user_row(1, when="2026-11-02T00:00:00Z", age=50),
        user_row(1, when="2026-11-01T00:00:00Z", age=10),  # older, later in the batch
        user_row(2, when="2026-11-01T00:00:00Z", age=20),
        user_row(2, when="2026-11-01T00:00:00Z", age=21),  # same time: the last row wins
    ]
    assert push(client_for(producer), group, rows).status_code == 201
    result = online_lookup(
        workspace=group.workspace, entities=["u1", "u2"], features=["user_profile:age"]
    )
    assert result["rows"] == [[50], [21]]


def test_newer_wins_across_write_chunks_of_new_and_stored_entities(group, producer, monkeypatch):
    """Chunks of new entities take MSETNX, chunks with stored ones the newer-wins script; a chunk
    whose keys appear between the existence check and the write falls back to the script."""
    from features import online_store
    from features.ingestion import write_online

    monkeypatch.setattr(online_store, "WRITE_CHUNK", 3)
    monkeypatch.setattr(online_store, "WRITE_GROUP_ROWS", 6)
    offline_schema = {"user_id": pa.string(), "event_time": pa.timestamp("us", tz="UTC")}

    def table(ids, day, age):
        return pa.table(
            {
                "user_id": pa.array([f"u{i}" for i in ids], offline_schema["user_id"]),
                "event_time": pa.array(
                    [pa.scalar(day, offline_schema["event_time"]).as_py()] * len(ids),
                    offline_schema["event_time"],
                ),
                "age": pa.array([age] * len(ids), pa.int64()),
            }
        )

    from datetime import UTC, datetime

    noon = datetime(2026, 11, 2, 12, tzinfo=UTC)
    morning = datetime(2026, 11, 2, 6, tzinfo=UTC)
    evening = datetime(2026, 11, 2, 18, tzinfo=UTC)
    assert write_online(group=group, version=1, table=table([0, 1, 2, 3], noon, 1)) == 4
    # u0-u5 older (stored ones stay), u6-u11 new, in chunks of three.
    written = write_online(group=group, version=1, table=table(range(12), morning, 2))
    assert written == 8
    written = write_online(group=group, version=1, table=table([3, 20, 21], evening, 3))
    assert written == 3

    ids = [f"u{i}" for i in [*range(12), 20, 21]]
    result = online_lookup(workspace=group.workspace, entities=ids, features=["user_profile:age"])
    assert [row[0] for row in result["rows"]] == [1, 1, 1, 3, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3]


@pytest.mark.every_pass  # the online store the settings choose: Redis in the server pass
@pytest.mark.parametrize("second", [("older", 5.0, "a1"), ("newer", 20.0, "a2")])
def test_a_key_written_by_an_earlier_chunk_of_the_same_write_is_compared(monkeypatch, second):
    """With Redis, the second chunk's existence check runs before the first chunk is written:
    its MSETNX then finds ``a`` taken and the chunk goes through the newer-wins script."""
    from features import online_store

    monkeypatch.setattr(online_store, "WRITE_CHUNK", 2)
    store = online_store.get_online_store()
    _label, stamp, expected = second
    store.write_encoded(
        namespace="chunks",
        entities=["a", "b", "a", "c"],
        stamps=[10.0, 10.0, stamp, 10.0],
        payloads=['{"v": "a1"}', '{"v": "b"}', '{"v": "a2"}', '{"v": "c"}'],
    )
    lookup = online_store.Lookup(namespace="chunks", entities=["a", "b", "c"], counter="chunks")
    assert [row["v"] for row in store.read([lookup])[0]] == [expected, "b", "c"]


def break_online_store(settings, tmp_path) -> tuple:
    """Point the online store where it cannot work (whatever kind it is); the settings to
    restore."""
    working = (settings.ONLINE_STORE_REDIS_URL, settings.ONLINE_STORE_SQLITE_PATH)
    if settings.ONLINE_STORE_REDIS_URL:
        settings.ONLINE_STORE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    else:
        settings.ONLINE_STORE_SQLITE_PATH = tmp_path  # a folder: SQLite cannot open it
    return working


def test_a_stored_batch_answers_201_when_the_online_write_fails_and_materialises_later(
    client_for, group, producer, settings, tmp_path
):
    from features.materialization import materialize_pending

    working = break_online_store(settings, tmp_path)
    response = push(client_for(producer), group, [user_row(i) for i in range(3)])
    assert response.status_code == 201, response.content
    batch = Batch.objects.for_workspace(group.workspace).get(pk=response.json()["id"])
    assert batch.rows == 3 and not batch.online_written
    settings.ONLINE_STORE_REDIS_URL, settings.ONLINE_STORE_SQLITE_PATH = working
    materialize_pending()
    batch.refresh_from_db()
    assert batch.online_written
    looked_up = online_lookup(
        workspace=group.workspace, entities=["u2"], features=["user_profile:age"]
    )
    assert looked_up["rows"] == [[22]]


def test_the_online_consumer_of_the_log_writes_a_batch_the_push_could_not(
    client_for, group, producer, settings, tmp_path
):
    from features.materialization import CONSUMER
    from workspaces.models import ConsumerCursor
    from workspaces.outbox import consume

    consume(CONSUMER)  # past the fixtures' events
    working = break_online_store(settings, tmp_path)
    response = push(client_for(producer), group, [user_row(i) for i in range(3)])
    assert response.status_code == 201, response.content
    batch = Batch.objects.for_workspace(group.workspace).get(pk=response.json()["id"])
    event = Event.objects.for_workspace(group.workspace).get(verb="feature_batch.ingested")
    # The store is still down: the consumer fails on the event and keeps its cursor before it.
    run = consume(CONSUMER)
    assert run.failed
    assert ConsumerCursor.objects.get(name=CONSUMER).last_event_id < event.pk
    batch.refresh_from_db()
    assert not batch.online_written

    settings.ONLINE_STORE_REDIS_URL, settings.ONLINE_STORE_SQLITE_PATH = working
    run = consume(CONSUMER)
    assert not run.failed and run.applied >= 1
    batch.refresh_from_db()
    assert batch.online_written
    looked_up = online_lookup(
        workspace=group.workspace, entities=["u2"], features=["user_profile:age"]
    )
    assert looked_up["rows"] == [[22]]
    assert consume(CONSUMER).applied == 0


def test_logged_in_browser_pushes_json_with_its_csrf_token(group, producer):
    """Session auth on the batches route: the CSRF check reads the request's form data, which must
    not run the upload parser on a JSON body (it answered 400 "Missing filename")."""
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(producer)
    token = "k" * 32  # the browser's CSRF cookie, sent back in the X-CSRFToken header
    browser.cookies["csrftoken"] = token
    body = json.dumps({"rows": [user_row(1), user_row(2)]})
    refused = browser.post(batches_url(group), body, content_type="application/json")
    assert refused.status_code == 403
    assert not Batch.objects.for_workspace(group.workspace).exists()
    response = browser.post(
        batches_url(group), body, content_type="application/json", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 201, response.content
    assert response.json()["rows"] == 2
    csv = b"user_id,event_time,age\nu7,2026-11-02T00:00:00+00:00,19\n"
    response = browser.post(
        batches_url(group), csv, content_type="text/csv", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 201, response.content
    assert Batch.objects.for_workspace(group.workspace).count() == 2
