"""The routing table: which model version serves a unit, per workspace and deployment.

Contract (used by the experiments app):

- ``bucket(unit_id, salt, buckets=10000)``: a deterministic bucket (blake2b of ``salt:unit_id``),
  the same in every process, on every machine and after restarts.
- A deployment's table is its production version plus experiment *layers*. Each layer has one
  salt; each experiment in it owns allocations ``(arm, version_id, [start, end))`` of bucket
  ranges. Ranges never overlap within a layer, so a unit falls in at most one allocation per
  layer. Layers are tried in name order and the first allocation containing the unit wins (so keep
  model-serving experiments of one deployment in one layer); units outside every allocation get
  production.
- ``routing_experiment_set`` / ``routing_experiment_clear`` write the table (services with
  events). Every write increments ``Deployment.routing_version`` and, after commit, the shared
  routing generation in the cache (Redis in production). Gateway processes read that generation
  at most every ``SERVING_ROUTING_POLL_S`` (0.2 s) and reload the tables they hold when it
  changed, so a change applies everywhere within a second.
- ``routing_table(workspace, deployment) -> dict`` (the published table as plain data) and
  ``route(table, unit_id) -> (version_id, experiment_key | None, arm | None)``.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import transaction

from workspaces.events import Actor, Ref, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace
from workspaces.selectors import workspace_object

BUCKETS = 10_000
GENERATION_KEY = "serving:routing-generation"


def bucket(unit_id: str, salt: str, buckets: int = BUCKETS) -> int:
    """Deterministic bucket in ``[0, buckets)`` of a unit under a salt."""
    digest = hashlib.blake2b(f"{salt}:{unit_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


# ---------------------------------------------------------------------------------------------
# Reading and evaluating tables


def routing_table(workspace: Workspace, deployment: Any) -> dict[str, Any]:
    """The deployment's published table as plain data (JSON-able)."""
    from serving.models import Deployment, ExperimentRoute
    from serving.replicas import remote_of

    dep = workspace_object(Deployment, workspace=workspace, ref=deployment, attr="deployment")
    layers: dict[str, dict[str, Any]] = {}
    for route_row in ExperimentRoute.objects.for_workspace(workspace).filter(deployment=dep):
        layer = layers.setdefault(
            route_row.layer, {"layer": route_row.layer, "salt": route_row.salt, "allocations": []}
        )
        for alloc in route_row.allocations:
            layer["allocations"].append(
                {
                    "experiment_key": route_row.experiment_key,
                    "arm": alloc["arm"],
                    "version_id": int(alloc["version_id"]),
                    "start": int(alloc["start"]),
                    "end": int(alloc["end"]),
                }
            )
    for layer in layers.values():
        layer["allocations"].sort(key=lambda a: a["start"])
    return {
        "workspace_id": workspace.pk,
        "deployment": dep.name,
        "deployment_id": dep.pk,
        "routing_version": dep.routing_version,
        "production": dep.version_id,
        "stopped": dep.state == "stopped",
        "previous": dep.previous_version_id,
        "buckets": BUCKETS,
        "layers": [layers[name] for name in sorted(layers)],
        # The production version's replicas, when its backend runs them and reports them Ready.
        "remote": remote_of(dep, _status_of(dep)),
    }


def _status_of(dep: Any) -> Any:
    """The deployment's controller status (its ``observed`` row, already loaded when the caller
    selected it), or None before its first reconcile."""
    from serving.models import DeploymentStatus

    try:
        return dep.observed
    except DeploymentStatus.DoesNotExist:
        return None


def _compiled(table: dict[str, Any]) -> list[tuple[str, list[int], list[dict[str, Any]]]]:
    compiled = table.get("_compiled")
    if compiled is None:
        compiled = [
            (
                layer["salt"],
                [a["start"] for a in layer["allocations"]],
                layer["allocations"],
            )
            for layer in table["layers"]
            if layer["allocations"]
        ]
        table["_compiled"] = compiled
    return compiled


