"""Serving: the model registry, deployments, the routing table and the prediction log.

A ``ModelVersion`` is an immutable copy of a model bundle in the platform's artifact store
(``ARTIFACT_ROOT/<ws>/models/<name>/<version>/``), tied to the training job, dataset, metrics and
release-gate results. A ``Deployment`` serves one production version (and keeps the previous one
loaded for a one-second rollback); ``ExperimentRoute`` rows are the experiment layers of its
routing table. ``PredictionLog`` is one row per acknowledged predict, joined on ``request_id`` by
the experiments app.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from workspaces.models import CreatedRecord, WorkspaceOwned

name_validator = RegexValidator(
    r"^[a-z][a-z0-9_-]{0,62}$",
    "Use 1-63 lowercase letters, digits, '-' and '_', starting with a letter.",
)


class GateStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"


class VersionSource(models.TextChoices):
    TRAINING = "training", "Platform training job"
    MLFLOW_IMPORT = "mlflow_import", "Imported from MLflow"
    UPLOAD = "upload", "Bundle written by the platform"
    QUANTIZED = "quantized", "Quantised (int8) variant of another version"


class RegisteredModel(WorkspaceOwned):
    event_kind = "registered_model"

    name = models.CharField(max_length=63, validators=[name_validator])
    description = models.TextField(blank=True)
    aliases = models.JSONField(
        default=dict, blank=True, help_text='{"production": 3, "candidate": 4} (version numbers).'
    )
    mlflow_name = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="serving_model_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class ModelVersion(WorkspaceOwned):
    event_kind = "model_version"

    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    source = models.CharField(
        max_length=20, choices=VersionSource.choices, default=VersionSource.TRAINING
    )
    job = models.ForeignKey(
        "training.TrainingJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    dataset = models.ForeignKey(
        "features.Dataset", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    artifact_path = models.CharField(
        max_length=500, help_text="The bundle, relative to ARTIFACT_ROOT (platform-written)."
    )
    spec = models.JSONField(default=dict, blank=True)
    features = models.JSONField(default=list, blank=True, help_text="Feature refs it reads.")
    metrics = models.JSONField(default=dict, blank=True)
    evaluation = models.JSONField(default=dict, blank=True)
    importance = models.JSONField(default=dict, blank=True)
    artifacts = models.JSONField(default=list, blank=True, help_text="[{name, size, sha256}]")
    mlflow_run_id = models.CharField(max_length=64, blank=True)
    mlflow_version = models.CharField(max_length=20, blank=True)
    quality = models.JSONField(
        default=dict,
        blank=True,
        help_text="The quality gate's verdict against a deployment's production model on the "
        "same held-out rows, and a maintainer's override if any.",
    )
    gate_status = models.CharField(
        max_length=10, choices=GateStatus.choices, default=GateStatus.PENDING
    )
    gates = models.JSONField(
        default=dict, blank=True, help_text='{"consistency": {...}, "performance": {...}}'
    )
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["model_id", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["model", "version"], name="serving_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.version}"

    @property
    def name(self) -> str:
        return f"{self.model.name}-v{self.version}"


class BenchmarkKind(models.TextChoices):
    RANKING = "ranking"
    LANGUAGE = "language"


class BenchmarkSet(WorkspaceOwned, CreatedRecord):
    """A versioned evaluation set of the workspace (X4's benchmark sets): a frozen sample
    (a feature-store dataset, or a record set) that every new model version of its kind is
    scored on without anyone asking. Re-creating a name makes its next version; a version never
    changes, so scores of different model versions on it compare."""

    name = models.CharField(max_length=63, validators=[name_validator])
    version = models.PositiveIntegerField(default=1)
    kind = models.CharField(max_length=10, choices=BenchmarkKind.choices)
    dataset = models.ForeignKey(
        "features.Dataset", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    record_set = models.ForeignKey(
        "curation.RecordSet", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    label_column = models.CharField(max_length=200, blank=True)
    group_column = models.CharField(
        max_length=200, blank=True, help_text="Rows of one request or user, for NDCG."
    )
    ndcg_k = models.PositiveSmallIntegerField(default=10)
    max_new_tokens = models.PositiveSmallIntegerField(default=64)
    rows = models.PositiveBigIntegerField(default=0)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name", "version"], name="serving_benchmark_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class BenchmarkScoreState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    NOT_APPLICABLE = "not_applicable"


class BenchmarkScore(WorkspaceOwned):
    """One model version's scores on one benchmark set version."""

    benchmark = models.ForeignKey(BenchmarkSet, on_delete=models.CASCADE, related_name="scores")
    version = models.ForeignKey(
        ModelVersion, on_delete=models.CASCADE, related_name="benchmark_scores"
    )
    state = models.CharField(
        max_length=16, choices=BenchmarkScoreState.choices, default=BenchmarkScoreState.QUEUED
    )
    metrics = models.JSONField(default=dict, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    scored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["benchmark_id", "version_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["benchmark", "version"], name="serving_benchmark_score_unique"
            )
        ]


class Backend(models.TextChoices):
    EMBEDDED = "embedded", "Embedded (loaded in every gateway process)"
    LOCAL = "local", "Local model-server processes (supervised)"
    KUBERNETES = "kubernetes", "Kubernetes (manifests from platform/k8s/serving)"


class DeploymentState(models.TextChoices):
    ACTIVE = "active", "Active"
    STOPPED = "stopped", "Stopped"


class Deployment(WorkspaceOwned):
    event_kind = "deployment"

    name = models.CharField(max_length=63, validators=[name_validator])
    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="+")
    backend = models.CharField(max_length=12, choices=Backend.choices, default=Backend.EMBEDDED)
    device = models.CharField(max_length=8, default="cpu", help_text="cpu or gpu")
    replicas = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    scaling = models.JSONField(
        default=dict,
        blank=True,
        help_text='{"mode": "fixed"} | {"mode": "schedule", "windows": [{"start": "HH:MM", '
        '"end": "HH:MM", "replicas": n}]} | {"mode": "load", "target_qps_per_replica": q, '
        '"min": a, "max": b}',
    )
    version = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, related_name="+", help_text="Production."
    )
    previous_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    state = models.CharField(
        max_length=10, choices=DeploymentState.choices, default=DeploymentState.ACTIVE
    )
    routing_version = models.PositiveBigIntegerField(default=1)
    generation = models.PositiveBigIntegerField(
        default=1,
        help_text="Bumped by every change of the desired state (version, replicas, scaling, "
        "state); the controller reports which generation it last made so.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"], name="serving_deployment_unique_name"
            )
        ]

    def __str__(self) -> str:
        return self.name


