from pathlib import Path

from serving import registry
from serving.deployments import deployment_create
from serving.gates import version_gates_run
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec


def passing_version(scene, actor, *, seed: int = 0, name: str = "ranker", transforms=None):
    job = make_job(scene, make_bundle(make_spec(scene, serving_transforms=transforms), seed=seed))
    version = registry.model_version_register(
        actor=actor, workspace=scene.workspace, name=name, job=job
    )
    return version_gates_run(actor=actor, workspace=scene.workspace, version=version)


def deployed(workspace, actor, *, versions: int = 2, name: str = "main"):
    """A scene, ``versions`` gated versions and a deployment serving the first."""
    scene = make_scene(workspace, actor)
    made = [passing_version(scene, actor, seed=i) for i in range(versions)]
    dep = deployment_create(actor=actor, workspace=workspace, name=name, version=made[0])
    return scene, made, dep


def predict_body(scene, *, request_id: str, user: str = "u1", deployment: str = "main", n=None):
    items = scene.item_ids if n is None else (scene.item_ids * 10)[:n]
    return {"request_id": request_id, "deployment": deployment, "user": user, "candidates": items}


def workspace_experiment(workspace) -> str:
    """The MLflow experiment the workspace's training jobs log to, made the way
    ``training.agent.Tracker`` makes it: ``rankops/<slug>``, artifacts under ``<root>/<slug>``."""
    import mlflow
    from django.conf import settings

    client = mlflow.MlflowClient(tracking_uri=settings.MLFLOW_TRACKING_URI)
    name = f"rankops/{workspace.slug}"
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = (Path(settings.MLFLOW_ARTIFACT_ROOT) / workspace.slug).as_uri()
    return client.create_experiment(name, artifact_location=location)


def log_stock_run(workspace, spec, state: dict, *, tags: dict | None = None) -> str:
    """A run logged with the stock MLflow client in the workspace's experiment: the bundle spec
    and a state dict under ``model/`` and an ``auc`` metric; returns the run id."""
    import mlflow
    from django.conf import settings

    mlflow.set_tracking_uri(settings.MLFLOW_TRACKING_URI)
    run_tags = {"rankops.workspace": workspace.slug, **(tags or {})}
    with mlflow.start_run(experiment_id=workspace_experiment(workspace), tags=run_tags) as run:
        mlflow.log_dict(spec.to_json(), "model/spec.json")
        mlflow.pytorch.log_state_dict(state, "model")
        mlflow.log_metric("auc", 0.73)
    return run.info.run_id


def register_stock_model(workspace, name: str, run_id: str) -> str:
    """``<slug>.<name>`` registered with the stock client from the run's ``model/`` artifacts;
    returns its ``models:/`` URI."""
    import mlflow
    from django.conf import settings

    client = mlflow.MlflowClient(tracking_uri=settings.MLFLOW_TRACKING_URI)
    full = f"{workspace.slug}.{name}"
    try:
        client.get_registered_model(full)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(full)
    version = client.create_model_version(full, source=f"runs:/{run_id}/model", run_id=run_id)
    return f"models:/{full}/{version.version}"
