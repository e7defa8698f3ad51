"""Body-reference rows of the serving API: jobs, model versions and MLflow import sources.

``auto_deploy`` (model-versions) names a deployment of the caller's workspace that is created on
first use, so another workspace's name only makes one of its own; one serving another model is
refused before anything is written (test_version_register_refs.py)."""

from __future__ import annotations

import itertools
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings

from serving.models import ModelVersion
from serving.tests import matrix
from serving.tests.helpers import log_stock_run, register_stock_model
from training.bundle import build_model
from workspaces.testing.permission_matrix import BodyReference, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_n = itertools.count(1)
MISSING_RUN = "0" * 32


def _run(ctx: MatrixContext) -> str:
    spec = matrix.BundleSpec(
        template="logreg",
        features=[
            matrix.FeatureSpec(ref="ctx:hour", column="ctx__hour", dtype="float", entity="context")
        ],
    )
    return log_stock_run(ctx.workspace, spec, build_model(spec).state_dict())


def _run_folder(ctx: MatrixContext) -> str:
    import mlflow

    uri = mlflow.MlflowClient(settings.MLFLOW_TRACKING_URI).get_run(_run(ctx)).info.artifact_uri
    return (Path(unquote(urlsplit(uri).path)) / "model").as_uri()


def _import(ctx: MatrixContext, source: str) -> dict:
    return {"model": f"imported-{next(_n)}", "source": source}


def _platform_model(ctx: MatrixContext) -> str:
    version = matrix._version(ctx, name=f"plat-{next(_n)}")
    return f"models:/{ctx.workspace.slug}.{version.model.name}/{version.version}"


def _model_with_versions(ctx: MatrixContext) -> dict:
    """A model of the caller's workspace with one version; other workspaces get its name."""
    ctx.extra["model"] = f"aliased-{next(_n)}"
    matrix._version(ctx, name=ctx.extra["model"])
    return {"name": ctx.extra["model"]}


def _model_name(ctx: MatrixContext) -> str:
    """The name setup() gave the caller's model (read from the other workspace too)."""
    return ctx.extra.get("home", ctx.extra)["model"]


def _next_version_number(ctx: MatrixContext) -> int:
    """Two more versions of the same model name in ctx's workspace; the number of the last."""
    matrix._version(ctx, name=_model_name(ctx))
    return matrix._version(ctx, name=_model_name(ctx)).version


def _deployment(ctx: MatrixContext) -> dict:
    kwargs = matrix._deployment(ctx)
    ctx.extra["model"] = ctx.extra["deployment"].model.name
    return kwargs


def _version_of_the_deployed_model(ctx: MatrixContext) -> int:
    return matrix._version(ctx, name=_model_name(ctx)).pk


def _quality_deployment(ctx: MatrixContext) -> str:
    """The deployment the version in the URL failed against (another workspace: one of its
    own, which must not be found)."""
    if "home" not in ctx.extra:
        return ctx.extra["quality_deployment"]
    from serving.models import Deployment, RegisteredModel

    model = RegisteredModel.objects.create(workspace=ctx.workspace, name=f"refq-{next(_n)}")
    version = ModelVersion.objects.create(
        workspace=ctx.workspace, model=model, version=1, artifact_path=f"mx/{model.name}/1"
    )
    return Deployment.objects.create(
        workspace=ctx.workspace, name=model.name, model=model, version=version
    ).name


def _dataset_id(ctx: MatrixContext) -> int:
    """A ready dataset with 0/1 labels (the serving scene's)."""
    from serving.tests.factories import make_scene

    return make_scene(ctx.workspace, None).dataset.pk


def _review_home(ctx: MatrixContext) -> dict:
    """Two language-model versions, prompts and two reviewers in the caller's workspace, for
    a review's body (other workspaces read the model's name)."""
    a, b = matrix._lm_versions(ctx)
    ctx.extra.update(
        model=a.model.name,
        version_a=a.version,
        version_b=b.version,
        record_set=matrix._prompts(ctx).pk,
        reviewers=[ctx.new_member().username, ctx.new_member().username],
    )
    return {}


def _review_body(ctx: MatrixContext, **refs) -> dict:
    home = ctx.extra
    fields = ("model", "version_a", "version_b", "record_set", "reviewers")
    return {**{f: home[f] for f in fields}, "items": 2, "max_new_tokens": 2, **refs}


def _review_version_number(ctx: MatrixContext) -> int:
    """A version number the caller's model lacks, made in ctx's workspace under its name (in
    the caller's workspace: one more version of it)."""
    count = 3 if "home" in ctx.extra else 1
    return matrix._lm_versions(ctx, name=_model_name(ctx), count=count)[-1].version


