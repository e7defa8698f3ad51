"""Workspaces (business scenes), memberships and roles, quotas, API tokens and the event log."""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from workspaces.scoping import WorkspaceScopedQuerySet

slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$",
    "Use 1-50 lowercase letters, digits and hyphens, starting and ending with a letter or digit.",
)


class PredictionType(models.TextChoices):
    PCTR = "pctr", "pCTR (click-through)"
    PCVR = "pcvr", "pCVR (conversion)"
    PCTCVR = "pctcvr", "pCTCVR (click and conversion)"
    RECALL = "recall", "Recall (candidate retrieval)"
    COARSE_RANK = "coarse_rank", "Coarse ranking"
    FINE_RANK = "fine_rank", "Fine ranking"


class Role(models.TextChoices):
    """Workspace roles, weakest first. Each role holds every permission of the ones before it."""

    VIEWER = "viewer", "Viewer"
    DEVELOPER = "developer", "Developer"
    MAINTAINER = "maintainer", "Maintainer"
    ADMIN = "admin", "Admin"

    @classmethod
    def rank(cls, role: str) -> int:
        return list(cls.values).index(role)


# The django-guardian object permissions on a Workspace that each role holds.
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    Role.VIEWER: ("view_workspace",),
    Role.DEVELOPER: ("view_workspace", "develop_in_workspace"),
    Role.MAINTAINER: ("view_workspace", "develop_in_workspace", "release_in_workspace"),
    Role.ADMIN: (
        "view_workspace",
        "develop_in_workspace",
        "release_in_workspace",
        "administer_workspace",
    ),
}
WORKSPACE_PERMISSIONS = ROLE_PERMISSIONS[Role.ADMIN]


def default_workspace_template() -> dict[str, Any]:
    return {
        "sample_stream": {"label_source": None, "features": []},
        "model": {"template": "fine_ranking", "params": {}},
    }


class Workspace(models.Model):
    """A business scene (ad placement x prediction type) that owns all work done inside it."""

    slug = models.SlugField(max_length=50, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=120)
    scene = models.CharField(
        max_length=80, help_text="The ad placement or business scene, e.g. 'feed' or 'search'."
    )
    prediction_type = models.CharField(max_length=20, choices=PredictionType.choices)
    description = models.TextField(blank=True)
    template = models.JSONField(
        default=default_workspace_template,
        help_text="The default sample stream and model config that new work starts from.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["scene", "prediction_type"], name="workspace_unique_scene_prediction_type"
            )
        ]
        permissions = [
            ("develop_in_workspace", "Create and change work in the workspace"),
            ("release_in_workspace", "Release, roll back and retire in the workspace"),
            ("administer_workspace", "Manage members, tokens and settings of the workspace"),
        ]

    def __str__(self) -> str:
        return f"{self.slug} ({self.scene} / {self.get_prediction_type_display()})"


class WorkspaceOwned(models.Model):
    """The base of every model whose rows belong to one workspace: the ``workspace`` key and the
    fail-closed manager (a query not narrowed to a workspace raises, see ``workspaces.scoping``).

    A workspace cannot be deleted while it owns these rows (PROTECT): the things a team built and
    the history of what they did outlive nothing by accident.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="+")

    objects = WorkspaceScopedQuerySet.as_manager()

    class Meta:
        abstract = True


class CreatedRecord(models.Model):
    """Who created a row (kept when the user is deleted, then blank) and when."""

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class WorkspaceOwnedCascade(WorkspaceOwned):
    """A workspace-owned model whose rows go with their workspace (CASCADE): settings, grants and
    rows derived from other data (quotas, memberships, lineage projections, metrics)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")

    class Meta:
        abstract = True


