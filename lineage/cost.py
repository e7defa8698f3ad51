"""Cost roll-ups: resources from the events, priced, then spread along the graph.

``Usage`` rows hold what each event reported for its subject (a job, a deployment), priced with
``LINEAGE_UNIT_PRICES``. From there:

- a job or deployment costs the sum of its usage;
- a model version costs its own usage, the jobs that produced it and its deployments;
- an experiment costs its own usage, the deployments/model versions tested in it and the jobs
  that trained those;
- a feature (and a feature group) carries a share of every costed object downstream of it: the
  object's cost divided equally among the features (groups) upstream of it;
- a workspace costs the sum of its usage, per day over time.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDay
from django.utils import timezone

from lineage.adjacency import reached_from_each
from lineage.conf import RESOURCE_KEYS, setting
from lineage.models import Node, Usage
from lineage.queries import downstream_ids
from workspaces.models import Event, Workspace

_SUMS = {key: Sum(key) for key in (*RESOURCE_KEYS, "cost")}


def _clean(values: dict[str, Any]) -> dict[str, float]:
    return {key: round(float(values.get(key) or 0), 6) for key in (*RESOURCE_KEYS, "cost")}


def own_costs(*, workspace: Workspace) -> dict[int, float]:
    rows = Usage.objects.for_workspace(workspace).values("node_id").annotate(total=Sum("cost"))
    return {row["node_id"]: float(row["total"] or 0) for row in rows}


def node_usage(*, workspace: Workspace, node: Node) -> dict[str, float]:
    return _clean(Usage.objects.for_workspace(workspace).filter(node=node).aggregate(**_SUMS))


def cost_of(*, workspace: Workspace, node: Node) -> dict[str, Any]:
    """The roll-up cost of one node with the parts it is made of."""
    costs = own_costs(workspace=workspace)
    parts: list[dict[str, Any]] = []
    own = costs.get(node.pk, 0.0)
    if node.kind in ("model_version", "experiment"):
        related = (
            [("upstream", 1), ("downstream", 1)]
            if node.kind == "model_version"
            else [("upstream", 3)]
        )
        kinds = {"training_job", "deployment", "model_version"}
        seen: set[int] = set()
        for direction, depth in related:
            seen |= downstream_ids(node.pk, depth, direction)
        for other in Node.objects.for_workspace(workspace).filter(pk__in=seen, kind__in=kinds):
            if costs.get(other.pk):
                parts.append({"key": other.key, "label": other.label, "cost": costs[other.pk]})
    elif node.kind in ("feature", "feature_group"):
        shares = feature_costs(workspace=workspace, kind=node.kind)
        share = shares.get(node.pk, {"cost": 0.0, "objects": 0})
        return {
            "key": node.key,
            "own": round(own, 6),
            "total": round(own + share["cost"], 6),
            "share_of": share["objects"],
            "parts": [],
            "usage": node_usage(workspace=workspace, node=node),
        }
    total = own + sum(p["cost"] for p in parts)
    return {
        "key": node.key,
        "own": round(own, 6),
        "total": round(total, 6),
        "parts": sorted(parts, key=lambda p: -p["cost"]),
        "usage": node_usage(workspace=workspace, node=node),
    }


def feature_costs(*, workspace: Workspace, kind: str = "feature") -> dict[int, dict[str, Any]]:
    """Each feature's (or group's) share of the costed objects downstream of it."""
    costs = own_costs(workspace=workspace)
    costed = {pk: c for pk, c in costs.items() if c > 0}
    kinds = dict(
        Node.objects.for_workspace(workspace)
        .filter(kind__in=("feature", "feature_group"))
        .values_list("id", "kind")
    )
    shares: dict[int, dict[str, Any]] = defaultdict(lambda: {"cost": 0.0, "objects": 0})
    upstream_of = reached_from_each(list(costed), 6, "upstream")
    for pk, cost in costed.items():
        upstream = [f for f in upstream_of[pk] if kinds.get(f) == kind]
        for feature in upstream:
            shares[feature]["cost"] += cost / len(upstream)
            shares[feature]["objects"] += 1
    return {pk: {"cost": round(v["cost"], 6), "objects": v["objects"]} for pk, v in shares.items()}


def top_costs(*, workspace: Workspace, kinds: tuple[str, ...], limit: int = 10) -> list[dict]:
    costs = own_costs(workspace=workspace)
    nodes = Node.objects.for_workspace(workspace).filter(pk__in=list(costs), kind__in=kinds)
    rows = [{"key": n.key, "label": n.label, "kind": n.kind, "cost": costs[n.pk]} for n in nodes]
    return sorted(rows, key=lambda r: -r["cost"])[:limit]


def workspace_cost(*, workspace: Workspace, days: int = 30) -> dict[str, Any]:
    """Total and per-day usage and cost of a workspace over the last ``days`` days."""
    since = timezone.now() - timedelta(days=days)
    usages = Usage.objects.for_workspace(workspace).filter(created_at__gte=since)
    daily = (
        usages.annotate(day=TruncDay("created_at"))
        .values("day")
        .annotate(**_SUMS, events=Count("id"))
        .order_by("day")
    )
    return {
        "workspace": workspace.slug,
        "days": days,
        "unit_prices": setting("LINEAGE_UNIT_PRICES"),
        "total": _clean(usages.aggregate(**_SUMS)),
        "daily": [{"day": row["day"].date().isoformat(), **_clean(row)} for row in daily],
    }


def platform_usage(*, since) -> list[dict[str, Any]]:
    """Usage and cost per workspace and day (the admin console's table)."""
    rows = (
        Usage.objects.unscoped()
        .filter(created_at__gte=since)
        .annotate(day=TruncDay("created_at"))
        .values("workspace__slug", "day")
        .annotate(**_SUMS)
        .order_by("workspace__slug", "day")
    )
    return [
        {"workspace": row["workspace__slug"], "day": row["day"].date(), **_clean(row)}
        for row in rows
    ]


def _durations(events: list[Event], key_of) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for event in events:
        key = key_of(event)
        if key is None:
            continue
        run = runs.setdefault(
            key, {"key": key, "started_at": None, "finished_at": None, "state": "", "samples": 0}
        )
        state = event.verb.rsplit(".", 1)[-1]
        run["state"] = state
        if state in ("running", "started") and run["started_at"] is None:
            run["started_at"] = event.created_at
        if run["started_at"] is None:
            run["first_at"] = run.get("first_at") or event.created_at
        if state in ("succeeded", "completed", "failed", "cancelled"):
            run["finished_at"] = event.created_at
        data = {**(event.payload or {}), **(event.resources or {})}
        for name in ("samples", "rows", "examples"):
            if isinstance(data.get(name), int | float):
                run["samples"] = max(run["samples"], data[name])
        if isinstance(data.get("samples_per_second"), int | float):
            run["samples_per_second"] = float(data["samples_per_second"])
    for run in runs.values():
        start = run["started_at"] or run.pop("first_at", None)
        run.pop("first_at", None)
        if start and run["finished_at"]:
            seconds = (run["finished_at"] - start).total_seconds()
            run["duration_s"] = round(seconds, 3)
            if "samples_per_second" not in run and seconds > 0 and run["samples"]:
                run["samples_per_second"] = round(run["samples"] / seconds, 3)
    return runs


def _subject(event: Event) -> str | None:
    for ref in event.refs.all():
        if ref.role == "subject":
            return f"{ref.kind}:{ref.object_id}"
    return None


def pipeline_runs(*, workspace: Workspace, limit: int = 200) -> dict[str, list[dict[str, Any]]]:
    """End-to-end duration per pipeline run (``training.pipeline_run.*``) and training speed per
    job (``training.job.*``), from their events."""
    pipeline = list(
        Event.objects.for_workspace(workspace)
        .filter(
            Q(verb__startswith="training.pipeline_run.") | Q(verb__startswith="training.pipeline.")
        )
        .exclude(verb="training.pipeline.created")
        .prefetch_related("refs")
        .order_by("id")[:5000]
    )
    jobs = list(
        Event.objects.for_workspace(workspace)
        .filter(verb__startswith="training.job.")
        .prefetch_related("refs")
        .order_by("id")[:5000]
    )
    return {
        "pipelines": list(_durations(pipeline, _subject).values())[-limit:],
        "jobs": list(_durations(jobs, _subject).values())[-limit:],
    }
