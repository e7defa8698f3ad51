"""The lineage graph, cost usage and audit items: all projections of the event log.

Nothing here is the source of truth. ``lineage.projection`` derives every row from
``workspaces.Event``/``EventRef`` in id order, so ``manage.py lineage_rebuild`` can throw the rows
away and produce exactly the same graph again.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from workspaces.models import WorkspaceOwnedCascade


class EdgeType(models.TextChoices):
    CONSUMES = "consumes", "consumes"
    PRODUCES = "produces", "produces"
    DERIVED_FROM = "derived_from", "derived from"
    DEPLOYED_AS = "deployed_as", "deployed as"
    TESTED_IN = "tested_in", "tested in"
    RELATED = "related", "related"


class Node(WorkspaceOwnedCascade):
    """One object of the platform (or an external dataset/job) as the event log names it."""

    kind = models.CharField(max_length=60)
    object_id = models.CharField(max_length=64)
    label = models.CharField(max_length=200, blank=True)
    owner_name = models.CharField(
        max_length=150, blank=True, help_text="Actor of the first event that made the object."
    )
    live = models.BooleanField(default=True, help_text="False once retired, deleted or removed.")
    status = models.CharField(max_length=40, blank=True, help_text="Last state seen in a verb.")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    first_event_id = models.BigIntegerField()
    last_event_id = models.BigIntegerField()

    class Meta:
        ordering = ["kind", "object_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "kind", "object_id"], name="lineage_node_unique"
            )
        ]
        indexes = [models.Index(fields=["workspace", "kind"], name="lineage_node_kind")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.object_id}"

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.object_id}"


class Edge(WorkspaceOwnedCascade):
    """A typed, directed link from an upstream node to a downstream one (data flows src -> dst).

    ``active`` turns False when the use ends (a consumer released); the row stays for history.
    """

    src = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="out_edges")
    dst = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="in_edges")
    type = models.CharField(max_length=20, choices=EdgeType.choices)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    first_event_id = models.BigIntegerField()
    last_event_id = models.BigIntegerField()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["src", "dst", "type"], name="lineage_edge_unique")
        ]
        indexes = [
            # Covering adjacency indexes of live edges: traversal reads only the index.
            models.Index(
                fields=["src"], include=["dst"], condition=Q(active=True), name="lineage_edge_down"
            ),
            models.Index(
                fields=["dst"], include=["src"], condition=Q(active=True), name="lineage_edge_up"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.src_id} -{self.type}-> {self.dst_id}"


class Cursor(models.Model):
    """How far the projection has read the event log (the last event id applied)."""

    name = models.CharField(max_length=40, primary_key=True)
    last_event_id = models.BigIntegerField(default=0)
    # An event with many refs is applied in slices, one transaction each: the event being
    # applied and how many of its refs are done (0, 0 when none is half-applied).
    partial_event_id = models.BigIntegerField(default=0)
    partial_refs_done = models.PositiveIntegerField(default=0)
    # Whether any ``CursorGap`` is remembered (so a batch without gaps spends no query on them).
    has_gaps = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} at event {self.last_event_id}"


class CursorGap(models.Model):
    """An event id the cursor passed without seeing: a transaction that took the id may still
    commit (its event is then applied late), or it rolled back (the id never appears, and the
    gap is forgotten after ``LINEAGE_GAP_FORGET_SECONDS``)."""

    cursor = models.ForeignKey(Cursor, on_delete=models.CASCADE, related_name="gaps")
    event_id = models.BigIntegerField()
    seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cursor", "event_id"], name="lineage_gap_unique")
        ]

    def __str__(self) -> str:
        return f"{self.cursor_id} missing event {self.event_id}"


class Usage(WorkspaceOwnedCascade):
    """Resources one event reports for the object it is about, priced at projection time."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="usages")
    event_id = models.BigIntegerField(unique=True)
    verb = models.CharField(max_length=80)
    created_at = models.DateTimeField()
    cpu_hours = models.FloatField(default=0)
    gpu_hours = models.FloatField(default=0)
    memory_gb_hours = models.FloatField(default=0)
    storage_gb = models.FloatField(default=0)
    cost = models.FloatField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["workspace", "created_at"], name="lineage_usage_time")]

    def __str__(self) -> str:
        return f"{self.verb} on {self.node_id}: {self.cost:.4f}"


class AuditCategory(models.TextChoices):
    OVER_QUOTA = "over_quota", "Over-quota job"
    IDLE_DEPLOYMENT = "idle_deployment", "Idle deployment"
    LOW_UTILISATION = "low_utilisation", "Low-utilisation job"
    QUALITY_OVERRIDE = "quality_override", "Quality gate overridden"


class AuditStatus(models.TextChoices):
    OPEN = "open", "Open"
    APPROVED = "approved", "Approved"
    REVOKED = "revoked", "Revoked"
    REVIEWED = "reviewed", "Reviewed"


class AuditItem(WorkspaceOwnedCascade):
    """Something used first and audited later: flagged by an event, decided by another."""

    category = models.CharField(max_length=20, choices=AuditCategory.choices)
    kind = models.CharField(max_length=60)
    object_id = models.CharField(max_length=64)
    label = models.CharField(max_length=200, blank=True)
    owner_name = models.CharField(max_length=150, blank=True)
    reason = models.TextField(blank=True)
    resources = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=AuditStatus.choices, default=AuditStatus.OPEN)
    flagged_at = models.DateTimeField()
    flag_event_id = models.BigIntegerField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    decision_note = models.TextField(blank=True)

    class Meta:
        ordering = ["-flagged_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "category", "kind", "object_id"], name="lineage_audit_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_category_display()} {self.kind}:{self.object_id} ({self.status})"


class Reach(WorkspaceOwnedCascade):
    """Precomputed impact: ``dst`` (a job, model version, deployment or experiment, live) is
    reachable from ``src`` over live edges in ``depth`` steps (the shortest way).

    Kept by the projection as edges come and go, so "what breaks if this is retired" reads one
    index range instead of walking a hub feature's tens of thousands of descendants. ``dst_kind``
    and ``dst_owner`` are copied from the node so counts by kind and owner need no join.
    """

    src = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    dst = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    dst_kind = models.CharField(max_length=60)
    dst_owner = models.CharField(max_length=150, blank=True)
    depth = models.PositiveSmallIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["src", "dst"], name="lineage_reach_unique")]
        indexes = [
            models.Index(
                fields=["src", "dst_kind", "dst_owner", "depth"],
                include=["dst"],
                name="lineage_reach_src",
            ),
            models.Index(fields=["dst"], name="lineage_reach_dst"),
        ]

    def __str__(self) -> str:
        return f"{self.src_id} ~{self.depth}~> {self.dst_id}"
