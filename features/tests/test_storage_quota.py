"""The one quota's storage limit at push: a batch that would take the workspace's stored bytes
past ``storage_gb`` answers 409 naming ``storage_gb`` and stores nothing; under the limit, or
with the limit raised, the same batch lands; the quota summary counts what the check counts."""

from __future__ import annotations

import pytest

from features import offline_store
from features.models import Batch
from features.tests.factories import user_row
from workspaces.models import Event
from workspaces.quota import GIB, quota_summary
from workspaces.services import quota_set

pytestmark = pytest.mark.django_db


def _push(client, group, rows):
    url = f"/api/v1/workspaces/{group.workspace.slug}/feature-groups/{group.name}/batches/"
    return client.post(url, {"rows": rows}, format="json")


def _files(group) -> list:
    base = offline_store.group_dir(
        workspace_id=group.workspace_id, group_id=group.pk, version=group.current_version
    )
    return sorted(p for p in base.rglob("*") if p.is_file()) if base.exists() else []


def test_a_push_past_the_storage_quota_is_409_and_stores_nothing(
    client_for, group, producer, workspace
):
    quota_set(actor=None, workspace=workspace, storage_gb=1)
    client = client_for(producer)
    first = _push(client, group, [user_row(1)])
    assert first.status_code == 201, first.content
    # What the workspace already stores: its one batch, grown to 100 bytes short of 1 GB.
    Batch.objects.for_workspace(workspace).update(bytes=GIB - 100)
    files_before = _files(group)
    events_before = Event.objects.for_workspace(workspace).filter(verb="feature_batch.ingested")

    refused = _push(client, group, [user_row(i) for i in range(2, 6)])

    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert (body["code"], body["attr"], body["storage_gb"]) == ("conflict", "storage_gb", 1)
    assert body["used_bytes"] == GIB - 100 and body["batch_bytes"] > 100
    assert "storage quota" in body["detail"] and "1 GB" in body["detail"]
    assert Batch.objects.for_workspace(workspace).count() == 1
    assert _files(group) == files_before
    assert events_before.count() == 1
    summary = quota_summary(workspace=workspace)
    assert summary["rows"][0]["storage_gb"] == 1
    assert summary["used_storage_gb"] == round((GIB - 100) / GIB, 3)

    # A batch that fits still lands; raising the limit lets the refused one in.
    Batch.objects.for_workspace(workspace).update(bytes=GIB - 10_000)
    assert _push(client, group, [user_row(7)]).status_code == 201
    quota_set(actor=None, workspace=workspace, storage_gb=2)
    assert _push(client, group, [user_row(i) for i in range(2, 6)]).status_code == 201
    assert Batch.objects.for_workspace(workspace).count() == 3


def test_cpu_and_gpu_limits_alone_leave_pushes_unlimited(client_for, group, producer, workspace):
    quota_set(actor=None, workspace=workspace, cpu_milli=1000, gpu_milli=0)
    quota_set(actor=None, workspace=workspace, gpu_type="A100", gpu_milli=1000)
    client = client_for(producer)
    assert _push(client, group, [user_row(1)]).status_code == 201
    Batch.objects.for_workspace(workspace).update(bytes=50 * GIB)
    assert _push(client, group, [user_row(2)]).status_code == 201
