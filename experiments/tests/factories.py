"""Serving objects for experiments tests: a registered model, gated versions and a deployment,
written straight to the database (no bundle is loaded: routing only needs the rows)."""

from __future__ import annotations

import itertools
import uuid

import numpy as np

from serving.models import Deployment, GateStatus, ModelVersion, PredictionLog, RegisteredModel
from serving.routing import route, routing_table

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


def served_in_experiment(workspace, dep, *, units: int) -> list[tuple[str, str, str]]:
    """Requests from ``units`` users routed by ``dep``'s live table and logged; only those an
    experiment's arm served: [(request_id, unit, arm)]."""
    table = routing_table(workspace, dep.name)
    logged = log_predictions(
        workspace, dep, lambda unit: route(table, unit), [f"u{i}" for i in range(units)]
    )
    return [row for row in logged if row[2]]


def click_events(
    served, *, click_rate: dict[str, float], seed: int, event_ids: bool = False, **fields
) -> list[dict]:
    """One feedback event per served request: 10 impressions, clicks drawn at the arm's
    ``click_rate`` (seeded, so a test's numbers repeat); ``event_ids`` names each event by its
    request; ``fields`` are added to every event."""
    rng = np.random.default_rng(seed)
    events = []
    for request_id, _, arm in served:
        event = {"request_id": request_id, "impressions": 10, **fields}
        event["clicks"] = int(rng.binomial(10, click_rate[arm]))
        if event_ids:
            event["event_id"] = request_id
        events.append(event)
    return events


def experiment_request(key: str, dep, treatments, **fields) -> dict:
    """The body a developer posts to create an A/B test of ``treatments`` on ``dep``: a 10% then
    20% ramp, a 10% click-rate guardrail, 20 units before any verdict."""
    return {
        "key": key,
        "hypothesis": "lift",
        "deployment": dep.name,
        "treatment_versions": [version.pk for version in treatments],
        "guardrails": [{"metric": "ctr", "max_drop": 0.1}],
        "ramp_plan": [10, 20],
        "min_units": 20,
        **fields,
    }
