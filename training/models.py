"""Training: compute nodes (inventory reported by node agents) and training jobs.

The job row in the database is the source of truth for a job's state. The lifecycle is
``pending -> admitted -> placed -> running -> succeeded | failed | preempted (-> pending)``;
``training.services.job_transition`` is the only writer of ``state`` and refuses illegal moves.
Placement policy (which node, preemption) belongs to the scheduler (``training.scheduler``).
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from features.models import Dataset
from workspaces.models import CreatedRecord, WorkspaceOwned, WorkspaceOwnedCascade

job_name_validator = RegexValidator(
    r"^[a-z][a-z0-9_-]{0,62}$",
    "Use 1-63 lowercase letters, digits, '-' and '_', starting with a letter.",
)
node_name_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9.-]{0,62}$",
    "Use 1-63 lowercase letters, digits, '.' and '-'.",
)


class NodeKind(models.TextChoices):
    TRAINING = "training", "Training"
    INFERENCE = "inference", "Inference (lends idle capacity in its windows)"


class NodeState(models.TextChoices):
    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned (no new jobs)"
    LOST = "lost", "Lost (heartbeat stopped)"


# The label of a node agent that runs in a pod of a TrainJob (TRAINING_BACKEND=kueue): the
# TrainJob's name. Such a node takes that TrainJob's job only (training.trainjobs).
TRAINJOB_LABEL = "rankops.io/trainjob"


class Node(models.Model):
    """A compute node. Its agent (a Celery worker on queue ``queue``) reports the inventory.

    Nodes are platform-wide (not workspace-owned): the scheduler shares them between workspaces
    within their quotas.
    """

    event_kind = "node"

    name = models.CharField(max_length=63, unique=True, validators=[node_name_validator])
    queue = models.CharField(max_length=100, unique=True, help_text="Celery queue of the agent.")
    kind = models.CharField(max_length=10, choices=NodeKind.choices, default=NodeKind.TRAINING)
    state = models.CharField(max_length=10, choices=NodeState.choices, default=NodeState.READY)
    state_reason = models.CharField(max_length=300, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    cpu_milli = models.PositiveIntegerField(default=0, help_text="Allocatable CPU, 1000 = 1 core.")
    memory_mb = models.PositiveIntegerField(default=0)
    gpus = models.JSONField(
        default=list,
        blank=True,
        help_text='[{"index": 0, "type": "H100", "memory_mb": 81559}, ...] as found.',
    )
    labels = models.JSONField(default=dict, blank=True)
    lending_windows = models.JSONField(
        default=list,
        blank=True,
        help_text='Inference nodes: [{"days": [0-6], "start": "HH:MM", "end": "HH:MM"}] (UTC).',
    )
    failure_count = models.PositiveIntegerField(default=0, help_text="Recent job failures here.")
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def gpu_count(self) -> int:
        return len(self.gpus or [])


class PriorityClass(models.TextChoices):
    PRODUCTION = "production", "Production (never preempted by lower classes)"
    EXPERIMENT = "experiment", "Experiment"
    EXPLORATION = "exploration", "Exploration (cheap, preemptible)"


PRIORITY_RANK: dict[str, int] = {
    PriorityClass.PRODUCTION: 300,
    PriorityClass.EXPERIMENT: 200,
    PriorityClass.EXPLORATION: 100,
}


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    ADMITTED = "admitted", "Admitted"
    PLACED = "placed", "Placed"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    PREEMPTED = "preempted", "Preempted"
    CANCELLED = "cancelled", "Cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# The lifecycle. `preempted -> pending` is the requeue after a checkpointed stop; `placed/running
# -> pending` is the reconciler's requeue of a job whose node was lost.
JOB_MOVES: dict[str, set[str]] = {
    JobState.PENDING: {JobState.ADMITTED, JobState.CANCELLED, JobState.FAILED},
    JobState.ADMITTED: {JobState.PLACED, JobState.PENDING, JobState.CANCELLED},
    JobState.PLACED: {
        JobState.RUNNING,
        JobState.PENDING,
        JobState.PREEMPTED,
        JobState.FAILED,
        JobState.CANCELLED,
    },
    JobState.RUNNING: {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.PREEMPTED,
        JobState.PENDING,
        JobState.CANCELLED,
    },
    JobState.PREEMPTED: {JobState.PENDING, JobState.CANCELLED},
    JobState.SUCCEEDED: set(),
    JobState.FAILED: set(),
    JobState.CANCELLED: set(),
}


class TrainingJob(WorkspaceOwned, CreatedRecord):
    """One training job: what to run (template or entry point), on what data, with what."""

    event_kind = "training_job"

    name = models.CharField(max_length=63, validators=[job_name_validator])
    template = models.CharField(
        max_length=40, blank=True, help_text="Built-in template, e.g. logreg, fine_ranking."
    )
    entry_point = models.CharField(
        max_length=200, blank=True, help_text="A registered user entry point instead of a template."
    )
    params = models.JSONField(default=dict, blank=True)
    compare_deployment = models.CharField(
        max_length=63,
        blank=True,
        help_text="The deployment whose production model the held-out evaluation compares "
        "against (blank: the workspace's only deployment, if it has one).",
    )
    dataset = models.ForeignKey(
        Dataset, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    record_set = models.ForeignKey(
        "curation.RecordSet",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The record set a language-model job (template lm_lora) trains on, instead of "
        "a dataset.",
    )
    base_job = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Incremental training: start from this job's model.",
    )

    # Requested resources.
    cpu_milli = models.PositiveIntegerField(default=1000, validators=[MinValueValidator(1)])
    memory_mb = models.PositiveIntegerField(default=1024, validators=[MinValueValidator(1)])
    gpu_count = models.PositiveSmallIntegerField(default=0, help_text="Whole GPUs.")
    gpu_milli = models.PositiveIntegerField(
        default=0, help_text="A fraction of one GPU (1-999), when gpu_count is 0."
    )
    gpu_type = models.CharField(max_length=40, blank=True, help_text="Required GPU type, if any.")
    workers = models.PositiveSmallIntegerField(default=1, help_text="Gang size (all or nothing).")
    priority_class = models.CharField(
        max_length=12, choices=PriorityClass.choices, default=PriorityClass.EXPERIMENT
    )

    # Lifecycle.
    state = models.CharField(max_length=10, choices=JobState.choices, default=JobState.PENDING)
    state_reason = models.CharField(max_length=500, blank=True)
    preemptible = models.BooleanField(default=False)
    over_quota = models.BooleanField(default=False, help_text="Admitted over quota (audit).")
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    assigned_gpus = models.JSONField(
        default=list, blank=True, help_text='[{"index": 0, "milli": 1000}, ...] on the node.'
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    stop_requested = models.CharField(
        max_length=20, blank=True, help_text="'preempt' or 'cancel' while a stop is pending."
    )

    # Progress, streamed by the agent.
    step = models.PositiveBigIntegerField(default=0)
    total_steps = models.PositiveBigIntegerField(default=0)
    epoch = models.PositiveIntegerField(default=0)
    samples_per_s = models.FloatField(default=0)
    loss = models.FloatField(null=True, blank=True)
    eta_s = models.FloatField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)

    # Results.
    checkpoint_path = models.CharField(max_length=500, blank=True)
    checkpoint_step = models.PositiveBigIntegerField(default=0)
    model_path = models.CharField(
        max_length=500, blank=True, help_text="The model bundle under ARTIFACT_ROOT."
    )
    mlflow_run_id = models.CharField(max_length=64, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    usage = models.JSONField(
        default=dict,
        blank=True,
        help_text="Peak and total usage: cpu_peak_milli, memory_peak_mb, gpu_memory_peak_mb, "
        "cpu_hours, gpu_hours.",
    )

    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["state", "created_at"]),
            models.Index(fields=["workspace", "state"]),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def priority_rank(self) -> int:
        return PRIORITY_RANK[self.priority_class]


class JobMetric(WorkspaceOwnedCascade):
    """One measured value of a job at a step: loss, samples/s, held-out AUC, checkpoints."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metric_rows")
    step = models.PositiveBigIntegerField()
    name = models.CharField(max_length=64)
    value = models.FloatField()
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "name", "step", "id"]
        indexes = [models.Index(fields=["job", "name", "step"])]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value:g}"


