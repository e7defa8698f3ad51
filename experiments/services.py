"""Use cases of the experiments app: layers, the request -> review -> ramp -> read -> conclude
flow, feedback, analysis snapshots and the guardrail/ramp check.

Every state change goes through ``_move`` (the only writer of ``Experiment.state``) inside a
transaction that also records its event; traffic changes go through ``routing_bridge`` (serving's
routing services), so the routing table and the experiment's state commit together.
"""

from __future__ import annotations

import math
import secrets
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from experiments import assignment, routing_bridge, stats
from experiments.models import (
    EXPERIMENT_MOVES,
    Experiment,
    ExperimentState,
    FeedbackEvent,
    Layer,
    Metric,
    SequentialMethod,
    Snapshot,
    Spending,
    Unit,
    key_validator,
)
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace
from workspaces.notifications import notify

# Workspace policy, overridable per workspace in ``workspace.template["experiments"]``.
DEFAULT_POLICY = {"max_percent": 50, "max_auto_percent": 20, "max_running": 20}
MAX_FEEDBACK_EVENTS = 5000
# The limits of an experiment's fields: the one source (the API serializers and the form read them).
MAX_TREATMENTS = 4
MAX_HYPOTHESIS_CHARS = 5000
MAX_RAMP_STEPS = 10
MAX_GUARDRAILS = 10
MAX_GUARDRAIL_DROP = 0.99
MAX_RAMP_INTERVAL_S = 90 * 86400
MIN_UNITS, MAX_UNITS = 2, 10_000_000
MIN_ALPHA, MAX_ALPHA = 0.001, 0.2


def policy_of(workspace: Workspace) -> dict[str, Any]:
    custom = (workspace.template or {}).get("experiments") or {}
    policy: dict[str, int | float] = dict(DEFAULT_POLICY)
    for key in policy:
        value = custom.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            policy[key] = value
    return policy


# --- layers ----------------------------------------------------------------------------------


@transaction.atomic
def layer_create(
    *, actor: Actor, workspace: Workspace, name: str, description: str = "", salt: str = ""
) -> Layer:
    """A layer with a fresh salt (or a given one, to reproduce an assignment): its units are
    split independently of every other layer's."""
    key_validator(name)
    if salt and (not isinstance(salt, str) or len(salt) > 100):
        raise ValidationError({"salt": "at most 100 characters"})
    if Layer.objects.for_workspace(workspace).filter(name=name).exists():
        raise ConflictError(f"layer '{name}' exists", attr="name")
    layer = Layer.objects.create(
        workspace=workspace,
        name=name,
        salt=salt or f"{workspace.slug}.{name}.{secrets.token_hex(6)}",
        description=str(description)[:2000],
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="experiments.layer.created",
        refs=[Ref.to(layer)],
        payload={"name": name, "salt": layer.salt},
    )
    return layer


def _layer(workspace: Workspace, layer: Layer | str | None, actor: Actor) -> Layer:
    if isinstance(layer, Layer):
        if layer.workspace_id != workspace.pk:
            raise ValidationError({"layer": "not a layer of this workspace"})
        return layer
    name = layer or "default"
    found = Layer.objects.for_workspace(workspace).filter(name=name).first()
    return found or layer_create(actor=actor, workspace=workspace, name=name)


# --- creating and reviewing ------------------------------------------------------------------


def _clean_guardrails(guardrails: Any) -> list[dict[str, Any]]:
    if guardrails in (None, ""):
        return []
    if not isinstance(guardrails, list) or len(guardrails) > MAX_GUARDRAILS:
        raise ValidationError(
            {"guardrails": f"give a list of {{metric, max_drop}} (at most {MAX_GUARDRAILS})"}
        )
    clean = []
    for i, rule in enumerate(guardrails):
        if not isinstance(rule, dict) or rule.get("metric") not in Metric.values:
            raise ValidationError({f"guardrails.{i}.metric": f"one of {Metric.values}"})
        drop = rule.get("max_drop", 0.05)
        if (
            not isinstance(drop, int | float)
            or isinstance(drop, bool)
            or not 0 <= drop <= MAX_GUARDRAIL_DROP
        ):
            raise ValidationError(
                {f"guardrails.{i}.max_drop": f"a relative drop in [0, {MAX_GUARDRAIL_DROP}]"}
            )
        clean.append({"metric": rule["metric"], "max_drop": float(drop)})
    return clean


def _clean_ramp(ramp_plan: Any, n_arms: int, workspace: Workspace) -> list[float]:
    policy = policy_of(workspace)
    if not isinstance(ramp_plan, list) or not 1 <= len(ramp_plan) <= MAX_RAMP_STEPS:
        raise ValidationError(
            {"ramp_plan": f"give 1-{MAX_RAMP_STEPS} per-arm percents, e.g. [1, 5, 20, 50]"}
        )
    plan: list[float] = []
    for value in ramp_plan:
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 100:
            raise ValidationError({"ramp_plan": "percents must be numbers in (0, 100]"})
        if plan and value <= plan[-1]:
            raise ValidationError({"ramp_plan": "percents must increase"})
        if abs(value * 100 - round(value * 100)) > 1e-9:
            raise ValidationError({"ramp_plan": "use at most two decimals (1 bucket = 0.01%)"})
        plan.append(float(value))
    if plan[-1] > policy["max_percent"]:
        raise ValidationError(
            {"ramp_plan": f"the workspace allows at most {policy['max_percent']}% per arm"}
        )
    if plan[-1] * n_arms > 100:
        raise ValidationError({"ramp_plan": f"{n_arms} arms x {plan[-1]}% exceed 100%"})
    return plan


