"""Queue page, staff cluster page, admin audit list and the scheduler API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from training.models import JobState, NodeKind, PriorityClass
from training.scheduler.models import WorkspaceQuota
from training.scheduler.tests.factories import make_job, make_node, run_on
from training.scheduler.tick import schedule_tick
from workspaces.models import Event, Role
from workspaces.testing.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_queue_page_shows_reasons(client, workspace, members):
    make_node(gpus=1, gpu_type="V100")
    WorkspaceQuota.objects.create(workspace=workspace, gpu_milli=0)
    make_job(workspace, name="big", gpu_count=2, gpu_type="V100")
    make_job(workspace, name="small", gpu_milli=500)
    schedule_tick()
    client.force_login(members[Role.VIEWER])
    page = client.get(f"/w/{workspace.slug}/queue/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "waiting for 2 x V100" in html
    assert "over quota, running preemptible" in html


def test_queue_page_is_404_for_outsiders(client, workspace, members):
    client.force_login(members["outsider"])
    assert client.get(f"/w/{workspace.slug}/queue/").status_code == 404


def test_cluster_page_is_for_staff(client, workspace):
    make_node(gpus=2, name="gpu-a")
    make_node(
        gpus=1,
        name="inf-a",
        kind=NodeKind.INFERENCE,
        lending_windows=[{"days": list(range(7)), "start": "00:00", "end": "24:00"}],
    )
    make_job(workspace, gpu_milli=300, priority_class=PriorityClass.EXPLORATION)
    make_job(workspace, gpu_milli=810, priority_class=PriorityClass.EXPLORATION)
    schedule_tick()
    client.force_login(UserFactory())
    assert client.get("/scheduler/cluster/").status_code == 302  # to the admin login
    client.force_login(UserFactory(is_staff=True))
    page = client.get("/scheduler/cluster/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "gpu-a" in html and "inf-a" in html
    assert "allocated" in html and "fragmentation" in html
    assert "utilisation with lending" in html
    # Slice costs of the recent mix: three 0.3s share a GPU; nothing fits beside a 0.81.
    assert page.context["overview"]["slice_costs"] == [
        {"size_gpu": 0.3, "cost_gpu": pytest.approx(0.333, abs=1e-3), "idle_gpu": 0.033},
        {"size_gpu": 0.81, "cost_gpu": 1.0, "idle_gpu": 0.19},
    ]
    assert 'data-testid="slice-costs"' in html


def test_cluster_page_shows_idle_capacity_beside_the_floor(client, workspace):
    staff = UserFactory(is_staff=True)
    client.force_login(staff)
    assert 'data-testid="floor"' in client.get("/scheduler/cluster/").content.decode()
    assert "register a GPU node" in client.get("/scheduler/cluster/").content.decode()
    node = make_node(gpus=2, cpu_milli=64000)
    # Two 0.3 slices on different GPUs: the 0.7 jobs waiting behind them find no GPU with 0.7.
    run_on(make_job(workspace, gpu_milli=300), node, gpus=[(0, 300)])
    run_on(make_job(workspace, gpu_milli=300), node, gpus=[(1, 300)])
    make_job(workspace, gpu_milli=700)
    make_job(workspace, gpu_milli=700)
    page = client.get("/scheduler/cluster/")
    floor = page.context["overview"]["floor"]
    assert floor["jobs_running"] == 2 and floor["jobs_waiting"] == 2
    assert floor["idle_share"] == pytest.approx(0.7)
    assert floor["floor_share"] == pytest.approx(0.0)  # 0.3 + 0.7 fill each GPU
    assert floor["gap_gpu"] == pytest.approx(1.4)
    html = page.content.decode()
    assert '<td data-testid="idle-now">70.00% of GPU capacity</td>' in html
    assert '<td data-testid="floor-share">0.00% of GPU capacity</td>' in html


def test_the_floor_counts_what_no_placement_can_avoid(client, workspace):
    client.force_login(UserFactory(is_staff=True))
    node = make_node(gpus=2, cpu_milli=64000)
    run_on(make_job(workspace, gpu_milli=300), node, gpus=[(0, 300)])
    run_on(make_job(workspace, gpu_milli=700), node, gpus=[(0, 700)])
    make_job(workspace, gpu_milli=600)
    floor = client.get("/scheduler/cluster/").context["overview"]["floor"]
    assert floor["idle_share"] == pytest.approx(0.5)
    assert floor["floor_share"] == pytest.approx(0.2)  # the 0.6 slice leaves 0.4 of a GPU
    assert floor["gap_gpu"] == pytest.approx(0.6)


def test_admin_audit_lists_over_quota_jobs_and_review_is_recorded(client, workspace):
    make_node(gpus=2)
    WorkspaceQuota.objects.create(workspace=workspace, gpu_milli=1000)
    make_job(workspace, name="within", gpu_count=1)
    make_job(workspace, name="beyond", gpu_count=1)
    schedule_tick()
    admin = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(admin)
    page = client.get("/admin/scheduler/overquotajob/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "beyond" in html and "within" not in html
    from training.scheduler.models import OverQuotaJob

    item = OverQuotaJob.objects.unscoped().get(over_quota=True)
    response = client.post(
        "/admin/scheduler/overquotajob/",
        {"action": "mark_reviewed", "_selected_action": [item.pk]},
    )
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.reviewed_by == admin
    assert Event.objects.unscoped().filter(verb="scheduler.job.over_quota_reviewed").exists()
    lending = client.get("/admin/scheduler/lendinglease/")
    assert lending.status_code == 200
    assert "without lending" in lending.content.decode()


def test_api_queue_recommendation_and_quotas(workspace, members, client_for):
    viewer = client_for(members[Role.VIEWER])
    now = timezone.now()
    make_job(
        workspace,
        state=JobState.SUCCEEDED,
        usage={"cpu_peak_milli": 1200, "memory_peak_mb": 900},
        started_at=now - timedelta(hours=1),
        finished_at=now,
    )
    waiting = make_job(workspace, gpu_count=1)
    base = f"/api/v1/workspaces/{workspace.slug}/scheduler"
    queue = viewer.get(base + "/queue/").json()
    assert [row["id"] for row in queue] == [waiting.pk]
    assert queue[0]["position"] == 1
    rec = viewer.get(base + "/recommendation/", {"template": "logreg"}).json()
    assert rec["based_on_jobs"] == 1
    assert 1200 <= rec["cpu_milli"] <= 1500 + 100
    assert viewer.get(base + "/recommendation/").status_code == 400
    admin = client_for(members[Role.ADMIN])
    refused = admin.post(base + "/quotas/", {"gpu_type": "", "gpu_milli": 2000}, format="json")
    assert refused.status_code == 403  # only platform admins change quotas
    platform_admin = client_for(UserFactory(is_staff=True, is_superuser=True))
    created = platform_admin.post(
        base + "/quotas/", {"gpu_type": "", "gpu_milli": 2000}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["gpu_milli"] == 2000
    assert Event.objects.unscoped().filter(verb="quota.changed").count() == 1
    assert viewer.get(base + "/quotas/").json()[0]["gpu_milli"] == 2000


def test_recommendation_fragment_for_the_submit_form(client, workspace, members):
    now = timezone.now()
    make_job(
        workspace,
        state=JobState.SUCCEEDED,
        usage={"cpu_peak_milli": 1200, "memory_peak_mb": 900},
        started_at=now - timedelta(hours=1),
        finished_at=now,
    )
    client.force_login(members[Role.DEVELOPER])
    html = client.get(
        f"/w/{workspace.slug}/queue/recommendation/", {"template": "logreg"}
    ).content.decode()
    assert 'data-field="cpu_milli" data-value="1500"' in html
    assert 'data-field="memory_mb" data-value="1152"' in html
    empty = client.get(f"/w/{workspace.slug}/queue/recommendation/", {"template": "two_tower"})
    assert "no recommendation" in empty.content.decode()


def test_admin_cordons_and_readies_nodes(client):
    from training.models import Node, NodeState

    node = make_node(gpus=1, name="admin-node")
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    listing = client.get("/admin/scheduler/managednode/")
    assert listing.status_code == 200 and "admin-node" in listing.content.decode()
    client.post(
        "/admin/scheduler/managednode/", {"action": "cordon", "_selected_action": [node.pk]}
    )
    assert Node.objects.get(pk=node.pk).state == NodeState.CORDONED
    client.post(
        "/admin/scheduler/managednode/", {"action": "make_ready", "_selected_action": [node.pk]}
    )
    assert Node.objects.get(pk=node.pk).state == NodeState.READY
