"""The serving demo step (order 30): register the demo-trained model, run gates, deploy."""

from __future__ import annotations

DEMO_WORKSPACE = "feed-pctr"
DEMO_MODEL = "feed-ranker"
DEMO_DEPLOYMENT = "feed-ranker"


def run_serving_demo(base_url: str, stdout) -> None:
    from serving.models import Deployment, ModelVersion
    from serving.pipeline import gates_and_deploy
    from serving.registry import model_version_register
    from training.models import JobState, TrainingJob
    from workspaces.models import Workspace

    workspace = Workspace.objects.filter(slug=DEMO_WORKSPACE).first()
    if workspace is None:
        stdout.write("serving demo: no workspace feed-pctr; skipped\n")
        return
    job = (
        TrainingJob.objects.for_workspace(workspace)
        .filter(state=JobState.SUCCEEDED)
        .exclude(model_path="")
        .order_by("-finished_at", "-id")
        .first()
    )
    if job is None:
        stdout.write("serving demo: no succeeded training job with a model yet; skipped\n")
        return
    version = ModelVersion.objects.for_workspace(workspace).filter(job=job).first()
    if version is None:
        version = model_version_register(actor=None, workspace=workspace, name=DEMO_MODEL, job=job)
        stdout.write(f"serving demo: registered {version}\n")
    dep = Deployment.objects.for_workspace(workspace).filter(name=DEMO_DEPLOYMENT).first()
    if dep is not None and dep.version_id == version.pk:
        stdout.write(f"serving demo: {version} already serves {DEMO_DEPLOYMENT}\n")
        return
    version = gates_and_deploy(
        actor=None, workspace=workspace, version=version, deployment=DEMO_DEPLOYMENT
    )
    stdout.write(
        f"serving demo: gates {version.gate_status} for {version}; "
        f"predict at {base_url}/api/v1/workspaces/{DEMO_WORKSPACE}/predict/ "
        f"(deployment '{DEMO_DEPLOYMENT}')\n"
    )