class EntryPointKind(models.TextChoices):
    MODULE = "module", "Python module (importable dotted path)"
    SCRIPT = "script", "Uploaded script (stored under ARTIFACT_ROOT)"


class EntryPoint(WorkspaceOwned, CreatedRecord):
    """User training code registered in a workspace; run in the child like a template.

    Contract: the module defines ``build(spec: BundleSpec) -> torch.nn.Module`` whose
    ``forward(dense, cat)`` returns one logit per row (optionally ``training_loss(dense, cat,
    label)``). The runner trains, checkpoints, evaluates and bundles it like a built-in template.
    """

    event_kind = "training_entry_point"

    name = models.CharField(max_length=63, validators=[job_name_validator])
    kind = models.CharField(max_length=10, choices=EntryPointKind.choices)
    module = models.CharField(max_length=200, blank=True, help_text="Dotted path (kind=module).")
    script_path = models.CharField(
        max_length=500, blank=True, help_text="Relative to ARTIFACT_ROOT (kind=script)."
    )
    sha256 = models.CharField(max_length=64, blank=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="entry_point_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class Pipeline(WorkspaceOwned, CreatedRecord):
    """A DAG of stages, defined once per workspace: ``stages`` is
    ``[{"name": ..., "kind": ..., "after": [names], "params": {...}}, ...]``."""

    event_kind = "training_pipeline"

    name = models.CharField(max_length=63, validators=[job_name_validator])
    description = models.TextField(blank=True)
    stages = models.JSONField(default=list)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="pipeline_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class RunState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"


class PipelineRun(WorkspaceOwned, CreatedRecord):
    event_kind = "pipeline_run"

    pipeline = models.ForeignKey(Pipeline, on_delete=models.PROTECT, related_name="runs")
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.PENDING)
    params = models.JSONField(default=dict, blank=True)
    context = models.JSONField(
        default=dict, blank=True, help_text="Outputs passed between stages (dataset_id, job_id)."
    )
    error = models.TextField(blank=True)
    lease_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="While set and in the future, one worker is advancing the run (no other may).",
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.pipeline.name} run #{self.pk}"


