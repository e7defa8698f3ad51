"""Training on Kubernetes through Kueue (``TRAINING_BACKEND=kueue``): each job runs as a Kubeflow
Trainer ``TrainJob``, queued by Kueue.

When the scheduler admits a job (the workspace's quota, as for any job) it no longer places it
on the platform's nodes: it applies the job's TrainJob (``platform/k8s/training/
trainjob.yaml.tmpl``: the LocalQueue ``rankops``, the WorkloadPriorityClass mapped from the job's
priority class, one pod per worker with the job's CPU, memory and GPUs) in
``TRAINING_K8S_NAMESPACE`` of the cluster ``TRAINING_KUBECONFIG`` names. Kueue decides when and
where it starts (its ClusterQueue quotas, ResourceFlavors for stable and preemptible capacity,
priorities). Each pod runs the platform's node agent (the runtime ``rankops-agent``,
``platform/k8s/kueue/agent-runtime.yaml``), which registers a node named after the pod and
labelled ``TRAINJOB_LABEL`` = the TrainJob's name; once all of a job's pods have registered, the
tick places the job on exactly those nodes (a gang over them when it has several workers: their
ranks join at the pods' addresses, ``training.distributed``) and the agents run it as on any
node, reporting progress, checkpoints, metrics and events to the platform. No other job is ever
placed on those nodes, and the platform's placement never uses them.

Preemption by Kueue suspends the TrainJob and its pods get SIGTERM: each agent cordons its node,
its running child checkpoints, and the job is preempted and requeued as by the platform's own
preemption; the TrainJob stays, and when Kueue admits it again the new pods resume the job from
its checkpoint. A job that ends (succeeded, failed, cancelled) has its TrainJob deleted.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from django.conf import settings

from training.models import TERMINAL_STATES, TRAINJOB_LABEL, Node, NodeState, TrainingJob
from workspaces import kube

TEMPLATE = Path(settings.BASE_DIR) / "platform" / "k8s" / "training" / "trainjob.yaml.tmpl"
QUEUE = "rankops"  # the LocalQueue of platform/k8s/kueue/cluster-queue.yaml
TIMEOUT_S = 30


def enabled() -> bool:
    return str(getattr(settings, "TRAINING_BACKEND", "nodes")) == "kueue"


def name(job: TrainingJob) -> str:
    return f"rankops-job-{job.pk}"


def namespace() -> str:
    return str(settings.TRAINING_K8S_NAMESPACE)


def describe(job: TrainingJob) -> str:
    """What the job runs as, in words (its scheduling reason and the job page say it)."""
    return (
        f"TrainJob {name(job)} in namespace {namespace()} "
        f"(Kueue queue {QUEUE}, priority rankops-{job.priority_class})"
    )


def render(job: TrainingJob) -> dict[str, Any]:
    """The job's TrainJob, as the API server takes it."""
    gpus = int(job.gpu_count or 0) or (1 if job.gpu_milli else 0)
    text = string.Template(TEMPLATE.read_text()).substitute(
        name=name(job),
        namespace=namespace(),
        priority=job.priority_class,
        image=settings.TRAINING_IMAGE,
        workers=max(int(job.workers or 1), 1),
        cpu=f"{max(int(job.cpu_milli or 0), 1)}m",
        memory=f"{max(int(job.memory_mb or 0), 1)}Mi",
        gpus=gpus,
    )
    (body,) = kube.manifest_objects(text)
    return body


def errors() -> tuple[type[BaseException], ...]:
    """A call to the cluster's failures (none configured, an API error, no answer)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return (kube.ClusterUnavailableError, ApiException, HTTPError, OSError)


def _client() -> Any:
    return kube.new_client(settings.TRAINING_KUBECONFIG, setting="TRAINING_KUBECONFIG")


def submit(job: TrainingJob) -> None:
    """Apply the job's TrainJob (idempotent)."""
    with _client() as api_client:
        kube.apply(api_client, render(job), timeout=TIMEOUT_S)


def remove(trainjob: str) -> bool:
    """Delete a TrainJob (its pods go with it); ``False`` when it was gone already."""
    with _client() as api_client:
        return kube.delete(api_client, "TrainJob", trainjob, namespace(), timeout=TIMEOUT_S)


def nodes_for(job: TrainingJob) -> list[Node]:
    """The ready nodes the job's TrainJob pods registered, oldest first."""
    return list(
        Node.objects.filter(
            state=NodeState.READY, **{f"labels__{TRAINJOB_LABEL}": name(job)}
        ).order_by("pk")
    )


def sync(handover: list[int]) -> dict[str, int]:
    """After a tick: apply the TrainJobs of the admitted jobs in ``handover`` (the tick found no
    pods of theirs), and delete those of jobs that ended. A cluster that cannot be reached is
    said in the job's scheduling reason, and the next tick tries again."""
    from training.scheduler.models import JobScheduling

    out = {"trainjobs_submitted": 0, "trainjobs_deleted": 0}
    for job in TrainingJob.objects.unscoped().filter(pk__in=handover):
        try:
            submit(job)
        except errors() as exc:
            reason = f"cannot submit {describe(job)}: {type(exc).__name__}: {exc}"
            JobScheduling.objects.unscoped().filter(job=job).update(reason=reason[:300])
            continue
        JobScheduling.objects.unscoped().filter(job=job).update(
            trainjob=name(job), reason=f"waiting for Kueue to start {describe(job)}"[:300]
        )
        out["trainjobs_submitted"] += 1
    ended = JobScheduling.objects.unscoped().filter(trainjob__gt="", job__state__in=TERMINAL_STATES)
    for sched in ended.only("pk", "trainjob"):
        try:
            remove(sched.trainjob)
        except errors():
            continue  # tried again on the next tick
        JobScheduling.objects.unscoped().filter(pk=sched.pk).update(trainjob="")
        out["trainjobs_deleted"] += 1
    return out
