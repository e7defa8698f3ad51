"""Producer batches under the workspace policy and against bad keys and times: rows over
``max_batch_rows`` answer 413, NUL in entity keys and out-of-range numeric event times 400
naming the column; nothing is stored."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.models import Batch
from features.tests.factories import user_row
from workspaces.models import Event
from workspaces.services import workspace_policy_set

pytestmark = pytest.mark.django_db


def batches_url(group) -> str:
    return f"/api/v1/workspaces/{group.workspace.slug}/feature-groups/{group.name}/batches/"


def _nothing_stored(group) -> None:
    assert not Batch.objects.for_workspace(group.workspace).exists()
    assert (
        not Event.objects.for_workspace(group.workspace)
        .filter(verb="feature_batch.ingested")
        .exists()
    )


def _parquet(rows: int) -> bytes:
    table = pa.table(
        {
            "user_id": pa.array([f"u{i}" for i in range(rows)]),
            "event_time": pa.array([1_761_955_200] * rows, type=pa.int64()),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_more_rows_than_the_policy_allows_answer_413(client_for, group, producer, workspace):
    workspace_policy_set(actor=None, workspace=workspace, max_batch_rows=3)
    client = client_for(producer)
    url = batches_url(group)
    response = client.post(url, {"rows": [user_row(i) for i in range(4)]}, format="json")
    assert response.status_code == 413, response.content
    error = response.json()
    assert error["type"] == "too_large" and "rows" in error["detail"]
    assert "max_batch_rows = 3" in error["detail"]
    assert error["attr"] == "rows"
    parquet = client.generic(
        "POST", url, _parquet(4), content_type="application/vnd.apache.parquet"
    )
    assert parquet.status_code == 413
    csv = b"user_id,event_time\n" + b"".join(b"u%d,1761955200\n" % i for i in range(4))
    assert client.generic("POST", url, csv, content_type="text/csv").status_code == 413
    _nothing_stored(group)
    ok = client.post(url, {"rows": [user_row(i) for i in range(3)]}, format="json")
    assert ok.status_code == 201, ok.content


@pytest.mark.parametrize("key", ["u\x001", "\x00", "u\n1", "x" * 257])
def test_entity_keys_with_nul_or_control_characters_are_400(client_for, group, producer, key):
    row = {**user_row(1), "user_id": key}
    response = client_for(producer).post(batches_url(group), {"rows": [row]}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == "user_id"
    _nothing_stored(group)


def test_nul_in_a_parquet_entity_key_is_400(client_for, group, producer):
    table = pa.table({"user_id": ["ok", "bad\x00key"], "event_time": [1_761_955_200] * 2})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    response = client_for(producer).generic(
        "POST", batches_url(group), buffer.getvalue(), content_type="application/vnd.apache.parquet"
    )
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == "user_id"
    _nothing_stored(group)


@pytest.mark.parametrize("event_time", [1e20, -1e20, -1, 1e300, 2**63])
def test_numeric_event_times_out_of_range_are_400_not_500(client_for, group, producer, event_time):
    row = {**user_row(1), "event_time": event_time}
    response = client_for(producer).post(batches_url(group), {"rows": [row]}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == "event_time"
    _nothing_stored(group)


@pytest.mark.parametrize("event_time", [1e20, -5.0])
def test_parquet_event_times_out_of_range_are_400(client_for, group, producer, event_time):
    table = pa.table({"user_id": ["u1"], "event_time": pa.array([event_time])})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    response = client_for(producer).generic(
        "POST", batches_url(group), buffer.getvalue(), content_type="application/vnd.apache.parquet"
    )
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == "event_time"
    _nothing_stored(group)
