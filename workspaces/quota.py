"""The one quota's reads: limits (``WorkspaceQuota`` rows) with live usage, in one summary.

Limits live here in ``workspaces`` (the quota belongs to the workspace, and the admin, the API and
the ``workspace`` command all live here). What a workspace *uses* is known only to apps on the
right: the scheduler counts the jobs holding capacity, ``features`` knows the bytes stored. The
dependency rule forbids importing them, so the scheduler registers a usage provider from its
``AppConfig.ready()`` (as the dashboard cards do) and ``quota_summary`` calls it. The dashboard
card, the queue page, the API's workspace detail and the admin all show ``quota_summary``, so
they cannot disagree; admission counts usage with the same function the provider uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from workspaces.models import Workspace, WorkspaceQuota

GIB = 1024**3


@dataclass(frozen=True)
class Usage:
    """What a workspace uses now: per quota GPU type ('' = all types) and its stored bytes."""

    by_gpu_type: dict[str, dict[str, int]] = field(default_factory=dict)
    storage_bytes: int = 0


# provider(workspaces, gpu types by workspace id): each workspace's usage for each quota GPU
# type given ('' always included), keyed by workspace id. It takes many workspaces at once so
# that a list of workspaces (the API's) costs the same few queries as one.
UsageProvider = Callable[[list[Workspace], dict[int, set[str]]], dict[int, Usage]]
_usage_provider: UsageProvider | None = None


def register_usage_provider(provider: UsageProvider) -> None:
    """Set the function that measures workspaces' live usage (the scheduler's, at start)."""
    global _usage_provider
    _usage_provider = provider


def usage_of(workspace: Workspace, gpu_types: set[str] | None = None) -> Usage:
    """One workspace's live usage (for its quota GPU types when none are given)."""
    if gpu_types is None:
        gpu_types = set(
            WorkspaceQuota.objects.for_workspace(workspace).values_list("gpu_type", flat=True)
        )
    return usages_of([workspace], {workspace.pk: gpu_types})[workspace.pk]


def usages_of(workspaces: list[Workspace], gpu_types: dict[int, set[str]]) -> dict[int, Usage]:
    """Live usage of each workspace (by id) for the GPU types given for it ('' included)."""
    if _usage_provider is None or not workspaces:
        return {workspace.pk: Usage() for workspace in workspaces}
    types = {w.pk: set(gpu_types.get(w.pk, ())) | {""} for w in workspaces}
    return _usage_provider(workspaces, types)


def limits_from_units(
    *,
    cpu_cores: Decimal | float | int | None = None,
    memory_gb: Decimal | float | int | None = None,
    gpus: Decimal | float | int | None = None,
    storage_gb: Decimal | float | int | None = None,
) -> dict[str, int | None]:
    """Human units (cores, GiB, GPUs, GB) as the quota's fields (milli-CPU, MiB, milli-GPU, GB).

    Used by the migration that folded the old ``workspaces.Quota`` into this model, by the
    ``workspace`` command and by demo setup. ``None`` stays ``None`` (unlimited).
    """

    def scaled(value, factor: int) -> int | None:
        if value is None:
            return None
        return int((Decimal(str(value)) * factor).to_integral_value(rounding=ROUND_HALF_UP))

    return {
        "cpu_milli": scaled(cpu_cores, 1000),
        "memory_mb": scaled(memory_gb, 1024),
        "gpu_milli": scaled(gpus, 1000),
        "storage_gb": scaled(storage_gb, 1),
    }


def quota_summary(*, workspace: Workspace) -> dict[str, Any]:
    """The workspace's quota rows with what it uses of each, and its usage overall.

    ``rows``: one per GPU type (blank: all types) with the limits (``None``: unlimited) and
    ``used_*``; the storage limit and use are on the all-types row. ``limited`` is False for a
    workspace without a quota (then the top-level ``used_*`` still say what it uses)."""
    return quota_summaries(workspaces=[workspace])[workspace.pk]


def quota_summaries(*, workspaces: list[Workspace]) -> dict[int, dict[str, Any]]:
    """``quota_summary`` of each workspace (by id), read together: the quota rows in one query
    and the usage in one call of the provider, however many workspaces are listed."""
    quotas: dict[int, list[WorkspaceQuota]] = {w.pk: [] for w in workspaces}
    if workspaces:
        limits = WorkspaceQuota.objects.for_workspaces([w.pk for w in workspaces])
        for quota in limits.order_by("workspace_id", "gpu_type"):
            quotas[quota.workspace_id].append(quota)
    usages = usages_of(workspaces, {pk: {q.gpu_type for q in qs} for pk, qs in quotas.items()})
    return {pk: _summary(quotas[pk], usages[pk]) for pk in quotas}


def _summary(quotas: list[WorkspaceQuota], usage: Usage) -> dict[str, Any]:
    used_storage_gb = round(usage.storage_bytes / GIB, 3)
    rows = []
    for quota in quotas:
        used = usage.by_gpu_type.get(quota.gpu_type, {})
        rows.append(
            {
                "gpu_type": quota.gpu_type,
                "cpu_milli": quota.cpu_milli,
                "memory_mb": quota.memory_mb,
                "gpu_milli": quota.gpu_milli,
                "storage_gb": quota.storage_gb if not quota.gpu_type else None,
                "used_cpu_milli": used.get("cpu_milli", 0),
                "used_memory_mb": used.get("memory_mb", 0),
                "used_gpu_milli": used.get("gpu_milli", 0),
                "used_storage_gb": used_storage_gb if not quota.gpu_type else None,
                "updated_at": quota.updated_at,
            }
        )
    in_use = usage.by_gpu_type.get("", {})
    return {
        "limited": bool(rows),
        "rows": rows,
        "used_cpu_milli": in_use.get("cpu_milli", 0),
        "used_memory_mb": in_use.get("memory_mb", 0),
        "used_gpu_milli": in_use.get("gpu_milli", 0),
        "used_storage_gb": used_storage_gb,
    }
