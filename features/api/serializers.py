"""Serializers of the feature registry API."""

from __future__ import annotations

from rest_framework import serializers

from features import registry as limits
from features.models import (
    Batch,
    Consumer,
    EntityKind,
    Feature,
    FeatureGroup,
    FeatureGroupVersion,
    Lifecycle,
)


class FeatureSpecSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    dtype = serializers.CharField(max_length=20)
    dimension = serializers.IntegerField(required=False, allow_null=True)
    description = serializers.CharField(
        required=False, allow_blank=True, max_length=limits.MAX_FEATURE_DESCRIPTION_CHARS
    )


class FeatureSerializer(serializers.ModelSerializer):
    class Meta:
        model = Feature
        fields = ["name", "dtype", "dimension", "description", "status", "added_in_version"]
        read_only_fields = fields


class VersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = FeatureGroupVersion
        fields = ["version", "features", "created_at"]
        read_only_fields = fields


class ConsumerSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", default=None)

    class Meta:
        model = Consumer
        fields = ["kind", "object_id", "label", "feature_name", "owner", "live", "created_at"]
        read_only_fields = fields


class FeatureGroupSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", default=None)
    producer = serializers.CharField(source="producer.username", default=None)
    successor = serializers.CharField(source="successor.name", default=None)
    features = serializers.SerializerMethodField()

    class Meta:
        model = FeatureGroup
        fields = [
            "name",
            "entity",
            "entity_keys",
            "event_time_column",
            "description",
            "tags",
            "owner",
            "producer",
            "online",
            "offline",
            "freshness_sla_seconds",
            "status",
            "current_version",
            "successor",
            "health_status",
            "health_changed_at",
            "last_ingested_at",
            "last_event_time",
            "features",
            "created_at",
        ]
        read_only_fields = fields

    def get_features(self, group: FeatureGroup) -> list[dict]:
        versions = getattr(group, "_prefetched_objects_cache", {}).get("versions")
        if versions is not None:
            current = next((v for v in versions if v.version == group.current_version), None)
            return current.features if current else []
        return self.context.get("current_features", {}).get(group.pk, [])


class FeatureGroupDetailSerializer(FeatureGroupSerializer):
    versions = VersionSerializer(many=True, read_only=True)
    feature_set = FeatureSerializer(many=True, read_only=True)
    consumers = ConsumerSerializer(many=True, read_only=True)

    class Meta(FeatureGroupSerializer.Meta):
        fields = [*FeatureGroupSerializer.Meta.fields, "versions", "feature_set", "consumers"]
        read_only_fields = fields


class FeatureGroupCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    entity = serializers.ChoiceField(choices=EntityKind.choices)
    entity_key = serializers.CharField(max_length=63, required=False)
    entity_keys = serializers.ListField(
        child=serializers.CharField(max_length=63),
        required=False,
        max_length=limits.MAX_ENTITY_KEYS,
    )
    event_time_column = serializers.CharField(max_length=63, default="event_time")
    features = serializers.ListField(
        child=serializers.JSONField(), max_length=limits.MAX_FEATURES_PER_GROUP
    )
    description = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=limits.MAX_GROUP_DESCRIPTION_CHARS
    )
    tags = serializers.ListField(
        child=serializers.CharField(max_length=limits.MAX_TAG_CHARS),
        required=False,
        default=list,
        max_length=limits.MAX_TAGS,
    )
    online = serializers.BooleanField(default=True)
    offline = serializers.BooleanField(default=True)
    freshness_sla_seconds = serializers.IntegerField(
        min_value=limits.MIN_FRESHNESS_SLA_S,
        max_value=limits.MAX_FRESHNESS_SLA_S,
        default=24 * 3600,
    )
    freshness_sla = serializers.IntegerField(
        min_value=limits.MIN_FRESHNESS_SLA_S,
        max_value=limits.MAX_FRESHNESS_SLA_S,
        required=False,
        help_text="Alias of freshness_sla_seconds.",
    )
    producer = serializers.CharField(max_length=150, required=False, allow_null=True)
    status = serializers.ChoiceField(
        choices=[Lifecycle.DRAFT, Lifecycle.ACTIVE], default=Lifecycle.ACTIVE
    )

    def validate(self, attrs):
        if "entity_keys" not in attrs:
            if "entity_key" not in attrs:
                raise serializers.ValidationError(
                    {"entity_keys": "give entity_keys (or entity_key)"}
                )
            attrs["entity_keys"] = [attrs["entity_key"]]
        attrs.pop("entity_key", None)
        if "freshness_sla" in attrs:
            attrs["freshness_sla_seconds"] = attrs.pop("freshness_sla")
        return attrs


class FeatureGroupUpdateSerializer(serializers.Serializer):
    description = serializers.CharField(
        required=False, allow_blank=True, max_length=limits.MAX_GROUP_DESCRIPTION_CHARS
    )
    tags = serializers.ListField(
        child=serializers.CharField(max_length=limits.MAX_TAG_CHARS),
        required=False,
        max_length=limits.MAX_TAGS,
    )
    freshness_sla_seconds = serializers.IntegerField(
        min_value=limits.MIN_FRESHNESS_SLA_S, max_value=limits.MAX_FRESHNESS_SLA_S, required=False
    )
    features = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        max_length=limits.MAX_FEATURES_PER_GROUP,
        help_text="A new schema: creates a new version.",
    )
    status = serializers.ChoiceField(choices=Lifecycle.choices, required=False)
    successor = serializers.CharField(
        max_length=63, required=False, help_text="Name of the group that upgrades this one."
    )
    producer = serializers.CharField(max_length=150, required=False, allow_null=True)


class FeatureStatusSerializer(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=[Lifecycle.ACTIVE, Lifecycle.DEPRECATED, Lifecycle.RETIRED]
    )


class BatchSerializer(serializers.ModelSerializer):
    producer = serializers.CharField(source="producer.username", default=None)

    class Meta:
        model = Batch
        fields = [
            "id",
            "version",
            "format",
            "rows",
            "bytes",
            "min_event_time",
            "max_event_time",
            "idempotency_key",
            "online_written",
            "producer",
            "created_at",
        ]
        read_only_fields = fields


class BatchAcceptedSerializer(BatchSerializer):
    replayed = serializers.BooleanField()

    class Meta(BatchSerializer.Meta):
        fields = [*BatchSerializer.Meta.fields, "replayed"]
        read_only_fields = fields


class OnlineLookupSerializer(serializers.Serializer):
    entities = serializers.ListField(
        child=serializers.JSONField(), help_text="Entity key values, or objects of key columns."
    )
    features = serializers.ListField(
        child=serializers.CharField(max_length=140),
        help_text="'group:feature' or 'group@v2:feature'.",
    )


class OnlineLookupResultSerializer(serializers.Serializer):
    features = serializers.ListField(child=serializers.CharField())
    rows = serializers.ListField(
        child=serializers.ListField(child=serializers.JSONField(allow_null=True))
    )
