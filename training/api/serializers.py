"""Serializers of the training API."""

from __future__ import annotations

from rest_framework import serializers

from training.models import (
    CandidateEvaluation,
    EntryPoint,
    JobMetric,
    Pipeline,
    PipelineRun,
    PriorityClass,
    StageRun,
    TrainingJob,
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
    dataset = serializers.IntegerField(help_text="Dataset id (same workspace, ready).")
    params = serializers.JSONField(required=False, default=dict)
    base_job = serializers.IntegerField(
        required=False, allow_null=True, default=None, help_text="Incremental: start from it."
    )
    cpu_milli = serializers.IntegerField(required=False, default=1000)
    memory_mb = serializers.IntegerField(required=False, default=1024)
    gpu_count = serializers.IntegerField(required=False, default=0)
    gpu_milli = serializers.IntegerField(required=False, default=0)
    gpu_type = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")
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
