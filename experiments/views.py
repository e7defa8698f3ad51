"""Browser UI of experiments: the list, an experiment's page (ramp timeline, effect over time with
interval bands as inline SVG, SRM, guardrails, decision buttons) and the layers' traffic map.

Decision buttons post to small views that call the same services as the API, with the same
roles; another workspace's experiments answer 404."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from experiments import routing_bridge, services
from experiments.forms import ExperimentForm
from experiments.models import Experiment, ExperimentState, Layer, Snapshot
from workspaces.dashboard import DashboardSection
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import _context, workspace_page

CHART_POINTS = 200
CHART_W, CHART_H, PAD = 640, 220, 36
ARM_COLOURS = ["#6b7280", "#2563eb", "#d97706", "#059669", "#7c3aed"]


def _experiment(workspace, key: str) -> Experiment:
    exp = (
        Experiment.objects.for_workspace(workspace)
        .select_related("deployment", "layer", "owner", "workspace")
        .filter(key=key)
        .first()
    )
    if exp is None:
        raise Http404
    return exp


@workspace_page()
def experiment_list(request: HttpRequest, workspace) -> HttpResponse:
    experiments = (
        Experiment.objects.for_workspace(workspace)
        .select_related("deployment", "layer", "owner")
        .order_by("-created_at", "-id")
    )
    state = request.GET.get("state", "")
    if state in ExperimentState.values:
        experiments = experiments.filter(state=state)
    return render(
        request,
        "experiments/experiment_list.html",
        _context(
            request,
            experiments=experiments[:200],
            states=ExperimentState.choices,
            state=state,
            can_develop=role_at_least(request.workspace_role, Role.DEVELOPER),
            section="experiments",
        ),
    )


RESERVED_KEYS = {"new", "layers"}  # URL words of this app: an experiment so named is unreachable


def _form(request: HttpRequest, workspace, *, editing: Experiment | None = None, **kwargs):
    return ExperimentForm(
        *([request.POST] if request.method == "POST" else []),
        deployments=routing_bridge.deployment_choices(workspace),
        versions=routing_bridge.version_choices(workspace),
        editing=editing,
        **kwargs,
    )


def _room_of(workspace, form: ExperimentForm, *, exclude: Experiment | None = None) -> dict:
    """The free-bucket hint next to the traffic field, from the form's layer, arms and plan."""
    data = form.data if form.is_bound else form.initial
    layer = str(data.get("layer") or form.fields["layer"].initial)
    versions = (
        data.getlist("treatment_versions")
        if hasattr(data, "getlist")
        else data.get("treatment_versions") or []
    )
    plan = data.get("ramp_plan") or form.fields["ramp_plan"].initial
    return _room(workspace, layer, 1 + len(versions), str(plan), exclude)


def _room(workspace, layer: str, n_arms: int, plan: str, exclude=None) -> dict:
    try:
        top = max(float(p.strip().rstrip("%")) for p in plan.split(",") if p.strip())
    except ValueError:
        top = None
    room = services.layer_room(
        workspace, layer[:63], n_arms=n_arms, top_percent=top, exclude=exclude
    )
    room["exists"] = Layer.objects.for_workspace(workspace).filter(name=layer[:63]).exists()
    return room


def _render_form(request, workspace, form, *, exp: Experiment | None = None, status: int = 200):
    layers = [
        {"name": layer.name, "free": services.layer_free_buckets(workspace, layer, exclude=exp)}
        for layer in Layer.objects.for_workspace(workspace).order_by("name")
    ]
    return render(
        request,
        "experiments/experiment_form.html",
        _context(
            request,
            form=form,
            exp=exp,
            layers=layers,
            room=_room_of(workspace, form, exclude=exp),
            section="experiments",
        ),
        status=status,
    )


def _save(request: HttpRequest, form: ExperimentForm, save) -> Experiment | None:
    """Run ``save(spec)`` (a service call) and put its refusals on the form."""
    if not form.is_valid():
        return None
    spec = form.spec()
    if spec.get("key") in RESERVED_KEYS:
        form.add_error("key", f"'{spec['key']}' is a word of the experiments URLs; pick another")
        return None
    try:
        return save(spec)
    except ValidationError as exc:
        form.add_service_error(exc)
    except ConflictError as exc:
        if exc.attr not in form.fields:
            raise  # not about a field (e.g. the state): the caller shows it on the page
        form.add_error(exc.attr, str(exc))
    return None