def layer_free_buckets(
    workspace: Workspace, layer: Layer | str | None, *, exclude: Experiment | None = None
) -> int:
    """The widest run of buckets no running experiment holds in ``layer`` (a name that is no
    layer yet: all of them): the largest block an experiment starting now could get."""
    if not isinstance(layer, Layer):
        layer = Layer.objects.for_workspace(workspace).filter(name=layer or "default").first()
        if layer is None:
            return assignment.BUCKETS
    taken = (
        Experiment.objects.for_workspace(workspace)
        .filter(layer=layer, state=ExperimentState.RUNNING, block_start__isnull=False)
        .exclude(pk=exclude.pk if exclude is not None else None)
        .values_list("block_start", "block_size")
    )
    return assignment.largest_free_run(list(taken))


def layer_room(
    workspace: Workspace,
    layer: Layer | str | None,
    *,
    n_arms: int,
    top_percent: float | None = None,
    exclude: Experiment | None = None,
) -> dict[str, Any]:
    """What fits in a layer now: its free buckets, the most per-arm percent ``n_arms`` arms can
    reach there, and (with ``top_percent``) the buckets that ramp needs and whether it fits."""
    free = layer_free_buckets(workspace, layer, exclude=exclude)
    n_arms = max(2, n_arms)
    most = math.floor(free / n_arms / assignment.BUCKETS_PER_PERCENT * 100) / 100
    room: dict[str, Any] = {
        "layer": layer.name if isinstance(layer, Layer) else (layer or "default"),
        "free": free,
        "buckets": assignment.BUCKETS,
        "n_arms": n_arms,
        "max_percent": min(most, float(policy_of(workspace)["max_percent"])),
        "needed": None,
        "fits": None,
    }
    if top_percent is not None:
        room["needed"] = assignment.block_size(n_arms, top_percent)
        room["fits"] = room["needed"] <= free
    return room


def _check_room(
    workspace: Workspace,
    layer: Layer,
    n_arms: int,
    plan: list[float],
    exp: Experiment | None = None,
) -> None:
    """Refuse a ramp whose block (arms x top percent) does not fit the layer's free buckets."""
    room = layer_room(workspace, layer, n_arms=n_arms, top_percent=plan[-1], exclude=exp)
    if not room["fits"]:
        raise ValidationError(
            {
                "ramp_plan": f"layer '{layer.name}' has {room['free']} free buckets; {n_arms} "
                f"arms x {plan[-1]:g}% need {room['needed']} (at most {room['max_percent']:g}% "
                "per arm fits there; lower the plan or use another layer)"
            }
        )


def _clean_spec(
    *,
    actor: Actor,
    workspace: Workspace,
    hypothesis: str,
    deployment: Any,
    treatment_versions: list[int],
    layer: Layer | str | None,
    unit: str,
    primary_metric: str,
    guardrails: Any,
    ramp_plan: Any,
    ramp_interval_s: int,
    min_units: int,
    alpha: float,
    sequential_method: str,
    spending: str,
    experiment: Experiment | None = None,
    require_room: bool = False,
) -> tuple[dict[str, Any], list[Any]]:
    """The checked fields of an experiment (for create and for a draft's edit) and its treatment
    versions; the layer is created when it does not exist yet."""
    if not str(hypothesis or "").strip():
        raise ValidationError({"hypothesis": "say what you expect and why"})
    if len(str(hypothesis)) > MAX_HYPOTHESIS_CHARS:
        raise ValidationError({"hypothesis": f"at most {MAX_HYPOTHESIS_CHARS} characters"})
    dep = routing_bridge.deployment_of(workspace, deployment)
    if unit not in Unit.values:
        raise ValidationError({"unit": f"one of {Unit.values}"})
    if primary_metric not in Metric.values:
        raise ValidationError({"primary_metric": f"one of {Metric.values}"})
    if not isinstance(treatment_versions, list) or not 1 <= len(treatment_versions) <= (
        MAX_TREATMENTS
    ):
        raise ValidationError({"treatment_versions": f"give 1-{MAX_TREATMENTS} version ids"})
    versions = []
    for vid in treatment_versions:
        version = routing_bridge.version_of(workspace, vid)
        if version.pk == dep.version_id:
            raise ValidationError({"treatment_versions": "the production version is the control"})
        if version in versions:
            raise ValidationError({"treatment_versions": "versions must differ"})
        versions.append(version)
    arms = [{"name": "control", "version_id": dep.version_id}] + [
        {"name": "treatment" if len(versions) == 1 else f"treatment-{i + 1}", "version_id": v.pk}
        for i, v in enumerate(versions)
    ]
    if not isinstance(ramp_interval_s, int) or not 1 <= ramp_interval_s <= MAX_RAMP_INTERVAL_S:
        raise ValidationError(
            {
                "ramp_interval_s": "seconds between ramp steps, 1 .. "
                f"{MAX_RAMP_INTERVAL_S // 86400} days"
            }
        )
    if not isinstance(min_units, int) or not MIN_UNITS <= min_units <= MAX_UNITS:
        raise ValidationError({"min_units": f"{MIN_UNITS} .. {MAX_UNITS:,}"})
    if not isinstance(alpha, float | int) or not MIN_ALPHA <= alpha <= MAX_ALPHA:
        raise ValidationError({"alpha": f"{MIN_ALPHA} .. {MAX_ALPHA}"})
    if sequential_method not in SequentialMethod.values:
        raise ValidationError({"sequential_method": f"one of {SequentialMethod.values}"})
    if spending not in Spending.values:
        raise ValidationError({"spending": f"one of {Spending.values}"})
    plan = _clean_ramp(ramp_plan if ramp_plan is not None else [1, 5, 20, 50], len(arms), workspace)
    clean_guardrails = _clean_guardrails(guardrails)
    the_layer = _layer(workspace, layer, actor)
    if require_room:
        _check_room(workspace, the_layer, len(arms), plan, experiment)
    fields = {
        "hypothesis": str(hypothesis),
        "deployment": dep,
        "control_version_id": dep.version_id,
        "arms": arms,
        "layer": the_layer,
        "unit": unit,
        "primary_metric": primary_metric,
        "guardrails": clean_guardrails,
        "ramp_plan": plan,
        "ramp_interval_s": ramp_interval_s,
        "min_units": min_units,
        "alpha": float(alpha),
        "sequential_method": sequential_method,
        "spending": spending,
    }
    return fields, versions


