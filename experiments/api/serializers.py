"""Serializers of the experiments API (output shapes, and input shapes for the schema)."""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from experiments import services as limits
from experiments.models import Experiment, Layer, Metric, SequentialMethod, Snapshot, Spending, Unit
from training.models import RunState


class LayerSerializer(serializers.ModelSerializer):
    class Meta:
        model = Layer
        fields = ["name", "salt", "description", "created_at"]
        read_only_fields = ["salt", "created_at"]


class LayerCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    description = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class ExperimentSerializer(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name", read_only=True)
    layer = serializers.CharField(source="layer.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True, default=None)
    traffic_percent = serializers.FloatField(read_only=True)
    allocations = serializers.SerializerMethodField()

    class Meta:
        model = Experiment
        fields = [
            "key",
            "hypothesis",
            "deployment",
            "control_version",
            "arms",
            "layer",
            "unit",
            "primary_metric",
            "guardrails",
            "ramp_plan",
            "ramp_interval_s",
            "ramp_step",
            "traffic_percent",
            "next_ramp_at",
            "ramp_history",
            "block_start",
            "block_size",
            "allocations",
            "min_units",
            "alpha",
            "sequential_method",
            "spending",
            "state",
            "review",
            "stop_reason",
            "decision",
            "owner",
            "created_at",
            "started_at",
            "ended_at",
        ]
        read_only_fields = fields

    def get_allocations(self, obj: Experiment) -> list[dict]:
        from experiments.services import current_allocations

        return current_allocations(obj) if obj.state == "running" else []


class GuardrailSerializer(serializers.Serializer):
    metric = serializers.ChoiceField(choices=Metric.choices)
    max_drop = serializers.FloatField(min_value=0, max_value=limits.MAX_GUARDRAIL_DROP)


class ExperimentCreateSerializer(serializers.Serializer):
    key = serializers.CharField(max_length=63)
    hypothesis = serializers.CharField(max_length=limits.MAX_HYPOTHESIS_CHARS)
    deployment = serializers.CharField(max_length=63, help_text="Deployment name.")
    treatment_versions = serializers.ListField(
        child=serializers.IntegerField(),
        min_length=1,
        max_length=limits.MAX_TREATMENTS,
        help_text="ModelVersion ids",
    )
    layer = serializers.CharField(max_length=63, required=False, default="default")
    unit = serializers.ChoiceField(choices=Unit.choices, default=Unit.USER)
    primary_metric = serializers.ChoiceField(choices=Metric.choices, default=Metric.CTR)
    guardrails = GuardrailSerializer(  # type: ignore[call-arg]  # many=True: a ListSerializer's max_length
        many=True, required=False, default=list, max_length=limits.MAX_GUARDRAILS
    )
    ramp_plan = serializers.ListField(
        child=serializers.FloatField(),
        min_length=1,
        max_length=limits.MAX_RAMP_STEPS,
        default=[1, 5, 20, 50],
    )
    ramp_interval_s = serializers.IntegerField(
        min_value=1, max_value=limits.MAX_RAMP_INTERVAL_S, default=86400
    )
    min_units = serializers.IntegerField(
        min_value=limits.MIN_UNITS, max_value=limits.MAX_UNITS, default=100
    )
    alpha = serializers.FloatField(
        min_value=limits.MIN_ALPHA, max_value=limits.MAX_ALPHA, default=0.05
    )
    sequential_method = serializers.ChoiceField(
        choices=SequentialMethod.choices, default=SequentialMethod.GROUP_SEQUENTIAL
    )
    spending = serializers.ChoiceField(choices=Spending.choices, default=Spending.OBRIEN_FLEMING)


class NoteSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class StopSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500)


class ConcludeSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=[("promote", "promote"), ("discard", "discard")])
    arm = serializers.CharField(required=False, allow_null=True, max_length=100)
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class SnapshotSerializer(serializers.ModelSerializer):
    class Meta:
        model = Snapshot
        fields = [
            "id",
            "created_at",
            "traffic_percent",
            "srm_mismatch",
            "guardrail_breaches",
            "result",
        ]
        read_only_fields = fields


