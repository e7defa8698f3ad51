"""Browser UI of experiments: the list, an experiment's page (ramp timeline and traffic chart,
effect over time with interval bands and each arm's metric, drawn by static/js/charts.js; SRM,
guardrails, decision buttons) and the layers' traffic map.

Decision buttons post to small views that call the same services as the API, with the same
roles; another workspace's experiments answer 404."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from experiments import routing_bridge, services
from experiments.forms import ExperimentForm
from experiments.models import Experiment, ExperimentState, Layer, Snapshot
from workspaces.dashboard import DashboardSection
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

CHART_POINTS = 200
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
def experiment_list(request: WorkspaceRequest, workspace) -> HttpResponse:
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
        page_context(
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
        page_context(
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
def experiment_new(request: WorkspaceRequest, workspace) -> HttpResponse:
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
def experiment_edit(request: WorkspaceRequest, workspace, key: str) -> HttpResponse:
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
def layer_room(request: WorkspaceRequest, workspace) -> HttpResponse:
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


def _epoch(moment) -> float:
    """Epoch seconds to the millisecond: snapshots a few ms apart stay distinct points."""
    return round(moment.timestamp(), 3)


def _effect_chart(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Chart data (static/js/charts.js) of an arm's relative effect over time, in percent, with
    its always-valid (sequential) interval and the fixed-horizon 95% interval as bands."""
    pts = [p for p in points if p["low"] is not None and p["high"] is not None]
    if not pts:
        return {"x": [], "series": []}

    def pct(key: str) -> list[float]:
        return [round(p[key] * 100, 4) for p in pts]

    return {
        "x": [_epoch(p["at"]) for p in pts],
        "series": [
            {"label": "Relative effect", "values": pct("estimate"), "color": "#1d4ed8"},
            {
                "label": "Always-valid high",
                "values": pct("high"),
                "color": "#93c5fd",
                "kind": "edge",
            },
            {"label": "Always-valid low", "values": pct("low"), "color": "#93c5fd", "kind": "edge"},
            {
                "label": "Fixed 95% high",
                "values": pct("fixed_high"),
                "color": "#60a5fa",
                "kind": "edge",
                "dash": [4, 3],
            },
            {
                "label": "Fixed 95% low",
                "values": pct("fixed_low"),
                "color": "#60a5fa",
                "kind": "edge",
                "dash": [4, 3],
            },
            {
                "label": "No effect",
                "values": [0.0] * len(pts),
                "color": "#111827",
                "kind": "edge",
                "dash": [2, 4],
            },
        ],
        "bands": [
            {"upper": 2, "lower": 3, "fill": "rgba(191, 219, 254, 0.45)"},
            {"upper": 4, "lower": 5, "fill": "rgba(96, 165, 250, 0.30)"},
        ],
    }


def _arm_chart(snapshots: list[Snapshot], metric: str, arms: list[str]) -> dict[str, Any]:
    """Each arm's metric over time, with its own 95% interval as a band."""
    if not snapshots:
        return {"x": [], "series": []}
    series: list[dict[str, Any]] = []
    bands = []
    for i, arm in enumerate(arms):
        colour = ARM_COLOURS[i % len(ARM_COLOURS)]
        means, lows, highs = [], [], []
        for snap in snapshots:
            values = snap.result.get("arms", {}).get(arm, {})
            mean = values.get(metric)
            low, high = values.get(f"{metric}_ci") or [mean, mean]
            means.append(mean)
            lows.append(low)
            highs.append(high)
        first = len(series) + 1  # uPlot's series index (0 is x)
        series += [
            {"label": arm, "values": means, "color": colour},
            {"label": f"{arm} 95% high", "values": highs, "color": colour + "66", "kind": "edge"},
            {"label": f"{arm} 95% low", "values": lows, "color": colour + "66", "kind": "edge"},
        ]
        bands.append({"upper": first + 1, "lower": first + 2, "fill": colour + "26"})
    return {"x": [_epoch(s.created_at) for s in snapshots], "series": series, "bands": bands}


def _ramp_chart(exp: Experiment, steps: list[dict[str, Any]], now) -> dict[str, Any]:
    """Traffic per treatment arm over time (a step line), and the next planned step."""
    done = [s for s in steps if s["at"] is not None]
    if not done:
        return {"x": [], "series": []}
    end = exp.ended_at if exp.ended_at and not exp.is_live else now
    xs = [_epoch(s["at"]) for s in done] + [_epoch(max(end, done[-1]["at"]))]
    actual = [float(s["percent"]) for s in done] + [float(done[-1]["percent"])]
    planned: list[float | None] = [None] * len(xs)
    upcoming = exp.ramp_step + 1
    if exp.is_live and exp.next_ramp_at and upcoming < len(exp.ramp_plan):
        planned[-1] = actual[-1]
        xs.append(_epoch(exp.next_ramp_at))
        actual.append(None)
        planned.append(float(exp.ramp_plan[upcoming]))
    series = [{"label": "Traffic per arm", "values": actual, "color": "#2563eb", "kind": "step"}]
    if any(v is not None for v in planned):
        series.append(
            {
                "label": "Next step (planned)",
                "values": planned,
                "color": "#9ca3af",
                "kind": "step",
                "dash": [5, 4],
            }
        )
    return {"x": xs, "series": series}


@workspace_page()
def experiment_page(request: WorkspaceRequest, workspace, key: str) -> HttpResponse:
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
        effect_charts.append({"arm": arm, "chart": _effect_chart(points), "n": len(points)})
    latest = snapshots[-1] if snapshots else None
    ramp_steps = [{**step, "at": parse_datetime(step.get("at") or "")} for step in exp.ramp_history]
    can_develop = role_at_least(request.workspace_role, Role.DEVELOPER)
    can_release = role_at_least(request.workspace_role, Role.MAINTAINER)
    return render(
        request,
        "experiments/experiment_detail.html",
        page_context(
            request,
            exp=exp,
            latest=latest,
            result=latest.result if latest else None,
            effect_rows=_effect_rows(latest.result, metric) if latest else [],
            effect_charts=effect_charts,
            arm_chart=_arm_chart(snapshots, metric, exp.arm_names),
            ramp_chart=_ramp_chart(exp, ramp_steps, timezone.now()),
            allocations=services.current_allocations(exp) if exp.is_live else [],
            verdict=services.experiment_verdict(exp, latest.result if latest else None),
            ramp_steps=ramp_steps,
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
def experiment_action(request: WorkspaceRequest, workspace, key: str, action: str) -> HttpResponse:
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
def layer_list(request: WorkspaceRequest, workspace) -> HttpResponse:
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
        page_context(request, layers=layers, section="experiments"),
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