class Membership(WorkspaceOwnedCascade):
    """A user's role in a workspace; its service keeps guardian permissions in step with it."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices)
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    granted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["workspace__slug", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} in {self.workspace.slug}"


class WorkspaceQuota(WorkspaceOwnedCascade):
    """The one quota: what a workspace may use at once, per GPU type (blank: any GPU type).

    The scheduler's admission reads these rows (``training.scheduler.admission``): jobs beyond
    the quota are still admitted (use first, audit later), as preemptible and flagged. A workspace
    without a row is unlimited, and a blank limit is unlimited. ``storage_gb`` (the blank-type row
    only) is counted against the workspace's stored feature batches: a push that would pass it
    is refused (409, ``features.ingestion.storage_quota_check``).

    Live usage is not stored here (a stored "used" column drifts): it is computed on read from
    the jobs holding capacity and the stored data (``workspaces.quota.quota_summary``). Writes go
    through ``workspaces.services.quota_set``, which records ``quota.changed``. The table keeps
    the name it had when the model lived in the scheduler app.
    """

    event_kind = "workspace_quota"
    LIMITS = ("cpu_milli", "memory_mb", "gpu_milli", "storage_gb")

    gpu_type = models.CharField(max_length=40, blank=True, help_text="Blank: all GPU types.")
    cpu_milli = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: unlimited.")
    memory_mb = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: unlimited.")
    gpu_milli = models.PositiveIntegerField(
        null=True, blank=True, help_text="Whole and fractional GPUs in milli-GPU; blank: unlimited."
    )
    storage_gb = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Stored feature batches, in GB; all-types row only. Blank: unlimited.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "scheduler_workspacequota"
        ordering = ["workspace_id", "gpu_type"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "gpu_type"], name="scheduler_quota_unique")
        ]

    def __str__(self) -> str:
        return f"quota {self.workspace_id}/{self.gpu_type or '*'}"

    def limits(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in self.LIMITS}


class ServiceAccount(WorkspaceOwnedCascade):
    """A non-human principal (a feature producer, CI) that acts in one workspace by token."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="service_account"
    )
    workspace = models.ForeignKey(
        Workspace, on_delete=models.CASCADE, related_name="service_accounts"
    )
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"service account {self.user.username} in {self.workspace.slug}"


def hash_token_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for scripts and producers; only its hash is stored.

    A token acts as its owner, never beyond the owner's roles, and can be narrowed further to a set
    of workspaces.
    """

    KEY_PREFIX = "rk_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(
        max_length=16, editable=False, help_text="The key's first characters."
    )
    workspaces = models.ManyToManyField(
        Workspace,
        blank=True,
        related_name="+",
        help_text="If any are set, the token only reaches these workspaces.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name}) of {self.user}"

    @property
    def is_active(self) -> bool:
        now = timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class ImmutableEventError(RuntimeError):
    """Events are append-only: nothing updates or deletes them."""


class EventQuerySet(WorkspaceScopedQuerySet):
    def update(self, **kwargs: Any) -> int:
        raise ImmutableEventError("events cannot be updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise ImmutableEventError("events cannot be deleted")

    def _raw_delete(self, using: Any) -> int:
        raise ImmutableEventError("events cannot be deleted")


class Event(models.Model):
    """One immutable record of a state change, written in the same transaction as the change.

    The audit trail, the lineage graph and notifications are projections of these rows.
    """

    created_at = models.DateTimeField(default=timezone.now, db_index=True, editable=False)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        editable=False,
    )
    actor_name = models.CharField(
        max_length=150, editable=False, help_text="The actor's username when the event happened."
    )
    token_prefix = models.CharField(max_length=16, blank=True, editable=False)
    workspace = models.ForeignKey(
        Workspace,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="events",
        editable=False,
    )
    verb = models.CharField(max_length=80, db_index=True, editable=False)
    resources = models.JSONField(
        default=dict, blank=True, editable=False, help_text="Resource figures, e.g. gpu_hours."
    )
    payload = models.JSONField(default=dict, blank=True, editable=False)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["workspace", "-created_at"], name="event_ws_time")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.verb}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableEventError("events cannot be changed once written")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ImmutableEventError("events cannot be deleted")


class EventRefQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise ImmutableEventError("event references cannot be updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise ImmutableEventError("event references cannot be deleted")


class EventRef(models.Model):
    """A typed reference from an event to an object it touched, with the object's role in it."""

    class RefRole(models.TextChoices):
        SUBJECT = "subject", "Subject"
        INPUT = "input", "Input"
        OUTPUT = "output", "Output"
        RELATED = "related", "Related"

    event = models.ForeignKey(Event, on_delete=models.DO_NOTHING, related_name="refs")
    role = models.CharField(max_length=10, choices=RefRole.choices, default=RefRole.SUBJECT)
    kind = models.CharField(max_length=60, help_text="The object's type, e.g. 'feature_group'.")
    object_id = models.CharField(max_length=64)
    label = models.CharField(max_length=200, blank=True)

    objects = EventRefQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["kind", "object_id"], name="eventref_object")]

    def __str__(self) -> str:
        return f"{self.role} {self.kind}:{self.object_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableEventError("event references cannot be changed once written")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ImmutableEventError("event references cannot be deleted")


