"""Online lookup: many features of many groups for many entities in one store round trip."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from features import online_store
from features.models import FeatureGroup, FeatureGroupVersion, Lifecycle
from workspaces import access_cache
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Workspace

MAX_ENTITIES = 1000
MAX_FEATURES = 500
REF_PATTERN = re.compile(
    r"^(?P<group>[a-z][a-z0-9_]{0,62})(?:@v(?P<version>\d{1,6}))?:(?P<feature>[a-z][a-z0-9_]{0,62})$"
)


@dataclass(frozen=True)
class FeatureRef:
    """``group:feature`` (the live version) or ``group@v2:feature`` (a pinned version)."""

    group: str
    feature: str
    version: int | None = None

    @classmethod
    def parse(cls, text: Any, *, index: int) -> FeatureRef:
        match = REF_PATTERN.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValidationError(
                {f"features.{index}": "use 'group:feature' or 'group@v2:feature'"}
            )
        version = match.group("version")
        return cls(match.group("group"), match.group("feature"), int(version) if version else None)

    def __str__(self) -> str:
        pinned = f"@v{self.version}" if self.version else ""
        return f"{self.group}{pinned}:{self.feature}"


def parse_refs(features: Any) -> list[FeatureRef]:
    if not isinstance(features, list) or not features:
        raise ValidationError({"features": "give a list of 'group:feature' references"})
    if len(features) > MAX_FEATURES:
        raise ValidationError({"features": f"at most {MAX_FEATURES} features per lookup"})
    return [FeatureRef.parse(text, index=i) for i, text in enumerate(features)]


def resolve_refs(
    *, workspace: Workspace, refs: list[FeatureRef]
) -> dict[tuple[str, int | None], tuple[FeatureGroup, FeatureGroupVersion]]:
    """Each (group, pinned version) in the refs, checked against the registry."""
    names = {ref.group for ref in refs}
    groups: dict[str, FeatureGroup] = {}
    versions: dict[tuple[int, int], FeatureGroupVersion] = {}
    # One query: every version of the named groups, each with its group.
    for version in (
        FeatureGroupVersion.objects.for_workspace(workspace)
        .filter(group__name__in=names)
        .select_related("group")
    ):
        groups[version.group.name] = version.group
        versions[(version.group_id, version.version)] = version
    resolved: dict[tuple[str, int | None], tuple[FeatureGroup, FeatureGroupVersion]] = {}
    for index, ref in enumerate(refs):
        group = groups.get(ref.group)
        if group is None:
            raise ReferenceNotFound(f"no feature group '{ref.group}'", attr=f"features.{index}")
        if group.status == Lifecycle.RETIRED:
            raise ValidationError({f"features.{index}": f"feature group '{ref.group}' is retired"})
        version = versions.get((group.pk, ref.version or group.current_version))
        if version is None:
            raise ReferenceNotFound(
                f"'{ref.group}' has no version {ref.version}", attr=f"features.{index}"
            )
        if ref.feature not in version.feature_map():
            raise ReferenceNotFound(f"no feature '{ref}'", attr=f"features.{index}")
        resolved[(ref.group, ref.version)] = (group, version)
    return resolved


def _entity_ids(entities: list[Any], group: FeatureGroup) -> list[str]:
    keys = group.entity_keys
    ids = []
    for index, entity in enumerate(entities):
        if isinstance(entity, dict):
            missing = [k for k in keys if k not in entity]
            if missing:
                raise ValidationError(
                    {f"entities.{index}": f"missing key '{missing[0]}' for '{group.name}'"}
                )
            ids.append(online_store.entity_id([entity[k] for k in keys]))
        elif len(keys) == 1 and isinstance(entity, (str, int)) and not isinstance(entity, bool):
            ids.append(str(entity))
        else:
            raise ValidationError(
                {f"entities.{index}": f"give an object with {', '.join(keys)} for '{group.name}'"}
            )
    return ids


@dataclass(frozen=True)
class PlanSource:
    """One group version a lookup reads, and which answer columns its stored row fills."""

    group: FeatureGroup
    namespace: str
    counter: str
    # (answer column, feature name, its position in a stored row: the version's schema order)
    wanted: tuple[tuple[int, str, int], ...]


@dataclass(frozen=True)
class LookupPlan:
    """What a list of feature references reads: resolved once, cached until the registry moves."""

    features: list[str]  # the references as answered (canonical text)
    sources: list[PlanSource]
    width: int


def lookup_plan(*, workspace: Workspace, features: Any) -> LookupPlan:
    """The plan for ``features`` in ``workspace``; raises ValidationError naming a bad reference."""
    refs = parse_refs(features)
    # The registry changes rarely: cache the resolution per process (invalidated on any write).
    resolved = access_cache.cached(
        ("feature-refs", workspace.pk, tuple(refs)),
        lambda: resolve_refs(workspace=workspace, refs=refs),
    )
    # Group the requested features by source so each stored row is visited once per entity.
    positions: dict[tuple[str, int | None], list[tuple[int, str]]] = {}
    for column, ref in enumerate(refs):
        positions.setdefault((ref.group, ref.version), []).append((column, ref.feature))
    sources = []
    for source, (group, version) in resolved.items():
        index = {spec["name"]: i for i, spec in enumerate(version.features)}
        sources.append(
            PlanSource(
                group=group,
                namespace=online_store.namespace(
                    workspace_id=workspace.pk, group_id=group.pk, version=version.version
                ),
                counter=f"{workspace.pk}:{group.pk}",
                wanted=tuple((column, name, index[name]) for column, name in positions[source]),
            )
        )
    return LookupPlan(features=[str(ref) for ref in refs], sources=sources, width=len(refs))


def check_entities(entities: Any) -> list[Any]:
    if not isinstance(entities, list) or not entities:
        raise ValidationError({"entities": "give a list of entities"})
    if len(entities) > MAX_ENTITIES:
        raise ValidationError({"entities": f"at most {MAX_ENTITIES} entities per lookup"})
    return entities


def plan_lookups(plan: LookupPlan, entities: list[Any]) -> list[online_store.Lookup]:
    """The store reads of a plan for these entities; raises ValidationError for a bad entity."""
    return [
        online_store.Lookup(
            namespace=source.namespace,
            entities=_entity_ids(entities, source.group),
            counter=source.counter,
        )
        for source in plan.sources
    ]


def plan_rows(plan: LookupPlan, count: int, found: list[list[Any]]) -> list[list[Any]]:
    """One answer row per entity, in order, from the stored rows of each source (arrays in the
    version's schema order; JSON objects by name for rows stored before arrays)."""
    pairs = [(stored, source.wanted) for stored, source in zip(found, plan.sources, strict=True)]
    width = plan.width
    rows = []
    for position in range(count):
        row: list[Any] = [None] * width
        for stored_rows, wanted in pairs:
            stored = stored_rows[position]
            if type(stored) is list:
                for column, _feature, index in wanted:
                    row[column] = stored[index]
            elif stored is not None:
                for column, feature, _index in wanted:
                    row[column] = stored.get(feature)
        rows.append(row)
    return rows


def online_lookup(*, workspace: Workspace, entities: Any, features: Any) -> dict[str, Any]:
    """Values of ``features`` for each entity, in order; missing values are null."""
    entities = check_entities(entities)
    plan = lookup_plan(workspace=workspace, features=features)
    found = online_store.get_online_store().read(plan_lookups(plan, entities))
    return {"features": plan.features, "rows": plan_rows(plan, len(entities), found)}
