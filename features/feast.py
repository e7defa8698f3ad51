"""Feast interoperability: a Feast project's definitions become feature groups, and Feast's
``get-online-features`` is answered from the platform's online store.

**Import.** ``feast registry-dump`` prints the project's registry as JSON (entities, data sources,
feature views, in protobuf's JSON mapping). Each feature view becomes a feature group of the same
name: its entities' join keys are the group's entity keys, its batch source's timestamp field the
event time column, its fields the features (``FEAST_DTYPES`` says how value types map; a list of
floats needs its ``vectorLength`` to become an embedding), its ``ttl`` the freshness SLA, its
``online`` flag and tags carried over, and the source named in the description. The Feast entity's
kind (user, item, ...) is read from its name (``user_id`` -> user) or given in ``entity_kinds``.
Importing again is idempotent: a view whose schema is unchanged is left alone, a changed one gets
a new schema version (consumers are told, as for any schema change), and a view whose entity
keys changed is a conflict (409). Everything is checked before anything is written, and the whole
import is one transaction.

**Serving.** ``POST .../feast/get-online-features`` takes Feast's request (``features``
``view:feature``, ``entities`` ``{join_key: [values]}``, ``full_feature_names``) and answers in
Feast's column-major shape: the join keys first, then each feature with its values and
statuses (``PRESENT``, ``NULL_VALUE``, ``NOT_FOUND``), so Feast's own ``remote`` online store
(``online_store: {type: remote, path: <platform>/api/v1/workspaces/<ws>/feast}``, with the
platform token as a bearer token through ``auth: {type: oidc, token_env_var: ...}``) reads from us.
The online store keeps no per-row event time, so every timestamp is the Unix epoch, as Feast gives
for its join-key columns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from features import online_store, registry
from features.lookup import check_entities, lookup_plan, plan_lookups
from features.models import EntityKind, FeatureGroup, Lifecycle
from workspaces.events import Ref, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace

# Feast's ValueType names (as registry-dump prints them) -> the platform's dtypes.
FEAST_DTYPES: dict[str, str] = {
    "INT32": "int",
    "INT64": "int",
    "FLOAT": "float",
    "DOUBLE": "float",
    "BOOL": "bool",
    "STRING": "string",
    "STRING_LIST": "categorical_list",
    "INT32_LIST": "categorical_list",
    "INT64_LIST": "categorical_list",
    "FLOAT_LIST": "embedding",
    "DOUBLE_LIST": "embedding",
}
MAX_VIEWS = 200
# Feast's placeholder entity of entity-less feature views.
DUMMY_ENTITY = "__dummy"
EPOCH = "1970-01-01T00:00:00Z"
_DURATION = re.compile(r"^(?P<seconds>\d+)(?:\.\d+)?s$")


@dataclass(frozen=True)
class ImportedView:
    """One Feast feature view as the feature group it becomes."""

    index: int
    name: str
    entity: str
    entity_keys: list[str]
    event_time_column: str
    features: list[dict[str, Any]]
    online: bool
    freshness_sla_seconds: int
    description: str
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FeastProject:
    project: str
    views: list[ImportedView]


def _at(index: int, rest: str = "") -> str:
    return f"featureViews.{index}.spec" + (f".{rest}" if rest else "")


def _prefixed(exc: ValidationError, prefix: str) -> ValidationError:
    """A registry error about one view, its field named under the view's path in the dump."""
    if hasattr(exc, "error_dict"):
        return ValidationError(
            {f"{prefix}.{key}": messages for key, messages in exc.message_dict.items()}
        )
    return ValidationError({prefix: exc.messages})


def _entity_kind(name: str, given: dict[str, Any]) -> str:
    kinds = ", ".join(EntityKind.values)
    kind = given.get(name)
    if kind is not None:
        if kind not in EntityKind.values:
            raise ValidationError(
                {f"entity_kinds.{name}": f"'{kind}' is not an entity kind: one of {kinds}"}
            )
        return str(kind)
    stem = name[:-3] if name.endswith("_id") else name
    kind = name if name in EntityKind.values else stem
    if kind not in EntityKind.values:
        raise ValidationError(
            {f"entity_kinds.{name}": f"say which kind the Feast entity '{name}' is: one of {kinds}"}
        )
    return str(kind)