class NotificationQuerySet(WorkspaceScopedQuerySet):
    def unread(self) -> NotificationQuerySet:
        return self.filter(read_at__isnull=True)


class Notification(WorkspaceOwnedCascade):
    """A message to one user about something in a workspace (a feature group broke, a job ended);
    shown in the app and delivered by e-mail and the workspace's webhooks after commit."""

    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    verb = models.CharField(max_length=80, help_text="What happened, e.g. feature_group.broken.")
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    link = models.CharField(max_length=500, blank=True)
    event = models.ForeignKey(
        Event, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    read_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its e-mail was sent (or found not needed: the recipient has no address).",
    )
    # E-mail delivery, driven by the notifications consumer of the event log: due from
    # ``email_next_attempt_at`` (none: not due yet, or nothing left to send), retried with backoff.
    email_attempts = models.PositiveSmallIntegerField(default=0)
    email_next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    email_error = models.TextField(blank=True)

    # The base's manager, with the inbox's own query (unread).
    objects = NotificationQuerySet.as_manager()  # type: ignore[misc]

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["recipient", "-created_at"], name="notification_inbox"),
        ]

    def __str__(self) -> str:
        return f"{self.verb} to {self.recipient} in {self.workspace.slug}"


class WebhookEndpoint(WorkspaceOwnedCascade):
    """An outbound URL that receives every notification of a workspace as signed JSON.

    The body is signed with HMAC-SHA256 under ``secret`` (header ``X-RankOps-Signature``); the URL
    is checked against private and link-local addresses when created and again when delivering.
    """

    url = models.CharField(max_length=2000)
    secret = models.CharField(max_length=200, editable=False)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of {self.workspace.slug}"


class WebhookDelivery(models.Model):
    """One attempt to post one notification (an event's announcement) to one webhook: the
    delivery log. The notifications consumer of the event log writes the first attempt; a failed
    attempt writes the next one, due after an exponential backoff, until one succeeds or the
    attempts run out. Receivers dedup on the event id (header ``X-RankOps-Event-Id``)."""

    # What the admin and the API show of an attempt (never the body sent: it names recipients).
    SHOWN_FIELDS = (
        "event_id",
        "notification_id",
        "attempt",
        "next_attempt_at",
        "attempted_at",
        "status_code",
        "error",
        "delivered_at",
    )

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    webhook = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.BigIntegerField(db_index=True)
    # The first notification of the announcement, by id: the log outlives the inbox row.
    notification_id = models.BigIntegerField(null=True, blank=True)
    attempt = models.PositiveSmallIntegerField(default=1)
    payload = models.JSONField(default=dict, editable=False)
    next_attempt_at = models.DateTimeField(help_text="When this attempt is due.")
    # A sender took the attempt until then; past it (the sender died), another one may.
    claimed_until = models.DateTimeField(null=True, blank=True, editable=False)
    attempted_at = models.DateTimeField(null=True, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = WorkspaceScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["webhook", "event_id", "notification_id", "attempt"],
                name="webhookdelivery_one_attempt",
            )
        ]
        indexes = [
            models.Index(fields=["attempted_at", "next_attempt_at"], name="webhookdelivery_due")
        ]

    def __str__(self) -> str:
        return f"event {self.event_id} to webhook {self.webhook_id}, attempt {self.attempt}"


class ConsumerCursor(models.Model):
    """How far one consumer of the event log (``workspaces.outbox``) has read: the last event id
    it applied, moved in the same transaction as the consumer's own writes."""

    name = models.CharField(max_length=60, primary_key=True)
    last_event_id = models.BigIntegerField(default=0)
    # Whether any ``ConsumerGap`` is remembered (a batch without gaps spends no query on them).
    has_gaps = models.BooleanField(default=False)
    failures = models.PositiveIntegerField(
        default=0, help_text="Runs in a row whose handler failed on the event after the cursor."
    )
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} at event {self.last_event_id}"