@transaction.atomic
def experiment_create(
    *,
    actor: Actor,
    workspace: Workspace,
    key: str,
    hypothesis: str,
    deployment: Any,
    treatment_versions: list[int],
    layer: Layer | str | None = None,
    unit: str = Unit.USER,
    primary_metric: str = Metric.CTR,
    guardrails: Any = None,
    ramp_plan: Any = None,
    ramp_interval_s: int = 86400,
    min_units: int = 100,
    alpha: float = 0.05,
    sequential_method: str = SequentialMethod.GROUP_SEQUENTIAL,
    spending: str = Spending.OBRIEN_FLEMING,
    require_room: bool = False,
) -> Experiment:
    """A draft experiment: control is the deployment's production version. A draft may wait
    for room in its layer (the start refuses while there is none); with ``require_room`` its
    ramp must fit the layer's free buckets now (the browser form asks for that)."""
    key_validator(key)
    if Experiment.objects.for_workspace(workspace).filter(key=key).exists():
        raise ConflictError(f"experiment '{key}' exists", attr="key")
    fields, versions = _clean_spec(
        actor=actor,
        workspace=workspace,
        hypothesis=hypothesis,
        deployment=deployment,
        treatment_versions=treatment_versions,
        layer=layer,
        unit=unit,
        primary_metric=primary_metric,
        guardrails=guardrails,
        ramp_plan=ramp_plan,
        ramp_interval_s=ramp_interval_s,
        min_units=min_units,
        alpha=alpha,
        sequential_method=sequential_method,
        spending=spending,
        require_room=require_room,
    )
    exp = Experiment.objects.create(
        workspace=workspace,
        key=key,
        owner=actor_user(actor),
        **fields,
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="experiments.experiment.created",
        refs=[
            Ref.to(exp),
            Ref.to(fields["deployment"], role="related"),
            *(Ref.to(v, role="related") for v in versions),
        ],
        payload={"arms": exp.arms, "ramp_plan": exp.ramp_plan, "guardrails": exp.guardrails},
    )
    return exp


@transaction.atomic
def experiment_update(
    *, actor: Actor, experiment: Experiment, require_room: bool = False, **spec: Any
) -> Experiment:
    """Change a draft (same fields and checks as ``experiment_create``, the key stays); once
    submitted an experiment's design is fixed (409)."""
    exp = _lock(experiment)
    if exp.state != ExperimentState.DRAFT:
        raise ConflictError(f"experiment is {exp.state}; only a draft can be edited", attr="state")
    current = {
        "hypothesis": exp.hypothesis,
        "deployment": exp.deployment_id,
        "treatment_versions": [arm["version_id"] for arm in exp.arms[1:]],
        "layer": exp.layer,
        "unit": exp.unit,
        "primary_metric": exp.primary_metric,
        "guardrails": exp.guardrails,
        "ramp_plan": exp.ramp_plan,
        "ramp_interval_s": exp.ramp_interval_s,
        "min_units": exp.min_units,
        "alpha": exp.alpha,
        "sequential_method": exp.sequential_method,
        "spending": exp.spending,
    }
    unknown = set(spec) - set(current)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "cannot be changed"})
    fields, versions = _clean_spec(
        actor=actor,
        workspace=exp.workspace,
        experiment=exp,
        require_room=require_room,
        **{**current, **spec},
    )
    changed = sorted(name for name, value in fields.items() if getattr(exp, name) != value)
    for name, value in fields.items():
        setattr(exp, name, value)
    exp.save()
    event_record(
        actor=actor,
        workspace=exp.workspace,
        verb="experiments.experiment.updated",
        refs=[Ref.to(exp), *(Ref.to(v, role="related") for v in versions)],
        payload={"changed": changed, "arms": exp.arms, "ramp_plan": exp.ramp_plan},
    )
    return exp


def _lock(exp: Experiment) -> Experiment:
    return Experiment.objects.for_workspace(exp.workspace_id).select_for_update().get(pk=exp.pk)


def _move(exp: Experiment, to: str) -> None:
    if to not in EXPERIMENT_MOVES[ExperimentState(exp.state)]:
        raise ConflictError(f"experiment is {exp.state}; cannot move to {to}", attr="state")
    exp.state = to


def policy_problems(exp: Experiment) -> list[str]:
    """Why an experiment needs a maintainer's review (empty: within policy)."""
    policy = policy_of(exp.workspace)
    problems = []
    for arm in exp.arms[1:]:
        version = routing_bridge.version_of(exp.workspace, arm["version_id"])
        if not routing_bridge.version_gated(version):
            problems.append(f"version {version} has not passed its release gates")
    if max(exp.ramp_plan) > policy["max_auto_percent"]:
        problems.append(
            f"ramp reaches {max(exp.ramp_plan)}% per arm, above the "
            f"{policy['max_auto_percent']}% allowed without review"
        )
    if not exp.guardrails:
        problems.append("no guardrail metrics set")
    running = Experiment.objects.for_workspace(exp.workspace_id).filter(
        state=ExperimentState.RUNNING
    )
    if running.count() >= policy["max_running"]:
        problems.append(f"the workspace already runs {policy['max_running']} experiments")
    return problems


