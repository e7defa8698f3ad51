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
