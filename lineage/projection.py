"""The projection of the event log into the lineage graph, cost usage and audit items.

It reads ``workspaces.Event`` rows in id order after a cursor and applies the rules that match
each event's verb. A rule is a function ``rule(event, refs, projector)``; rules are registered per
verb pattern (``fnmatch`` syntax) with ``register_rule``, so a new kind of event extends the
graph without touching the rest. Events no rule claims get the default rule: every ``input`` ref
points to every ``subject``/``output`` ref, with an edge type derived from the two kinds
(``edge_type_for``; extend with ``register_edge_type``).

Everything is derived from the event rows alone (times are event times), so replaying the log
from scratch (``rebuild``) gives exactly the graph built incrementally.

Commit order vs id order: a transaction that took a smaller event id may commit after a larger
one. The projection stops before a hole in the ids whose next event is younger than
``LINEAGE_GAP_WAIT_SECONDS`` (it may still commit), which keeps the usual case in order. Once it
passes an older hole it records each missing id as a ``CursorGap``; every batch first looks the
gaps up again and applies the events that have committed since ("late" events, applied once,
however late), and forgets a gap after ``LINEAGE_GAP_FORGET_SECONDS`` (a rolled-back transaction's
id never appears). A late event never moves a node's status or last-seen event backwards and does
not end an edge a newer event touched, so the graph ends as if it had come in order, except that
its own refs now exist. At most ``LINEAGE_GAP_MAX`` gaps are kept (the oldest go first, logged):
PostgreSQL sequences also jump after a crash, and such a jump is not thousands of commits.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, QuerySet, prefetch_related_objects
from django.utils import timezone

from lineage.conf import RESOURCE_KEYS, setting
from lineage.models import (
    AuditCategory,
    AuditItem,
    AuditStatus,
    Cursor,
    CursorGap,
    Edge,
    EdgeType,
    Node,
    Reach,
    Usage,
)
from lineage.reach import (
    reach_add_edge,
    reach_edge_ended,
    reach_node_died,
    reach_node_revived,
    reach_owner_changed,
)
from workspaces.models import Event, EventRef
from workspaces.outbox import gaps_late_events, gaps_remember

logger = logging.getLogger(__name__)

CURSOR = "graph"

# Event kinds that are not part of the data lineage (access control, infrastructure, telemetry).
IGNORED_KINDS = {
    "workspace",
    "user",
    "membership",
    "api_token",
    "service_account",
    "webhook",
    "notification",
    "node",
    "quota",
    "workspace_quota",
    "quota_request",
    "batch",
    "prediction",
}
# Kinds the same object goes by in different apps (a feature consumer of kind "model" is a
# model version).
KIND_ALIASES = {"model": "model_version"}
# Last verb segments after which an object no longer runs or serves.
DEAD_STATES = {"retired", "deleted", "removed", "archived", "stopped", "concluded", "cancelled"}
# Kinds whose data a downstream object reads.
DATA_KINDS = {
    "feature_group",
    "feature",
    "feature_group_version",
    "dataset",
    "external_dataset",
    "record_set",
}


def canonical_kind(kind: str) -> str:
    return KIND_ALIASES.get(kind, kind)


def external_dataset_id(namespace: str, name: str) -> str:
    """Stable id of an OpenLineage dataset (namespace + name can exceed the 64-char id)."""
    return "ol-" + hashlib.sha256(f"{namespace}\x00{name}".encode()).hexdigest()[:32]


def external_job_id(namespace: str, name: str) -> str:
    return "olj-" + hashlib.sha256(f"{namespace}\x00{name}".encode()).hexdigest()[:32]


# --- edge types ------------------------------------------------------------------------------

_EDGE_TYPES: dict[tuple[str, str], str] = {
    ("training_job", "model_version"): EdgeType.PRODUCES,
    ("external_job", "external_dataset"): EdgeType.PRODUCES,
    ("model_version", "deployment"): EdgeType.DEPLOYED_AS,
    ("registered_model", "deployment"): EdgeType.DEPLOYED_AS,
    ("deployment", "experiment"): EdgeType.TESTED_IN,
    ("model_version", "experiment"): EdgeType.TESTED_IN,
    ("external_dataset", "feature_group"): EdgeType.DERIVED_FROM,
    ("feature_group", "feature"): EdgeType.RELATED,
}


def register_edge_type(src_kind: str, dst_kind: str, edge_type: str) -> None:
    """Name the edge type between two kinds (``*`` matches any kind on that side)."""
    _EDGE_TYPES[(src_kind, dst_kind)] = edge_type


def edge_type_for(src_kind: str, dst_kind: str) -> str:
    for key in ((src_kind, dst_kind), (src_kind, "*"), ("*", dst_kind)):
        if key in _EDGE_TYPES:
            return _EDGE_TYPES[key]
    if src_kind == dst_kind:
        return EdgeType.DERIVED_FROM
    if src_kind in DATA_KINDS:
        return EdgeType.CONSUMES
    if dst_kind == "experiment":
        return EdgeType.TESTED_IN
    return EdgeType.DERIVED_FROM


# --- rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class R:
    """A ref as the projection sees it (kind canonical)."""

    kind: str
    object_id: str
    label: str
    role: str


Rule = Callable[[Event, list[R], "Projector"], None]


@dataclass
class _Registered:
    pattern: str
    rule: Rule
    replaces_default: bool


_RULES: list[_Registered] = []


def register_rule(pattern: str, *, replaces_default: bool = False) -> Callable[[Rule], Rule]:
    """Apply ``rule`` to events whose verb matches ``pattern``; with ``replaces_default`` the
    default input -> subject/output rule is not applied to them."""

    def decorator(rule: Rule) -> Rule:
        _RULES[:] = [r for r in _RULES if not (r.pattern == pattern and r.rule is rule)]
        _RULES.append(_Registered(pattern, rule, replaces_default))
        return rule

    return decorator


def default_rule(event: Event, refs: list[R], p: Projector) -> None:
    """Every input ref points to every subject/output ref."""
    inputs = [r for r in refs if r.role == "input"]
    targets = [r for r in refs if r.role in ("subject", "output")]
    for target in targets:
        dst = p.node(event, target)
        for ref in inputs:
            src = p.node(event, ref)
            if src.pk != dst.pk:
                p.edge(event, src, dst)


@register_rule("feature.*", replaces_default=True)
def feature_rule(event: Event, refs: list[R], p: Projector) -> None:
    """Feature events name the feature by pk; the graph keys features by group and name (the
    form consumers use), so the node is ``feature:<group id>:<name>`` under its group."""
    group = next((r for r in refs if r.kind == "feature_group"), None)
    for ref in refs:
        if ref.kind != "feature" or group is None:
            continue
        name = ref.label.split(":")[-1]
        p.feature_node(event, group, name, status_from_verb=True)


@register_rule("feature_group.registered")
@register_rule("feature_group.versioned")
def feature_group_features_rule(event: Event, refs: list[R], p: Projector) -> None:
    """A group's features are nodes from the start (so unused ones can be found)."""
    group = next((r for r in refs if r.kind == "feature_group" and r.role == "subject"), None)
    payload = event.payload or {}
    names = [f.get("name") for f in payload.get("features") or [] if isinstance(f, dict)]
    names += [n for n in payload.get("added") or [] if isinstance(n, str)]
    for name in names:
        if group is not None and isinstance(name, str) and name:
            p.feature_node(event, group, name)