REFERENCES = [
    BodyReference(
        "POST",
        WS + "/model-versions/{pk}/quality-override/",
        "deployment",
        setup=matrix._failed_quality_version,
        make=_quality_deployment,
        body=lambda ctx, ref: {"reason": "body reference", "deployment": ref},
        missing="no-such-deployment",
        success=200,
    ),
    BodyReference(
        "POST",
        WS + "/model-versions/",
        "job_id",
        make=lambda ctx: matrix._job(ctx).pk,
        body=lambda ctx, ref: {"model": f"from-job-{next(_n)}", "job_id": ref},
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/model-versions/",
        "source runs:/",
        make=lambda ctx: f"runs:/{_run(ctx)}/model",
        body=_import,
        attr="source",
        missing=f"runs:/{MISSING_RUN}/model",
    ),
    BodyReference(
        "POST",
        WS + "/model-versions/",
        "source models:/ (stock client)",
        make=lambda ctx: register_stock_model(ctx.workspace, f"stock-{next(_n)}", _run(ctx)),
        body=_import,
        attr="source",
        missing="models:/no-such-workspace.ranker/1",
    ),
    BodyReference(
        "POST",
        WS + "/model-versions/",
        "source models:/ (platform registry)",
        make=_platform_model,
        body=_import,
        attr="source",
        missing="models:/no-such-workspace.ranker/1",
    ),
    BodyReference(
        "POST",
        WS + "/model-versions/",
        "source file://",
        make=_run_folder,
        body=_import,
        attr="source",
        missing=(Path(settings.MLFLOW_ARTIFACT_ROOT) / "no-such-workspace" / "model").as_uri(),
    ),
    BodyReference(
        "POST",
        WS + "/models/{name}/alias/",
        "version",
        setup=_model_with_versions,
        make=_next_version_number,
        body=lambda ctx, ref: {"alias": "staging", "version": ref},
        missing=999,
        success=200,
    ),
    BodyReference(
        "POST",
        WS + "/deployments/",
        "version_id",
        make=lambda ctx: matrix._version(ctx).pk,
        body=lambda ctx, ref: {"name": f"refdep-{next(_n)}", "version_id": ref},
        missing=999_999,
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/deployments/{name}/release/",
        "version_id",
        setup=_deployment,
        make=_version_of_the_deployed_model,
        body=lambda ctx, ref: {"version_id": ref, "reason": "body reference"},
        missing=999_999,
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/benchmarks/",
        "record_set_id",
        make=lambda ctx: matrix._ranking_record_set(ctx).pk,
        body=lambda ctx, ref: {"name": f"bm-ref-{next(_n)}", "record_set_id": ref},
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/benchmarks/",
        "dataset_id",
        make=_dataset_id,
        body=lambda ctx, ref: {"name": f"bm-ref-{next(_n)}", "dataset_id": ref},
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/reviews/",
        "model",
        setup=_review_home,
        make=lambda ctx: matrix._lm_versions(ctx)[0].model.name,
        body=lambda ctx, ref: _review_body(ctx, model=ref),
        missing="no-such-model",
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/reviews/",
        "version_a",
        setup=_review_home,
        make=_review_version_number,
        body=lambda ctx, ref: _review_body(ctx, version_a=ref),
        missing=999,
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/reviews/",
        "version_b",
        setup=_review_home,
        make=_review_version_number,
        body=lambda ctx, ref: _review_body(ctx, version_b=ref),
        missing=999,
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/reviews/",
        "record_set",
        setup=_review_home,
        make=lambda ctx: matrix._prompts(ctx).pk,
        body=lambda ctx, ref: _review_body(ctx, record_set=ref),
        missing=999_999,
        success=202,
    ),
    # a member of another workspace is no member of this one, as a user who does not exist
    BodyReference(
        "POST",
        WS + "/reviews/",
        "reviewers",
        setup=_review_home,
        make=lambda ctx: ctx.new_member().username,
        body=lambda ctx, ref: _review_body(ctx, reviewers=[ctx.extra["reviewers"][0], ref]),
        missing="no-such-user",
        success=202,
        status=400,
    ),
]

NO_REFERENCES = {
    "POST " + WS + "/benchmark-scores/{pk}/rescore/": "no body; the score is in the URL",
    "POST " + WS + "/model-versions/{pk}/gates/": "no body; the version is in the URL",
    "POST " + WS + "/model-versions/{pk}/quantize/": "a method only; the version is in the URL",
    "POST " + WS + "/model-versions/{pk}/try/": "feature values or a prompt; the version is in "
    "the URL",
    "POST " + WS + "/deployments/{name}/rollback/": "a reason only",
    "POST " + WS + "/deployments/{name}/scale/": "replicas and a scaling policy only",
    "POST " + WS + "/deployments/{name}/stop/": "a reason only",
    "POST " + WS + "/reviews/{pk}/close/": "no body; the review is in the URL",
    "POST " + WS + "/reviews/{pk}/judgements/": "an item's position within the review in the URL "
    "and a choice",
}
