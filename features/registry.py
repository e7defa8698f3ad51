"""Registry writes: feature groups, schema versions, lifecycle, upgrades and consumers.

Other apps (training, serving, experiments) record what they use through
``consumer_register``/``consumer_release``; retiring something a live consumer uses is a conflict.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from features.models import (
    LIFECYCLE_MOVES,
    Consumer,
    Dtype,
    EntityKind,
    Feature,
    FeatureGroup,
    FeatureGroupVersion,
    Lifecycle,
    name_validator,
)
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace

# The limits of a group's fields: the one source (the API serializers and the forms read them).
MAX_FEATURES_PER_GROUP = 1000
MAX_EMBEDDING_DIMENSION = 4096
MAX_FEATURE_DESCRIPTION_CHARS = 5000
MAX_GROUP_DESCRIPTION_CHARS = 10_000
MAX_ENTITY_KEYS = 5
MAX_TAGS = 50
MAX_TAG_CHARS = 50
MIN_FRESHNESS_SLA_S = 60
MAX_FRESHNESS_SLA_S = 90 * 24 * 3600
# Column names DuckDB adds when reading the Parquet record (file name, row number).
RESERVED_COLUMNS = frozenset({"filename", "file_row_number"})


def validate_name(value: str, *, attr: str) -> None:
    try:
        name_validator(value)
    except ValidationError as exc:
        raise ValidationError({attr: exc.messages}) from exc


def normalise_features(specs: Any) -> list[dict[str, Any]]:
    """Validate a list of feature specs; returns them in canonical form."""
    if not isinstance(specs, list) or not specs:
        raise ValidationError({"features": "give at least one feature"})
    if len(specs) > MAX_FEATURES_PER_GROUP:
        raise ValidationError({"features": f"at most {MAX_FEATURES_PER_GROUP} features"})
    seen: set[str] = set()
    result = []
    for index, spec in enumerate(specs):
        attr = f"features.{index}"
        if not isinstance(spec, dict):
            raise ValidationError({attr: "must be an object with name and dtype"})
        name, dtype = spec.get("name"), spec.get("dtype")
        if not isinstance(name, str):
            raise ValidationError({f"{attr}.name": "required"})
        validate_name(name, attr=f"{attr}.name")
        if name in seen:
            raise ValidationError({f"{attr}.name": f"duplicate feature '{name}'"})
        seen.add(name)
        if dtype not in Dtype.values:
            raise ValidationError({f"{attr}.dtype": f"one of {', '.join(Dtype.values)}"})
        dimension = spec.get("dimension")
        if dtype == Dtype.EMBEDDING:
            if (
                not isinstance(dimension, int)
                or isinstance(dimension, bool)
                or not (1 <= dimension <= MAX_EMBEDDING_DIMENSION)
            ):
                raise ValidationError(
                    {f"{attr}.dimension": f"an embedding needs 1-{MAX_EMBEDDING_DIMENSION}"}
                )
        elif dimension is not None:
            raise ValidationError({f"{attr}.dimension": "only embeddings have a dimension"})
        description = spec.get("description", "")
        if not isinstance(description, str) or len(description) > MAX_FEATURE_DESCRIPTION_CHARS:
            raise ValidationError(
                {
                    f"{attr}.description": "a string of at most "
                    f"{MAX_FEATURE_DESCRIPTION_CHARS} characters"
                }
            )
        result.append(
            {"name": name, "dtype": dtype, "dimension": dimension, "description": description}
        )
    return result


def check_columns(entity_keys: Any, event_time_column: str, features: list[dict]) -> list[str]:
    if not isinstance(entity_keys, list) or not entity_keys or len(entity_keys) > MAX_ENTITY_KEYS:
        raise ValidationError({"entity_keys": f"give 1-{MAX_ENTITY_KEYS} entity key columns"})
    for index, key in enumerate(entity_keys):
        if not isinstance(key, str):
            raise ValidationError({f"entity_keys.{index}": "must be a column name"})
        validate_name(key, attr=f"entity_keys.{index}")
    validate_name(event_time_column, attr="event_time_column")
    reserved = [*entity_keys, event_time_column]
    for index, spec in enumerate(features):
        if spec["name"] in RESERVED_COLUMNS:
            raise ValidationError(
                {f"features.{index}.name": f"'{spec['name']}' is reserved by the offline store"}
            )
    if len(set(reserved)) != len(reserved):
        raise ValidationError({"entity_keys": "entity keys and the event time column must differ"})
    for index, spec in enumerate(features):
        if spec["name"] in reserved:
            raise ValidationError(
                {f"features.{index}.name": f"'{spec['name']}' is a key or time column"}
            )
    return list(entity_keys)


def group_locked(group: FeatureGroup) -> FeatureGroup:
    """The group's row read again under ``select_for_update``: every write to a group and every
    consumer registration takes this one lock, so a retirement and a new consumer (or a batch
    and a schema change) see each other instead of racing."""
    return (
        FeatureGroup.objects.select_for_update()
        .filter(pk=group.pk, workspace=group.workspace_id)
        .get()
    )


def _check_group_fields(
    *, description: Any = None, tags: Any = None, freshness_sla_seconds: Any = None
) -> None:
    """The limits of a group's descriptive fields (None: not given), for register and update."""
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_GROUP_DESCRIPTION_CHARS
    ):
        raise ValidationError(
            {"description": f"a string of at most {MAX_GROUP_DESCRIPTION_CHARS} characters"}
        )
    if tags is not None:
        if not isinstance(tags, list) or len(tags) > MAX_TAGS:
            raise ValidationError({"tags": f"a list of at most {MAX_TAGS} tags"})
        for index, tag in enumerate(tags):
            if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_CHARS:
                raise ValidationError({f"tags.{index}": f"a tag of 1-{MAX_TAG_CHARS} characters"})
    if freshness_sla_seconds is not None and (
        not isinstance(freshness_sla_seconds, int)
        or isinstance(freshness_sla_seconds, bool)
        or not MIN_FRESHNESS_SLA_S <= freshness_sla_seconds <= MAX_FRESHNESS_SLA_S
    ):
        raise ValidationError(
            {
                "freshness_sla_seconds": f"from {MIN_FRESHNESS_SLA_S // 60} minute to "
                f"{MAX_FRESHNESS_SLA_S // 86400} days"
            }
        )


