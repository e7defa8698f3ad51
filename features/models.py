"""Feature registry: groups, their versioned schemas, features, consumers, batches, datasets
and health records. Every row carries its workspace, so scoping is one filter everywhere."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from workspaces.models import CreatedRecord, WorkspaceOwned, WorkspaceOwnedCascade

name_validator = RegexValidator(
    r"^[a-z][a-z0-9_]{0,62}$",
    "Use 1-63 lowercase letters, digits and underscores, starting with a letter.",
)


class EntityKind(models.TextChoices):
    USER = "user", "User"
    ITEM = "item", "Ad / item"
    CONTEXT = "context", "Context"
    SEMANTIC = "semantic", "Semantic (embedding)"
    LABEL = "label", "Labelled events"


class Dtype(models.TextChoices):
    INT = "int", "Integer"
    FLOAT = "float", "Float"
    BOOL = "bool", "Boolean"
    STRING = "string", "String"
    CATEGORICAL = "categorical", "Categorical"
    EMBEDDING = "embedding", "Embedding (fixed dimension)"
    # A row holds a list of categories (strings; integers are stored as their text), e.g. a
    # user's recent ad categories: training gives its items one vocabulary and pools them.
    CATEGORICAL_LIST = "categorical_list", "List of categories"


class Lifecycle(models.TextChoices):
    DRAFT = "draft", "Draft"
    ACTIVE = "active", "Active"
    DEPRECATED = "deprecated", "Deprecated"
    RETIRED = "retired", "Retired"


# Allowed lifecycle moves; retiring goes through the consumer check.
LIFECYCLE_MOVES: dict[str, set[str]] = {
    Lifecycle.DRAFT: {Lifecycle.ACTIVE, Lifecycle.RETIRED},
    Lifecycle.ACTIVE: {Lifecycle.DEPRECATED, Lifecycle.RETIRED},
    Lifecycle.DEPRECATED: {Lifecycle.ACTIVE, Lifecycle.RETIRED},
    Lifecycle.RETIRED: set(),
}


class HealthStatus(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    HEALTHY = "healthy", "Healthy"
    BROKEN = "broken", "Broken"


class FeatureGroup(WorkspaceOwned):
    """A set of features about one entity, pushed by one producer, with a versioned schema."""

    event_kind = "feature_group"

    name = models.CharField(max_length=63, validators=[name_validator])
    entity = models.CharField(max_length=20, choices=EntityKind.choices)
    entity_keys = models.JSONField(help_text="Entity key column names, e.g. ['user_id'].")
    event_time_column = models.CharField(
        max_length=63, default="event_time", validators=[name_validator]
    )
    description = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    producer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The account that pushes batches; told when the group breaks.",
    )
    online = models.BooleanField(default=True)
    offline = models.BooleanField(default=True)
    freshness_sla_seconds = models.PositiveIntegerField(
        default=24 * 3600, validators=[MinValueValidator(1)]
    )
    status = models.CharField(max_length=12, choices=Lifecycle.choices, default=Lifecycle.DRAFT)
    current_version = models.PositiveIntegerField(default=1)
    successor = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="predecessors"
    )
    health_status = models.CharField(
        max_length=10, choices=HealthStatus.choices, default=HealthStatus.UNKNOWN
    )
    health_changed_at = models.DateTimeField(null=True, blank=True)
    last_ingested_at = models.DateTimeField(null=True, blank=True)
    last_event_time = models.DateTimeField(null=True, blank=True)
    online_materialized_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="featuregroup_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.current_version}"


class FeatureGroupVersion(WorkspaceOwned, CreatedRecord):
    """One schema of a group. Old versions stay readable: their data is kept by version."""

    group = models.ForeignKey(FeatureGroup, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    features = models.JSONField(help_text="[{name, dtype, dimension, description}]")

    class Meta:
        ordering = ["group", "version"]
        constraints = [
            models.UniqueConstraint(fields=["group", "version"], name="groupversion_unique")
        ]

    def __str__(self) -> str:
        return f"{self.group.name} v{self.version}"

    def feature_map(self) -> dict[str, dict[str, Any]]:
        return {spec["name"]: spec for spec in self.features}


class Feature(WorkspaceOwned):
    """One feature of a group, with its own lifecycle; its schema lives in the group's versions."""

    event_kind = "feature"

    group = models.ForeignKey(FeatureGroup, on_delete=models.CASCADE, related_name="feature_set")
    name = models.CharField(max_length=63, validators=[name_validator])
    dtype = models.CharField(max_length=20, choices=Dtype.choices)
    dimension = models.PositiveIntegerField(null=True, blank=True)
    description = models.TextField(blank=True)
    status = models.CharField(max_length=12, choices=Lifecycle.choices, default=Lifecycle.ACTIVE)
    added_in_version = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["group", "name"]
        constraints = [models.UniqueConstraint(fields=["group", "name"], name="feature_unique")]

    def __str__(self) -> str:
        return f"{self.group.name}:{self.name}"


class ConsumerKind(models.TextChoices):
    DATASET = "dataset", "Dataset"
    MODEL = "model", "Model version"
    DEPLOYMENT = "deployment", "Deployment"
    EXPERIMENT = "experiment", "Experiment"
    SAMPLE_STREAM = "sample_stream", "Workspace sample stream"
    TRAINING_JOB = "training_job", "Training job"