@register_rule("feature_consumer.registered", replaces_default=True)
def consumer_registered_rule(event: Event, refs: list[R], p: Projector) -> None:
    """group -consumes-> consumer, and feature -consumes-> consumer when a feature is named."""
    group = next((r for r in refs if r.role == "input"), None)
    consumer = next((r for r in refs if r.role == "output"), None)
    if group is None or consumer is None:
        return
    g = p.node(event, group)
    c = p.node(event, consumer)
    p.edge(event, g, c, EdgeType.CONSUMES)
    feature_name = (event.payload or {}).get("feature") or ""
    if feature_name:
        f = p.feature_node(event, group, feature_name)
        p.edge(event, f, c, EdgeType.CONSUMES)


@register_rule("feature_consumer.released", replaces_default=True)
def consumer_released_rule(event: Event, refs: list[R], p: Projector) -> None:
    """Every live use of feature groups and features by the object ends."""
    for ref in refs:
        node = p.find(event.workspace_id, ref.kind, ref.object_id)
        if node is None:
            continue
        p.end_edges(
            event,
            Edge.objects.for_workspace(event.workspace_id).filter(
                dst=node,
                active=True,
                type=EdgeType.CONSUMES,
                src__kind__in=("feature_group", "feature"),
            ),
        )


@register_rule("serving.deployment.released")
@register_rule("serving.deployment.rolled_back")
def deployment_switch_rule(event: Event, refs: list[R], p: Projector) -> None:
    """A deployment serves one model version: a release (input = new, related = old) or a
    rollback (related = bad, then good) ends the old version's ``deployed_as`` edge."""
    deployment = next((r for r in refs if r.kind == "deployment"), None)
    versions = [r for r in refs if r.kind == "model_version"]
    if deployment is None or not versions:
        return
    if event.verb.endswith(".released"):
        new = [r for r in versions if r.role == "input"]
        old = [r for r in versions if r.role == "related"]
    else:  # rolled_back: [bad, good] as the serving app records them
        related = [r for r in versions if r.role == "related"]
        old, new = related[:1], related[1:2]
    dep = p.node(event, deployment)
    keep = {r.object_id for r in new}
    for ref in new:
        p.edge(event, p.node(event, ref), dep, EdgeType.DEPLOYED_AS)
    for ref in old:
        stale = p.find(event.workspace_id, ref.kind, ref.object_id)
        if stale is not None and ref.object_id not in keep:
            p.end_edges(
                event,
                Edge.objects.for_workspace(event.workspace_id).filter(
                    src=stale, dst=dep, type=EdgeType.DEPLOYED_AS, active=True
                ),
            )


