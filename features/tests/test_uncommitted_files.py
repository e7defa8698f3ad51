"""A push killed between writing its Parquet files and committing its batch row leaves files that
no reader takes as data, and the hourly sweep removes them (issue 17)."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest

from features import ingestion, offline_store
from features.models import Batch
from features.tests.factories import make_group, user_row
from workspaces.models import Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


def test_files_of_a_batch_that_never_committed_are_not_read_and_are_swept(workspace):
    producer = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=producer, online=False)
    body = json.dumps({"rows": [user_row(1), user_row(2)]}).encode()
    kept = ingestion.batch_ingest(actor=producer, group=group, body=body, format="json").batch
    # What a killed push leaves: its files, under an id its transaction took and never committed.
    ghost_id = Batch.objects.unscoped().order_by("-pk").first().pk + 1000
    ghost = offline_store.write_batch(
        workspace_id=workspace.pk,
        group_id=group.pk,
        version=group.current_version,
        batch_id=ghost_id,
        table=pa.table(
            {
                "user_id": ["ghost"],
                "event_time": pa.array([1_700_000_000_000_000], pa.timestamp("us", tz="UTC")),
                "age": [99],
            }
        ),
        time_column="event_time",
    )

    rows = offline_store.read_group(
        workspace_id=workspace.pk, group_id=group.pk, version=group.current_version
    )
    assert sorted(rows["user_id"].to_pylist()) == ["u1", "u2"]
    files = offline_store.parquet_glob(
        workspace_id=workspace.pk, group_id=group.pk, version=group.current_version
    )
    assert files and all(f"batch-{kept.pk}.parquet" in f for f in files)

    # A young leftover may still be committing: the sweep leaves it; an old one goes.
    assert offline_store.sweep_uncommitted(older_than_s=3600) == []
    old = time.time() - 7200
    for path in ghost:
        os.utime(path, (old, old))
    assert offline_store.sweep_uncommitted(older_than_s=3600) == ghost
    assert all(not os.path.exists(path) for path in ghost)
    assert (
        offline_store.read_group(
            workspace_id=workspace.pk, group_id=group.pk, version=group.current_version
        ).num_rows
        == 2
    )
