"""The resource-audit console: flagged items, decisions as events, usage vs quota, the trail."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from lineage.audit import audit_scan_idle
from lineage.models import AuditCategory, AuditItem, AuditStatus, Node
from lineage.projection import project, rebuild
from lineage.tests.helpers import record
from workspaces.events import Ref
from workspaces.models import Event
from workspaces.services import quota_set

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_superuser("auditor", "a@example.com", "pw-123456!")
    client.force_login(user)
    return user


def plant_over_quota_job(workspace):
    job = Ref("training_job", 41, "big-job")
    record(
        workspace,
        "training.job.running",
        [job],
        resources={"gpu_hours": 12.0, "cpu_hours": 48.0},
    )
    record(
        workspace,
        "scheduler.job.over_quota",
        [job],
        payload={"reason": "gpus 4 > quota 2"},
        resources={"gpu_hours": 12.0},
    )


def test_planted_over_quota_job_is_flagged_and_approving_it_is_an_event(client, staff, workspace):
    plant_over_quota_job(workspace)
    changelist = reverse("admin:lineage_audititem_changelist")
    page = client.get(changelist + "?status__exact=open")
    assert page.status_code == 200
    assert b"big-job" in page.content and b"Over-quota job" in page.content
    item = AuditItem.objects.for_workspace(workspace).get()
    assert (item.category, item.status, item.reason) == (
        AuditCategory.OVER_QUOTA,
        AuditStatus.OPEN,
        "gpus 4 > quota 2",
    )

    response = client.post(
        changelist, {"action": "mark_approved", "_selected_action": [item.pk]}, follow=True
    )
    assert response.status_code == 200
    item.refresh_from_db()
    assert (item.status, item.decided_by) == (AuditStatus.APPROVED, "auditor")
    event = Event.objects.for_workspace(workspace).get(verb="lineage.audit.approved")
    assert event.actor_id == staff.pk
    assert [(r.kind, r.object_id) for r in event.refs.all()] == [("training_job", "41")]

    # The decision is part of the projection: a rebuild from the log keeps it.
    project()
    rebuild()
    item = AuditItem.objects.for_workspace(workspace).get()
    assert (item.status, item.decided_by) == (AuditStatus.APPROVED, "auditor")

    for action, status in (("mark_revoked", "revoked"), ("mark_reviewed", "reviewed")):
        client.post(changelist, {"action": action, "_selected_action": [item.pk]})
        item.refresh_from_db()
        assert item.status == status
        assert (
            Event.objects.for_workspace(workspace).filter(verb=f"lineage.audit.{status}").exists()
        )


def test_the_schedulers_own_review_closes_the_item(workspace):
    plant_over_quota_job(workspace)
    record(workspace, "scheduler.job.over_quota_reviewed", [Ref("training_job", 41, "big-job")])
    project()
    item = AuditItem.objects.for_workspace(workspace).get()
    assert item.status == AuditStatus.REVIEWED


def test_low_utilisation_and_idle_deployments_are_flagged(workspace):
    record(
        workspace,
        "training.job.succeeded",
        [Ref("training_job", 5, "lazy-job")],
        resources={"gpu_hours": 3.0, "gpu_utilisation": 0.05},
    )
    record(workspace, "serving.deployment.created", [Ref("deployment", 8, "old-dep")])
    record(workspace, "serving.deployment.created", [Ref("deployment", 9, "busy-dep")])
    project()
    Node.objects.for_workspace(workspace).filter(object_id="8").update(
        last_seen_at=timezone.now() - timedelta(days=30)
    )
    assert audit_scan_idle() == 1
    assert audit_scan_idle() == 0  # flagged once
    flagged = {(a.category, a.label) for a in AuditItem.objects.for_workspace(workspace)}
    assert flagged == {
        (AuditCategory.LOW_UTILISATION, "lazy-job"),
        (AuditCategory.IDLE_DEPLOYMENT, "old-dep"),
    }
    assert Event.objects.for_workspace(workspace).filter(verb="lineage.audit.flagged").count() == 1


def test_usage_against_quota_and_the_trail_with_csv(client, staff, workspace, other_workspace):
    quota_set(actor=None, workspace=workspace, cpu_milli=16000, memory_mb=65536)
    plant_over_quota_job(workspace)
    record(other_workspace, "training.job.running", [Ref("training_job", 2, "theirs")])
    usage = client.get(reverse("admin:lineage_audit_usage") + "?days=1")
    assert usage.status_code == 200
    text = usage.content.decode()
    assert workspace.slug in text and "48.00" in text  # CPU-hours used
    # 48 CPU-h against 16 cores x 24 h = 12.5% of the quota's capacity.
    assert "12.5%" in text
    assert "16.0 / unlimited / 64.0" in text  # the one quota's limits; no GPU limit

    exported = client.get(reverse("admin:lineage_audit_usage") + "?days=1&format=csv")
    rows = list(csv.reader(io.StringIO(b"".join(exported.streaming_content).decode())))
    assert rows[0][:2] == ["workspace", "day"] and rows[1][0] == workspace.slug

    trail = reverse("admin:lineage_audit_trail")
    page = client.get(trail, {"workspace": workspace.slug, "verb": "scheduler."})
    assert page.status_code == 200 and b"scheduler.job.over_quota" in page.content
    assert b"theirs" not in page.content
    exported = client.get(trail, {"workspace": workspace.slug, "format": "csv"})
    assert exported["Content-Type"] == "text/csv"
    rows = list(csv.reader(io.StringIO(b"".join(exported.streaming_content).decode())))
    verbs = [row[5] for row in rows[1:]]
    assert "scheduler.job.over_quota" in verbs and "training.job.running" in verbs
    assert all(row[2] == workspace.slug for row in rows[1:])


def test_console_needs_staff(client, workspace):
    response = client.get(reverse("admin:lineage_audit_trail"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
