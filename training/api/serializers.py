"""Serializers of the training API."""

from __future__ import annotations

from rest_framework import serializers

from training.models import (
    CandidateEvaluation,
    EntryPoint,
    JobMetric,
    NotebookServer,
    Pipeline,
    PipelineRun,
    PriorityClass,
    StageRun,
    TrainingJob,
    TuningJob,
    TuningMetric,
    TuningPruner,
    TuningTrial,
)
from training.params import PARAM_TYPES


class TrainingJobSerializer(serializers.ModelSerializer):
    dataset = serializers.IntegerField(source="dataset_id", allow_null=True)
    dataset_label = serializers.SerializerMethodField()
    node = serializers.CharField(source="node.name", default=None)
    base_job = serializers.IntegerField(source="base_job_id", allow_null=True)
    created_by = serializers.CharField(source="created_by.username", default=None)
    progress = serializers.SerializerMethodField(help_text="step / total_steps (0-1).")

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "name",
            "template",
            "entry_point",
            "params",
            "dataset",
            "dataset_label",
            "record_set",
            "base_job",
            "cpu_milli",
            "memory_mb",
            "gpu_count",
            "gpu_milli",
            "gpu_type",
            "workers",
            "priority_class",
            "preemptible",
            "state",
            "state_reason",
            "node",
            "assigned_gpus",
            "attempts",
            "max_attempts",
            "stop_requested",
            "step",
            "total_steps",
            "epoch",
            "samples_per_s",
            "loss",
            "eta_s",
            "progress",
            "progress_at",
            "checkpoint_step",
            "model_path",
            "mlflow_run_id",
            "metrics",
            "usage",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_dataset_label(self, job: TrainingJob) -> str | None:
        return str(job.dataset) if job.dataset_id else None

    def get_progress(self, job: TrainingJob) -> float:
        return min(1.0, job.step / job.total_steps) if job.total_steps else 0.0


class TrainingJobCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    template = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")
    entry_point = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )
    dataset = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Dataset id (same workspace, ready): what every template but the language "
        "models (lm_lora, lm_full) trains on.",
    )
    record_set = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Record set id (same workspace, ready): what an lm_lora or lm_full job "
        "trains on (instead of a dataset).",
    )
    params = serializers.JSONField(required=False, default=dict)
    base_job = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="Incremental: start from it."
    )
    cpu_milli = serializers.IntegerField(required=False, default=1000)
    memory_mb = serializers.IntegerField(required=False, default=1024)
    gpu_count = serializers.IntegerField(required=False, default=0)
    gpu_milli = serializers.IntegerField(required=False, default=0)
    gpu_type = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")
    workers = serializers.IntegerField(
        required=False,
        default=1,
        help_text="Data-parallel ranks (1-16), each with cpu_milli, memory_mb and its GPUs; "
        "placed all or none, on one node where one node holds them all.",
    )
    priority_class = serializers.ChoiceField(
        choices=PriorityClass.choices, required=False, default=PriorityClass.EXPERIMENT
    )
    preemptible = serializers.BooleanField(required=False, default=False)

    def validate_params(self, params):
        """An object; what it may hold is the service's one check
        (``training.params.job_params_check``), which names ``params.<name>``."""
        if not isinstance(params, dict):
            raise serializers.ValidationError("Give the parameters as an object.")
        return params


class ParamSchemaSerializer(serializers.Serializer):
    """One param of a template's schema (``training.params.Param``)."""

    type = serializers.ChoiceField(choices=PARAM_TYPES)
    default = serializers.JSONField(help_text="What the job runs with when not given it.")
    label = serializers.CharField(allow_blank=True)
    help = serializers.CharField(allow_blank=True)
    allowed = serializers.CharField(help_text="What it allows, in words (as errors say it).")
    advanced = serializers.BooleanField(help_text="Tuning few jobs need (a form may fold it).")
    min = serializers.FloatField(required=False, help_text="Inclusive; each item's for int_list.")
    max = serializers.FloatField(required=False, help_text="Inclusive; each item's for int_list.")
    choices = serializers.ListField(child=serializers.CharField(), required=False)
    fields = serializers.DictField(
        child=serializers.DictField(), required=False, help_text="An object's own params."
    )


class TrainingTemplateSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    params = serializers.DictField(
        child=ParamSchemaSerializer(),
        help_text="Every param a job of this template may be given (the shared ones included), "
        "with the workspace's limits on epochs and max_steps.",
    )


