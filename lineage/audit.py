"""The resource audit ("use first, audit later"): flag, then approve / revoke / mark reviewed.

Both flags and decisions are events (``lineage.audit.flagged``, ``lineage.audit.approved``,
``.revoked``, ``.reviewed``); ``AuditItem`` rows are their projection. Over-quota jobs come from
``*.over_quota`` events the scheduler records; low-utilisation jobs from the utilisation a job
reports in its events; idle deployments from ``audit_scan_idle`` (hourly beat).
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from lineage.conf import setting
from lineage.models import AuditCategory, AuditItem, AuditStatus, Node
from lineage.projection import project
from workspaces.events import Actor, Ref, event_record
from workspaces.exceptions import ConflictError

DECISIONS = (AuditStatus.APPROVED, AuditStatus.REVOKED, AuditStatus.REVIEWED)


@transaction.atomic
def audit_item_decide(*, actor: Actor, item: AuditItem, decision: str, note: str = "") -> AuditItem:
    """Record a decision on a flagged item as an event and apply it to the item."""
    if decision not in DECISIONS:
        raise ConflictError(f"unknown audit decision {decision!r}", attr="decision")
    event = event_record(
        actor=actor,
        workspace=item.workspace,
        verb=f"lineage.audit.{decision}",
        refs=[Ref(item.kind, item.object_id, item.label)],
        payload={"category": item.category, "note": note[:2000], "previous": item.status},
    )
    # The same values the projection writes when it reaches the event.
    item.status = decision
    item.decided_at = event.created_at
    item.decided_by = event.actor_name
    item.decision_note = note[:2000]
    item.save(update_fields=["status", "decided_at", "decided_by", "decision_note"])
    return item


def audit_scan_idle(*, now=None) -> int:
    """Flag live deployments with no event for ``LINEAGE_IDLE_DEPLOYMENT_DAYS`` days."""
    project()
    now = now or timezone.now()
    cutoff = now - timedelta(days=float(setting("LINEAGE_IDLE_DEPLOYMENT_DAYS")))
    idle = (
        Node.objects.unscoped()
        .filter(kind="deployment", live=True, last_seen_at__lt=cutoff)
        .select_related("workspace")
    )
    flagged = 0
    for node in idle:
        exists = (
            AuditItem.objects.for_workspace(node.workspace)
            .filter(
                category=AuditCategory.IDLE_DEPLOYMENT, kind=node.kind, object_id=node.object_id
            )
            .exists()
        )
        if exists:
            continue
        with transaction.atomic():
            event_record(
                actor=None,
                workspace=node.workspace,
                verb="lineage.audit.flagged",
                refs=[Ref(node.kind, node.object_id, node.label)],
                payload={
                    "category": AuditCategory.IDLE_DEPLOYMENT,
                    "reason": f"no activity since {node.last_seen_at:%Y-%m-%d}",
                },
            )
        flagged += 1
    if flagged:
        project()
    return flagged