@register_rule("dataset.failed")
def dataset_failed_rule(event: Event, refs: list[R], p: Projector) -> None:
    for ref in refs:
        if ref.kind == "dataset":
            p.set_status(event, ref, "failed", live=False)


@register_rule("lineage.openlineage.*", replaces_default=True)
def openlineage_rule(event: Event, refs: list[R], p: Projector) -> None:
    """External job: input datasets -consumes-> job -produces-> output datasets; an output named
    like a feature group of the workspace (namespace = workspace slug, name = group name) is
    upstream of that group."""
    job = next((r for r in refs if r.role == "subject"), None)
    inputs = [p.node(event, r) for r in refs if r.role == "input"]
    outputs = [p.node(event, r) for r in refs if r.role == "output"]
    if job is not None:
        job_node = p.node(event, job)
        for node in inputs:
            p.edge(event, node, job_node, EdgeType.CONSUMES)
        for node in outputs:
            p.edge(event, job_node, node, EdgeType.PRODUCES)
    else:
        for src in inputs:
            for dst in outputs:
                p.edge(event, src, dst, EdgeType.DERIVED_FROM)
    from lineage.openlineage import mapped_namespace

    slug = event.workspace.slug if event.workspace_id else ""
    for ref in refs:
        if ref.role != "output" or ref.kind != "external_dataset":
            continue
        namespace, _, name = ref.label.partition("/")
        if mapped_namespace(namespace) != slug:  # the workspace's own, or one mapped to it
            continue
        group = (
            Node.objects.for_workspace(event.workspace_id)
            .filter(kind="feature_group", label=name)
            .order_by("id")
            .first()
        )
        if group is not None:
            p.edge(event, p.node(event, ref), group, EdgeType.DERIVED_FROM)


