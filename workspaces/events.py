"""The one way to write to the event log, used by every app's services.

``event_record`` must run inside the transaction that makes the change it records, so the change
and its event commit or roll back together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from django.contrib.auth.models import AnonymousUser, User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction

from workspaces.models import Event, EventRef, Workspace

# Who a change is attributed to: the signed-in user, an anonymous request's user, or None for the
# platform itself (tasks, controllers). Every service takes its ``actor`` as this type.
Actor: TypeAlias = User | AnonymousUser | None


def actor_user(actor: Actor) -> User | None:
    """The user a change is recorded against: anonymous callers and the platform count as none."""
    if actor is None or isinstance(actor, AnonymousUser) or not actor.is_authenticated:
        return None
    return actor


class EventOutsideTransactionError(RuntimeError):
    """An event was recorded outside the transaction of the change it describes."""


@dataclass(frozen=True)
class Ref:
    """A typed reference to an object for an event: kind, id, label and its role in the event."""

    kind: str
    object_id: str | int
    label: str = ""
    role: str = EventRef.RefRole.SUBJECT

    @classmethod
    def to(cls, obj: models.Model, *, role: str = EventRef.RefRole.SUBJECT) -> Ref:
        """A reference to a model instance, its kind being the model's snake-case name."""
        kind = getattr(obj, "event_kind", None) or obj._meta.model_name or ""
        label = getattr(obj, "slug", None) or getattr(obj, "name", None) or str(obj)
        return cls(kind=kind, object_id=obj.pk, label=str(label)[:200], role=role)


def _jsonable(value: Mapping[str, Any] | None) -> dict[str, Any]:
    import json

    if not value:
        return {}
    return json.loads(json.dumps(dict(value), cls=DjangoJSONEncoder))


def event_record(
    *,
    actor: Actor,
    workspace: Workspace | None,
    verb: str,
    refs: Iterable[Ref] = (),
    resources: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
    token_prefix: str = "",
) -> Event:
    """Append one event. Must be called inside the transaction that makes the change."""
    if not transaction.get_connection().in_atomic_block:
        raise EventOutsideTransactionError(
            f"event {verb!r} recorded outside a transaction; wrap the change in transaction.atomic"
        )
    user = actor_user(actor)
    event = Event(
        actor=user,
        actor_name=user.get_username() if user is not None else "system",
        token_prefix=token_prefix,
        workspace=workspace,
        verb=verb,
        resources=_jsonable(resources),
        payload=_jsonable(payload),
    )
    event.save()
    EventRef.objects.bulk_create(
        [
            EventRef(
                event=event,
                role=ref.role,
                kind=ref.kind,
                object_id=str(ref.object_id),
                label=ref.label[:200],
            )
            for ref in refs
        ]
    )
    return event