@workspace_page(Role.DEVELOPER)
def experiment_new(request: HttpRequest, workspace) -> HttpResponse:
    """The new-experiment form; it calls ``experiment_create`` like the API, and refuses a ramp
    that does not fit the layer's free buckets now."""
    form = _form(request, workspace)
    if request.method == "POST":
        try:
            exp = _save(
                request,
                form,
                lambda spec: services.experiment_create(
                    actor=request.user, workspace=workspace, require_room=True, **spec
                ),
            )
        except ConflictError as exc:
            exp = None
            form.add_error(None, str(exc))
        if exp is not None:
            messages.success(request, f"Draft {exp.key} created: submit it when it looks right.")
            return redirect("experiments-detail", ws=workspace.slug, key=exp.key)
        return _render_form(request, workspace, form, status=400)
    return _render_form(request, workspace, form)


@workspace_page(Role.DEVELOPER)
def experiment_edit(request: HttpRequest, workspace, key: str) -> HttpResponse:
    """A draft's form, pre-filled; once submitted the service refuses (a page message)."""
    exp = _experiment(workspace, key)
    if exp.state != ExperimentState.DRAFT:
        messages.error(
            request,
            f"{exp.key} is {exp.get_state_display().lower()}: only a draft can be edited.",
        )
        return redirect("experiments-detail", ws=workspace.slug, key=exp.key)
    form = _form(request, workspace, editing=exp, initial=ExperimentForm.initial_of(exp))
    if request.method == "POST":
        try:
            saved = _save(
                request,
                form,
                lambda spec: services.experiment_update(
                    actor=request.user, experiment=exp, require_room=True, **spec
                ),
            )
        except ConflictError as exc:  # submitted meanwhile (409): say so on the page
            messages.error(request, f"Not saved: {exc}")
            return redirect("experiments-detail", ws=workspace.slug, key=exp.key)
        if saved is not None:
            messages.success(request, f"Draft {saved.key} saved.")
            return redirect("experiments-detail", ws=workspace.slug, key=saved.key)
        return _render_form(request, workspace, form, exp=exp, status=400)
    return _render_form(request, workspace, form, exp=exp)


@require_GET
@workspace_page()
def layer_room(request: HttpRequest, workspace) -> HttpResponse:
    """The free-bucket hint of the experiment form, re-rendered by htmx as the layer, the
    treatments or the ramp plan change."""
    exclude = None
    if request.GET.get("experiment"):
        exclude = (
            Experiment.objects.for_workspace(workspace)
            .filter(key=request.GET["experiment"])
            .first()
        )
    room = _room(
        workspace,
        request.GET.get("layer", "") or "default",
        1 + len(request.GET.getlist("treatment_versions")),
        request.GET.get("ramp_plan", ""),
        exclude,
    )
    return render(request, "experiments/_layer_room.html", {"room": room})


def _scale(values: list[float], lo: float, hi: float, size: float, invert: bool) -> list[float]:
    span = (hi - lo) or 1.0
    out = [(v - lo) / span * (size - 2 * PAD) + PAD for v in values]
    return [size - v for v in out] if invert else out


def _effect_chart(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """SVG geometry of the relative effect over time with sequential and fixed bands."""
    pts = [p for p in points if p["low"] is not None and p["high"] is not None]
    if len(pts) < 1:
        return None
    xs = _scale([float(i) for i in range(len(pts))], 0, max(1, len(pts) - 1), CHART_W, False)
    lo = min(min(p["low"] for p in pts), 0.0)
    hi = max(max(p["high"] for p in pts), 0.0)
    ys = lambda key: _scale([p[key] for p in pts], lo, hi, CHART_H, True)  # noqa: E731
    y_low, y_high, y_est = ys("low"), ys("high"), ys("estimate")
    f_low, f_high = ys("fixed_low"), ys("fixed_high")
    band = " ".join(
        f"{x:.1f},{y:.1f}" for x, y in zip(xs + xs[::-1], y_high + y_low[::-1], strict=True)
    )
    fixed = " ".join(
        f"{x:.1f},{y:.1f}" for x, y in zip(xs + xs[::-1], f_high + f_low[::-1], strict=True)
    )
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, y_est, strict=True))
    zero = _scale([0.0], lo, hi, CHART_H, True)[0]
    return {
        "w": CHART_W,
        "h": CHART_H,
        "band": band,
        "fixed": fixed,
        "line": line,
        "zero": f"{zero:.1f}",
        "lo": f"{lo:+.1%}",
        "hi": f"{hi:+.1%}",
        "pad": PAD,
        "n": len(pts),
        "first": pts[0]["at"],
        "last": pts[-1]["at"],
    }