@transaction.atomic
def feature_group_register(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    entity: str,
    entity_keys: list[str],
    features: list[dict[str, Any]],
    event_time_column: str = "event_time",
    description: str = "",
    tags: list[str] | None = None,
    online: bool = True,
    offline: bool = True,
    freshness_sla_seconds: int = 24 * 3600,
    producer: User | None = None,
    status: str = Lifecycle.ACTIVE,
) -> FeatureGroup:
    """Register a feature group with its first schema version."""
    validate_name(name, attr="name")
    if entity not in EntityKind.values:
        raise ValidationError({"entity": f"one of {', '.join(EntityKind.values)}"})
    specs = normalise_features(features)
    keys = check_columns(entity_keys, event_time_column, specs)
    _check_group_fields(
        description=description, tags=tags, freshness_sla_seconds=freshness_sla_seconds
    )
    if not (online or offline):
        raise ValidationError({"online": "a group must be online, offline or both"})
    if status not in (Lifecycle.DRAFT, Lifecycle.ACTIVE):
        raise ValidationError({"status": "a new group starts as draft or active"})
    if FeatureGroup.objects.for_workspace(workspace).filter(name=name).exists():
        raise ConflictError(f"feature group '{name}' already exists", attr="name")
    group = FeatureGroup(
        workspace=workspace,
        name=name,
        entity=entity,
        entity_keys=keys,
        event_time_column=event_time_column,
        description=description,
        tags=list(tags or []),
        owner=actor_user(actor),
        producer=producer,
        online=online,
        offline=offline,
        freshness_sla_seconds=freshness_sla_seconds,
        status=status,
        current_version=1,
    )
    group.full_clean(exclude=["owner", "producer", "successor", "workspace"])
    group.save()
    FeatureGroupVersion.objects.create(
        workspace=workspace, group=group, version=1, features=specs, created_by=actor_user(actor)
    )
    Feature.objects.bulk_create(
        [
            Feature(
                workspace=workspace,
                group=group,
                name=spec["name"],
                dtype=spec["dtype"],
                dimension=spec["dimension"],
                description=spec["description"],
                added_in_version=1,
            )
            for spec in specs
        ]
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="feature_group.registered",
        refs=[Ref.to(group)],
        payload={
            "name": name,
            "version": 1,
            "entity": entity,
            "entity_keys": keys,
            "features": specs,
            "online": online,
            "offline": offline,
        },
    )
    return group


