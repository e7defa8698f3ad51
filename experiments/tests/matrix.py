"""Permission-matrix rows for the experiments app's API routes."""

from __future__ import annotations

import itertools

from experiments import loop, services
from experiments.tests.factories import make_deployment
from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_keys = itertools.count(1)


def _experiment(ctx: MatrixContext, *, submit: bool = False, ramp_plan=(5, 10)):
    dep, (treatment,) = make_deployment(ctx.workspace)
    exp = services.experiment_create(
        actor=None,
        workspace=ctx.workspace,
        key=f"mx{next(_keys)}",
        hypothesis="matrix",
        deployment=dep.name,
        treatment_versions=[treatment.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.1}],
        ramp_plan=list(ramp_plan),
        layer=f"mxl{next(_keys)}",
    )
    if submit:
        exp = services.experiment_submit(actor=None, experiment=exp)
    return exp


def _key(**kw):
    return lambda ctx: {"key": _experiment(ctx, **kw).key}


def _new_experiment(ctx: MatrixContext) -> dict:
    dep, (treatment,) = make_deployment(ctx.workspace)
    return {
        "key": f"new{next(_keys)}",
        "hypothesis": "lift",
        "deployment": dep.name,
        "treatment_versions": [treatment.pk],
        "guardrails": [{"metric": "ctr", "max_drop": 0.1}],
        "ramp_plan": [5, 10],
    }


def _layer(ctx: MatrixContext) -> dict:
    return {
        "name": services.layer_create(
            actor=None, workspace=ctx.workspace, name=f"layer{next(_keys)}"
        ).name
    }


def _loop(ctx: MatrixContext, *, failed: bool = False) -> dict:
    from training import pipelines
    from training.models import PipelineRun, RunState

    run = pipelines.pipeline_run_start(
        actor=None, pipeline=loop.loop_pipeline(ctx.workspace), params={}, dispatch=False
    )
    if failed:
        PipelineRun.objects.for_workspace(ctx.workspace).filter(pk=run.pk).update(
            state=RunState.FAILED
        )
    return {"pk": run.pk}


def _new_loop(ctx: MatrixContext) -> dict:
    from features.tests.factories import make_group

    dep, _ = make_deployment(ctx.workspace)
    group = make_group(ctx.workspace, features=[{"name": "f", "dtype": "float"}])
    return {"group": group.name, "deployment": dep.name}


ENDPOINTS = [
    Endpoint("GET", WS + "/loops/", role=Role.VIEWER),
    Endpoint("POST", WS + "/loops/", role=Role.DEVELOPER, success=202, body=_new_loop),
    Endpoint("GET", WS + "/loops/{pk}/", setup=_loop, has_object=True),
    Endpoint(
        "POST",
        WS + "/loops/{pk}/retry/",
        role=Role.DEVELOPER,
        setup=lambda ctx: _loop(ctx, failed=True),
        has_object=True,
        body=lambda ctx: {},
    ),
    Endpoint("GET", WS + "/experiments/", role=Role.VIEWER),
    Endpoint("POST", WS + "/experiments/", role=Role.DEVELOPER, success=201, body=_new_experiment),
    Endpoint("GET", WS + "/experiments/{key}/", setup=_key(), has_object=True),
    Endpoint(
        "POST",
        WS + "/experiments/{key}/submit/",
        role=Role.DEVELOPER,
        setup=_key(),
        has_object=True,
    ),
    Endpoint(
        "POST",
        WS + "/experiments/{key}/approve/",
        role=Role.MAINTAINER,
        setup=_key(submit=True, ramp_plan=(5, 50)),
        has_object=True,
        body=lambda ctx: {},
    ),
    Endpoint(
        "POST",
        WS + "/experiments/{key}/ramp/",
        role=Role.MAINTAINER,
        setup=_key(submit=True),
        has_object=True,
    ),
    Endpoint(
        "POST",
        WS + "/experiments/{key}/stop/",
        role=Role.DEVELOPER,
        setup=_key(submit=True),
        has_object=True,
        body=lambda ctx: {"reason": "matrix"},
    ),
    Endpoint(
        "POST",
        WS + "/experiments/{key}/conclude/",
        role=Role.MAINTAINER,
        setup=_key(submit=True),
        has_object=True,
        body=lambda ctx: {"action": "discard"},
    ),
    Endpoint("GET", WS + "/experiments/{key}/analysis/", setup=_key(submit=True), has_object=True),
    Endpoint("GET", WS + "/experiments/{key}/snapshots/", setup=_key(submit=True), has_object=True),
    Endpoint("GET", WS + "/experiment-layers/", role=Role.VIEWER),
    Endpoint(
        "POST",
        WS + "/experiment-layers/",
        role=Role.DEVELOPER,
        success=201,
        body=lambda ctx: {"name": f"nl{next(_keys)}"},
    ),
    Endpoint("GET", WS + "/experiment-layers/{name}/", setup=_layer, has_object=True),
    Endpoint(
        "POST",
        WS + "/feedback/",
        role=Role.DEVELOPER,
        body=lambda ctx: {
            "events": [{"request_id": "r1", "event_id": f"e{next(_keys)}", "impressions": 1}]
        },
    ),
]