def _arm_chart(snapshots: list[Snapshot], metric: str, arms: list[str]) -> dict[str, Any] | None:
    """Each arm's metric over time with its own interval as a band."""
    series: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in arms}
    for snap in snapshots:
        for arm in arms:
            values = snap.result.get("arms", {}).get(arm, {})
            mean = values.get(metric) or 0.0
            low, high = values.get(f"{metric}_ci") or [mean, mean]
            series[arm].append((mean, low, high))
    values = [v for points in series.values() for p in points for v in p]
    if not values:
        return None
    lo, hi = min(values), max(values)
    n = len(snapshots)
    xs = _scale([float(i) for i in range(n)], 0, max(1, n - 1), CHART_W, False)
    lines = []
    for i, (arm, points) in enumerate(series.items()):
        ys, lows, highs = (_scale([p[k] for p in points], lo, hi, CHART_H, True) for k in range(3))
        lines.append(
            {
                "arm": arm,
                "colour": ARM_COLOURS[i % len(ARM_COLOURS)],
                "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True)),
                "band": " ".join(
                    f"{x:.1f},{y:.1f}"
                    for x, y in zip(xs + xs[::-1], highs + lows[::-1], strict=True)
                ),
                "last": points[-1][0],
            }
        )
    return {"w": CHART_W, "h": CHART_H, "lines": lines, "lo": lo, "hi": hi, "pad": PAD}


@workspace_page()
def experiment_page(request: HttpRequest, workspace, key: str) -> HttpResponse:
    exp = _experiment(workspace, key)
    snapshots = list(
        Snapshot.objects.for_workspace(workspace)
        .filter(experiment=exp)
        .order_by("-created_at")[:CHART_POINTS]
    )[::-1]
    metric = exp.primary_metric
    effect_charts = []
    for arm in exp.arm_names[1:]:
        points = []
        for snap in snapshots:
            effect = snap.result.get("effects", {}).get(arm, {}).get(metric)
            if not effect:
                continue
            seq, fixed = effect["sequential"], effect["relative"]
            points.append(
                {
                    "at": snap.created_at,
                    "estimate": seq["estimate"],
                    "low": seq["ci_low"],
                    "high": seq["ci_high"],
                    "fixed_low": fixed["ci_low"]
                    if fixed["ci_low"] is not None
                    else seq["estimate"],
                    "fixed_high": (
                        fixed["ci_high"] if fixed["ci_high"] is not None else seq["estimate"]
                    ),
                }
            )
        effect_charts.append({"arm": arm, "chart": _effect_chart(points)})
    latest = snapshots[-1] if snapshots else None
    can_develop = role_at_least(request.workspace_role, Role.DEVELOPER)
    can_release = role_at_least(request.workspace_role, Role.MAINTAINER)
    return render(
        request,
        "experiments/experiment_detail.html",
        _context(
            request,
            exp=exp,
            latest=latest,
            result=latest.result if latest else None,
            effect_rows=_effect_rows(latest.result, metric) if latest else [],
            effect_charts=effect_charts,
            arm_chart=_arm_chart(snapshots, metric, exp.arm_names) if snapshots else None,
            allocations=services.current_allocations(exp) if exp.is_live else [],
            verdict=services.experiment_verdict(exp, latest.result if latest else None),
            ramp_steps=[
                {**step, "at": parse_datetime(step.get("at") or "")} for step in exp.ramp_history
            ],
            can_develop=can_develop,
            can_release=can_release,
            # a flagged request waits for a maintainer other than its submitter
            self_review=bool(exp.review.get("problems"))
            and services.is_submitter(request.user, exp),
            section="experiments",
        ),
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2%}"