class DeploymentPhase(models.TextChoices):
    PENDING = "Pending", "Pending: the controller has not taken up this generation yet"
    PROGRESSING = "Progressing", "Progressing: the backend is being made to match"
    READY = "Ready", "Ready: the backend serves the desired state"
    FAILED = "Failed", "Failed: the last attempt failed (retried by the resync)"
    STOPPED = "Stopped", "Stopped: every replica is gone, as desired"


class DeploymentStatus(WorkspaceOwned):
    """What a deployment's backend controller last observed and did (``serving.controllers``).

    The desired state is the ``Deployment`` row (version, replicas, backend, state) and its
    ``generation``; this row is written only by the controller, outside any request
    transaction, so a request never waits on a model load, a process start or a cluster."""

    event_kind = "deployment_status"

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="observed")
    observed_generation = models.PositiveBigIntegerField(
        default=0, help_text="The desired-state generation the controller last acted on."
    )
    phase = models.CharField(
        max_length=12, choices=DeploymentPhase.choices, default=DeploymentPhase.PENDING
    )
    message = models.CharField(max_length=500, blank=True)
    ready_replicas = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(
        default=0, help_text="Consecutive failed attempts (0 once an attempt succeeds)."
    )
    detail = models.JSONField(default=dict, blank=True, help_text="The backend's own report.")
    manifest = models.TextField(blank=True, help_text="The Kubernetes objects last applied.")
    last_transition_at = models.DateTimeField(null=True, blank=True)
    reconciled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deployment statuses"

    def __str__(self) -> str:
        return f"{self.phase} (generation {self.observed_generation})"


class DeploymentChange(WorkspaceOwned):
    """History of a deployment: who moved traffic where, and why."""

    event_kind = "deployment_change"

    class Kind(models.TextChoices):
        CREATE = "create", "Created"
        RELEASE = "release", "New version released"
        ROLLBACK = "rollback", "Rolled back"
        SCALE = "scale", "Scaled"
        STOP = "stop", "Stopped"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="changes")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    from_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    to_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.CharField(max_length=500, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} of deployment {self.deployment_id}"