@transaction.atomic
def experiment_submit(
    *, actor: Actor, experiment: Experiment, now: datetime | None = None
) -> Experiment:
    """Ask to start: automatic approval (and start) within policy, else wait for a maintainer."""
    exp = _lock(experiment)
    if exp.state == ExperimentState.DRAFT:
        routing_bridge.require_quality(exp)
    problems = policy_problems(exp)
    auto = not problems
    _move(exp, ExperimentState.RUNNING if auto else ExperimentState.PENDING_REVIEW)
    exp.review = {
        "automatic": auto,
        "problems": problems,
        "submitted_by": getattr(actor, "username", ""),
        "submitted_by_id": getattr(actor, "pk", None),
        "submitted_at": timezone.now().isoformat(),
    }
    if auto:
        exp.review.update({"approved": True, "reviewer": "policy"})
        exp.state = ExperimentState.DRAFT  # _start moves it
        _start(actor, exp, now=now)
    else:
        exp.save(update_fields=["state", "review"])
    event_record(
        actor=actor,
        workspace=exp.workspace,
        verb="experiments.experiment.reviewed" if auto else "experiments.experiment.submitted",
        refs=[Ref.to(exp)],
        payload={"automatic": auto, "problems": problems, "state": exp.state},
    )
    return exp


@transaction.atomic
def experiment_approve(
    *, actor: Actor, experiment: Experiment, note: str = "", now: datetime | None = None
) -> Experiment:
    """A maintainer approves a request outside policy; it starts at once. A flagged request
    needs a second pair of eyes: its submitter cannot approve it (403)."""
    exp = _lock(experiment)
    if exp.state != ExperimentState.PENDING_REVIEW:
        raise ConflictError(f"experiment is {exp.state}, not waiting for review", attr="state")
    if exp.review.get("problems") and is_submitter(actor, exp):
        raise PermissionDenied(
            "you submitted this experiment and it was flagged "
            f"({'; '.join(exp.review['problems'])}): another maintainer must approve it"
        )
    for arm in exp.arms[1:]:
        version = routing_bridge.version_of(exp.workspace, arm["version_id"])
        if not routing_bridge.version_gated(version):
            raise ConflictError(
                f"version {version} has not passed its release gates; it cannot take traffic",
                attr="treatment_versions",
            )
    routing_bridge.require_quality(exp)
    exp.review.update(
        {
            "approved": True,
            "reviewer": getattr(actor, "username", ""),
            "note": str(note)[:2000],
            "approved_at": timezone.now().isoformat(),
        }
    )
    exp.state = ExperimentState.DRAFT
    _start(actor, exp, now=now)
    event_record(
        actor=actor,
        workspace=exp.workspace,
        verb="experiments.experiment.approved",
        refs=[Ref.to(exp)],
        payload={"note": str(note)[:2000]},
    )
    return exp


def is_submitter(actor: Actor, exp: Experiment) -> bool:
    """Whether ``actor`` submitted ``exp`` for review (a request without a user has none)."""
    submitted_by = exp.review.get("submitted_by_id")
    if submitted_by is not None:
        return submitted_by == getattr(actor, "pk", None)
    name = exp.review.get("submitted_by") or ""  # reviews recorded before the id was kept
    return bool(name) and name == getattr(actor, "username", None)


def _start(actor: Actor, exp: Experiment, *, now: datetime | None) -> None:
    """Reserve a bucket block in the layer, publish the first ramp step, record the start."""
    now = now or timezone.now()
    Layer.objects.for_workspace(exp.workspace_id).select_for_update().get(pk=exp.layer_id)
    size = assignment.block_size(len(exp.arms), max(exp.ramp_plan))
    taken = (
        Experiment.objects.for_workspace(exp.workspace_id)
        .filter(layer=exp.layer, state=ExperimentState.RUNNING, block_start__isnull=False)
        .exclude(pk=exp.pk)
        .values_list("block_start", "block_size")
    )
    start = assignment.find_block(list(taken), size)
    if start is None:
        raise ConflictError(
            f"layer '{exp.layer.name}' has no room for {size} buckets; use another layer",
            attr="layer",
        )
    _move(exp, ExperimentState.RUNNING)
    exp.block_start, exp.block_size = start, size
    exp.ramp_step = 0
    exp.started_at = now
    exp.next_ramp_at = now + timedelta(seconds=exp.ramp_interval_s)
    exp.ramp_history = [{"percent": exp.ramp_plan[0], "at": now.isoformat(), "reason": "start"}]
    exp.save()
    _publish(actor, exp)
    event_record(
        actor=actor,
        workspace=exp.workspace,
        verb="experiments.experiment.started",
        refs=[
            Ref.to(exp.deployment, role="input"),
            *(
                Ref("model_version", arm["version_id"], arm["name"], role="input")
                for arm in exp.arms
            ),
            Ref.to(exp, role="output"),
        ],
        payload={
            "layer": exp.layer.name,
            "block": [start, start + size],
            "percent": exp.traffic_percent,
            "allocations": current_allocations(exp),
        },
    )


def current_allocations(exp: Experiment) -> list[dict[str, Any]]:
    if exp.block_start is None or exp.ramp_step < 0:
        return []
    return assignment.allocations(
        block_start=exp.block_start,
        arms=exp.arms,
        max_percent=max(exp.ramp_plan),
        percent=exp.traffic_percent,
    )


def _publish(actor: Actor, exp: Experiment) -> None:
    routing_bridge.set_allocations(
        actor=actor,
        workspace=exp.workspace,
        deployment=exp.deployment,
        experiment_key=exp.key,
        layer=exp.layer.name,
        salt=exp.layer.salt,
        allocations=current_allocations(exp),
    )


