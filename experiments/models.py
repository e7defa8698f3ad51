"""Experiments: layers, experiments with their arms and ramp, feedback events and analysis
snapshots.

An experiment compares treatment model versions with the deployment's production version
(control) on the units hashed into its bucket block of a layer. A layer owns one salt; the blocks
of the experiments in a layer never overlap, so a layer never gives a unit to two experiments,
while two layers (two salts) split units independently. Each arm's range starts at a fixed
bucket and only grows when the ramp advances, so units already in treatment stay there.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from workspaces.models import WorkspaceOwned

key_validator = RegexValidator(
    r"^[a-z][a-z0-9_-]{0,62}$",
    "Use 1-63 lowercase letters, digits, '-' and '_', starting with a letter.",
)


class Layer(WorkspaceOwned):
    """A hashing namespace: one salt, experiments in non-overlapping bucket blocks."""

    event_kind = "experiment_layer"

    name = models.CharField(max_length=63, validators=[key_validator])
    salt = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="experiments_layer_name")
        ]

    def __str__(self) -> str:
        return self.name


class ExperimentState(models.TextChoices):
    DRAFT = "draft", "Draft"
    PENDING_REVIEW = "pending_review", "Waiting for review"
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    CONCLUDED = "concluded", "Concluded"


# state -> states it may move to
EXPERIMENT_MOVES = {
    ExperimentState.DRAFT: {ExperimentState.PENDING_REVIEW, ExperimentState.RUNNING},
    ExperimentState.PENDING_REVIEW: {ExperimentState.RUNNING, ExperimentState.CONCLUDED},
    ExperimentState.RUNNING: {ExperimentState.STOPPED, ExperimentState.CONCLUDED},
    ExperimentState.STOPPED: {ExperimentState.CONCLUDED},
    ExperimentState.CONCLUDED: set(),
}


class Unit(models.TextChoices):
    USER = "user", "User"
    SESSION = "session", "Session"
    REQUEST = "request", "Request"


class Metric(models.TextChoices):
    CTR = "ctr", "CTR (clicks / impressions)"
    CVR = "cvr", "CVR (conversions / clicks)"
    RPM = "rpm", "Revenue per mille impressions"


class SequentialMethod(models.TextChoices):
    GROUP_SEQUENTIAL = "group_sequential", "Group-sequential (planned daily looks)"
    ALWAYS_VALID = "always_valid", "Always-valid (read at any time)"


class Spending(models.TextChoices):
    OBRIEN_FLEMING = "obrien_fleming", "O'Brien-Fleming-type"
    POCOCK = "pocock", "Pocock-type"


class Experiment(WorkspaceOwned):
    event_kind = "experiment"

    key = models.CharField(max_length=63, validators=[key_validator])
    hypothesis = models.TextField()
    deployment = models.ForeignKey("serving.Deployment", on_delete=models.PROTECT, related_name="+")
    control_version = models.ForeignKey(
        "serving.ModelVersion", on_delete=models.PROTECT, related_name="+"
    )
    arms = models.JSONField(
        default=list, help_text='[{"name": "control", "version_id": 1}, {"name": "b", ...}]'
    )
    layer = models.ForeignKey(Layer, on_delete=models.PROTECT, related_name="experiments")
    unit = models.CharField(max_length=10, choices=Unit.choices, default=Unit.USER)
    primary_metric = models.CharField(max_length=8, choices=Metric.choices, default=Metric.CTR)
    guardrails = models.JSONField(
        default=list, help_text='[{"metric": "ctr", "max_drop": 0.05}] relative drops'
    )
    ramp_plan = models.JSONField(
        default=list, help_text="Per-arm traffic percents, e.g. [1, 5, 20]"
    )
    ramp_interval_s = models.PositiveIntegerField(default=86400)
    ramp_step = models.IntegerField(default=-1, help_text="Index into ramp_plan; -1 before start")
    next_ramp_at = models.DateTimeField(null=True, blank=True)
    ramp_history = models.JSONField(default=list, blank=True)
    block_start = models.PositiveIntegerField(null=True, blank=True)
    block_size = models.PositiveIntegerField(default=0)
    min_units = models.PositiveIntegerField(
        default=100, help_text="Units per arm before guardrails and SRM are judged."
    )
    alpha = models.FloatField(default=0.05)
    sequential_tuning = models.FloatField(default=5000)
    sequential_method = models.CharField(
        max_length=16,
        choices=SequentialMethod.choices,
        default=SequentialMethod.GROUP_SEQUENTIAL,
        help_text="How results read while running are judged: planned daily looks with alpha "
        "spending, or always-valid intervals (any time, more conservative).",
    )
    spending = models.CharField(
        max_length=16, choices=Spending.choices, default=Spending.OBRIEN_FLEMING
    )
    state = models.CharField(
        max_length=16, choices=ExperimentState.choices, default=ExperimentState.DRAFT
    )
    review = models.JSONField(default=dict, blank=True)
    stop_reason = models.CharField(max_length=500, blank=True)
    decision = models.JSONField(default=dict, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "key"], name="experiments_unique_key")
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def traffic_percent(self) -> float:
        """Per-arm percent of the layer's units now in the experiment."""
        if self.ramp_step < 0 or not self.ramp_plan:
            return 0.0
        return float(self.ramp_plan[min(self.ramp_step, len(self.ramp_plan) - 1)])

    @property
    def arm_names(self) -> list[str]:
        return [arm["name"] for arm in self.arms]

    @property
    def is_live(self) -> bool:
        return self.state == ExperimentState.RUNNING


class FeedbackEvent(WorkspaceOwned):
    """What happened after one served request: impressions, clicks, conversions, revenue.

    ``event_id`` (the client's, or derived from the Idempotency-Key) makes retries harmless.
    Unit, experiment and arm come from the gateway's PredictionLog row of the request.
    """

    event_id = models.CharField(max_length=200)
    request_id = models.CharField(max_length=100)
    unit_id = models.CharField(max_length=200, blank=True)
    experiment = models.ForeignKey(
        Experiment, null=True, blank=True, on_delete=models.CASCADE, related_name="feedback"
    )
    arm = models.CharField(max_length=100, blank=True)
    impressions = models.PositiveIntegerField(default=0)
    clicks = models.PositiveIntegerField(default=0)
    conversions = models.PositiveIntegerField(default=0)
    revenue = models.FloatField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "event_id"], name="experiments_feedback_unique_event"
            )
        ]
        indexes = [models.Index(fields=["experiment", "arm", "unit_id"])]

    def __str__(self) -> str:
        return self.event_id


class Snapshot(WorkspaceOwned):
    """One analysis of an experiment at a point in time (for the over-time chart and evidence)."""

    event_kind = "experiment_snapshot"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="snapshots")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    traffic_percent = models.FloatField(default=0)
    result = models.JSONField(default=dict)
    srm_mismatch = models.BooleanField(default=False)
    guardrail_breaches = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.experiment_id}@{self.created_at:%Y-%m-%d %H:%M}"