@transaction.atomic
def feature_group_new_version(
    *, actor: Actor, group: FeatureGroup, features: list[dict[str, Any]]
) -> FeatureGroupVersion:
    """Change a group's schema: a new version that goes live at once. Old data stays readable
    under its version; consumers are told through the event log."""
    group = group_locked(group)
    if group.status == Lifecycle.RETIRED:
        raise ConflictError(f"feature group '{group.name}' is retired", attr="status")
    specs = normalise_features(features)
    check_columns(group.entity_keys, group.event_time_column, specs)
    current = group.versions.get(version=group.current_version)
    if current.features == specs:
        raise ValidationError({"features": "the schema is unchanged"})
    version = FeatureGroupVersion.objects.create(
        workspace=group.workspace,
        group=group,
        version=group.current_version + 1,
        features=specs,
        created_by=actor_user(actor),
    )
    previous = current.feature_map()
    for spec in specs:
        Feature.objects.update_or_create(
            workspace=group.workspace,
            group=group,
            name=spec["name"],
            defaults={
                "dtype": spec["dtype"],
                "dimension": spec["dimension"],
                "description": spec["description"],
                **({} if spec["name"] in previous else {"added_in_version": version.version}),
            },
        )
    group.current_version = version.version
    group.save(update_fields=["current_version"])
    removed = sorted(set(previous) - {s["name"] for s in specs})
    added = sorted({s["name"] for s in specs} - set(previous))
    event_record(
        actor=actor,
        workspace=group.workspace,
        verb="feature_group.versioned",
        refs=[Ref.to(group), *_consumer_refs(group)],
        payload={
            "name": group.name,
            "version": version.version,
            "previous_version": version.version - 1,
            "added": added,
            "removed": removed,
            "consumers": _consumer_labels(group),
        },
    )
    return version


def _live_consumers(group: FeatureGroup, feature_name: str | None = None) -> QuerySet[Consumer]:
    consumers = Consumer.objects.for_workspace(group.workspace).filter(group=group, live=True)
    if feature_name is not None:
        consumers = consumers.filter(feature_name__in=["", feature_name])
    return consumers.order_by("kind", "label")


def _consumer_labels(group: FeatureGroup, feature_name: str | None = None) -> list[str]:
    return [f"{c.kind} {c.label}" for c in _live_consumers(group, feature_name)]


def _consumer_refs(group: FeatureGroup) -> list[Ref]:
    return [
        Ref(kind=c.kind, object_id=c.object_id, label=c.label, role="related")
        for c in _live_consumers(group)
    ]


def _refuse_if_consumed(group: FeatureGroup, feature_name: str | None, action: str) -> None:
    labels = _consumer_labels(group, feature_name)
    if labels:
        target = f"{group.name}:{feature_name}" if feature_name else group.name
        raise ConflictError(
            f"cannot {action} '{target}': used by {', '.join(labels)}",
            attr="status",
        )