@register_rule("*.over_quota")
def over_quota_rule(event: Event, refs: list[R], p: Projector) -> None:
    target = _first_target(refs)
    if target is not None:
        payload = event.payload or {}
        exceeded = payload.get("exceeded")
        if isinstance(exceeded, list | tuple):  # the scheduler sends ["gpu_milli 2000 > 0 (...)"]
            exceeded = "; ".join(str(item) for item in exceeded)
        reason = payload.get("reason") or (f"exceeded {exceeded}" if exceeded else "over its quota")
        p.flag(event, target, AuditCategory.OVER_QUOTA, str(reason))


@register_rule("*.over_quota_reviewed")
def over_quota_reviewed_rule(event: Event, refs: list[R], p: Projector) -> None:
    """The scheduler's own review of an over-quota job closes the audit item."""
    target = _first_target(refs)
    if target is None:
        return
    AuditItem.objects.for_workspace(event.workspace_id).filter(
        category=AuditCategory.OVER_QUOTA, kind=target.kind, object_id=target.object_id
    ).update(status=AuditStatus.REVIEWED, decided_at=event.created_at, decided_by=event.actor_name)


@register_rule("*.quality_overridden")
def quality_override_rule(event: Event, refs: list[R], p: Projector) -> None:
    """A maintainer let a candidate past a failed quality gate: used first, audited later."""
    target = _first_target(refs)
    if target is not None:
        payload = event.payload or {}
        failures = "; ".join(
            f"{f.get('metric')} {f.get('candidate'):.4f} vs production {f.get('production'):.4f}"
            for f in payload.get("failures") or []
            if isinstance(f.get("candidate"), int | float)
            and isinstance(f.get("production"), int | float)
        )
        reason = f"quality gate overridden ({failures or 'worse than production'}): "
        p.flag(event, target, AuditCategory.QUALITY_OVERRIDE, reason + str(payload.get("reason")))


@register_rule("training.job.*")
def low_utilisation_rule(event: Event, refs: list[R], p: Projector) -> None:
    data = {**(event.payload or {}), **(event.resources or {})}
    for key in ("utilisation", "utilization", "gpu_utilisation", "cpu_utilisation"):
        value = data.get(key)
        if isinstance(value, int | float) and value < setting("LINEAGE_LOW_UTILISATION"):
            target = _first_target(refs)
            if target is not None:
                p.flag(event, target, AuditCategory.LOW_UTILISATION, f"{key} {value:.0%} reported")
            return


@register_rule("lineage.audit.flagged", replaces_default=True)
def audit_flagged_rule(event: Event, refs: list[R], p: Projector) -> None:
    target = _first_target(refs)
    payload = event.payload or {}
    if target is not None and payload.get("category") in AuditCategory.values:
        p.flag(event, target, payload["category"], str(payload.get("reason", "")))


@register_rule("lineage.audit.*", replaces_default=True)
def audit_decided_rule(event: Event, refs: list[R], p: Projector) -> None:
    decision = event.verb.rsplit(".", 1)[-1]
    if decision not in (AuditStatus.APPROVED, AuditStatus.REVOKED, AuditStatus.REVIEWED):
        return
    target = _first_target(refs)
    if target is None:
        return
    payload = event.payload or {}
    AuditItem.objects.for_workspace(event.workspace_id).filter(
        category=payload.get("category", ""), kind=target.kind, object_id=target.object_id
    ).update(
        status=decision,
        decided_at=event.created_at,
        decided_by=event.actor_name,
        decision_note=str(payload.get("note", ""))[:2000],
    )


def _first_target(refs: list[R]) -> R | None:
    return next((r for r in refs if r.role == "subject"), None) or next(
        (r for r in refs if r.role == "output"), None
    )


# --- the projector ---------------------------------------------------------------------------


