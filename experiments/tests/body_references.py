"""Body-reference rows of the experiments API: the deployment and the treatment versions.

``layer`` names a layer of the caller's workspace, created on first use (never another's)."""

from __future__ import annotations

import itertools

from experiments.tests.factories import make_deployment
from workspaces.testing.permission_matrix import BodyReference, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_keys = itertools.count(1)


def _body(ctx: MatrixContext, *, deployment: str | None = None, versions=None) -> dict:
    dep, (treatment,) = make_deployment(ctx.workspace)
    return {
        "key": f"ref{next(_keys)}",
        "hypothesis": "lift",
        "deployment": deployment or dep.name,
        "treatment_versions": versions or [treatment.pk],
        "ramp_plan": [5, 10],
    }


def _deployment_name(ctx: MatrixContext) -> str:
    return make_deployment(ctx.workspace)[0].name


def _treatment_id(ctx: MatrixContext) -> int:
    return make_deployment(ctx.workspace)[1][0].pk


def _group_name(ctx: MatrixContext) -> str:
    from features.tests.factories import make_group

    return make_group(ctx.workspace, features=[{"name": "f", "dtype": "float"}]).name


def _loop_body(ctx: MatrixContext, *, group: str | None = None, deployment=None) -> dict:
    return {"group": group or _group_name(ctx), "deployment": deployment or _deployment_name(ctx)}


REFERENCES = [
    BodyReference(
        "POST",
        WS + "/loops/",
        "group",
        make=_group_name,
        body=lambda ctx, ref: _loop_body(ctx, group=ref),
        missing="no_such_group",
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/loops/",
        "deployment",
        make=_deployment_name,
        body=lambda ctx, ref: _loop_body(ctx, deployment=ref),
        missing="no-such-deployment",
        success=202,
    ),
    BodyReference(
        "POST",
        WS + "/experiments/",
        "deployment",
        make=_deployment_name,
        body=lambda ctx, ref: _body(ctx, deployment=ref),
        missing="no-such-deployment",
    ),
    BodyReference(
        "POST",
        WS + "/experiments/",
        "treatment_versions",
        make=_treatment_id,
        body=lambda ctx, ref: _body(ctx, versions=[ref]),
        missing=999_999,
    ),
]

NO_REFERENCES = {
    "POST " + WS + "/loops/{pk}/retry/": "a reason only; the loop is in the URL",
    "POST " + WS + "/experiments/{key}/submit/": "no body; the experiment is in the URL",
    "POST " + WS + "/experiments/{key}/approve/": "a note only",
    "POST " + WS + "/experiments/{key}/ramp/": "no body",
    "POST " + WS + "/experiments/{key}/stop/": "a reason only",
    "POST " + WS + "/experiments/{key}/conclude/": "an arm of the experiment in the URL",
    "POST " + WS + "/experiment-layers/": "a new layer's name",
    # Request ids are the gateway's, matched only against this workspace's prediction log: one
    # of another workspace is unmatched like an unknown one (test_feedback_body_references.py).
    "POST " + WS + "/feedback/": "request ids, matched inside the workspace only",
}