def route(table: dict[str, Any], unit_id: str) -> tuple[int, str | None, str | None]:
    """(version_id, experiment_key or None, arm or None) for a unit."""
    for salt, starts, allocations in _compiled(table):
        b = bucket(unit_id, salt, table.get("buckets", BUCKETS))
        i = bisect.bisect_right(starts, b) - 1
        if i >= 0:
            alloc = allocations[i]
            if b < alloc["end"]:
                return alloc["version_id"], alloc["experiment_key"], alloc["arm"]
    return table["production"], None, None


def table_version_ids(table: dict[str, Any]) -> set[int]:
    """Every version a table can route to (all must be loaded before it takes traffic)."""
    ids = {table["production"]}
    if table.get("previous"):
        ids.add(table["previous"])
    for layer in table["layers"]:
        ids.update(a["version_id"] for a in layer["allocations"])
    return ids


# ---------------------------------------------------------------------------------------------
# Publication


def publish() -> None:
    """Tell every gateway process that some table changed (after the transaction commits)."""

    def _bump_table_generation() -> None:
        cache.set(GENERATION_KEY, uuid.uuid4().hex, timeout=None)
        TABLES.force_refresh()

    transaction.on_commit(_bump_table_generation)


class TableCache:
    """Per-process tables, refreshed when the shared generation changes (polled <= every 0.2 s).

    ``prepare`` is called with a freshly loaded table before it replaces the old one, so the
    gateway can load and warm every version the table routes to before traffic moves.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[int, str], dict[str, Any]] = {}
        self._generation: str | None = None
        self._checked = 0.0
        self.prepare: Callable[[dict[str, Any]], None] | None = None

    def force_refresh(self) -> None:
        self._checked = 0.0

    def _poll(self) -> None:
        now = time.monotonic()
        interval = getattr(settings, "SERVING_ROUTING_POLL_S", 0.2)
        if now - self._checked < interval:
            return
        self._checked = now
        generation = cache.get(GENERATION_KEY)
        if generation != self._generation:
            self._generation = generation
            stale = list(self._tables)
            for key in stale:
                try:
                    self._reload(*key)
                except ValidationError:
                    with self._lock:
                        self._tables.pop(key, None)

    def _reload(self, workspace_id: int, name: str) -> dict[str, Any]:
        workspace = Workspace(pk=workspace_id)
        table = routing_table(workspace, name)
        if self.prepare is not None:
            self.prepare(table)
        with self._lock:
            self._tables[(workspace_id, name)] = table
        return table

    def get(self, workspace_id: int, name: str) -> dict[str, Any]:
        self._poll()
        table = self._tables.get((workspace_id, name))
        if table is None:
            table = self._reload(workspace_id, name)
        return table

    def routed_versions(self) -> set[int]:
        """Every version id a table of this process routes to (production, the rollback
        target, experiment arms)."""
        ids: set[int] = set()
        with self._lock:
            tables = list(self._tables.values())
        for table in tables:
            ids.update(i for i in (table.get("production"), table.get("previous")) if i)
            for layer in table.get("layers") or []:
                for alloc in layer.get("allocations") or []:
                    if alloc.get("version_id"):
                        ids.add(int(alloc["version_id"]))
        return ids

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
        self._generation = None
        self._checked = 0.0


TABLES = TableCache()


# ---------------------------------------------------------------------------------------------
# Services


def _check_allocations(allocations: Any, workspace: Workspace) -> list[dict[str, Any]]:
    from serving.gates import require_deployable
    from serving.models import ModelVersion

    if not isinstance(allocations, list) or not allocations:
        raise ValidationError({"allocations": "give a list of {arm, version_id, start, end}"})
    if len(allocations) > 100:
        raise ValidationError({"allocations": "at most 100 allocations"})
    clean = []
    for i, alloc in enumerate(allocations):
        if not isinstance(alloc, dict):
            raise ValidationError({f"allocations.{i}": "give an object"})
        arm = alloc.get("arm")
        start, end, version_id = alloc.get("start"), alloc.get("end"), alloc.get("version_id")
        if not isinstance(arm, str) or not arm or len(arm) > 100:
            raise ValidationError({f"allocations.{i}.arm": "give an arm name"})
        for key, value in (("start", start), ("end", end), ("version_id", version_id)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValidationError({f"allocations.{i}.{key}": "give an integer"})
        if not 0 <= start < end <= BUCKETS:
            raise ValidationError({f"allocations.{i}": f"need 0 <= start < end <= {BUCKETS}"})
        version = ModelVersion.objects.for_workspace(workspace).filter(pk=version_id).first()
        if version is None:
            raise ReferenceNotFound("no such model version", attr=f"allocations.{i}.version_id")
        require_deployable(version)
        clean.append({"arm": arm, "version_id": version_id, "start": start, "end": end})
    ordered = sorted(clean, key=lambda a: a["start"])
    for before, after in itertools.pairwise(ordered):
        if after["start"] < before["end"]:
            raise ValidationError({"allocations": "bucket ranges overlap"})
    return clean


def _bump_routing_version(dep) -> None:
    """Count one more change of the deployment's table and publish it after the commit."""
    from serving.models import Deployment

    Deployment.objects.for_workspace(dep.workspace_id).filter(pk=dep.pk).update(
        routing_version=dep.routing_version + 1
    )
    dep.routing_version += 1
    publish()