class StageRun(WorkspaceOwned):
    run = models.ForeignKey(PipelineRun, on_delete=models.CASCADE, related_name="stage_runs")
    name = models.CharField(max_length=63)
    kind = models.CharField(max_length=40)
    position = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    output = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "name"], name="stage_run_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class CandidateEvaluation(WorkspaceOwned, CreatedRecord):
    """F11: a candidate feature's values, joined onto a dataset, trained with and without."""

    event_kind = "candidate_feature_evaluation"

    name = models.CharField(max_length=63, validators=[job_name_validator])
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="+")
    key_column = models.CharField(max_length=63)
    dtype = models.CharField(max_length=12, default="float")
    values_path = models.CharField(max_length=500, blank=True)
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.PENDING)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name


class TuningState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


TUNING_TERMINAL_STATES = frozenset(
    {TuningState.SUCCEEDED, TuningState.FAILED, TuningState.CANCELLED}
)


class TuningMetric(models.TextChoices):
    LOGLOSS = "logloss", "Validation log loss, calibrated (lower is better)"
    AUC = "auc", "Validation AUC (higher is better)"


class TuningPruner(models.TextChoices):
    MEDIAN = "median", "Median: stop a trial behind the finished trials' median"
    ASHA = "asha", "ASHA: asynchronous successive halving"
    NONE = "none", "None: every trial runs to its end"


class TuningJob(WorkspaceOwned, CreatedRecord):
    """A hyperparameter search (Katib's Experiment): trials are training jobs of one template on
    one dataset, sampled by Optuna's TPE from ``space`` and placed by the scheduler, at most
    ``parallelism`` at once, until ``n_trials`` or ``max_minutes``; the best trial by the
    validation ``metric`` is registered as a model version, or first trained again with
    ``cv_folds`` (``refit_cv_folds``, ``refit_job``). ``training.tuning`` advances it."""

    event_kind = "tuning_job"

    name = models.CharField(max_length=63, validators=[job_name_validator])
    template = models.CharField(max_length=40)
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="+")
    base_job = models.ForeignKey(
        TrainingJob,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The job whose template, dataset, params and resources were copied.",
    )
    params = models.JSONField(default=dict, blank=True, help_text="Fixed params of every trial.")
    space = models.JSONField(
        default=dict,
        help_text='{"lr": {"low": 0.0001, "high": 0.1, "log": true}, '
        '"embedding_dim": {"choices": [8, 16]}}',
    )
    metric = models.CharField(
        max_length=10, choices=TuningMetric.choices, default=TuningMetric.LOGLOSS
    )
    direction = models.CharField(max_length=10, default="minimize")
    pruner = models.CharField(
        max_length=10, choices=TuningPruner.choices, default=TuningPruner.MEDIAN
    )
    n_trials = models.PositiveSmallIntegerField(default=8, validators=[MinValueValidator(1)])
    max_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Time budget from the start (blank: trials decide)."
    )
    parallelism = models.PositiveSmallIntegerField(default=2, validators=[MinValueValidator(1)])
    seed = models.PositiveIntegerField(default=0)
    model_name = models.CharField(
        max_length=63, validators=[job_name_validator], help_text="Registered model of the best."
    )
    refit_cv_folds = models.PositiveSmallIntegerField(
        default=0,
        help_text="0: the best trial's model is registered as it is. k >= 2: once the trials "
        "are done, the best trial's params are trained again with cv_folds = k (train and "
        "validation rows pooled into k folds, the model their average) and that job's model "
        "is registered.",
    )
    refit_job = models.OneToOneField(
        TrainingJob,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tuning_refit",
        help_text="The best trial's cross-fitted retraining (refit_cv_folds >= 2).",
    )

    # What each trial job asks for.
    cpu_milli = models.PositiveIntegerField(default=1000, validators=[MinValueValidator(1)])
    memory_mb = models.PositiveIntegerField(default=1024, validators=[MinValueValidator(1)])
    gpu_count = models.PositiveSmallIntegerField(default=0)
    gpu_milli = models.PositiveIntegerField(default=0)
    gpu_type = models.CharField(max_length=40, blank=True)
    priority_class = models.CharField(
        max_length=12, choices=PriorityClass.choices, default=PriorityClass.EXPERIMENT
    )

    state = models.CharField(max_length=10, choices=TuningState.choices, default=TuningState.QUEUED)
    state_reason = models.CharField(max_length=500, blank=True)
    best_trial = models.ForeignKey(
        "TuningTrial", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    best_value = models.FloatField(null=True, blank=True)
    # The registered version lives in serving (to the right of training): its id and label.
    model_version_id = models.PositiveBigIntegerField(null=True, blank=True)
    model_version_label = models.CharField(max_length=100, blank=True)

    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "created_at"])]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"

    @property
    def is_terminal(self) -> bool:
        return self.state in TUNING_TERMINAL_STATES