@dataclass
class Projector:
    """Applies events; caches the nodes it touched during one batch."""

    nodes: dict[tuple[int, str, str], Node] = field(default_factory=dict)

    def find(self, workspace_id: int, kind: str, object_id: str) -> Node | None:
        key = (workspace_id, canonical_kind(kind), str(object_id))
        node = self.nodes.get(key)
        if node is None:
            node = (
                Node.objects.for_workspace(workspace_id)
                .filter(kind=key[1], object_id=key[2])
                .first()
            )
            if node is not None:
                self.nodes[key] = node
        return node

    def node(self, event: Event, ref: R) -> Node:
        """The node of ``ref``, made or refreshed by ``event``."""
        node = self.find(event.workspace_id, ref.kind, ref.object_id)
        acting = ref.role in ("subject", "output")
        if node is None:
            node = Node.objects.create(
                workspace_id=event.workspace_id,
                kind=ref.kind,
                object_id=ref.object_id,
                label=ref.label[:200],
                owner_name=event.actor_name if acting else "",
                first_seen_at=event.created_at,
                last_seen_at=event.created_at,
                first_event_id=event.id,
                last_event_id=event.id,
            )
            self.nodes[(event.workspace_id, node.kind, node.object_id)] = node
            if node.kind == "feature_group":
                self._link_external_datasets(event, node)
            return node
        changed = []
        if node.last_event_id < event.id:
            node.last_seen_at, node.last_event_id = event.created_at, event.id
            changed += ["last_seen_at", "last_event_id"]
        if acting:
            if ref.label and ref.label[:200] != node.label:
                node.label = ref.label[:200]
                changed.append("label")
            if not node.owner_name and event.actor_name:
                node.owner_name = event.actor_name
                changed.append("owner_name")
        if changed:
            node.save(update_fields=changed)
            if "owner_name" in changed:
                reach_owner_changed(node)
        return node

    def feature_node(
        self, event: Event, group: R, name: str, *, status_from_verb: bool = False
    ) -> Node:
        g = self.node(event, R(group.kind, group.object_id, group.label, "input"))
        ref = R("feature", f"{group.object_id}:{name}", f"{g.label}:{name}", "subject")
        f = self.node(event, ref)
        self.edge(event, g, f, EdgeType.RELATED)
        if status_from_verb:
            self.set_status(event, ref, event.verb.rsplit(".", 1)[-1])
        return f

    def set_status(self, event: Event, ref: R, status: str, *, live: bool | None = None) -> None:
        node = self.node(event, ref)
        if node.last_event_id > event.id:
            return  # a late event: a newer one already set the status
        alive = status not in DEAD_STATES if live is None else live
        if node.status != status[:40] or node.live != alive:
            was_live = node.live
            node.status, node.live = status[:40], alive
            node.save(update_fields=["status", "live"])
            if was_live and not alive:
                reach_node_died(node)
            elif alive and not was_live:
                reach_node_revived(node)

    def edge(self, event: Event, src: Node, dst: Node, edge_type: str | None = None) -> Edge:
        edge_type = edge_type or edge_type_for(src.kind, dst.kind)
        edge = (
            Edge.objects.for_workspace(event.workspace_id)
            .filter(src=src, dst=dst, type=edge_type)
            .first()
        )
        if edge is None:
            edge = Edge.objects.create(
                workspace_id=event.workspace_id,
                src=src,
                dst=dst,
                type=edge_type,
                created_at=event.created_at,
                first_event_id=event.id,
                last_event_id=event.id,
            )
            reach_add_edge(src, dst)
            return edge
        if edge.last_event_id > event.id:
            return edge  # a late event: a newer one decided whether the edge is active
        edge.last_event_id = event.id
        fields = ["last_event_id"]
        revived = not edge.active
        if revived:
            edge.active, edge.ended_at = True, None
            fields += ["active", "ended_at"]
        edge.save(update_fields=fields)
        if revived:
            reach_add_edge(src, dst)
        return edge

    def end_edges(self, event: Event, edges: QuerySet[Edge]) -> None:
        sources = {}
        for edge in edges.filter(last_event_id__lt=event.id).select_related("src"):
            edge.active, edge.ended_at, edge.last_event_id = False, event.created_at, event.id
            edge.save(update_fields=["active", "ended_at", "last_event_id"])
            sources[edge.src_id] = edge.src
        for src in sources.values():
            reach_edge_ended(src)

    def _link_external_datasets(self, event: Event, group: Node) -> None:
        """An external dataset announced before its feature group existed."""
        slug = event.workspace.slug
        mapped = setting("OPENLINEAGE_NAMESPACES") or {}
        labels = [
            f"{ns}/{group.label}" for ns in [slug, *(n for n, s in mapped.items() if s == slug)]
        ]
        for dataset in Node.objects.for_workspace(event.workspace_id).filter(
            kind="external_dataset", label__in=labels
        ):
            self.edge(event, dataset, group, EdgeType.DERIVED_FROM)

    def usage(self, event: Event, refs: list[R]) -> None:
        resources = event.resources or {}
        amounts = {}
        for key in RESOURCE_KEYS:
            value = resources.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                amounts[key] = float(value)
        target = _first_target(refs)
        if not amounts or target is None:
            return
        prices = setting("LINEAGE_UNIT_PRICES")
        cost = sum(amount * float(prices.get(key, 0)) for key, amount in amounts.items())
        Usage.objects.create(
            workspace_id=event.workspace_id,
            node=self.node(event, target),
            event_id=event.id,
            verb=event.verb,
            created_at=event.created_at,
            cost=round(cost, 6),
            **amounts,
        )

    def flag(self, event: Event, target: R, category: str, reason: str) -> None:
        node = self.node(event, target)
        AuditItem.objects.update_or_create(
            workspace_id=event.workspace_id,
            category=category,
            kind=node.kind,
            object_id=node.object_id,
            defaults={
                "label": node.label,
                "owner_name": node.owner_name or event.actor_name,
                "reason": reason[:2000],
                "resources": event.resources or {},
                "status": AuditStatus.OPEN,
                "flagged_at": event.created_at,
                "flag_event_id": event.id,
                "decided_at": None,
                "decided_by": "",
                "decision_note": "",
            },
        )

    def apply(self, event: Event, raw_refs: list | None = None, *, first: bool = True) -> None:
        """Apply one event (or, with ``raw_refs``, one slice of its refs; ``first`` on the
        slice that starts it)."""
        refs = [
            R(canonical_kind(r.kind), r.object_id, r.label, r.role)
            for r in (event.refs.all() if raw_refs is None else raw_refs)
            if canonical_kind(r.kind) not in IGNORED_KINDS
        ]
        matched = [r for r in _RULES if fnmatch.fnmatchcase(event.verb, r.pattern)]
        if not any(r.replaces_default for r in matched):
            default_rule(event, refs, self)
            # The last verb segment is the state of the event's subject.
            state = event.verb.rsplit(".", 1)[-1]
            for ref in refs:
                if ref.role == "subject" and "." in event.verb:
                    self.set_status(event, ref, state)
        for registered in matched:
            registered.rule(event, refs, self)
        if first:
            self.usage(event, refs)


