"""The `make run` demo step: train a fine-ranking model on the demo data through the real path.

It builds a dataset from the demo feature groups (impressions labelled with clicks, joined with
user, ad and embedding features), submits a ``fine_ranking`` job, and waits while the scheduler
places it on the local node (the `make run` worker consumes ``node.local`` and beats for it) and
the agent trains it, so the newcomer finds curves, evaluation plots and importance on the job
page. Without a scheduler it places the job on the local node itself. Idempotent: a second run
finds the succeeded demo job and stops.
"""

from __future__ import annotations

import time

from django.core.exceptions import ValidationError

WORKSPACE = "feed-pctr"
DATASET = "demo_ctr_samples"
JOB = "demo-fine-ranking"
LOCAL_NODE = "local"
FEATURES = [
    "user_profile:age_bucket",
    "user_profile:gender",
    "user_profile:activity_level",
    "ad_profile:category",
    "ad_profile:price",
    "ad_profile:ctr_prior",
    "ad_profile:is_video",
    "user_embedding:interest",
]
PARAMS = {
    "epochs": 6,
    "batch_size": 256,
    "lr": 0.005,
    "log_every_steps": 5,
    "slice_column": "",
    "threads": 1,
}
PLACE_AFTER_S = 20.0
WAIT_S = 600.0


def _dataset(workspace, stdout):
    from features import services as features_services
    from features.models import Dataset, DatasetStatus, FeatureGroup

    ready = (
        Dataset.objects.for_workspace(workspace)
        .filter(name=DATASET, status=DatasetStatus.READY)
        .first()
    )
    if ready is not None:
        return ready
    labels = FeatureGroup.objects.for_workspace(workspace).filter(name="impressions").first()
    if labels is None:
        stdout.write("training demo: no impressions group (run the features demo first)\n")
        return None
    dataset = features_services.dataset_create(
        actor=None,
        workspace=workspace,
        name=DATASET,
        label_group=labels,
        label_columns=["click"],
        feature_refs=FEATURES,
    )
    stdout.write(
        f"training demo: dataset {dataset} is {dataset.status} ({dataset.row_count} rows)\n"
    )
    return dataset if dataset.status == DatasetStatus.READY else None


def place_locally(job, stdout, *, node_name: str = LOCAL_NODE) -> None:
    """Admit and place a job the scheduler has not placed on the local node (demo only)."""
    from training.models import JobState, Node
    from training.services import job_transition
    from training.tasks import run_job

    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return
    job.refresh_from_db()
    if job.state == JobState.PENDING:
        job_transition(job=job, to=JobState.ADMITTED, expect=JobState.PENDING, reason="demo")
    if job.state == JobState.ADMITTED:
        job_transition(
            job=job,
            to=JobState.PLACED,
            expect=JobState.ADMITTED,
            node=node,
            reason="demo: placed on the local node",
        )
        run_job.apply_async(args=[job.pk], queue=node.queue)
        stdout.write(f"training demo: placed job #{job.pk} on {node.name}\n")


def run_training_demo(base_url: str, stdout) -> None:
    from training.models import JobState, TrainingJob
    from training.services import job_create
    from workspaces.models import Workspace

    workspace = Workspace.objects.filter(slug=WORKSPACE).first()
    if workspace is None:
        stdout.write("training demo: no demo workspace\n")
        return
    done = (
        TrainingJob.objects.for_workspace(workspace)
        .filter(name=JOB, state=JobState.SUCCEEDED)
        .first()
    )
    if done is not None:
        stdout.write(f"training demo: job #{done.pk} already trained\n")
        return
    job = (
        TrainingJob.objects.for_workspace(workspace)
        .filter(name=JOB)
        .exclude(state__in=[JobState.FAILED, JobState.CANCELLED])
        .first()
    )
    if job is None:
        dataset = _dataset(workspace, stdout)
        if dataset is None:
            return
        try:
            job = job_create(
                actor=None,
                workspace=workspace,
                name=JOB,
                dataset=dataset,
                template="fine_ranking",
                params=PARAMS,
                priority_class="production",
            )
        except ValidationError as exc:
            stdout.write(f"training demo: job refused: {exc}\n")
            return
        stdout.write(f"training demo: submitted job #{job.pk} (fine_ranking)\n")
    started = time.monotonic()
    while time.monotonic() - started < WAIT_S:
        job.refresh_from_db()
        if job.is_terminal:
            break
        if job.state in {JobState.PENDING, JobState.ADMITTED} and (
            time.monotonic() - started > PLACE_AFTER_S
        ):
            place_locally(job, stdout)
        time.sleep(2)
    auc = ((job.metrics or {}).get("holdout") or {}).get("auc")
    stdout.write(f"training demo: job #{job.pk} is {job.state} (held-out AUC {auc})\n")