class ConsumerGap(models.Model):
    """An event id a consumer's cursor passed without seeing: a transaction that took it may
    still commit (the event is then applied late), or it rolled back (the gap is forgotten after
    ``OUTBOX_GAP_FORGET_SECONDS``)."""

    cursor = models.ForeignKey(ConsumerCursor, on_delete=models.CASCADE, related_name="gaps")
    event_id = models.BigIntegerField()
    seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cursor", "event_id"], name="consumergap_unique")
        ]

    def __str__(self) -> str:
        return f"{self.cursor_id} missing event {self.event_id}"


# Platform-wide defaults of the per-workspace policy; ``settings.WORKSPACE_POLICY_DEFAULTS``
# overrides single keys. A policy field left blank falls back to these.
POLICY_DEFAULTS: dict[str, int] = {
    # Input plus output datasets of one OpenLineage event.
    "max_lineage_datasets": 1000,
    # Rows of one producer batch (JSON, CSV or Parquet).
    "max_batch_rows": 100_000,
    # Epochs and optimiser steps of one training job.
    "max_job_epochs": 1000,
    "max_job_steps": 10_000_000,
    # Wall time of one training job (the agent stops a job that runs longer).
    "max_job_wall_s": 24 * 3600,
    # Worker slots one workspace's heavy tasks may hold at once.
    "max_concurrent_tasks": 1,
}


class WorkspacePolicy(models.Model):
    """How much work one request, event or job of a workspace may ask for (fair use of shared
    capacity). Blank fields mean the platform default; only platform admins change it."""

    workspace = models.OneToOneField(Workspace, on_delete=models.CASCADE, related_name="policy")
    max_lineage_datasets = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    max_batch_rows = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    max_job_epochs = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    max_job_steps = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    max_job_wall_s = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Seconds."
    )
    max_concurrent_tasks = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    updated_at = models.DateTimeField(auto_now=True)

    objects = WorkspaceScopedQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "workspace policies"

    def __str__(self) -> str:
        return f"policy of {self.workspace.slug}"


class QuotaRequest(WorkspaceOwnedCascade):
    """A workspace admin's request for a different scheduler quota; a platform admin approves
    (which applies it) or rejects it in the admin console."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"

    gpu_type = models.CharField(max_length=40, blank=True, help_text="Blank: all GPU types.")
    cpu_milli = models.PositiveIntegerField(null=True, blank=True)
    memory_mb = models.PositiveIntegerField(null=True, blank=True)
    gpu_milli = models.PositiveIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_at = models.DateTimeField(default=timezone.now)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]

    def __str__(self) -> str:
        return f"quota request {self.pk} of {self.workspace.slug} ({self.status})"


class TaskSlot(WorkspaceOwnedCascade):
    """One of the worker slots a workspace's heavy tasks may hold at once (policy
    ``max_concurrent_tasks``): a row per held slot, unique per workspace and slot number, so
    taking one is an INSERT that either wins or fails, on SQLite and PostgreSQL alike. A slot
    whose holder died is free again after ``expires_at``."""

    slot = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=60, help_text="The task, e.g. features.materialize.")
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "slot"], name="taskslot_one_holder")
        ]

    def __str__(self) -> str:
        return f"slot {self.slot} of {self.workspace_id} ({self.kind})"


class IdempotentRequest(models.Model):
    """A write sent with an ``Idempotency-Key`` and what it answered, kept for
    ``IDEMPOTENCY_TTL_S`` (``workspaces.idempotency``): the same key from the same caller
    replays the answer instead of doing the write again; with another request it is a 409."""

    principal = models.CharField(max_length=64, help_text="A digest of who sent it.")
    key = models.CharField(max_length=200)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=500)
    body_sha256 = models.CharField(max_length=64)
    done = models.BooleanField(default=False)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True)
    response = models.BinaryField(blank=True, default=b"")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="idempotent_request_key")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotent_request_age")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} ({self.key})"