def _effect_rows(result: dict[str, Any], primary: str) -> list[dict[str, Any]]:
    """Rows of the effects table with the relative effects and intervals as percentages."""
    rows = []
    for arm, per_metric in result.get("effects", {}).items():
        for metric in ("ctr", "cvr", "rpm"):
            e = per_metric.get(metric)
            if not e:
                continue
            fixed, seq = e["relative"], e["sequential"]
            rows.append(
                {
                    "arm": arm,
                    "metric": metric,
                    "primary": metric == primary,
                    "error": fixed["error"],
                    "estimate": _pct(fixed["estimate"]),
                    "ci": f"[{_pct(fixed['ci_low'])}, {_pct(fixed['ci_high'])}]",
                    "p_value": fixed["p_value"],
                    "seq_ci": f"[{_pct(seq['ci_low'])}, {_pct(seq['ci_high'])}]",
                    "seq_p_value": seq["p_value"],
                    "significant": seq["significant"],
                    "gs_ci": (
                        f"[{_pct(e['group_sequential']['ci_low'])}, "
                        f"{_pct(e['group_sequential']['ci_high'])}]"
                        if e.get("group_sequential")
                        else "-"
                    ),
                    "gs_significant": bool((e.get("group_sequential") or {}).get("significant")),
                }
            )
    return rows


@require_POST
@workspace_page(Role.DEVELOPER)
def experiment_action(request: HttpRequest, workspace, key: str, action: str) -> HttpResponse:
    exp = _experiment(workspace, key)
    needs = {
        "submit": Role.DEVELOPER,
        "stop": Role.DEVELOPER,
        "approve": Role.MAINTAINER,
        "ramp": Role.MAINTAINER,
        "promote": Role.MAINTAINER,
        "discard": Role.MAINTAINER,
        "snapshot": Role.DEVELOPER,
    }
    if action not in needs:
        raise Http404
    if not role_at_least(request.workspace_role, needs[action]):
        raise PermissionDenied(f"This needs the {needs[action]} role.")
    user = request.user
    try:
        if action == "submit":
            services.experiment_submit(actor=user, experiment=exp)
        elif action == "approve":
            services.experiment_approve(
                actor=user, experiment=exp, note=request.POST.get("note", "")
            )
        elif action == "ramp":
            services.experiment_ramp(actor=user, experiment=exp)
        elif action == "stop":
            reason = request.POST.get("reason", "").strip() or "manual stop"
            services.experiment_stop(
                actor=user, experiment=exp, reason=f"stopped by {user.username}: {reason}"
            )
        elif action == "snapshot":
            services.snapshot_take(experiment=exp)
        else:
            services.experiment_conclude(
                actor=user,
                experiment=exp,
                action=action,
                arm=request.POST.get("arm") or None,
                note=request.POST.get("note", ""),
            )
        messages.success(request, f"{action}: done")
    except (ConflictError, ValidationError, PermissionDenied) as exc:
        why = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        messages.error(request, f"{action} failed: {why}")
    return redirect("experiments-detail", ws=workspace.slug, key=exp.key)


@workspace_page()
def layer_list(request: HttpRequest, workspace) -> HttpResponse:
    layers = []
    for layer in Layer.objects.for_workspace(workspace).order_by("name"):
        traffic = services.layer_traffic(layer)
        segments = []
        for row in traffic["experiments"]:
            start, end = row["block"]
            segments.append(
                {
                    **row,
                    "x": start / traffic["buckets"] * 100,
                    "w": (end - start) / traffic["buckets"] * 100,
                    "arms": [
                        {
                            **a,
                            "x": a["start"] / traffic["buckets"] * 100,
                            "w": (a["end"] - a["start"]) / traffic["buckets"] * 100,
                            "colour": ARM_COLOURS[j % len(ARM_COLOURS)],
                        }
                        for j, a in enumerate(row["allocations"])
                    ],
                }
            )
        layers.append({"layer": layer, "traffic": traffic, "segments": segments})
    return render(
        request,
        "experiments/layer_list.html",
        _context(request, layers=layers, section="experiments"),
    )


def dashboard_section(*, workspace, user) -> DashboardSection:
    """The "Experiments" card: how many run, wait for review or stopped, in one query."""
    counts = dict.fromkeys(ExperimentState.values, 0)
    running = []
    for key, state in (
        Experiment.objects.for_workspace(workspace)
        .order_by("-created_at")
        .values_list("key", "state")[:500]
    ):
        counts[state] += 1
        if state == ExperimentState.RUNNING and len(running) < 5:
            running.append(key)
    return DashboardSection(
        template="experiments/_dashboard_section.html",
        context={"workspace": workspace, "counts": counts, "running": running},
    )