@transaction.atomic
def routing_experiment_set(
    *,
    actor: Actor,
    workspace: Workspace,
    deployment: Any,
    experiment_key: str,
    layer: str,
    salt: str,
    allocations: list[dict[str, Any]],
):
    """Create or replace an experiment's allocations in a layer of a deployment's table."""
    from serving.models import Deployment, ExperimentRoute

    for field, value in (("experiment_key", experiment_key), ("layer", layer), ("salt", salt)):
        if not isinstance(value, str) or not value or len(value) > 100:
            raise ValidationError({field: "give a non-empty string of at most 100 characters"})
    dep = workspace_object(Deployment, workspace=workspace, ref=deployment, attr="deployment")
    dep = Deployment.objects.for_workspace(workspace).select_for_update().get(pk=dep.pk)
    clean = _check_allocations(allocations, workspace)
    others = ExperimentRoute.objects.for_workspace(workspace).filter(deployment=dep, layer=layer)
    for other in others.exclude(experiment_key=experiment_key):
        if other.salt != salt:
            raise ConflictError(
                f"layer '{layer}' uses salt '{other.salt}' (experiment '{other.experiment_key}')",
                attr="salt",
            )
        for mine in clean:
            for theirs in other.allocations:
                if mine["start"] < theirs["end"] and theirs["start"] < mine["end"]:
                    raise ConflictError(
                        f"buckets [{mine['start']}, {mine['end']}) overlap experiment "
                        f"'{other.experiment_key}' in layer '{layer}'",
                        attr="allocations",
                    )
    row, created = ExperimentRoute.objects.update_or_create(
        workspace=workspace,
        deployment=dep,
        experiment_key=experiment_key,
        defaults={"layer": layer, "salt": salt, "allocations": clean},
    )
    _bump_routing_version(dep)
    from serving.models import ModelVersion

    versions = ModelVersion.objects.for_workspace(workspace).filter(
        pk__in={a["version_id"] for a in clean}
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.routing.experiment_set",
        refs=[Ref.to(dep), *(Ref.to(v, role="related") for v in versions)],
        payload={
            "experiment_key": experiment_key,
            "layer": layer,
            "salt": salt,
            "allocations": clean,
            "routing_version": dep.routing_version,
            "created": created,
        },
    )
    return row


@transaction.atomic
def routing_experiment_clear(
    *, actor: Actor, workspace: Workspace, deployment: Any, experiment_key: str, reason: str = ""
) -> bool:
    """Remove an experiment from the table: its traffic goes back to production (control)."""
    from serving.models import Deployment, ExperimentRoute

    dep = workspace_object(Deployment, workspace=workspace, ref=deployment, attr="deployment")
    dep = Deployment.objects.for_workspace(workspace).select_for_update().get(pk=dep.pk)
    deleted, _ = (
        ExperimentRoute.objects.for_workspace(workspace)
        .filter(deployment=dep, experiment_key=experiment_key)
        .delete()
    )
    if not deleted:
        return False
    _bump_routing_version(dep)
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.routing.experiment_cleared",
        refs=[Ref.to(dep)],
        payload={
            "experiment_key": experiment_key,
            "reason": str(reason)[:500],
            "routing_version": dep.routing_version,
        },
    )
    return True