@transaction.atomic
def feature_group_set_status(*, actor: Actor, group: FeatureGroup, status: str) -> FeatureGroup:
    """Move a group through draft -> active -> deprecated -> retired (retired is final)."""
    group = group_locked(group)
    if status not in Lifecycle.values:
        raise ValidationError({"status": f"one of {', '.join(Lifecycle.values)}"})
    if status == group.status:
        return group
    if status not in LIFECYCLE_MOVES[group.status]:
        raise ConflictError(
            f"'{group.name}' cannot go from {group.status} to {status}", attr="status"
        )
    if status == Lifecycle.RETIRED:
        _refuse_if_consumed(group, None, "retire")
    previous = group.status
    group.status = status
    group.save(update_fields=["status"])
    event_record(
        actor=actor,
        workspace=group.workspace,
        verb=f"feature_group.{status}",
        refs=[Ref.to(group)],
        payload={"name": group.name, "from": previous, "to": status},
    )
    return group


@transaction.atomic
def feature_set_status(*, actor: Actor, feature: Feature, status: str) -> Feature:
    """Deprecate, reactivate or retire one feature; retiring a consumed feature is refused."""
    feature = (
        Feature.objects.select_for_update().filter(pk=feature.pk, workspace=feature.workspace).get()
    )
    if status not in Lifecycle.values or status == Lifecycle.DRAFT:
        raise ValidationError({"status": "one of active, deprecated, retired"})
    if status == feature.status:
        return feature
    if status not in LIFECYCLE_MOVES[feature.status]:
        raise ConflictError(
            f"'{feature}' cannot go from {feature.status} to {status}", attr="status"
        )
    if status == Lifecycle.RETIRED:
        _refuse_if_consumed(feature.group, feature.name, "retire")
    previous = feature.status
    feature.status = status
    feature.save(update_fields=["status"])
    event_record(
        actor=actor,
        workspace=feature.workspace,
        verb=f"feature.{status}",
        refs=[Ref.to(feature), Ref.to(feature.group, role="related")],
        payload={"feature": str(feature), "from": previous, "to": status},
    )
    return feature


@transaction.atomic
def feature_group_delete(*, actor: Actor, group: FeatureGroup) -> None:
    """Delete a group that nobody uses and that holds no data beyond drafts."""
    group = group_locked(group)
    _refuse_if_consumed(group, None, "delete")
    if group.batches.exists() or group.labelled_datasets.exists():
        raise ConflictError(
            f"'{group.name}' holds data; retire it instead of deleting it", attr="name"
        )
    event_record(
        actor=actor,
        workspace=group.workspace,
        verb="feature_group.deleted",
        refs=[Ref.to(group)],
        payload={"name": group.name},
    )
    group.delete()


@transaction.atomic
def feature_group_link_successor(
    *, actor: Actor, group: FeatureGroup, successor: FeatureGroup
) -> FeatureGroup:
    """Link a group to the group that upgrades it; its consumers are told (event + notices)."""
    if successor.workspace_id != group.workspace_id:
        raise ReferenceNotFound(f"no feature group '{successor.name}'", attr="successor")
    if successor.pk == group.pk:
        raise ValidationError({"successor": "a group cannot succeed itself"})
    group = group_locked(group)
    group.successor = successor
    group.save(update_fields=["successor"])
    event_record(
        actor=actor,
        workspace=group.workspace,
        verb="feature_group.upgraded",
        refs=[
            Ref.to(group, role="input"),
            Ref.to(successor, role="output"),
            *_consumer_refs(group),
        ],
        payload={
            "name": group.name,
            "successor": successor.name,
            "consumers": _consumer_labels(group),
        },
    )
    return group