class TrialState(models.TextChoices):
    RUNNING = "running", "Running"
    COMPLETE = "complete", "Complete"
    PRUNED = "pruned", "Pruned (stopped early by the pruner)"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class TuningTrial(WorkspaceOwnedCascade):
    """One trial of a tuning job: its sampled params and its child training job. What the tuner
    reads of it is validation only (``value``: the final validation metric; ``intermediate``:
    ``[[epoch, value], ...]``); this row has no place for a held-out metric."""

    event_kind = "tuning_trial"

    tuning_job = models.ForeignKey(TuningJob, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField()
    job = models.OneToOneField(TrainingJob, on_delete=models.PROTECT, related_name="tuning_trial")
    params = models.JSONField(default=dict, help_text="The sampled params.")
    state = models.CharField(max_length=10, choices=TrialState.choices, default=TrialState.RUNNING)
    value = models.FloatField(null=True, blank=True)
    intermediate = models.JSONField(default=list, blank=True)
    pruner_attrs = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tuning_job", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["tuning_job", "number"], name="tuning_trial_unique_number"
            )
        ]

    def __str__(self) -> str:
        return f"trial {self.number} of {self.tuning_job_id}"


class NotebookState(models.TextChoices):
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed to start"


NOTEBOOK_LIVE = (NotebookState.STARTING, NotebookState.RUNNING)


class NotebookBackend(models.TextChoices):
    PROCESS = "process", "Process on the web server"
    KUBERNETES = "kubernetes", "Pod in the cluster"


class NotebookServer(WorkspaceOwned):
    """A JupyterLab server one member started for themself in one workspace (X1): a process
    under a uid of its own (``training.sandbox.notebook_uid``), or a pod of its own under
    Kubernetes (``backend``), whose kernels hold an API token
    narrowed to this workspace and short-lived, and nothing of the platform's. It stops itself
    after ``idle_timeout_s`` without activity (``training.notebooks``)."""

    event_kind = "notebook_server"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(
        max_length=10, choices=NotebookState.choices, default=NotebookState.STARTING
    )
    backend = models.CharField(
        max_length=12, choices=NotebookBackend.choices, default=NotebookBackend.PROCESS
    )
    port = models.PositiveIntegerField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    secret = models.CharField(
        max_length=64, editable=False, help_text="Jupyter's own token; only its user sees it."
    )
    api_token = models.ForeignKey(
        "workspaces.ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    folder = models.CharField(max_length=500, blank=True)
    isolation = models.CharField(max_length=10, blank=True)
    idle_timeout_s = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "user"],
                condition=models.Q(state__in=["starting", "running"]),
                name="notebook_one_live_per_user",
            )
        ]

    def __str__(self) -> str:
        return f"notebook {self.pk} of {self.user_id}"

    @property
    def is_live(self) -> bool:
        return self.state in NOTEBOOK_LIVE
