"""Serving objects for experiments tests: a registered model, gated versions and a deployment,
written straight to the database (no bundle is loaded: routing only needs the rows)."""

from __future__ import annotations

import itertools
import uuid

from serving.models import Deployment, GateStatus, ModelVersion, PredictionLog, RegisteredModel

PASSED = {"consistency": {"status": "passed"}, "performance": {"status": "passed"}}
_names = itertools.count(1)


def make_model(workspace, name: str | None = None) -> RegisteredModel:
    return RegisteredModel.objects.create(workspace=workspace, name=name or f"m{next(_names)}")


def make_version(workspace, model: RegisteredModel, *, gated: bool = True) -> ModelVersion:
    number = ModelVersion.objects.for_workspace(workspace).filter(model=model).count() + 1
    return ModelVersion.objects.create(
        workspace=workspace,
        model=model,
        version=number,
        artifact_path=f"{workspace.slug}/models/{model.name}/{number}",
        gate_status=GateStatus.PASSED if gated else GateStatus.PENDING,
        gates=PASSED if gated else {},
    )


def make_deployment(workspace, *, name: str | None = None, treatments: int = 1, gated=True):
    """(deployment, [treatment versions]) with a production version and ``treatments`` more."""
    model = make_model(workspace)
    production = make_version(workspace, model)
    dep = Deployment.objects.create(
        workspace=workspace, name=name or f"dep{next(_names)}", model=model, version=production
    )
    return dep, [make_version(workspace, model, gated=gated) for _ in range(treatments)]


def log_predictions(workspace, dep, table_route, units, *, per_unit: int = 1):
    """What the gateway logs: one row per request, routed by ``table_route(unit)``; returns
    [(request_id, unit, arm)]."""
    rows, out = [], []
    for unit in units:
        version_id, experiment, arm = table_route(unit)
        for _ in range(per_unit):
            rid = uuid.uuid4().hex
            rows.append(
                PredictionLog(
                    workspace=workspace,
                    request_id=rid,
                    unit_id=unit,
                    deployment=dep,
                    deployment_name=dep.name,
                    model_version_id=version_id,
                    experiment_key=experiment or "",
                    arm=arm or "",
                )
            )
            out.append((rid, unit, arm))
    PredictionLog.objects.bulk_create(rows, batch_size=1000)
    return out