@transaction.atomic
def experiment_ramp(
    *, actor: Actor, experiment: Experiment, now: datetime | None = None, reason: str = "manual"
) -> Experiment:
    """Advance to the next step of the ramp plan (ranges only grow)."""
    now = now or timezone.now()
    exp = _lock(experiment)
    if exp.state != ExperimentState.RUNNING:
        raise ConflictError(f"experiment is {exp.state}, not running", attr="state")
    if exp.ramp_step >= len(exp.ramp_plan) - 1:
        raise ConflictError("the ramp plan is complete", attr="ramp_plan")
    before = exp.traffic_percent
    exp.ramp_step += 1
    exp.next_ramp_at = now + timedelta(seconds=exp.ramp_interval_s)
    exp.ramp_history = [
        *exp.ramp_history,
        {"percent": exp.traffic_percent, "at": now.isoformat(), "reason": reason},
    ]
    exp.save(update_fields=["ramp_step", "next_ramp_at", "ramp_history"])
    _publish(actor, exp)
    event_record(
        actor=actor,
        workspace=exp.workspace,
        verb="experiments.experiment.ramped",
        refs=[Ref.to(exp)],
        payload={"from_percent": before, "to_percent": exp.traffic_percent, "reason": reason},
    )
    return exp


@transaction.atomic
def experiment_stop(
    *,
    actor: Actor,
    experiment: Experiment,
    reason: str,
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Experiment:
    """Stop: every unit goes back to control (production) and the owner is told."""
    exp = _lock(experiment)
    _move(exp, ExperimentState.STOPPED)
    exp.stop_reason = str(reason)[:500]
    exp.ended_at = now or timezone.now()
    exp.next_ramp_at = None
    exp.save(update_fields=["state", "stop_reason", "ended_at", "next_ramp_at"])
    routing_bridge.clear(
        actor=actor,
        workspace=exp.workspace,
        deployment=exp.deployment,
        experiment_key=exp.key,
        reason=reason,
    )
    event = event_record(
        actor=actor,
        workspace=exp.workspace,
        verb="experiments.experiment.stopped",
        refs=[Ref.to(exp)],
        payload={"reason": exp.stop_reason, "evidence": evidence or {}},
    )
    notify(
        workspace=exp.workspace,
        recipients=[exp.owner],
        verb="experiment.stopped",
        title=f"Experiment {exp.key} stopped: traffic is back on control",
        body=exp.stop_reason,
        link=_link(exp),
        event=event,
    )
    return exp


def _link(exp: Experiment) -> str:
    try:
        return reverse("experiments-detail", args=[exp.workspace.slug, exp.key])
    except Exception:  # noqa: BLE001 - the link is a convenience
        return ""


def experiment_conclude(
    *,
    actor: Actor,
    experiment: Experiment,
    action: str,
    arm: str | None = None,
    note: str = "",
) -> Experiment:
    """Promote an arm's version to production (a serving release) or discard; keep the evidence.

    Routing is cleared first so the experiment's units go to production, then production itself
    switches (the gateway loads the new version before it takes traffic). The release only
    records serving's desired state: its controller warms the version and applies the backend
    after the commit, so no model load, cluster call or process start runs under the lock."""
    with transaction.atomic():
        return _conclude_locked(
            actor=actor, experiment=experiment, action=action, arm=arm, note=note
        )


def _conclude_locked(
    *, actor: Actor, experiment: Experiment, action: str, arm: str | None, note: str
) -> Experiment:
    exp = _lock(experiment)
    if action not in ("promote", "discard"):
        raise ValidationError({"action": "promote or discard"})
    _move(exp, ExperimentState.CONCLUDED)
    version_id = None
    if action == "promote":
        choices = {a["name"]: a["version_id"] for a in exp.arms[1:]}
        if arm is None and len(choices) == 1:
            arm = next(iter(choices))
        if arm not in choices:
            raise ValidationError({"arm": f"one of {sorted(choices)}"})
        version_id = choices[arm]
    # The evidence is the read-out at the moment of the decision, not the last scheduled
    # snapshot (feedback keeps arriving between snapshots): analysed now, before routing is
    # cleared, and kept as the experiment's final snapshot so the chart ends where it was decided.
    decided_at = timezone.now()
    final = snapshot_take(experiment=exp, now=decided_at)
    evidence = {
        "snapshot_id": final.pk,
        "snapshot_at": final.created_at.isoformat(),
        "summary": summary_of(final.result, exp),
    }
    if exp.block_start is not None:
        routing_bridge.clear(
            actor=actor,
            workspace=exp.workspace,
            deployment=exp.deployment,
            experiment_key=exp.key,
            reason=f"concluded: {action}",
        )
    if version_id is not None:
        routing_bridge.promote(
            actor=actor,
            workspace=exp.workspace,
            deployment=exp.deployment,
            version_id=version_id,
            reason=f"experiment {exp.key}: {arm} won",
        )
    exp.decision = {
        "action": action,
        "arm": arm,
        "version_id": version_id,
        "note": str(note)[:2000],
        "by": getattr(actor, "username", ""),
        "at": decided_at.isoformat(),
        "evidence": evidence,
    }
    exp.ended_at = exp.ended_at or decided_at
    exp.next_ramp_at = None
    exp.save(update_fields=["state", "decision", "ended_at", "next_ramp_at"])
    refs = [Ref.to(exp, role="input" if version_id else "subject")]
    if version_id:
        refs.append(Ref("model_version", version_id, arm or "", role="output"))
    event_record(
        actor=actor,
        workspace=exp.workspace,
        verb="experiments.experiment.concluded",
        refs=refs,
        payload=exp.decision,
    )
    return exp


# --- feedback --------------------------------------------------------------------------------

FEEDBACK_FIELDS = ("impressions", "clicks", "conversions")


def _clean_event(i: int, raw: Any, idempotency_key: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValidationError({f"events.{i}": "give an object"})
    request_id = raw.get("request_id")
    if not isinstance(request_id, str) or not request_id or len(request_id) > 100:
        raise ValidationError({f"events.{i}.request_id": "the request id the gateway returned"})
    event_id = raw.get("event_id")
    if event_id is None:
        if not idempotency_key:
            raise ValidationError(
                {f"events.{i}.event_id": "give event ids or an Idempotency-Key header"}
            )
        event_id = f"{idempotency_key}:{i}"
    if not isinstance(event_id, str) or not event_id or len(event_id) > 200:
        raise ValidationError({f"events.{i}.event_id": "a string of at most 200 characters"})
    clean: dict[str, Any] = {"request_id": request_id, "event_id": event_id}
    for field in FEEDBACK_FIELDS:
        value = raw.get(field, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1_000_000:
            raise ValidationError({f"events.{i}.{field}": "an integer in 0 .. 1,000,000"})
        clean[field] = value
    revenue = raw.get("revenue", 0)
    if (
        not isinstance(revenue, int | float)
        or isinstance(revenue, bool)
        or not math.isfinite(revenue)
        or not 0 <= revenue <= 1e9
    ):
        raise ValidationError({f"events.{i}.revenue": "a finite amount in 0 .. 1e9"})
    clean["revenue"] = float(revenue)
    if clean["clicks"] > clean["impressions"] and clean["impressions"]:
        raise ValidationError({f"events.{i}.clicks": "more clicks than impressions"})
    return clean


def feedback_record(
    *, actor: Actor, workspace: Workspace, events: Any, idempotency_key: str = ""
) -> dict[str, int]:
    """Store a batch of feedback, joined with the prediction log; replays are no-ops."""
    if not isinstance(events, list) or not 1 <= len(events) <= MAX_FEEDBACK_EVENTS:
        raise ValidationError({"events": f"give 1-{MAX_FEEDBACK_EVENTS} events"})
    idempotency_key = str(idempotency_key or "")[:150]
    clean = [_clean_event(i, raw, idempotency_key) for i, raw in enumerate(events)]
    ids = [c["event_id"] for c in clean]
    if len(set(ids)) != len(ids):
        raise ValidationError({"events": "event ids repeat inside the batch"})
    logs = routing_bridge.predictions_by_request(workspace, {c["request_id"] for c in clean})
    keys = {log["experiment_key"] for log in logs.values() if log["experiment_key"]}
    experiments = {
        e.key: e for e in Experiment.objects.for_workspace(workspace).filter(key__in=keys)
    }
    with transaction.atomic():
        existing = set(
            FeedbackEvent.objects.for_workspace(workspace)
            .filter(event_id__in=ids)
            .values_list("event_id", flat=True)
        )
        rows = []
        unmatched = 0
        for c in clean:
            if c["event_id"] in existing:
                continue
            log = logs.get(c["request_id"])
            if log is None:
                unmatched += 1
            exp = experiments.get(log["experiment_key"]) if log else None
            rows.append(
                FeedbackEvent(
                    workspace=workspace,
                    unit_id=log["unit_id"] if log else "",
                    experiment=exp,
                    arm=(log["arm"] if exp and log else ""),
                    **c,
                )
            )
        try:
            FeedbackEvent.objects.bulk_create(rows)
        except IntegrityError as exc:  # a concurrent replay of the same batch
            raise ConflictError(
                "some events were recorded concurrently; retry", attr="events"
            ) from exc
        if rows:
            event_record(
                actor=actor,
                workspace=workspace,
                verb="experiments.feedback.recorded",
                refs=[
                    Ref.to(e, role="related") for e in {r.experiment for r in rows if r.experiment}
                ],
                payload={"accepted": len(rows), "unmatched": unmatched},
            )
    return {
        "received": len(clean),
        "accepted": len(rows),
        "duplicates": len(clean) - len(rows),
        "unmatched": unmatched,
    }


# --- analysis --------------------------------------------------------------------------------


CUPED_PRE_DAYS = 14


def _pre_period_clicks(exp: Experiment, units: set[str]) -> dict[str, float]:
    """Clicks of each unit in the two weeks before the experiment started (CUPED covariate)."""
    if exp.started_at is None or not units:
        return {}
    out: dict[str, float] = {}
    ordered = sorted(units)
    for start in range(0, len(ordered), 5000):
        rows = (
            FeedbackEvent.objects.for_workspace(exp.workspace_id)
            .filter(
                unit_id__in=ordered[start : start + 5000],
                created_at__lt=exp.started_at,
                created_at__gte=exp.started_at - timedelta(days=CUPED_PRE_DAYS),
            )
            .values("unit_id")
            .annotate(c=Sum("clicks"))
        )
        out.update({row["unit_id"]: float(row["c"] or 0) for row in rows})
    return out


def arm_data(exp: Experiment, *, cuped: bool = False) -> dict[str, stats.ArmData]:
    """Per-unit totals per arm: exposed units (prediction log) joined with their feedback, and
    with ``cuped`` each unit's pre-period clicks."""
    per_arm: dict[str, dict[str, list[float]]] = {
        name: defaultdict(lambda: [0.0, 0.0, 0.0, 0.0]) for name in exp.arm_names
    }
    for arm, unit in routing_bridge.exposed_units(exp.workspace, exp.key):
        if arm in per_arm:
            _ = per_arm[arm][unit]  # touching the defaultdict creates the zero row
    rows = (
        FeedbackEvent.objects.for_workspace(exp.workspace_id)
        .filter(experiment=exp)
        .values("arm", "unit_id")
        .annotate(i=Sum("impressions"), c=Sum("clicks"), v=Sum("conversions"), r=Sum("revenue"))
    )
    for row in rows:
        if row["arm"] in per_arm:
            per_arm[row["arm"]][row["unit_id"]] = [
                float(row["i"] or 0),
                float(row["c"] or 0),
                float(row["v"] or 0),
                float(row["r"] or 0),
            ]
    pre = _pre_period_clicks(exp, {u for units in per_arm.values() for u in units}) if cuped else {}
    out = {}
    for name, units in per_arm.items():
        values = np.array(list(units.values()), dtype=float).reshape(-1, 4)
        out[name] = stats.ArmData(
            impressions=values[:, 0],
            clicks=values[:, 1],
            conversions=values[:, 2],
            revenue=values[:, 3],
            pre_clicks=np.array([pre.get(u, 0.0) for u in units], dtype=float) if cuped else None,
        )
    return out


# Planned looks of the group-sequential read-out: one a day over the ramp plan's duration.
LOOK_INTERVAL_S = 86400


def look_plan(exp: Experiment, *, now: datetime, units: float) -> stats.LookPlan | None:
    """Where ``now`` stands among the experiment's planned looks, for the group-sequential
    read-out; None before it starts or without a ramp plan (then only always-valid).

    The planned duration is the ramp plan (one interval per step); its looks are daily (at
    least one). Alpha is spent on calendar time (the fraction of the duration elapsed, capped
    at 1) and the looks' correlation comes from the units seen at each: the latest snapshot at
    or before a past look's time, ``units`` now. Past looks without data are not looks.
    """
    if exp.sequential_method != SequentialMethod.GROUP_SEQUENTIAL:
        return None
    if exp.started_at is None or not exp.ramp_plan or units <= 0:
        return None
    duration = len(exp.ramp_plan) * exp.ramp_interval_s
    planned = max(1, round(duration / LOOK_INTERVAL_S))
    if exp.ended_at is not None:
        now = min(now, exp.ended_at)
    elapsed = max((now - exp.started_at).total_seconds(), 1.0)
    current = min(1.0, elapsed / duration)
    fractions: list[float] = []
    information: list[float] = []
    for k in range(1, planned + 1):
        fraction = k / planned
        if fraction >= current:
            break
        snap = (
            Snapshot.objects.for_workspace(exp.workspace_id)
            .filter(
                experiment=exp,
                created_at__lte=exp.started_at + timedelta(seconds=fraction * duration),
            )
            .order_by("-created_at", "-id")
            .only("result")
            .first()
        )
        arms = snap.result.get("arms", {}) if snap else {}
        seen = sum(a.get("units", 0) for a in arms.values())
        if seen > (information[-1] if information else 0) and seen < units:
            fractions.append(fraction)
            information.append(float(seen))
    return stats.LookPlan(
        fractions=(*fractions, current),
        information=(*information, float(units)),
        spending=exp.spending,
    )


def experiment_analyze(
    exp: Experiment, *, cuped: bool = False, now: datetime | None = None
) -> dict[str, Any]:
    """The read-out of an experiment now; ``cuped`` adds clicks per unit adjusted with each
    unit's pre-period clicks; a started experiment adds the group-sequential read-out at its
    current look (``look_plan``)."""
    arms = arm_data(exp, cuped=cuped)
    looks = look_plan(
        exp, now=now or timezone.now(), units=float(sum(a.units for a in arms.values()))
    )
    result = stats.analyze(
        arms,
        control="control",
        planned_weights=dict.fromkeys(exp.arm_names, 1.0),
        alpha=exp.alpha,
        tuning=exp.sequential_tuning,
        cuped=cuped,
        looks=looks,
    )
    result["guardrails"] = guardrail_breaches(exp, result)
    result["primary_metric"] = exp.primary_metric
    result["enough_units"] = all(a["units"] >= exp.min_units for a in result["arms"].values())
    return result


def guardrail_breaches(exp: Experiment, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Guardrails that fail: a treatment's metric is significantly worse (the always-valid
    interval lies below zero) and its estimated drop exceeds the rule's ``max_drop``."""
    breaches = []
    for arm, effects in result["effects"].items():
        for rule in exp.guardrails:
            seq = effects[rule["metric"]]["sequential"]
            if seq["error"] or seq["ci_high"] is None:
                continue
            if seq["ci_high"] < 0 and seq["estimate"] < -rule["max_drop"]:
                breaches.append(
                    {
                        "arm": arm,
                        "metric": rule["metric"],
                        "max_drop": rule["max_drop"],
                        "estimate": seq["estimate"],
                        "ci": [seq["ci_low"], seq["ci_high"]],
                    }
                )
    return breaches


def summary_of(result: dict[str, Any], exp: Experiment) -> dict[str, Any]:
    metric = exp.primary_metric
    return {
        "primary_metric": metric,
        "arms": {
            name: {"units": a["units"], metric: a[metric]} for name, a in result["arms"].items()
        },
        "effects": {
            arm: {
                "relative": e[metric]["relative"],
                "sequential": e[metric]["sequential"],
            }
            for arm, e in result["effects"].items()
        },
        "srm": result["srm"],
        "guardrails": result.get("guardrails", []),
    }


def experiment_verdict(exp: Experiment, result: dict[str, Any] | None) -> dict[str, Any]:
    """One recommendation from the latest read-out: ``ship`` (an arm), ``keep_running`` or
    ``stop`` (``not_started`` before it runs), with why, judged by the experiment's own
    sequential method on its primary metric.

    Group-sequential reads the effect against this look's alpha-spending boundary (and at the
    last planned look an effect that never crossed means stop); always-valid reads the
    always-valid interval. SRM and guardrail breaches stop it whatever the effect. A concluded
    or stopped experiment reports what happened instead."""
    metric = exp.primary_metric
    if exp.state == ExperimentState.CONCLUDED:
        if exp.decision.get("action") == "promote":
            return {
                "verdict": "ship",
                "arm": exp.decision.get("arm"),
                "reason": f"shipped: {exp.decision.get('arm')} was promoted to production by "
                f"{exp.decision.get('by') or 'someone'}",
                "method": exp.sequential_method,
            }
        return {
            "verdict": "stop",
            "arm": None,
            "reason": f"stopped: discarded by {exp.decision.get('by') or 'someone'}; "
            "production was kept",
            "method": exp.sequential_method,
        }
    if exp.state == ExperimentState.STOPPED:
        return {
            "verdict": "stop",
            "arm": None,
            "reason": f"stopped: {exp.stop_reason or 'traffic is back on control'}",
            "method": exp.sequential_method,
        }

    def verdict(kind: str, reason: str, arm: str | None = None, method: str = "") -> dict:
        return {
            "verdict": kind,
            "arm": arm,
            "reason": reason,
            "method": method or exp.sequential_method,
        }

    if exp.state in (ExperimentState.DRAFT, ExperimentState.PENDING_REVIEW):
        waiting = "a maintainer's review" if exp.review.get("problems") else "its submission"
        return verdict("not_started", f"no traffic yet: it waits for {waiting}")
    if not result:
        return verdict("keep_running", "no results yet: the first snapshot comes within minutes")
    if not result.get("enough_units"):
        return verdict(
            "keep_running", f"not enough units yet: every arm needs {exp.min_units} to be judged"
        )
    if result.get("srm", {}).get("mismatch"):
        return verdict(
            "stop",
            f"sample ratio mismatch (p = {result['srm']['p_value']:.2g}): the split is broken, "
            "so no effect can be trusted",
        )
    breaches = result.get("guardrails") or []
    if breaches:
        first = breaches[0]
        return verdict(
            "stop",
            f"guardrail {first['metric']} breached by {first['arm']}: "
            f"{first['estimate']:+.1%} (allowed -{first['max_drop']:.0%})",
        )
    plan = result.get("group_sequential")
    method = exp.sequential_method
    readout = "group_sequential"
    if method != SequentialMethod.GROUP_SEQUENTIAL or plan is None:
        readout = "sequential"  # always-valid (also before a group-sequential design has looks)
        method = SequentialMethod.ALWAYS_VALID
    design: dict[str, Any] = plan or {}  # empty only on the always-valid readout
    label = (
        f"look {design['look']}'s group-sequential boundary"
        if readout == "group_sequential"
        else "the always-valid interval"
    )
    winners, losers, undecided = [], [], []
    for arm, effects in result.get("effects", {}).items():
        effect = (effects.get(metric) or {}).get(readout)
        if not effect or effect.get("error"):
            undecided.append(arm)
        elif effect["significant"] and effect["estimate"] > 0:
            winners.append((effect["estimate"], arm, effect))
        elif effect["significant"]:
            losers.append(arm)
        else:
            undecided.append(arm)
    name = metric.upper()
    if winners:
        estimate, arm, effect = max(winners)
        return verdict(
            "ship",
            f"{arm} lifts {name} by {estimate:+.1%} "
            f"[{effect['ci_low']:+.1%}, {effect['ci_high']:+.1%}], beyond {label}, "
            "with guardrails holding and no sample ratio mismatch",
            arm,
            method,
        )
    if losers and not undecided:
        return verdict("stop", f"every treatment lowers {name}, beyond {label}", method=method)
    if readout == "group_sequential" and design["fractions"][-1] >= 1:
        return verdict(
            "stop",
            f"the planned duration is over and no treatment moved {name} beyond the final "
            "boundary: no effect worth shipping",
            method=method,
        )
    return verdict(
        "keep_running",
        f"no treatment's {name} effect is beyond {label} yet; keep collecting units",
        method=method,
    )


@transaction.atomic
def snapshot_take(*, experiment: Experiment, now: datetime | None = None) -> Snapshot:
    exp = experiment
    result = experiment_analyze(exp, now=now)
    enough = result["enough_units"]
    return Snapshot.objects.create(
        workspace_id=exp.workspace_id,
        experiment=exp,
        created_at=now or timezone.now(),
        traffic_percent=exp.traffic_percent,
        result=result,
        srm_mismatch=bool(enough and result["srm"]["mismatch"]),
        guardrail_breaches=result["guardrails"] if enough else [],
    )


def experiment_check(*, experiment: Experiment, now: datetime | None = None) -> str:
    """The scheduled check: snapshot, then stop on SRM or a guardrail breach, else ramp when
    due. Returns what it did: 'stopped', 'ramped' or 'held'."""
    now = now or timezone.now()
    exp = experiment
    if exp.state != ExperimentState.RUNNING:
        return "held"
    snap = snapshot_take(experiment=exp, now=now)
    if snap.srm_mismatch or snap.guardrail_breaches:
        if snap.srm_mismatch:
            reason = f"sample ratio mismatch (p = {snap.result['srm']['p_value']:.2g})"
        else:
            first = snap.guardrail_breaches[0]
            reason = (
                f"guardrail {first['metric']} breached by {first['arm']}: "
                f"{first['estimate']:+.1%} (allowed -{first['max_drop']:.0%})"
            )
        try:
            experiment_stop(
                actor=None,
                experiment=exp,
                reason=reason,
                evidence={"snapshot_id": snap.pk, "breaches": snap.guardrail_breaches},
                now=now,
            )
        except ConflictError:  # concluded or stopped by someone meanwhile
            return "held"
        return "stopped"
    if (
        exp.next_ramp_at is not None
        and now >= exp.next_ramp_at
        and exp.ramp_step < len(exp.ramp_plan) - 1
        and snap.result["enough_units"]
    ):
        try:
            experiment_ramp(actor=None, experiment=exp, now=now, reason="schedule")
        except ConflictError:
            return "held"
        return "ramped"
    return "held"


def layer_traffic(layer: Layer) -> dict[str, Any]:
    """The layer's bucket map: each running experiment's block and current arm ranges."""
    rows = []
    for exp in (
        Experiment.objects.for_workspace(layer.workspace_id)
        .filter(layer=layer, state=ExperimentState.RUNNING)
        .order_by("block_start")
    ):
        rows.append(
            {
                "experiment": exp.key,
                "deployment": exp.deployment.name,
                "block": [exp.block_start, exp.block_start + exp.block_size],
                "traffic_percent": exp.traffic_percent,
                "allocations": current_allocations(exp),
            }
        )
    used = sum(r["block"][1] - r["block"][0] for r in rows)
    return {
        "buckets": assignment.BUCKETS,
        "reserved_share": used / assignment.BUCKETS,
        "experiments": rows,
    }
