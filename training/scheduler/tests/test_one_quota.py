"""One quota: admission, the dashboard, the queue page, the API and the admin all read the one
``WorkspaceQuota`` with the same live usage; the scheduler's record is read-only in the admin."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from features.models import Batch, FeatureGroup
from training.models import JobState
from training.scheduler.models import JobScheduling
from training.scheduler.tests.factories import make_job, make_node
from training.scheduler.tick import schedule_tick
from workspaces import services
from workspaces.models import Event, Role
from workspaces.quota import GIB, quota_summary
from workspaces.testing.factories import UserFactory

pytestmark = pytest.mark.django_db


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def quota_table(html: str) -> str:
    return re.search(r'<table class="compact" data-testid="quotas">.*?</table>', html, re.S)[0]


def store_bytes(workspace, size: int) -> None:
    group = FeatureGroup.objects.create(
        workspace=workspace, name="clicks", entity="user", entity_keys=["user_id"]
    )
    Batch.objects.create(
        workspace=workspace, group=group, version=1, body_sha256="0" * 64, format="json",
        rows=1, bytes=size,
    )  # fmt: skip


def test_dashboard_queue_api_and_admin_show_the_same_quota_and_usage(
    workspace, members, client_for
):
    quota = services.quota_set(
        actor=None,
        workspace=workspace,
        cpu_milli=8000,
        memory_mb=16384,
        gpu_milli=2000,
        storage_gb=10,
    )
    make_job(workspace, state=JobState.RUNNING, cpu_milli=2500, memory_mb=4096, gpu_count=1)
    make_job(workspace, state=JobState.PENDING, cpu_milli=4000)  # waiting: holds nothing
    store_bytes(workspace, 3 * GIB // 2)

    viewer = browser(members[Role.VIEWER])
    dashboard = quota_table(viewer.get(f"/w/{workspace.slug}/").content.decode())
    queue = quota_table(viewer.get(f"/w/{workspace.slug}/queue/").content.decode())
    assert dashboard == queue
    for cell in (
        '<td data-testid="quota-cpu">2.5 of 8</td>',
        '<td data-testid="quota-memory">4 of 16</td>',
        '<td data-testid="quota-gpu">1 of 2</td>',
        '<td data-testid="quota-storage">1.5 of 10</td>',
    ):
        assert cell in queue, cell

    api = client_for(members[Role.VIEWER]).get(f"/api/v1/workspaces/{workspace.slug}/").json()
    row = api["quota"]["rows"][0]
    assert api["quota"]["limited"] is True and len(api["quota"]["rows"]) == 1
    assert (row["cpu_milli"], row["memory_mb"], row["gpu_milli"], row["storage_gb"]) == (
        8000,
        16384,
        2000,
        10,
    )
    assert (row["used_cpu_milli"], row["used_memory_mb"], row["used_gpu_milli"]) == (
        2500,
        4096,
        1000,
    )
    assert row["used_storage_gb"] == 1.5

    staff = browser(UserFactory(is_staff=True, is_superuser=True))
    in_use = "CPU 2.5 cores, memory 4 GiB, GPU 1, storage 1.5 GB"
    listing = staff.get("/admin/workspaces/workspacequota/").content.decode()
    assert in_use in listing
    change = staff.get(f"/admin/workspaces/workspacequota/{quota.pk}/change/").content.decode()
    assert in_use in change
    workspace_page = staff.get(f"/admin/workspaces/workspace/{workspace.pk}/change/")
    assert in_use in workspace_page.content.decode()

    # All of them are the one summary, and admission counts the same usage.
    assert quota_summary(workspace=workspace)["rows"][0]["used_cpu_milli"] == 2500


def test_over_quota_job_is_admitted_preemptible_and_flagged_against_the_one_quota(workspace):
    make_node(gpus=4)
    services.quota_set(actor=None, workspace=workspace, gpu_milli=1000)
    first = make_job(workspace, gpu_count=1)
    second = make_job(workspace, gpu_count=1)
    schedule_tick()
    first.refresh_from_db()
    second.refresh_from_db()
    assert not first.over_quota and not first.preemptible
    assert second.over_quota and second.preemptible
    assert "over quota, running preemptible" in second.scheduling.reason
    flagged = Event.objects.for_workspace(workspace).get(verb="scheduler.job.over_quota")
    assert flagged.refs.get().object_id == str(second.pk)
    assert flagged.payload["exceeded"] == ["gpu_milli 2000 > 1000 (all GPU types)"]
    # The summary shows what admission counted: the in-quota job only.
    assert quota_summary(workspace=workspace)["rows"][0]["used_gpu_milli"] == 1000

    # Raising the quota through the service lets the next job in within it.
    services.quota_set(actor=None, workspace=workspace, gpu_milli=3000)
    third = make_job(workspace, gpu_count=1)
    schedule_tick()
    third.refresh_from_db()
    assert third.state == JobState.PLACED and not third.over_quota


def test_a_gpu_type_quota_only_counts_jobs_of_that_type(workspace):
    services.quota_set(actor=None, workspace=workspace, gpu_type="A100", gpu_milli=1000)
    make_job(workspace, state=JobState.RUNNING, gpu_count=2, gpu_type="V100")
    make_job(workspace, state=JobState.RUNNING, gpu_count=1, gpu_type="A100")
    summary = quota_summary(workspace=workspace)
    (row,) = summary["rows"]
    assert (row["gpu_type"], row["used_gpu_milli"], row["storage_gb"]) == ("A100", 1000, None)
    assert summary["used_gpu_milli"] == 3000  # all types together


def test_the_scheduling_record_is_read_only_in_the_admin(workspace):
    job = make_job(workspace, state=JobState.RUNNING)
    sched = JobScheduling.objects.create(workspace=workspace, job=job, reason="admitted")
    staff = browser(UserFactory(is_staff=True, is_superuser=True))
    page = staff.get(f"/admin/scheduler/jobscheduling/{sched.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    for url in (
        f"/admin/scheduler/jobscheduling/{sched.pk}/change/",
        f"/admin/scheduler/overquotajob/{sched.pk}/change/",
    ):
        response = staff.post(url, {"over_quota": "on", "reason": "forged", "borrowed": "on"})
        assert response.status_code in (403, 404), url
    sched.refresh_from_db()
    assert (sched.over_quota, sched.reason, sched.borrowed) == (False, "admitted", False)


def test_the_quota_api_sets_storage_on_the_all_types_row_only(workspace, members, client_for):
    base = f"/api/v1/workspaces/{workspace.slug}/scheduler/quotas/"
    platform_admin = client_for(UserFactory(is_staff=True, is_superuser=True))
    refused = platform_admin.post(
        base, {"gpu_type": "A100", "gpu_milli": 1000, "storage_gb": 5}, format="json"
    )
    assert refused.status_code == 400, refused.content
    assert refused.json()["attr"] == "storage_gb"
    created = platform_admin.post(base, {"gpu_type": "", "storage_gb": 5}, format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["storage_gb"], created.json()["used_storage_gb"]) == (5, 0.0)
    event = Event.objects.for_workspace(workspace).get(verb="quota.changed")
    assert event.payload["after"]["storage_gb"] == 5 and event.payload["before"] is None
    assert event.resources == {}  # a limit is not usage: lineage must not price it
