"""Inference in process: loaded versions, the serving path's feature fetch, batch scoring.

``LoadedVersion`` holds one model version's bundle (tensors-only weights) and its *serving plan*:
which features come from the online store for which request part (user / item / other entity, by
the group's entity kind) and which come from the request context. ``serving_columns`` is the
serving path the release gate compares with the training path (dataset rows); both end in the
same ``FeatureEncoder``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings

from serving import oip
from workspaces.models import Workspace

MAX_LOADED = 32
_threads_set = False


def _one_thread() -> None:
    """Scoring batches of ~100 rows is fastest single-threaded; several gateway threads and
    processes share the cores instead of oversubscribing them."""
    global _threads_set
    if not _threads_set:
        import torch

        torch.set_num_threads(int(getattr(settings, "SERVING_TORCH_THREADS", 1)))
        _threads_set = True


@dataclass
class ServingPlan:
    # entity kind -> list of feature refs looked up in the online store for that entity
    lookups: dict[str, list[str]] = field(default_factory=dict)
    # features taken from the request context: (ref, column, feature name)
    context: list[tuple[str, str, str]] = field(default_factory=list)
    # entity kind -> key columns (for the gate, which reads keys from dataset rows)
    keys: dict[str, list[str]] = field(default_factory=dict)
    # context groups kept online: group name -> (its entity keys, its refs the model reads); a
    # request that names the keys (in its context, user or candidates) gets their values
    context_groups: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    transforms: dict[str, dict[str, float]] = field(default_factory=dict)


def build_plan(workspace_id: int, spec) -> ServingPlan:
    from features.models import EntityKind, FeatureGroup

    plan = ServingPlan()
    names = {f.ref.split(":")[0].split("@")[0] for f in spec.features}
    groups = {
        g.name: g for g in FeatureGroup.objects.for_workspace(workspace_id).filter(name__in=names)
    }
    for feature in spec.features:
        group = groups.get(feature.ref.split(":")[0].split("@")[0])
        entity = feature.entity or (group.entity if group else EntityKind.CONTEXT)
        if group is None or entity == EntityKind.CONTEXT:
            plan.context.append((feature.ref, feature.column, feature.ref.split(":")[-1]))
            if group is not None and group.online and group.entity_keys:
                keys, refs = plan.context_groups.setdefault(
                    group.name, (list(group.entity_keys), [])
                )
                refs.append(feature.ref)
            continue
        plan.lookups.setdefault(entity, []).append(feature.ref)
        keys = (spec.entity_keys or {}).get(entity) or list(group.entity_keys)
        plan.keys.setdefault(entity, keys)
    plan.transforms = dict((spec.extra or {}).get("serving_transforms") or {})
    return plan


def _apply_transforms(columns: dict[str, list], transforms: dict[str, dict[str, float]]) -> None:
    for name, transform in transforms.items():
        values = columns.get(name)
        if values is None:
            continue
        scale = float(transform.get("scale", 1.0))
        offset = float(transform.get("offset", 0.0))
        columns[name] = [None if v is None else float(v) * scale + offset for v in values]


def serving_columns(
    *,
    workspace: Workspace,
    plan: ServingPlan,
    entities: dict[str, list[Any]],
    context: dict[str, Any] | list[dict[str, Any]],
    n: int,
    key_rows: list[dict[str, Any]] | None = None,
) -> dict[str, list]:
    """Raw feature values by ref for ``n`` rows, fetched from the online store.

    ``entities`` maps an entity kind to its keys: one key (broadcast to all rows, e.g. the user
    of a request) or ``n`` keys (one per row, e.g. the candidates). ``context`` is one dict for
    all rows or one per row. ``key_rows`` (one dict per row: the keys the request names for that
    row) lets a context group kept online be looked up by its keys; a value the context gives
    for a feature wins over the stored one.
    """
    from features.selectors import online_lookup

    columns: dict[str, list] = {}
    for entity, refs in plan.lookups.items():
        keys = entities.get(entity)
        if not keys:
            for ref in refs:
                columns[ref] = [None] * n
            continue
        found = online_lookup(workspace=workspace, entities=keys, features=refs)
        rows = found["rows"]
        for index, ref in enumerate(refs):
            values = [row[index] for row in rows]
            if len(values) == 1 and n != 1:
                values = values * n
            columns[ref] = values
    stored: dict[str, list] = {}
    if key_rows is not None:
        for keys, refs in plan.context_groups.values():
            wanted = [
                {k: row[k] for k in keys} if all(k in row for k in keys) else None
                for row in key_rows
            ]
            known = [w for w in wanted if w is not None]
            if not known:
                continue
            found = online_lookup(workspace=workspace, entities=known, features=refs)
            values = iter(found["rows"])
            rows_of = [next(values) if w is not None else None for w in wanted]
            for index, ref in enumerate(refs):
                stored[ref] = [None if r is None else r[index] for r in rows_of]
    for ref, column, name in plan.context:
        if isinstance(context, list):
            given = [_context_value(c, ref, column, name) for c in context]
        else:
            given = [_context_value(context, ref, column, name)] * n
        if ref in stored:
            given = [g if g is not None else v for g, v in zip(given, stored[ref], strict=True)]
        columns[ref] = given
    _apply_transforms(columns, plan.transforms)
    return columns


def context_refusal(plan: ServingPlan, context: dict[str, Any], key_rows: list[dict]) -> str:
    """Why a request's context does not fit the model ("" when it does): a key the model reads
    nothing from, or a context feature neither given nor reachable by its group's keys."""
    allowed: set[str] = set(plan.lookups)
    for ref, column, name in plan.context:
        allowed |= {ref, column, name}
    for keys, _refs in plan.context_groups.values():
        allowed |= set(keys)
    unknown = sorted(set(context) - allowed)
    if unknown:
        return (
            f"unknown context key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; this "
            f"model reads {', '.join(sorted(allowed)) or 'no context'}"
        )
    for ref, column, name in plan.context:
        if _context_value(context, ref, column, name) is not None:
            continue
        group = ref.split(":")[0].split("@")[0]
        keys = plan.context_groups.get(group, ([], []))[0]
        if keys and all(all(k in row for k in keys) for row in key_rows):
            continue
        how = f" or its group's key{'s' if len(keys) > 1 else ''} {', '.join(keys)}" if keys else ""
        return f"the context misses {name} ({ref}): give it{how}"
    return ""