# --- driving it ------------------------------------------------------------------------------


def _cursor_locked(*, wait: bool = True) -> Cursor | None:
    Cursor.objects.get_or_create(name=CURSOR)
    return Cursor.objects.select_for_update(skip_locked=not wait).filter(name=CURSOR).first()


def _sliced(event: Event) -> bool:
    """Whether an event is applied in slices of its refs (only OpenLineage events, whose rule
    treats each input or output on its own, can be large)."""
    return event.verb.startswith("lineage.openlineage.")


def _slice_refs(event: Event, done: int, size: int) -> tuple[list, list]:
    """An event's subject refs and its other refs from ``done`` on, ``size`` of them and one
    more (which tells that more follow)."""
    refs = EventRef.objects.filter(event=event).order_by("id")
    subjects = list(refs.filter(role=EventRef.RefRole.SUBJECT))
    others = list(refs.exclude(role=EventRef.RefRole.SUBJECT)[done : done + size + 1])
    return subjects, others


def _apply_slice(
    projector: Projector, cursor: Cursor, event: Event, subjects: list, others: list
) -> bool:
    """Apply the next slice of a sliced event: its subject refs and the next
    ``LINEAGE_REFS_PER_SLICE`` of the others, given from the slice's start (one more tells that
    more follow). Returns whether the event is now fully applied."""
    size = max(1, int(setting("LINEAGE_REFS_PER_SLICE")))
    done = cursor.partial_refs_done if cursor.partial_event_id == event.id else 0
    if event.workspace_id is not None:
        projector.apply(event, subjects + others[:size], first=done == 0)
    finished = len(others) <= size
    if finished:
        if event.id > cursor.last_event_id:
            _record_gaps(cursor, cursor.last_event_id + 1, event.id)
        cursor.last_event_id, cursor.partial_event_id, cursor.partial_refs_done = event.id, 0, 0
    else:
        cursor.partial_event_id, cursor.partial_refs_done = event.id, done + size
    cursor.save(
        update_fields=["last_event_id", "partial_event_id", "partial_refs_done", "updated_at"]
    )
    return finished


