"""Serializers of the serving API (the gateway's hot path uses none)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from serving.controllers import deployment_status
from serving.models import (
    Deployment,
    DeploymentChange,
    DeploymentPhase,
    ModelVersion,
    RegisteredModel,
)


class RegisteredModelSerializer(serializers.ModelSerializer):
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = RegisteredModel
        fields = [
            "id",
            "name",
            "description",
            "aliases",
            "mlflow_name",
            "created_at",
            "latest_version",
        ]

    def get_latest_version(self, obj) -> int | None:
        return getattr(obj, "latest", None)


class ModelVersionSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.name")
    job = serializers.IntegerField(source="job_id", allow_null=True)
    dataset = serializers.IntegerField(source="dataset_id", allow_null=True)

    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "model",
            "version",
            "source",
            "job",
            "dataset",
            "artifact_path",
            "features",
            "metrics",
            "evaluation",
            "importance",
            "artifacts",
            "mlflow_run_id",
            "mlflow_version",
            "gate_status",
            "gates",
            "quality",
            "description",
            "created_at",
        ]


class TrySerializer(serializers.Serializer):
    rows = serializers.JSONField(
        required=False,
        help_text="A ranking model's request: a list of 1 to 100 objects of raw feature values "
        "keyed by feature reference (the version's ``features``), one per candidate.",
    )
    prompt = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=4000,
        help_text="A language model's prompt, continued greedily.",
    )
    max_new_tokens = serializers.IntegerField(
        required=False, default=64, min_value=1, max_value=256
    )


class TryResultSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["ranking", "language"])
    version = serializers.IntegerField()
    replica = serializers.CharField(help_text="What scored the request (never production).")
    scores = serializers.ListField(child=serializers.FloatField(), required=False)
    rows = serializers.JSONField(required=False)
    model_ms = serializers.FloatField(required=False)
    prompt = serializers.CharField(required=False)
    completion = serializers.CharField(required=False)
    max_new_tokens = serializers.IntegerField(required=False)
    total_ms = serializers.FloatField()


class QuantizeSerializer(serializers.Serializer):
    method = serializers.ChoiceField(
        choices=["onnx_dynamic_int8", "torch_dynamic_int8"],
        required=False,
        error_messages={
            "invalid_choice": '"{input}" is not an int8 method; allowed values: '
            "onnx_dynamic_int8, torch_dynamic_int8"
        },
        help_text="The int8 method (default: the one the version takes: ONNX Runtime dynamic "
        "int8 for a neural ranker, torch.ao dynamic int8 for a language model).",
    )


class QualityOverrideSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=2000, help_text="Why the version may go on despite the failed quality gate."
    )
    deployment = serializers.CharField(
        max_length=63,
        required=False,
        help_text="The deployment whose production the gate compares with (default: the one "
        "the verdict was for, else the model's only deployment).",
    )


class VersionRegisterSerializer(serializers.Serializer):
    model = serializers.CharField(max_length=63)
    job_id = serializers.IntegerField(required=False)
    source = serializers.CharField(max_length=1000, required=False, help_text="runs:/ or models:/")
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    inputs = serializers.JSONField(
        required=False,
        help_text="An imported model's input mapping: {signature column: 'group:feature' or a "
        "plain name}, or a list in input order for a tensor or a state dict.",
    )
    dataset_id = serializers.IntegerField(
        required=False, help_text="The training dataset the mapped features come from."
    )
    architecture = serializers.JSONField(
        required=False,
        help_text='A state dict\'s architecture: {"kind": "mlp", "activation": "relu", '
        '"output": "logit"}.',
    )
    output = serializers.ChoiceField(
        choices=["probability", "logit"],
        required=False,
        default="probability",
        help_text="What the imported model's score is.",
    )
    run_gates = serializers.BooleanField(required=False, default=False)
    auto_deploy = serializers.CharField(
        max_length=63,
        required=False,
        allow_blank=True,
        help_text="Deployment to release the version to when its gates pass.",
    )


class AliasSerializer(serializers.Serializer):
    alias = serializers.CharField(max_length=40)
    version = serializers.IntegerField(allow_null=True)


class DeploymentStatusSerializer(serializers.Serializer):
    """What the backend's controller reports (``serving.controllers.deployment_status``)."""

    phase = serializers.ChoiceField(choices=DeploymentPhase.choices)
    message = serializers.CharField()
    generation = serializers.IntegerField(help_text="The desired state's generation.")
    observed_generation = serializers.IntegerField(
        help_text="The generation the controller last acted on; below ``generation``: Pending."
    )
    desired_replicas = serializers.IntegerField()
    ready_replicas = serializers.IntegerField()
    failures = serializers.IntegerField(help_text="Consecutive failed attempts.")
    last_transition_at = serializers.DateTimeField(allow_null=True)
    reconciled_at = serializers.DateTimeField(allow_null=True)


class DeploymentSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True)
    version_id = serializers.IntegerField(read_only=True)
    previous_version = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()
    status_detail = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "model",
            "version",
            "version_id",
            "previous_version",
            "previous_version_id",
            "backend",
            "device",
            "replicas",
            "scaling",
            "state",
            "routing_version",
            "generation",
            "status",
            "status_detail",
            "created_at",
            "updated_at",
        ]

    def get_previous_version(self, obj) -> int | None:
        return obj.previous_version.version if obj.previous_version_id else None

    @extend_schema_field(DeploymentStatusSerializer)
    def get_status(self, obj) -> dict:
        return DeploymentStatusSerializer(deployment_status(obj)).data

    def get_status_detail(self, obj) -> dict:
        """The backend's own report (processes, cluster objects), as the controller wrote it."""
        observed = getattr(obj, "observed", None)
        return observed.detail if observed is not None else {}


class DeploymentCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    version_id = serializers.IntegerField()
    backend = serializers.CharField(max_length=12, required=False, default="embedded")
    device = serializers.CharField(max_length=8, required=False, default="cpu")
    replicas = serializers.IntegerField(required=False, default=1)
    scaling = serializers.JSONField(required=False)


class ReleaseSerializer(serializers.Serializer):
    version_id = serializers.IntegerField(source="version")
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)


class RollbackSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500)


class DeploymentStopSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)


class ScaleSerializer(serializers.Serializer):
    replicas = serializers.IntegerField(required=False)
    scaling = serializers.JSONField(required=False)


class DeploymentChangeSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None)
    from_version = serializers.IntegerField(source="from_version.version", default=None)
    to_version = serializers.IntegerField(source="to_version.version", default=None)

    class Meta:
        model = DeploymentChange
        fields = ["kind", "from_version", "to_version", "reason", "actor", "detail", "created_at"]