class ExperimentRoute(WorkspaceOwned):
    """One experiment's allocations in a layer of a deployment's routing table."""

    event_kind = "experiment_route"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="routes")
    experiment_key = models.CharField(max_length=100)
    layer = models.CharField(max_length=100)
    salt = models.CharField(max_length=100)
    allocations = models.JSONField(
        default=list, help_text='[{"arm", "version_id", "start", "end"}] bucket ranges [start, end)'
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["layer", "experiment_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "experiment_key"], name="serving_route_unique_experiment"
            )
        ]

    def __str__(self) -> str:
        return f"{self.experiment_key} in layer {self.layer}"


class PredictionLog(WorkspaceOwned):
    """One acknowledged predict; ``request_id`` is unique per workspace (feedback joins on it)."""

    event_kind = "prediction"

    request_id = models.CharField(max_length=100)
    unit_id = models.CharField(max_length=200)
    deployment = models.ForeignKey(
        Deployment, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    deployment_name = models.CharField(max_length=63)
    model_version = models.ForeignKey(
        ModelVersion, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    experiment_key = models.CharField(max_length=100, blank=True)
    arm = models.CharField(max_length=100, blank=True)
    n_candidates = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField(default=0)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "request_id"], name="serving_prediction_unique_request"
            )
        ]
        indexes = [models.Index(fields=["workspace", "experiment_key", "created_at"])]

    def __str__(self) -> str:
        return self.request_id


# ---------------------------------------------------------------------------------------------
# Blind side-by-side human review of two language-model versions (serving.review)


class ReviewStatus(models.TextChoices):
    GENERATING = "generating", "Generating the two versions' responses"
    OPEN = "open", "Open for judgements"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class ReviewVerdict(models.TextChoices):
    """A judgement in the versions' terms (the reviewer chose a side; the server maps it)."""

    A = "a", "A is better"
    B = "b", "B is better"
    TIE = "tie", "Tie"


class PairwiseReview(WorkspaceOwned):
    """A blind side-by-side review: reviewers compare the responses of versions A and B of one
    language model to prompts sampled from a record set, without knowing which is which."""

    event_kind = "pairwise_review"

    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="+")
    version_a = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    version_b = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    record_set = models.ForeignKey("curation.RecordSet", on_delete=models.PROTECT, related_name="+")
    item_count = models.PositiveIntegerField(help_text="Prompts sampled from the record set.")
    seed = models.PositiveIntegerField(default=0, help_text="The sample's seed.")
    max_new_tokens = models.PositiveSmallIntegerField(default=64)
    reviewers = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="+")
    status = models.CharField(
        max_length=10, choices=ReviewStatus.choices, default=ReviewStatus.GENERATING
    )
    generated = models.PositiveIntegerField(
        default=0, help_text="Responses generated so far (of twice the items)."
    )
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"review {self.pk}"


class PairwiseItem(WorkspaceOwned):
    """One sampled prompt with both versions' responses and the side A is shown on."""

    event_kind = "pairwise_item"

    review = models.ForeignKey(PairwiseReview, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    row = models.JSONField(default=dict, help_text="The record the prompt was rendered from.")
    prompt = models.TextField()
    output_a = models.TextField(blank=True)
    output_b = models.TextField(blank=True)
    a_on_left = models.BooleanField(help_text="A is 'Response 1' (shown first).")

    class Meta:
        ordering = ["review_id", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["review", "position"], name="serving_pairwise_item_unique_position"
            )
        ]

    def __str__(self) -> str:
        return f"item {self.position} of review {self.review_id}"


class PairwiseJudgement(WorkspaceOwned):
    """One reviewer's verdict on one item, stored in the versions' terms with the side they
    picked (for position-bias checks)."""

    event_kind = "pairwise_judgement"

    review = models.ForeignKey(PairwiseReview, on_delete=models.CASCADE, related_name="judgements")
    item = models.ForeignKey(PairwiseItem, on_delete=models.CASCADE, related_name="judgements")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    verdict = models.CharField(max_length=3, choices=ReviewVerdict.choices)
    side = models.CharField(max_length=3, help_text="What the reviewer picked: 1, 2 or tie.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["review_id", "item_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["item", "reviewer"], name="serving_pairwise_judgement_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.reviewer_id} on item {self.item_id}: {self.verdict}"