def _record_gaps(cursor: Cursor, first: int, passed: int) -> None:
    """Remember the ids ``first`` .. ``passed - 1`` the cursor is about to pass unseen."""
    if cursor.last_event_id == 0:
        return  # a fresh cursor starts at the first event it sees
    if (
        gaps_remember(
            CursorGap.objects.filter(cursor=cursor),
            lambda event_id, seen_at: CursorGap(cursor=cursor, event_id=event_id, seen_at=seen_at),
            first=first,
            passed=passed,
            limit=max(0, int(setting("LINEAGE_GAP_MAX"))),
            label="lineage",
        )
        and not cursor.has_gaps
    ):
        cursor.has_gaps = True
        cursor.save(update_fields=["has_gaps", "updated_at"])


def _apply_late_events(projector: Projector, cursor: Cursor) -> int:
    """Apply the events that committed after the cursor passed their ids; forget gaps older
    than ``LINEAGE_GAP_FORGET_SECONDS``. Returns how many late events were applied."""
    if not cursor.has_gaps:
        return 0
    gaps = CursorGap.objects.filter(cursor=cursor)
    late = gaps_late_events(gaps, forget_seconds=float(setting("LINEAGE_GAP_FORGET_SECONDS")))
    for event in late:
        if event.workspace_id is not None:
            logger.info("lineage: applying event %d late", event.id)
            projector.apply(event)
    if late:
        gaps.filter(event_id__in=[e.id for e in late]).delete()
    if not gaps.exists():
        cursor.has_gaps = False
        cursor.save(update_fields=["has_gaps", "updated_at"])
    return len(late)


def _project_batch(batch_size: int, gap_wait: float, wait: bool = True) -> tuple[int, bool | None]:
    """Apply up to ``batch_size`` events, or one slice of a large event; returns (applied,
    more may follow), or (0, None) when another process holds the cursor."""
    projector = Projector()
    size = max(1, int(setting("LINEAGE_REFS_PER_SLICE")))
    with transaction.atomic():
        cursor = _cursor_locked(wait=wait)
        if cursor is None:
            return 0, None  # another process is projecting right now
        if cursor.partial_event_id:
            # Go on with the half-applied event, loading only its refs (a slice at a time).
            event = (
                Event.objects.unscoped().select_related("workspace").get(pk=cursor.partial_event_id)
            )
            subjects, others = _slice_refs(event, cursor.partial_refs_done, size)
            return int(_apply_slice(projector, cursor, event, subjects, others)), True
        late = _apply_late_events(projector, cursor)
        if late:
            return late, True
        events = list(
            Event.objects.unscoped()
            .filter(id__gt=cursor.last_event_id)
            .select_related("workspace")
            .order_by("id")[:batch_size]
        )
        # Large events are read a slice at a time, never whole; the rest have their refs
        # prefetched as usual.
        large = {
            event_id
            for event_id, count in EventRef.objects.filter(
                event_id__in=[e.id for e in events if _sliced(e)]
            )
            .values("event_id")
            .annotate(count=Count("id"))
            .values_list("event_id", "count")
            if count > size + 1
        }
        prefetch_related_objects([e for e in events if e.id not in large], "refs")
        settle = timezone.now() - timedelta(seconds=gap_wait)
        expected = cursor.last_event_id + 1
        applied = 0
        stopped = False
        for event in events:
            if event.id != expected and gap_wait > 0 and event.created_at > settle:
                stopped = True  # an earlier id may still be committing
                break
            if event.id in large:
                if applied:
                    break  # the large event starts a transaction of its own
                subjects, others = _slice_refs(event, 0, size)
                return int(_apply_slice(projector, cursor, event, subjects, others)), True
            if event.workspace_id is not None:
                projector.apply(event)
            _record_gaps(cursor, expected, event.id)
            cursor.last_event_id = event.id
            expected = event.id + 1
            applied += 1
        if applied:
            cursor.save(update_fields=["last_event_id", "updated_at"])
    more = len(events) == batch_size or applied < len(events)
    return applied, more and not stopped