def _ttl_seconds(raw: Any) -> int:
    """Feast's ttl (``"86400s"``; 0 or absent means no expiry) as a freshness SLA within the
    platform's limits (a day when Feast sets none)."""
    match = _DURATION.match(str(raw or "0s"))
    seconds = int(match.group("seconds")) if match else 0
    if seconds <= 0:
        return 24 * 3600
    return max(registry.MIN_FRESHNESS_SLA_S, min(seconds, registry.MAX_FRESHNESS_SLA_S))


def _features(index: int, fields: Any) -> list[dict[str, Any]]:
    if not isinstance(fields, list) or not fields:
        raise ValidationError({_at(index, "features"): "a feature view needs fields"})
    specs = []
    for position, item in enumerate(fields):
        attr = _at(index, f"features.{position}")
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValidationError({attr: "a field with a name and a valueType"})
        value_type = str(item.get("valueType") or "")
        dtype = FEAST_DTYPES.get(value_type)
        if dtype is None:
            raise ValidationError(
                {
                    f"{attr}.valueType": f"'{value_type or 'unset'}' is not imported; "
                    f"one of {', '.join(FEAST_DTYPES)}"
                }
            )
        spec: dict[str, Any] = {
            "name": item["name"],
            "dtype": dtype,
            "description": str(item.get("description") or "")[
                : registry.MAX_FEATURE_DESCRIPTION_CHARS
            ],
        }
        if dtype == "embedding":
            length = item.get("vectorLength")
            if not isinstance(length, int) or length < 1:
                raise ValidationError(
                    {
                        f"{attr}.vectorLength": f"a {value_type} field becomes an embedding: "
                        "give it vector_length in Feast"
                    }
                )
            spec["dimension"] = length
        specs.append(spec)
    try:
        return registry.normalise_features(specs)
    except ValidationError as exc:
        raise _prefixed(exc, _at(index)) from exc


def _description(project: str, spec: dict[str, Any]) -> str:
    source = spec.get("batchSource") or {}
    where = (source.get("fileOptions") or {}).get("uri") or source.get("type") or ""
    origin = f"Imported from Feast project '{project}'"
    if source.get("name"):
        origin += f", source '{source['name']}'" + (f" ({where})" if where else "")
    text = str(spec.get("description") or "").strip()
    return (f"{text}\n\n{origin}." if text else f"{origin}.")[
        : registry.MAX_GROUP_DESCRIPTION_CHARS
    ]


def _tags(spec: dict[str, Any]) -> list[str]:
    raw = spec.get("tags") or {}
    pairs = [f"{k}={v}" for k, v in raw.items()] if isinstance(raw, dict) else []
    tags = ["feast", *(p[: registry.MAX_TAG_CHARS] for p in pairs if p.strip("="))]
    return tags[: registry.MAX_TAGS]