class Consumer(WorkspaceOwned):
    """Something that uses a group (or one of its features). Live consumers block retirement."""

    group = models.ForeignKey(FeatureGroup, on_delete=models.CASCADE, related_name="consumers")
    feature_name = models.CharField(max_length=63, blank=True, help_text="Blank: the whole group.")
    kind = models.CharField(max_length=20, choices=ConsumerKind.choices)
    object_id = models.CharField(max_length=64)
    label = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    live = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["kind", "label"]
        constraints = [
            models.UniqueConstraint(
                fields=["group", "feature_name", "kind", "object_id"], name="consumer_unique"
            )
        ]

    def __str__(self) -> str:
        target = f"{self.group.name}:{self.feature_name}" if self.feature_name else self.group.name
        return f"{self.kind} {self.label} uses {target}"


class BatchFormat(models.TextChoices):
    JSON = "json", "JSON"
    CSV = "csv", "CSV"
    PARQUET = "parquet", "Parquet"


class Batch(WorkspaceOwned):
    """One accepted producer push: where it landed, how big it was, who sent it."""

    event_kind = "batch"

    group = models.ForeignKey(FeatureGroup, on_delete=models.CASCADE, related_name="batches")
    version = models.PositiveIntegerField()
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL: no key (unique only when set)
    body_sha256 = models.CharField(max_length=64)
    format = models.CharField(max_length=10, choices=BatchFormat.choices)
    rows = models.PositiveIntegerField()
    bytes = models.PositiveBigIntegerField()
    min_event_time = models.DateTimeField(null=True)
    max_event_time = models.DateTimeField(null=True)
    offline_path = models.CharField(max_length=500, blank=True)
    online_written = models.BooleanField(default=False)
    # Whether its rows' drift sketches were written with it (pushes before sketches existed:
    # no; drift over a window holding such a batch reads the Parquet instead).
    sketched = models.BooleanField(default=False)
    producer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["group", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="batch_unique_idempotency_key",
            )
        ]

    def __str__(self) -> str:
        return f"batch {self.pk} of {self.group.name} ({self.rows} rows)"


class DatasetStatus(models.TextChoices):
    BUILDING = "building", "Building"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class DriftSketch(WorkspaceOwnedCascade):
    """One hour of event time of one batch: a KLL quantile sketch of each of its numeric features
    (``features.sketches``), what a drift run merges instead of rereading the Parquet."""

    group = models.ForeignKey(FeatureGroup, on_delete=models.CASCADE, related_name="+")
    version = models.PositiveIntegerField()
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="sketches")
    hour = models.DateTimeField()
    rows = models.PositiveIntegerField()
    sketches = models.JSONField(default=dict, help_text="feature -> base64 KLL sketch")

    class Meta:
        indexes = [models.Index(fields=["group", "version", "hour"], name="sketch_group_hour")]


class Dataset(WorkspaceOwned, CreatedRecord):
    """A training sample: labelled events with point-in-time feature values, stored as Parquet."""

    event_kind = "dataset"

    name = models.CharField(max_length=63, validators=[name_validator])
    version = models.PositiveIntegerField(default=1)
    label_group = models.ForeignKey(
        FeatureGroup, on_delete=models.PROTECT, related_name="labelled_datasets"
    )
    label_columns = models.JSONField(default=list)
    feature_refs = models.JSONField(help_text='["group:feature", ...]')
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    status = models.CharField(
        max_length=10, choices=DatasetStatus.choices, default=DatasetStatus.BUILDING
    )
    path = models.CharField(max_length=500, blank=True)
    row_count = models.PositiveBigIntegerField(default=0)
    rows_total = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Label rows the build joins; unknown until it counted."
    )
    rows_done = models.PositiveBigIntegerField(
        default=0, help_text="Rows the build has written so far."
    )
    partitions_total = models.PositiveIntegerField(
        null=True, blank=True, help_text="Parquet parts the sample is written as (label days)."
    )
    partitions_done = models.PositiveIntegerField(
        default=0, help_text="Parts joined and written so far."
    )
    coverage = models.JSONField(default=dict, blank=True, help_text="feature ref -> share non-null")
    error = models.TextField(blank=True)
    built_at = models.DateTimeField(null=True, blank=True)
    engine = models.CharField(
        max_length=10, blank=True, help_text="The offline engine that built it."
    )
    build_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name", "version"], name="dataset_unique_version"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def progress(self) -> float:
        """Share of the build done: 1 once ready, rows written over rows to write while it runs
        (0 while queued or counting)."""
        if self.status == DatasetStatus.READY:
            return 1.0
        if not self.rows_total:
            return 0.0
        return min(self.rows_done / self.rows_total, 1.0)


class HealthCheck(WorkspaceOwned):
    """One health check of a group: freshness, coverage, drift and consistency at a moment."""

    group = models.ForeignKey(FeatureGroup, on_delete=models.CASCADE, related_name="health_checks")
    checked_at = models.DateTimeField(default=timezone.now, db_index=True)
    status = models.CharField(max_length=10, choices=HealthStatus.choices)
    freshness_lag_seconds = models.FloatField(null=True)
    coverage = models.FloatField(null=True, help_text="Share of online lookups that found a value.")
    drift_psi = models.JSONField(default=dict, blank=True, help_text="feature -> PSI")
    consistency = models.FloatField(
        null=True, help_text="Share of sampled online values equal to the offline ones."
    )
    problems = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-checked_at", "-id"]

    def __str__(self) -> str:
        return f"{self.group.name} {self.status} at {self.checked_at:%Y-%m-%d %H:%M}"