class JobLogSerializer(serializers.Serializer):
    """A chunk of a job's log (what the node agent and the training child wrote, in order)."""

    offset = serializers.IntegerField(help_text="The byte offset this chunk starts at.")
    next_offset = serializers.IntegerField(help_text="Ask for this offset to read on.")
    size = serializers.IntegerField(help_text="The log's size in bytes now.")
    text = serializers.CharField(help_text="The chunk, decoded as UTF-8 (bad bytes replaced).")
    done = serializers.BooleanField(help_text="The job has ended: the log grows no more.")
    state = serializers.CharField()


class JobMetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobMetric
        fields = ["step", "name", "value", "recorded_at"]
        read_only_fields = fields


class EntryPointSerializer(serializers.ModelSerializer):
    class Meta:
        model = EntryPoint
        fields = ["id", "name", "kind", "module", "sha256", "description", "created_at"]
        read_only_fields = fields


class EntryPointCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    module = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    script = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="Python source defining build(spec) -> torch.nn.Module.",
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")


class StageRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = StageRun
        fields = [
            "name",
            "kind",
            "position",
            "state",
            "attempts",
            "output",
            "error",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class PipelineRunSerializer(serializers.ModelSerializer):
    pipeline = serializers.CharField(source="pipeline.name")
    stages = StageRunSerializer(source="stage_runs", many=True)

    class Meta:
        model = PipelineRun
        fields = [
            "id",
            "pipeline",
            "state",
            "params",
            "context",
            "error",
            "stages",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class PipelineSerializer(serializers.ModelSerializer):
    class Meta:
        model = Pipeline
        fields = ["id", "name", "description", "stages", "created_at"]
        read_only_fields = ["id", "created_at"]


class PipelineRunCreateSerializer(serializers.Serializer):
    params = serializers.JSONField(required=False, default=dict)


class CandidateEvaluationSerializer(serializers.ModelSerializer):
    dataset = serializers.IntegerField(source="dataset_id")

    class Meta:
        model = CandidateEvaluation
        fields = [
            "id",
            "name",
            "dataset",
            "key_column",
            "dtype",
            "state",
            "result",
            "error",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class CandidateEvaluationCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    dataset = serializers.IntegerField(help_text="A ready dataset of the workspace.")
    key_column = serializers.CharField(
        max_length=63, help_text="One of the dataset's entity keys, e.g. user_id."
    )
    dtype = serializers.CharField(max_length=12, required=False, default="float")
    file = serializers.FileField(
        help_text="CSV or Parquet with the key column and a 'value' column."
    )
    template = serializers.CharField(max_length=40, required=False, default="logreg")


class TuningTrialSerializer(serializers.ModelSerializer):
    """One trial: its sampled params, its training job and what the tuner read of it
    (validation only)."""

    job = serializers.IntegerField(source="job_id")
    job_name = serializers.CharField(source="job.name")
    job_state = serializers.CharField(source="job.state")
    intermediate = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField()),
        help_text="[[epoch, validation metric], ...] as the trial ran.",
    )

    class Meta:
        model = TuningTrial
        fields = [
            "number",
            "job",
            "job_name",
            "job_state",
            "params",
            "state",
            "value",
            "intermediate",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class TuningJobSerializer(serializers.ModelSerializer):
    dataset = serializers.IntegerField(source="dataset_id")
    base_job = serializers.IntegerField(source="base_job_id", allow_null=True)
    best_trial = serializers.IntegerField(
        source="best_trial.number", default=None, help_text="The best trial's number."
    )
    created_by = serializers.CharField(source="created_by.username", default=None)
    refit_job = serializers.IntegerField(
        source="refit_job_id",
        allow_null=True,
        help_text="The job that trains the best trial's params again with cv_folds "
        "(refit_cv_folds >= 2); its model is the one registered.",
    )
    trials_started = serializers.SerializerMethodField()
    trials_finished = serializers.SerializerMethodField()

    class Meta:
        model = TuningJob
        fields = [
            "id",
            "name",
            "template",
            "dataset",
            "base_job",
            "params",
            "space",
            "metric",
            "direction",
            "pruner",
            "n_trials",
            "max_minutes",
            "parallelism",
            "seed",
            "model_name",
            "refit_cv_folds",
            "refit_job",
            "cpu_milli",
            "memory_mb",
            "gpu_count",
            "gpu_milli",
            "gpu_type",
            "priority_class",
            "state",
            "state_reason",
            "trials_started",
            "trials_finished",
            "best_trial",
            "best_value",
            "model_version_id",
            "model_version_label",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_trials_started(self, tuning: TuningJob) -> int:
        return len(tuning.trials.all())

    def get_trials_finished(self, tuning: TuningJob) -> int:
        return sum(1 for t in tuning.trials.all() if t.state != "running")


class TuningJobDetailSerializer(TuningJobSerializer):
    trials = TuningTrialSerializer(many=True)
    importances = serializers.SerializerMethodField(
        help_text="Optuna's parameter importances (fANOVA) over the complete trials; empty "
        "with fewer than two."
    )

    class Meta(TuningJobSerializer.Meta):
        fields = [*TuningJobSerializer.Meta.fields, "trials", "importances"]
        read_only_fields = fields

    def get_importances(self, tuning: TuningJob) -> dict[str, float]:
        from training.tuning import tuning_importances

        return tuning_importances(tuning, list(tuning.trials.all()))


class TuningJobCreateSerializer(serializers.Serializer):
    """What a tuning job needs: a template and dataset (or a ``base_job`` to copy them, its
    params and resources from), the search space (default: the template's), the budget."""

    name = serializers.CharField(max_length=63)
    template = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")
    dataset = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="Dataset id (ready)."
    )
    base_job = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Copy the template, dataset, params and resources of this job.",
    )
    params = serializers.JSONField(
        required=False, default=None, help_text="Fixed params of every trial (an object)."
    )
    space = serializers.JSONField(
        required=False,
        default=None,
        help_text='{"lr": {"low": 0.0001, "high": 0.1, "log": true}, "embedding_dim": '
        '{"choices": [8, 16, 32]}} over the template\'s params (default: its default space).',
    )
    metric = serializers.ChoiceField(
        choices=TuningMetric.choices, required=False, default=TuningMetric.LOGLOSS
    )
    pruner = serializers.ChoiceField(
        choices=TuningPruner.choices, required=False, default=TuningPruner.MEDIAN
    )
    n_trials = serializers.IntegerField(required=False, default=8, help_text="Budget: trials.")
    max_minutes = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="Budget: minutes (optional)."
    )
    parallelism = serializers.IntegerField(
        required=False, default=2, help_text="Trials at once (within the workspace's quota)."
    )
    seed = serializers.IntegerField(required=False, default=0)
    model_name = serializers.CharField(
        max_length=63, required=False, allow_blank=True, default="",
        help_text="Registered model for the best trial (default: the tuning job's name).",
    )  # fmt: skip
    refit_cv_folds = serializers.IntegerField(
        required=False,
        default=0,
        help_text="0: register the best trial's model. k >= 2 (a template with cv_folds): "
        "train the best trial's params once more with cv_folds = k on the train and "
        "validation rows pooled, and register that model.",
    )
    cpu_milli = serializers.IntegerField(required=False, allow_null=True, default=None)
    memory_mb = serializers.IntegerField(required=False, allow_null=True, default=None)
    gpu_count = serializers.IntegerField(required=False, allow_null=True, default=None)
    gpu_milli = serializers.IntegerField(required=False, allow_null=True, default=None)
    gpu_type = serializers.CharField(
        max_length=40, required=False, allow_blank=True, allow_null=True, default=None
    )
    priority_class = serializers.ChoiceField(
        choices=PriorityClass.choices, required=False, allow_null=True, default=None
    )

    def validate_params(self, params):
        if params is not None and not isinstance(params, dict):
            raise serializers.ValidationError("Give the fixed parameters as an object.")
        return params

    def validate_space(self, space):
        if space is not None and not isinstance(space, dict):
            raise serializers.ValidationError(
                'Give an object: {"param": {"low": .., "high": ..} or {"choices": [..]}}.'
            )
        return space


class NotebookServerSerializer(serializers.ModelSerializer):
    """A member's JupyterLab server; ``url`` (with Jupyter's token) is its member's alone."""

    url = serializers.SerializerMethodField(
        help_text="Where the browser opens JupyterLab, once running ('' before and after)."
    )
    log_tail = serializers.SerializerMethodField(help_text="The server's last log lines.")

    class Meta:
        model = NotebookServer
        fields = [
            "id",
            "state",
            "url",
            "backend",
            "isolation",
            "idle_timeout_s",
            "created_at",
            "started_at",
            "stopped_at",
            "stop_reason",
            "log_tail",
        ]
        read_only_fields = fields

    def get_url(self, obj: NotebookServer) -> str:
        from training.notebooks import notebook_url

        request = self.context.get("request")
        if obj.state != "running" or request is None or request.user.pk != obj.user_id:
            return ""
        return notebook_url(obj, request.get_host())

    def get_log_tail(self, obj: NotebookServer) -> str:
        from training.notebooks import log_tail

        return log_tail(obj) if obj.state == "failed" else ""