def parse_registry(document: Any, entity_kinds: Any = None) -> FeastProject:
    """The feature groups a ``feast registry-dump`` document defines; ValidationError naming the
    field (by its path in the dump) that cannot be imported."""
    if not isinstance(document, dict) or not isinstance(document.get("featureViews"), list):
        raise ValidationError(
            {"registry": "give the JSON that `feast registry-dump` prints (with featureViews)"}
        )
    if entity_kinds is not None and not isinstance(entity_kinds, dict):
        raise ValidationError({"entity_kinds": "an object: Feast entity name -> entity kind"})
    given = dict(entity_kinds or {})
    project = str(document.get("project") or "")
    raw_views = document["featureViews"]
    if not raw_views:
        raise ValidationError({"featureViews": "the registry has no feature views"})
    if len(raw_views) > MAX_VIEWS:
        raise ValidationError({"featureViews": f"at most {MAX_VIEWS} feature views per import"})
    join_keys = {}
    for position, entity in enumerate(document.get("entities") or []):
        spec = (entity or {}).get("spec") or {}
        if not isinstance(spec.get("name"), str):
            raise ValidationError({f"entities.{position}.spec.name": "required"})
        join_keys[spec["name"]] = str(spec.get("joinKey") or spec["name"])
    views, names = [], set()
    for index, raw in enumerate(raw_views):
        spec = (raw or {}).get("spec") if isinstance(raw, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValidationError({_at(index, "name"): "required"})
        name = spec["name"]
        try:
            registry.validate_name(name, attr=_at(index, "name"))
        except ValidationError as exc:
            raise ValidationError(
                {_at(index, "name"): f"'{name}' is not a feature group name: {exc.messages[0]}"}
            ) from exc
        if name in names:
            raise ValidationError({_at(index, "name"): f"feature view '{name}' appears twice"})
        names.add(name)
        entities = [e for e in spec.get("entities") or [] if e != DUMMY_ENTITY]
        if not entities:
            raise ValidationError(
                {_at(index, "entities"): "an entity-less feature view has no key to serve by"}
            )
        unknown = [e for e in entities if e not in join_keys]
        if unknown:
            raise ValidationError(
                {_at(index, "entities"): f"entity '{unknown[0]}' is not in the registry"}
            )
        source = spec.get("batchSource") or {}
        view = ImportedView(
            index=index,
            name=name,
            entity=_entity_kind(entities[0], given),
            entity_keys=[join_keys[e] for e in entities],
            event_time_column=str(source.get("timestampField") or "event_time"),
            features=_features(index, spec.get("features")),
            online=spec.get("online", True) is not False,
            freshness_sla_seconds=_ttl_seconds(spec.get("ttl")),
            description=_description(project, spec),
            tags=_tags(spec),
        )
        try:
            registry.check_columns(view.entity_keys, view.event_time_column, view.features)
        except ValidationError as exc:
            raise _prefixed(exc, _at(index)) from exc
        views.append(view)
    return FeastProject(project=project, views=views)


def _schema(specs: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    return [(s["name"], s["dtype"], s.get("dimension")) for s in specs]


def _outcome(view: ImportedView, group: FeatureGroup | None) -> str:
    """``created``, ``unchanged`` or ``new_version`` for one view; ConflictError when the
    group exists under other keys or is retired."""
    if group is None:
        return "created"
    if list(group.entity_keys) != view.entity_keys:
        raise ConflictError(
            f"feature group '{group.name}' exists keyed by {', '.join(group.entity_keys)}, "
            f"the Feast view by {', '.join(view.entity_keys)}",
            attr=_at(view.index, "entities"),
        )
    current = group.versions.get(version=group.current_version)
    if _schema(current.features) == _schema(view.features):
        return "unchanged"
    if group.status == Lifecycle.RETIRED:
        raise ConflictError(f"feature group '{group.name}' is retired", attr=_at(view.index))
    return "new_version"


def feast_import(
    *,
    actor: Any,
    workspace: Workspace,
    document: Any,
    entity_kinds: Any = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Import a ``feast registry-dump`` document as feature groups (see the module docstring);
    ``dry_run`` checks and reports without writing. Returns ``{"project", "dry_run",
    "feature_groups": [{"name", "outcome", "version", "entity", "entity_keys", "features"}]}``."""
    project = parse_registry(document, entity_kinds)
    with transaction.atomic():
        existing = {
            g.name: g
            for g in FeatureGroup.objects.for_workspace(workspace)
            .filter(name__in=[v.name for v in project.views])
            .select_for_update()
        }
        plan = [(view, _outcome(view, existing.get(view.name))) for view in project.views]
        results = []
        for view, outcome in plan:
            group = existing.get(view.name)
            version = group.current_version if group is not None else 1
            if not dry_run and outcome == "created":
                try:
                    group = registry.feature_group_register(
                        actor=actor,
                        workspace=workspace,
                        name=view.name,
                        entity=view.entity,
                        entity_keys=view.entity_keys,
                        features=view.features,
                        event_time_column=view.event_time_column,
                        description=view.description,
                        tags=view.tags,
                        online=view.online,
                        freshness_sla_seconds=view.freshness_sla_seconds,
                    )
                except ValidationError as exc:
                    raise _prefixed(exc, _at(view.index)) from exc
            elif not dry_run and outcome == "new_version":
                assert group is not None
                version = registry.feature_group_new_version(
                    actor=actor, group=group, features=view.features
                ).version
            elif outcome == "new_version":
                version += 1
            results.append(
                {
                    "name": view.name,
                    "outcome": outcome,
                    "version": version,
                    "entity": view.entity,
                    "entity_keys": view.entity_keys,
                    "event_time_column": view.event_time_column,
                    "features": len(view.features),
                }
            )
        if not dry_run:
            groups = FeatureGroup.objects.for_workspace(workspace).filter(
                name__in=[r["name"] for r in results]
            )
            event_record(
                actor=actor,
                workspace=workspace,
                verb="feature_group.feast_imported",
                refs=[Ref.to(g) for g in groups],
                payload={
                    "project": project.project,
                    "outcomes": {r["name"]: r["outcome"] for r in results},
                },
            )
    return {"project": project.project, "dry_run": dry_run, "feature_groups": results}


def _entity_rows(entities: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Feast's ``{join_key: [values]}`` as the join keys and one entity object per row."""
    if not isinstance(entities, dict) or not entities:
        raise ValidationError({"entities": "give {join_key: [values, ...]}"})
    keys = list(entities)
    columns = []
    for key in keys:
        values = entities[key]
        if not isinstance(values, list) or not values:
            raise ValidationError({f"entities.{key}": "a non-empty list of values"})
        columns.append(values)
    if len({len(c) for c in columns}) != 1:
        raise ValidationError({"entities": "every join key needs as many values as the others"})
    return keys, [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]


def feast_online_features(
    *,
    workspace: Workspace,
    features: Any,
    entities: Any,
    full_feature_names: Any = False,
    feature_service: Any = None,
) -> dict[str, Any]:
    """Feast's ``get-online-features`` answer for a request in its shape (see the module
    docstring); the values are what ``online-features/`` reads for the same references."""
    if feature_service:
        raise ValidationError(
            {"feature_service": "feature services are not imported; name the features instead"}
        )
    if not isinstance(full_feature_names, bool):
        raise ValidationError({"full_feature_names": "true or false"})
    keys, rows = _entity_rows(entities)
    check_entities(rows)
    plan = lookup_plan(workspace=workspace, features=features)
    found = online_store.get_online_store().read(plan_lookups(plan, rows)) or []
    count = len(rows)
    results = [
        {
            "values": [row[key] for row in rows],
            "statuses": ["PRESENT"] * count,
            "event_timestamps": [EPOCH] * count,
        }
        for key in keys
    ]
    columns: list[dict[str, Any] | None] = [None] * plan.width
    for stored_rows, source in zip(found, plan.sources, strict=True):
        for column, feature, index in source.wanted:
            values, statuses = [], []
            for stored in stored_rows:
                if stored is None:
                    value, status = None, "NOT_FOUND"
                else:
                    value = stored[index] if type(stored) is list else stored.get(feature)
                    status = "PRESENT" if value is not None else "NULL_VALUE"
                values.append(value)
                statuses.append(status)
            columns[column] = {
                "values": values,
                "statuses": statuses,
                "event_timestamps": [EPOCH] * count,
            }
    names = [
        ref.split(":", 1)[0].split("@", 1)[0] + "__" + ref.split(":", 1)[1]
        if full_feature_names
        else ref.split(":", 1)[1]
        for ref in plan.features
    ]
    results.extend(c for c in columns if c is not None)
    return {"metadata": {"feature_names": [*keys, *names]}, "results": results}