@transaction.atomic
def consumer_register(
    *,
    actor: Actor,
    group: FeatureGroup,
    kind: str,
    object_id: str | int,
    label: str,
    feature_name: str = "",
    owner: User | None = None,
) -> Consumer:
    """Record that an object (dataset, model, deployment, experiment) uses a group or feature.

    The group's row (and the feature's) is locked first, the same lock retiring takes: either the
    retirement sees this consumer and is refused, or this registration sees the retirement."""
    group = group_locked(group)
    if group.status == Lifecycle.RETIRED:
        raise ConflictError(f"feature group '{group.name}' is retired", attr="features")
    if feature_name:
        feature = (
            Feature.objects.for_workspace(group.workspace_id)
            .select_for_update()
            .filter(group=group, name=feature_name)
            .first()
        )
        if feature is None:
            raise ValidationError({"features": f"no feature '{group.name}:{feature_name}'"})
        if feature.status == Lifecycle.RETIRED:
            raise ConflictError(f"feature '{feature}' is retired", attr="features")
    # A released consumer that comes back is registered again (and says so in the event log,
    # which the lineage graph projects), not silently revived.
    was_live = (
        Consumer.objects.for_workspace(group.workspace)
        .filter(group=group, feature_name=feature_name, kind=kind, object_id=str(object_id))
        .values_list("live", flat=True)
        .first()
    )
    consumer, created = Consumer.objects.update_or_create(
        workspace=group.workspace,
        group=group,
        feature_name=feature_name,
        kind=kind,
        object_id=str(object_id),
        defaults={
            "label": label[:200],
            "owner": owner or actor,
            "live": True,
        },
    )
    if created or was_live is False:
        event_record(
            actor=actor,
            workspace=group.workspace,
            verb="feature_consumer.registered",
            refs=[
                Ref.to(group, role="input"),
                Ref(kind=kind, object_id=object_id, label=label, role="output"),
            ],
            payload={"group": group.name, "feature": feature_name, "kind": kind, "label": label},
        )
    return consumer


@transaction.atomic
def consumer_release(*, actor: Actor, workspace: Workspace, kind: str, object_id: str | int) -> int:
    """Mark every use by an object as no longer live (e.g. a deployment was removed)."""
    released = Consumer.objects.for_workspace(workspace).filter(
        kind=kind, object_id=str(object_id), live=True
    )
    count = 0
    for consumer in released.select_related("group"):
        consumer.live = False
        consumer.save(update_fields=["live"])
        count += 1
    if count:
        event_record(
            actor=actor,
            workspace=workspace,
            verb="feature_consumer.released",
            refs=[Ref(kind=kind, object_id=object_id, label=str(object_id))],
            payload={"kind": kind, "object_id": str(object_id), "released": count},
        )
    return count


def touch_ingested(*, group: FeatureGroup, max_event_time: datetime | None) -> None:
    """Advance the group's ingestion and event-time watermarks (inside the batch transaction)."""
    updates: dict[str, Any] = {"last_ingested_at": timezone.now()}
    if max_event_time is not None and (
        group.last_event_time is None or max_event_time > group.last_event_time
    ):
        updates["last_event_time"] = max_event_time
    FeatureGroup.objects.filter(pk=group.pk, workspace=group.workspace).update(**updates)
    for field, value in updates.items():
        setattr(group, field, value)


@transaction.atomic
def feature_group_update(
    *,
    actor: Actor,
    group: FeatureGroup,
    description: str | None = None,
    tags: list[str] | None = None,
    freshness_sla_seconds: int | None = None,
    producer: User | object | None = ...,
) -> FeatureGroup:
    """Change a group's description, tags, freshness SLA or producer (not its schema)."""
    _check_group_fields(
        description=description, tags=tags, freshness_sla_seconds=freshness_sla_seconds
    )
    group = group_locked(group)
    changes: dict[str, Any] = {}
    for field, value in (
        ("description", description),
        ("tags", tags),
        ("freshness_sla_seconds", freshness_sla_seconds),
    ):
        if value is not None and value != getattr(group, field):
            changes[field] = value
    if producer is not ... and producer != group.producer:
        changes["producer"] = producer
    if not changes:
        return group
    for field, value in changes.items():
        setattr(group, field, value)
    group.save(update_fields=list(changes))
    event_record(
        actor=actor,
        workspace=group.workspace,
        verb="feature_group.changed",
        refs=[Ref.to(group)],
        payload={
            field: (value.get_username() if hasattr(value, "get_username") else value)
            for field, value in changes.items()
        },
    )
    return group