class FeedbackEventSerializer(serializers.Serializer):
    request_id = serializers.CharField(max_length=100)
    event_id = serializers.CharField(max_length=200, required=False)
    impressions = serializers.IntegerField(min_value=0, default=0)
    clicks = serializers.IntegerField(min_value=0, default=0)
    conversions = serializers.IntegerField(min_value=0, default=0)
    revenue = serializers.FloatField(min_value=0, default=0)


class FeedbackBatchSerializer(serializers.Serializer):
    events = FeedbackEventSerializer(many=True)


class FeedbackResultSerializer(serializers.Serializer):
    received = serializers.IntegerField()
    accepted = serializers.IntegerField()
    duplicates = serializers.IntegerField()
    unmatched = serializers.IntegerField()


# A declared field named ``label`` would shadow Field.label for the type checker: built inline.
LoopObjectSerializer = inline_serializer(
    name="LoopObject",
    fields={
        "kind": serializers.ChoiceField(choices=["dataset", "job", "model_version", "experiment"]),
        "id": serializers.IntegerField(),
        "label": serializers.CharField(),
        "url": serializers.CharField(help_text="The object's page in the web UI."),
        "state": serializers.CharField(required=False, help_text="An experiment's state."),
    },
    allow_null=True,
    help_text="What the stage made, linked to its page (null in lists, before the stage made "
    "it, or once it is gone).",
)


class LoopStageSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.CharField(help_text="The pipeline stage kind (samples, train, gates, ...).")
    state = serializers.ChoiceField(choices=RunState.choices)
    attempts = serializers.IntegerField()
    error = serializers.CharField(allow_blank=True)
    seconds = serializers.FloatField(allow_null=True, help_text="How long it ran, once ended.")
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    object = LoopObjectSerializer


class LoopSerializer(serializers.Serializer):
    """A loop's answer (its resource, create, retry; lists carry no stage objects)."""

    id = serializers.IntegerField()
    state = serializers.ChoiceField(choices=RunState.choices)
    group = serializers.CharField(allow_null=True, help_text="The feature group it tries.")
    features = serializers.ListField(child=serializers.CharField())
    deployment = serializers.CharField(allow_null=True, help_text="The deployment to beat.")
    error = serializers.CharField(allow_blank=True)
    failed_stage = serializers.CharField(allow_null=True)
    quality_gate_failed = serializers.BooleanField(
        help_text="The candidate lost to production on the quality gate (a maintainer may retry "
        "with quality_override)."
    )
    quality = serializers.DictField(help_text="The quality gate's comparison, once it ran.")
    stages = LoopStageSerializer(many=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class LoopCreateSerializer(serializers.Serializer):
    group = serializers.CharField(
        max_length=63,
        required=False,
        help_text="The feature group whose features to try (all unless named).",
    )
    evaluation = serializers.IntegerField(
        required=False,
        help_text="Or a finished candidate-feature evaluation: its values become the feature "
        "group cand_<name> and that is tried.",
    )
    features = serializers.ListField(
        child=serializers.CharField(max_length=63),
        required=False,
        min_length=1,
        max_length=64,
        help_text="Feature names of the group; default: all of its current version.",
    )
    deployment = serializers.CharField(
        max_length=63,
        required=False,
        help_text="The production deployment to beat (default: the loop policy's, else the "
        "workspace's only deployment).",
    )

    def validate(self, attrs):
        if not attrs.get("group") and attrs.get("evaluation") is None:
            raise serializers.ValidationError({"group": "name a feature group (or an evaluation)"})
        return attrs


class LoopRetrySerializer(serializers.Serializer):
    quality_override = serializers.CharField(
        max_length=2000,
        required=False,
        allow_blank=True,
        help_text="A maintainer's reason to let a candidate past a failed quality gate "
        "(recorded and flagged for audit).",
    )