def _context_value(context: Any, ref: str, column: str, name: str) -> Any:
    if not isinstance(context, dict):
        return None
    for key in (column, ref, name):
        if key in context:
            return context[key]
    return None


class LoadedVersion:
    def __init__(self, version) -> None:
        _one_thread()
        from serving.registry import load_version

        self.version_id = version.pk
        self.number = version.version
        self.model_name = version.model.name
        self.workspace_id = version.workspace_id
        self.bundle = load_version(version)
        self.plan = build_plan(version.workspace_id, self.bundle.spec)
        self.oip_inputs = oip.model_inputs(self.bundle.spec.features)  # OIP metadata, per version
        self.lock = threading.Lock()
        self.warm()

    def warm(self) -> None:
        """One dummy batch so the first real request pays no lazy-initialisation cost."""
        self.predict({}, 4)

    def predict(self, columns: dict[str, list], n: int) -> np.ndarray:
        return self.bundle.predict(columns, n)


class ModelCache:
    """Versions loaded in this process, by id (a deployment's production and previous versions
    and its experiment arms stay loaded, so rollback and routing never wait for a load).

    At most ``MAX_LOADED`` versions: the least recently used one is evicted first, never one a
    routing table of this process routes to (``TABLES``: production, rollback target, arms), so a
    burst of one-off loads (playgrounds, evaluations) cannot push the hot production model out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: OrderedDict[int, LoadedVersion] = OrderedDict()

    def get(self, version_id: int) -> LoadedVersion:
        loaded = self._loaded.get(version_id)
        if loaded is not None:
            with self._lock:
                if version_id in self._loaded:
                    self._loaded.move_to_end(version_id)
            return loaded
        from serving.models import ModelVersion

        version = ModelVersion.objects.unscoped().select_related("model").get(pk=version_id)
        loaded = LoadedVersion(version)
        with self._lock:
            self._loaded.setdefault(version_id, loaded)
            self._loaded.move_to_end(version_id)
            self._evict(keep=version_id)
        return self._loaded[version_id]

    def _evict(self, *, keep: int) -> None:
        """Under the lock: drop least recently used versions that no table routes to."""
        if len(self._loaded) <= MAX_LOADED:
            return
        from serving.routing import TABLES

        routed = TABLES.routed_versions() | {keep}
        for candidate in list(self._loaded):
            if len(self._loaded) <= MAX_LOADED:
                break
            if candidate not in routed:
                del self._loaded[candidate]

    def loaded_ids(self) -> list[int]:
        """Loaded version ids, least recently used first."""
        return list(self._loaded)

    def ensure(self, version_ids) -> None:
        for version_id in version_ids:
            if version_id:
                self.get(version_id)

    def clear(self) -> None:
        with self._lock:
            self._loaded.clear()


MODELS = ModelCache()
