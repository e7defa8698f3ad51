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


def _ranking_record_set(ctx: MatrixContext):
    """A ready record set of 0/1-labelled rows with the matrix bundle's one feature column."""
    import json

    from curation.services import record_set_upload

    rows = [{"ctx__hour": float(h), "label": h % 2} for h in range(8)]
    return record_set_upload(
        actor=None,
        workspace=ctx.workspace,
        name=f"bm_rows_{next(_n)}",
        content="\n".join(json.dumps(r) for r in rows).encode(),
        fmt="jsonl",
    )


def _benchmark(ctx: MatrixContext):
    from serving.benchmarks import benchmark_set_create

    return benchmark_set_create(
        actor=None,
        workspace=ctx.workspace,
        name=f"bm-{next(_n)}",
        record_set=_ranking_record_set(ctx),
    )


def _benchmark_kwargs(ctx: MatrixContext) -> dict:
    return {"pk": _benchmark(ctx).pk}


def _score(ctx: MatrixContext, *, state: str = "done"):
    from serving.models import BenchmarkScore

    version = _version(ctx)  # registered before the set: the set asks for its score
    score, _ = BenchmarkScore.objects.for_workspace(ctx.workspace).update_or_create(
        benchmark=_benchmark(ctx),
        version=version,
        defaults={"state": state, "workspace": ctx.workspace},
    )
    return score


def _score_kwargs(ctx: MatrixContext, *, state: str = "done") -> dict:
    return {"pk": _score(ctx, state=state).pk}


# Blind reviews: language-model versions are LoRA adapters on one tiny GPT-2, built once per
# process under the allowed base-model folders (artifacts are wiped between tests, base models
# are not) and removed when the process ends.
_review_base: dict[str, object] = {}


def _lm_base():
    import atexit
    import os
    import shutil
    from pathlib import Path

    root = str(settings.TRAINING_BASE_MODEL_ROOTS[0])
    if root not in _review_base:
        from training.tests.test_lm_lora import instruction_rows, save_tiny_model

        base = Path(root) / f"matrix-review-{os.getpid()}"
        if not base.is_dir():
            save_tiny_model(base, instruction_rows())
            atexit.register(shutil.rmtree, base, ignore_errors=True)
        _review_base[root] = base
    return _review_base[root]


def _lm_versions(ctx: MatrixContext, name: str = "", count: int = 2) -> list[ModelVersion]:
    """``count`` registered language-model versions of model ``name`` (a new one when blank)."""
    from pathlib import Path

    from serving.tests.test_review import save_adapter

    name = name or f"revlm-{next(_n)}"
    versions = []
    for _ in range(count):
        n = next(_n)
        folder = Path(settings.ARTIFACT_ROOT) / "matrix" / f"lm{n}" / "model"
        save_adapter(_lm_base(), folder, n)
        versions.append(
            registry.model_version_register(
                actor=None, workspace=ctx.workspace, name=name, bundle_path=folder
            )
        )
    return versions


def _prompts(ctx: MatrixContext):
    from serving.tests.test_review import upload_prompts

    return upload_prompts(ctx.workspace, None, name=f"review_prompts_{next(_n)}", rows=4)


def _reviewers(ctx: MatrixContext) -> list[str]:
    """Two reviewers: the actor where they are a member of ctx.workspace, and new members."""
    from workspaces.models import Membership

    names = []
    actor = ctx.actor
    members = Membership.objects.for_workspace(ctx.workspace)
    if actor is not None and members.filter(user=actor).exists():
        names.append(actor.username)
    while len(names) < 2:
        names.append(ctx.new_member().username)
    return names


def _review(ctx: MatrixContext, *, state: str = "open"):
    """An open review of two items (generated at once), judged once or done when asked."""
    from serving import review as reviews
    from serving.models import ReviewStatus

    a, b = _lm_versions(ctx)
    review = reviews.review_create(
        actor=None,
        workspace=ctx.workspace,
        version_a=a,
        version_b=b,
        record_set=_prompts(ctx),
        reviewers=_reviewers(ctx),
        items=2,
        max_new_tokens=2,
        background=False,
    )
    assert review.status == ReviewStatus.OPEN, review.error
    if state in ("judged", "done"):
        item = reviews.items_of(review).order_by("position").first()
        judge = review.reviewers.order_by("-pk").first()
        reviews.review_judge(actor=judge, review=review, item=item, side="tie")
    if state == "done":
        reviews.review_close(actor=None, review=review)
    return review


def _review_kwargs(ctx: MatrixContext, *, state: str = "open") -> dict:
    return {"pk": _review(ctx, state=state).pk}


def _review_create_body(ctx: MatrixContext) -> dict:
    a, b = _lm_versions(ctx)
    return {
        "model": a.model.name,
        "version_a": a.version,
        "version_b": b.version,
        "record_set": _prompts(ctx).pk,
        "reviewers": [ctx.new_member().username, ctx.new_member().username],
        "items": 2,
        "max_new_tokens": 2,
    }


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
        WS + "/model-versions/{pk}/try/",
        role=Role.DEVELOPER,
        success=200,
        setup=_version_kwargs,
        has_object=True,
        body=lambda ctx: {"rows": [{"ctx:hour": 3}]},
    ),
    Endpoint(
        "POST",
        WS + "/model-versions/{pk}/quantize/",
        role=Role.DEVELOPER,
        success=201,
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
    Endpoint("GET", WS + "/benchmarks/", role=Role.VIEWER),
    Endpoint("GET", WS + "/benchmarks/{pk}/", setup=_benchmark_kwargs, has_object=True),
    Endpoint(
        "POST",
        WS + "/benchmarks/",
        role=Role.DEVELOPER,
        success=201,
        body=lambda ctx: {
            "name": f"bm-new-{next(_n)}",
            "record_set_id": _ranking_record_set(ctx).pk,
        },
    ),
    Endpoint("GET", WS + "/benchmark-scores/", role=Role.VIEWER),
    Endpoint("GET", WS + "/benchmark-scores/{pk}/", setup=_score_kwargs, has_object=True),
    Endpoint(
        "POST",
        WS + "/benchmark-scores/{pk}/rescore/",
        role=Role.DEVELOPER,
        success=202,
        setup=lambda ctx: _score_kwargs(ctx, state="failed"),
        has_object=True,
    ),
    Endpoint("GET", WS + "/reviews/", role=Role.VIEWER),
    Endpoint("GET", WS + "/reviews/{pk}/", setup=_review_kwargs, has_object=True),
    Endpoint(
        "POST",
        WS + "/reviews/",
        role=Role.MAINTAINER,
        success=202,
        body=_review_create_body,
    ),
    # the actor reviews it (where a member): who judges is the review's to say
    Endpoint("GET", WS + "/reviews/{pk}/next/", setup=_review_kwargs, has_object=True),
    Endpoint(
        "POST",
        WS + "/reviews/{pk}/judgements/",
        role=Role.VIEWER,
        success=201,
        setup=_review_kwargs,
        has_object=True,
        body=lambda ctx: {"position": 0, "choice": "1"},
    ),
    Endpoint(
        "POST",
        WS + "/reviews/{pk}/close/",
        role=Role.MAINTAINER,
        setup=lambda ctx: _review_kwargs(ctx, state="judged"),
        has_object=True,
    ),
    # done: everybody in the workspace sees the results
    Endpoint(
        "GET",
        WS + "/reviews/{pk}/results/",
        setup=lambda ctx: _review_kwargs(ctx, state="done"),
        has_object=True,
    ),
]
