"""Training through Kueue (``TRAINING_BACKEND=kueue``, ``training.trainjobs``): the tick submits
each admitted job as a TrainJob through the official client (a loopback API server stands in
for a cluster: ``workspaces.testing.kube_api``), places it on its TrainJob's pods once they have
all registered, never on the platform's own nodes, and deletes the TrainJob when the job ends."""

from __future__ import annotations

import pytest

from training import agent, trainjobs
from training.models import TRAINJOB_LABEL, JobState, Node, NodeState, PriorityClass, TrainingJob
from training.scheduler.inventory import schedulable_nodes
from training.scheduler.models import JobScheduling
from training.scheduler.tests.factories import make_job, make_node
from training.scheduler.tick import schedule_tick
from training.services import job_transition
from workspaces.models import Role
from workspaces.testing.factories import make_member
from workspaces.testing.kube_api import fake_api_server

pytestmark = pytest.mark.django_db

NS = "train-test"


@pytest.fixture
def cluster(tmp_path, settings):
    with fake_api_server() as server:
        settings.TRAINING_BACKEND = "kueue"
        settings.TRAINING_KUBECONFIG = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        settings.TRAINING_K8S_NAMESPACE = NS
        settings.TRAINING_IMAGE = "registry.example/rankops:1.2"
        yield server


def path(job) -> str:
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs/rankops-job-{job.pk}"


def pod_node(job, i: int, *, gpus: int = 1) -> Node:
    """What a TrainJob pod's agent registers (``agent.node_inventory`` in the pod)."""
    return make_node(
        name=f"rankops-job-{job.pk}-node-0-{i}",
        gpus=gpus,
        labels={TRAINJOB_LABEL: f"rankops-job-{job.pk}"},
    )


def test_an_admitted_job_is_submitted_as_a_trainjob_and_not_placed_on_the_platforms_nodes(
    cluster, workspace
):
    platform_node = make_node(gpus=8)  # room enough: the platform would place it here
    job = make_job(
        workspace, workers=2, cpu_milli=1500, memory_mb=512, gpu_count=1,
        priority_class=PriorityClass.PRODUCTION,
    )  # fmt: skip
    summary = schedule_tick()
    assert summary["trainjobs_submitted"] == 1 and summary.get("placed", 0) == 0
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED and job.node_id is None
    applied = [r for r in cluster.requests if r["method"] == "PATCH"]
    assert [r["path"] for r in applied] == [path(job)]
    assert applied[0]["content_type"] == "application/apply-patch+yaml"
    body = applied[0]["body"]
    assert body["kind"] == "TrainJob" and body["metadata"]["namespace"] == NS
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "rankops"
    assert body["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "rankops-production"
    assert body["spec"]["suspend"] is True  # Kueue admits it
    assert body["spec"]["runtimeRef"]["name"] == "rankops-agent"
    trainer = body["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["image"] == "registry.example/rankops:1.2"
    assert trainer["resourcesPerNode"]["requests"] == {
        "cpu": "1500m",
        "memory": "512Mi",
        "nvidia.com/gpu": "1",
    }
    assert trainer["env"] == [{"name": "RANKOPS_TRAINJOB", "value": f"rankops-job-{job.pk}"}]
    sched = JobScheduling.objects.unscoped().get(job=job)
    assert sched.trainjob == f"rankops-job-{job.pk}"
    assert "waiting for Kueue to start TrainJob" in sched.reason

    schedule_tick()  # submitted once: the next tick waits for its pods
    assert len([r for r in cluster.requests if r["method"] == "PATCH"]) == 1
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED and job.node_id is None
    assert not TrainingJob.objects.unscoped().filter(node=platform_node).exists()


def test_the_job_runs_on_its_pods_once_all_are_up_and_its_trainjob_goes_when_it_ends(
    cluster, workspace
):
    make_node(gpus=8)
    job = make_job(workspace, workers=2, cpu_milli=1000, memory_mb=256, gpu_count=1)
    schedule_tick()
    first = pod_node(job, 0)
    schedule_tick()
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
    assert "1 of 2 pods ready" in JobScheduling.objects.unscoped().get(job=job).reason

    second = pod_node(job, 1)
    other = make_job(workspace, cpu_milli=1000, memory_mb=256)  # another job: its own TrainJob
    summary = schedule_tick()
    assert summary["placed"] == 1
    job.refresh_from_db()
    assert job.state == JobState.PLACED and job.node_id == first.pk
    assert job.assigned_gpus == [{"index": 0, "milli": 1000}]
    sched = JobScheduling.objects.unscoped().get(job=job)
    assert sched.policy == "kueue"
    assert [w["node"] for w in sched.gang_nodes] == [first.pk, second.pk]
    assert "started by Kueue" in sched.reason
    other.refresh_from_db()
    assert other.state == JobState.ADMITTED and other.node_id is None  # not on job's pods

    job_transition(job=job, to=JobState.RUNNING, expect=JobState.PLACED, attempts=1)
    job_transition(job=job, to=JobState.SUCCEEDED, expect=JobState.RUNNING, reason="done")
    summary = schedule_tick()
    assert summary["trainjobs_deleted"] == 1
    assert path(job) in cluster.paths("DELETE") and path(job) not in cluster.objects
    assert JobScheduling.objects.unscoped().get(job=job).trainjob == ""


def test_an_unreachable_cluster_is_said_and_tried_again(settings, workspace):
    settings.TRAINING_BACKEND = "kueue"
    settings.TRAINING_KUBECONFIG = ""
    job = make_job(workspace)
    schedule_tick()
    sched = JobScheduling.objects.unscoped().get(job=job)
    assert sched.trainjob == ""
    assert "no cluster configured (TRAINING_KUBECONFIG)" in sched.reason
    assert f"cannot submit TrainJob rankops-job-{job.pk}" in sched.reason


def test_a_pods_agent_labels_its_node_and_cordons_it_when_the_pod_stops(monkeypatch, settings):
    settings.TRAINING_BACKEND = "kueue"
    monkeypatch.setenv(agent.TRAINJOB_ENV, "rankops-job-9")
    inventory = agent.node_inventory()
    assert inventory["labels"] == {TRAINJOB_LABEL: "rankops-job-9"}
    node = agent.node_heartbeat("rankops-job-9-node-0-0", "node.rankops-job-9-node-0-0")
    assert node.labels == {TRAINJOB_LABEL: "rankops-job-9"}
    ordinary = make_node(gpus=1)
    assert [n.pk for n in schedulable_nodes(include_lending=False)] == [ordinary.pk]
    monkeypatch.setattr(agent.HEARTBEATS, "names", [node.name])
    assert agent.pod_stopping() == 1
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED and "TrainJob pod" in node.state_reason
    assert Node.objects.get(pk=ordinary.pk).state == NodeState.READY


def test_the_pages_say_that_kueue_places_the_work(cluster, workspace, client):
    job = make_job(workspace)
    member = make_member(workspace, Role.VIEWER)
    client.force_login(member)
    page = client.get(f"/w/{workspace.slug}/training/jobs/{job.pk}/").content.decode()
    assert f"Runs on Kubernetes as {trainjobs.describe(job)}" in page
    member.is_staff = True
    member.save()
    page = client.get("/scheduler/cluster/").content.decode()
    assert 'data-testid="kueue-handover"' in page and f"<code>{NS}</code>" in page
