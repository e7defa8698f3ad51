"""The shapes of the lineage API's answers, for the OpenAPI schema (the views answer the dicts
``lineage.queries`` builds; Schemathesis checks those answers against these shapes).

A node's ``label`` is added in ``get_fields`` (and objects with one are built with
``inline_serializer``): a declared field of that name shadows ``Field.label`` for the type
checker."""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from lineage.models import EdgeType


class LineageNodeSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="<kind>:<id>, what the node query parameter takes.")
    kind = serializers.CharField(help_text="feature_group, feature, dataset, job, ...")
    object_id = serializers.CharField()
    owner = serializers.CharField(allow_blank=True)
    live = serializers.BooleanField(help_text="False once retired, deleted or removed.")
    status = serializers.CharField(allow_blank=True, help_text="Last state seen.")
    first_seen_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()

    def get_fields(self) -> dict[str, serializers.Field]:
        return {**super().get_fields(), "label": serializers.CharField(allow_blank=True)}


class LineageGraphNodeSerializer(LineageNodeSerializer):
    level = serializers.IntegerField(
        help_text="Steps from the root: negative upstream, positive downstream."
    )
    url = serializers.CharField(allow_blank=True, help_text="The object's page ('' if none).")


class LineageUnusedNodeSerializer(LineageNodeSerializer):
    idle_since = serializers.DateTimeField(
        help_text="When it was last consumed, else when it first appeared."
    )


def _nodes_of(name: str, field: str, help_text: str) -> serializers.Serializer:
    return inline_serializer(
        name=name,
        fields={
            "root": serializers.CharField(),
            field: LineageNodeSerializer(many=True, help_text=help_text),
        },
    )


GRAPH = inline_serializer(
    name="LineageGraph",
    fields={
        "root": serializers.CharField(),
        "direction": serializers.ChoiceField(choices=["upstream", "downstream", "both"]),
        "depth": serializers.IntegerField(),
        "truncated": serializers.BooleanField(help_text="More nodes than the cap were reached."),
        "nodes": LineageGraphNodeSerializer(many=True),
        "edges": inline_serializer(
            name="LineageEdge",
            fields={
                "src": serializers.CharField(),
                "dst": serializers.CharField(),
                "type": serializers.ChoiceField(choices=EdgeType.choices),
                "active": serializers.BooleanField(help_text="False once the use ended."),
            },
            many=True,
        ),
    },
)

IMPACT = inline_serializer(
    name="LineageImpact",
    fields={
        "root": serializers.CharField(),
        "depth": serializers.IntegerField(),
        "counts": serializers.DictField(
            child=serializers.IntegerField(), help_text="Live objects downstream, by kind."
        ),
        "total": serializers.IntegerField(),
        "owners": inline_serializer(
            name="LineageOwner",
            fields={"owner": serializers.CharField(), "items": serializers.IntegerField()},
            many=True,
        ),
        "items": inline_serializer(
            name="LineageImpactItem",
            fields={
                "key": serializers.CharField(),
                "kind": serializers.CharField(),
                "label": serializers.CharField(allow_blank=True),
                "owner": serializers.CharField(allow_blank=True),
                "depth": serializers.IntegerField(),
            },
            many=True,
            help_text="The first 100, by kind.",
        ),
        "truncated": serializers.BooleanField(help_text="total is more than items lists."),
    },
)

CONSUMERS = _nodes_of("LineageConsumers", "consumers", "Objects that use the node now.")
FEATURES = _nodes_of("LineageFeatures", "features", "Feature groups and features upstream.")
MODELS = _nodes_of("LineageModels", "models", "Model versions downstream.")

UNUSED = inline_serializer(
    name="LineageUnused",
    fields={
        "days": serializers.IntegerField(),
        "unused": LineageUnusedNodeSerializer(many=True),
    },
)
