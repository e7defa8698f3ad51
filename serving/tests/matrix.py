"""Permission-matrix rows for the serving app's REST routes (the lean /predict/ view and OIP are
covered by serving/tests/test_gateway.py)."""

from __future__ import annotations

import itertools

from django.conf import settings

from serving import registry
from serving.deployments import deployment_create, deployment_release
from serving.models import ModelVersion
from training.bundle import BundleSpec, FeatureSpec
from training.models import JobState, TrainingJob
from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_n = itertools.count(1)
PASSED = {"consistency": {"status": "passed"}, "performance": {"status": "passed"}}


def _job(ctx: MatrixContext) -> TrainingJob:
    from pathlib import Path

    import torch

    from training.bundle import build_model, save_bundle

    spec = BundleSpec(
        template="logreg",
        features=[FeatureSpec(ref="ctx:hour", column="ctx__hour", dtype="float", entity="context")],
    )
    n = next(_n)
    path = Path(settings.ARTIFACT_ROOT) / "matrix" / f"b{n}"
    torch.manual_seed(n)
    save_bundle(path, build_model(spec), spec)
    return TrainingJob.objects.create(
        workspace=ctx.workspace,
        name=f"mjob-{n}",
        state=JobState.SUCCEEDED,
        model_path=str(path.relative_to(Path(settings.ARTIFACT_ROOT))),
    )


def _version(ctx: MatrixContext, name: str = "mx") -> ModelVersion:
    version = registry.model_version_register(
        actor=None, workspace=ctx.workspace, name=name, job=_job(ctx)
    )
    ModelVersion.objects.for_workspace(ctx.workspace).filter(pk=version.pk).update(gates=PASSED)
    version.gates = PASSED
    return version


def _model(ctx):
    return {"name": _version(ctx).model.name}


def _version_kwargs(ctx):
    return {"pk": _version(ctx).pk}


def _deployment(ctx, *, released: bool = False):
    name = f"dep-{next(_n)}"
    first = _version(ctx, name=name)
    dep = deployment_create(actor=None, workspace=ctx.workspace, name=name, version=first)
    if released:
        deployment_release(
            actor=None, workspace=ctx.workspace, deployment=dep, version=_version(ctx, name=name)
        )
    ctx.extra["deployment"] = dep
    return {"name": name}


def _released(ctx):
    return _deployment(ctx, released=True)


def _release_body(ctx):
    dep = ctx.extra["deployment"]
    return {"version_id": _version(ctx, name=dep.model.name).pk, "reason": "matrix"}


def _failed_quality_version(ctx: MatrixContext) -> dict:
    """A version that failed the quality gate against a deployment's production."""
    from serving.models import Deployment, RegisteredModel

    model = RegisteredModel.objects.create(workspace=ctx.workspace, name=f"mxq{next(_n)}")
    production, version = (
        ModelVersion.objects.create(
            workspace=ctx.workspace, model=model, version=v, artifact_path=f"mx/{model.name}/{v}"
        )
        for v in (1, 2)
    )
    dep = Deployment.objects.create(
        workspace=ctx.workspace, name=model.name, model=model, version=production
    )
    version.quality = {
        "status": "failed",
        "deployment": dep.name,
        "production_version_id": dep.version_id,
        "failures": [{"metric": "auc", "candidate": 0.7, "production": 0.73, "limit": 0.01}],
    }
    version.save(update_fields=["quality"])
    ctx.extra["quality_deployment"] = dep.name
    return {"pk": version.pk}


ENDPOINTS = [
    Endpoint("GET", WS + "/models/", role=Role.VIEWER),
    Endpoint("GET", WS + "/models/{name}/", setup=_model, has_object=True),
    Endpoint(
        "POST",
        WS + "/models/{name}/alias/",
        role=Role.MAINTAINER,
        setup=_model,
        has_object=True,
        body=lambda ctx: {"alias": "candidate", "version": 1},
    ),
    Endpoint("GET", WS + "/model-versions/", role=Role.VIEWER),
    Endpoint("GET", WS + "/model-versions/{pk}/", setup=_version_kwargs, has_object=True),
    Endpoint(
        "POST",
        WS + "/model-versions/",
        role=Role.DEVELOPER,
        success=201,
        body=lambda ctx: {"model": "mx-new", "job_id": _job(ctx).pk},
    ),
    Endpoint(
        "POST",
        WS + "/model-versions/{pk}/gates/",
        role=Role.MAINTAINER,
        success=202,
        setup=_version_kwargs,
        has_object=True,
    ),
    Endpoint(
        "POST",
        WS + "/model-versions/{pk}/quality-override/",
        role=Role.MAINTAINER,
        setup=_failed_quality_version,
        has_object=True,
        body=lambda ctx: {"reason": "matrix"},
    ),
    Endpoint("GET", WS + "/deployments/", role=Role.VIEWER),
    Endpoint(
        "POST",
        WS + "/deployments/",
        role=Role.MAINTAINER,
        success=202,
        body=lambda ctx: {"name": f"new-{next(_n)}", "version_id": _version(ctx).pk},
    ),
    Endpoint("GET", WS + "/deployments/{name}/", setup=_deployment, has_object=True),
    Endpoint(
        "POST",
        WS + "/deployments/{name}/release/",
        role=Role.MAINTAINER,
        success=202,
        setup=_deployment,
        has_object=True,
        body=_release_body,
    ),
    Endpoint(
        "POST",
        WS + "/deployments/{name}/rollback/",
        role=Role.MAINTAINER,
        success=202,
        setup=_released,
        has_object=True,
        body=lambda ctx: {"reason": "matrix rollback"},
    ),
    Endpoint(
        "POST",
        WS + "/deployments/{name}/scale/",
        role=Role.MAINTAINER,
        success=202,
        setup=_deployment,
        has_object=True,
        body=lambda ctx: {"replicas": 2},
    ),
    Endpoint(
        "POST",
        WS + "/deployments/{name}/stop/",
        role=Role.MAINTAINER,
        success=202,
        setup=_deployment,
        has_object=True,
        body=lambda ctx: {"reason": "matrix stop"},
    ),
    Endpoint("GET", WS + "/deployments/{name}/routing/", setup=_deployment, has_object=True),
    Endpoint("GET", WS + "/deployments/{name}/stats/", setup=_deployment, has_object=True),
    Endpoint("GET", WS + "/deployments/{name}/history/", setup=_deployment, has_object=True),
]