@dataclass(frozen=True)
class ProjectionRun:
    """What one bounded projection run did: events applied, whether events are left, and
    whether it stopped because another process holds the cursor."""

    applied: int
    more: bool
    busy: bool = False


def project_for(
    *,
    seconds: float | None = None,
    limit: int | None = None,
    gap_wait: float | None = None,
    wait: bool = True,
) -> ProjectionRun:
    """Apply events after the cursor for at most ``seconds`` (and ``limit`` events). Each
    batch or slice is one short transaction."""
    batch_size = int(setting("LINEAGE_BATCH_SIZE"))
    gap = float(setting("LINEAGE_GAP_WAIT_SECONDS") if gap_wait is None else gap_wait)
    deadline = None if seconds is None else time.monotonic() + seconds
    total = 0
    more: bool | None = True
    while limit is None or total < limit:
        size = batch_size if limit is None else min(batch_size, limit - total)
        applied, more = _project_batch(size, gap, wait)
        total += applied
        if more is None:
            return ProjectionRun(total, more=True, busy=True)
        if not more or (deadline is not None and time.monotonic() >= deadline):
            break
    return ProjectionRun(total, more=bool(more))


def project(
    *,
    limit: int | None = None,
    gap_wait: float | None = None,
    wait: bool = True,
) -> int:
    """Apply the events after the cursor (at most ``limit``); returns how many were applied.

    ``wait=False`` returns at once when another process holds the cursor (it is projecting)."""
    return project_for(limit=limit, gap_wait=gap_wait, wait=wait).applied


def catch_up() -> None:
    """Bring the graph up to date before a read, for a bounded time (a large backlog is the
    worker's); a failure leaves the read merely stale."""
    try:
        project_for(
            seconds=float(setting("LINEAGE_CATCH_UP_SECONDS")),
            limit=int(setting("LINEAGE_BATCH_SIZE")) * 5,
            wait=False,
        )
    except Exception:  # reads must not fail because the projection did
        logger.exception("lineage projection failed during catch-up")


@transaction.atomic
def rebuild() -> int:
    """Throw the projection away and replay the whole event log (OpenLineage export is a
    consumer of the log with its own cursor: a rebuild sends nothing again)."""
    Cursor.objects.select_for_update().filter(name=CURSOR).first()
    AuditItem.objects.unscoped().delete()
    CursorGap.objects.all().delete()
    Usage.objects.unscoped().delete()
    Reach.objects.unscoped().delete()
    Edge.objects.unscoped().delete()
    Node.objects.unscoped().delete()
    Cursor.objects.update_or_create(
        name=CURSOR,
        defaults={
            "last_event_id": 0,
            "partial_event_id": 0,
            "partial_refs_done": 0,
            "has_gaps": False,
        },
    )
    return project(gap_wait=0)


# --- the post-commit hook --------------------------------------------------------------------


def schedule_after_commit(sender: Any, instance: Event, created: bool, **kwargs: Any) -> None:
    """post_save of Event: once per transaction, enqueue the projection after commit."""
    if not created:
        return
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        _enqueue_projection()
        return
    if any(func is _enqueue_projection for _, func, _ in connection.run_on_commit):
        return
    transaction.on_commit(_enqueue_projection, robust=True)


def _enqueue_projection() -> None:
    from lineage.tasks import enqueue_projection_once

    enqueue_projection_once()
