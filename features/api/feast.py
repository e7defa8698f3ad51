"""Feast interoperability over REST: import a ``feast registry-dump``, and Feast's own
``get-online-features`` (the path Feast's ``remote`` online store posts to, without a trailing
slash). The work is in ``features.feast``."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from features.feast import FEAST_DTYPES, feast_import, feast_online_features
from features.models import EntityKind
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.models import Role


class FeastImportSerializer(serializers.Serializer):
    registry = serializers.JSONField(
        help_text="What `feast registry-dump` prints: {project, entities, dataSources, "
        "featureViews, ...}. Value types imported: " + ", ".join(FEAST_DTYPES) + "."
    )
    entity_kinds = serializers.DictField(
        child=serializers.ChoiceField(choices=EntityKind.values),
        required=False,
        help_text="Feast entity name -> entity kind, where the name does not say it "
        "(user_id is read as user).",
    )
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Check and report without writing."
    )


class FeastImportedGroupSerializer(serializers.Serializer):
    name = serializers.CharField()
    outcome = serializers.ChoiceField(choices=["created", "unchanged", "new_version"])
    version = serializers.IntegerField()
    entity = serializers.CharField()
    entity_keys = serializers.ListField(child=serializers.CharField())
    event_time_column = serializers.CharField()
    features = serializers.IntegerField(help_text="How many features the group has.")


class FeastImportResultSerializer(serializers.Serializer):
    project = serializers.CharField()
    dry_run = serializers.BooleanField()
    feature_groups = FeastImportedGroupSerializer(many=True)


class FeastOnlineRequestSerializer(serializers.Serializer):
    features = serializers.ListField(
        child=serializers.CharField(max_length=140), help_text="'view:feature' (Feast's refs)."
    )
    entities = serializers.DictField(
        child=serializers.ListField(child=serializers.JSONField()),
        help_text="Join key -> its values, one per entity row.",
    )
    full_feature_names = serializers.BooleanField(
        required=False, default=False, help_text="Name features view__feature."
    )


class FeastFeatureVectorSerializer(serializers.Serializer):
    values = serializers.ListField(child=serializers.JSONField(allow_null=True))
    statuses = serializers.ListField(
        child=serializers.ChoiceField(choices=["PRESENT", "NULL_VALUE", "NOT_FOUND"])
    )
    event_timestamps = serializers.ListField(child=serializers.CharField())


class FeastOnlineMetadataSerializer(serializers.Serializer):
    feature_names = serializers.ListField(child=serializers.CharField())


class FeastOnlineResponseSerializer(serializers.Serializer):
    metadata = FeastOnlineMetadataSerializer()
    results = FeastFeatureVectorSerializer(many=True)


class FeastViewSet(WorkspaceScopedViewSet):
    """Feast's definitions in, Feast's online read out."""

    action_roles = {"import_registry": Role.DEVELOPER, "online_features": Role.VIEWER}
    serializer_class = FeastImportSerializer

    def get_workspace_queryset(self) -> QuerySet:  # no rows of its own
        raise Http404

    def _body(self, request: Request, required: str) -> dict:
        if not isinstance(request.data, dict):
            raise ValidationError({required: "send a JSON object"})
        return request.data

    @extend_schema(request=FeastImportSerializer, responses={201: FeastImportResultSerializer})
    @action(detail=False, methods=["post"], url_path="import")
    def import_registry(self, request: Request, ws: str) -> Response:
        """Import a Feast project's feature views as feature groups (``features.feast``):
        201 with each view's outcome (created, unchanged or new_version), 200 for a dry run."""
        body = self._body(request, "registry")
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ValidationError({"dry_run": "true or false"})
        result = feast_import(
            actor=request.user,
            workspace=self.workspace,
            document=body.get("registry"),
            entity_kinds=body.get("entity_kinds"),
            dry_run=dry_run,
        )
        return Response(result, status=200 if dry_run else 201)

    @extend_schema(
        request=FeastOnlineRequestSerializer,
        responses={200: FeastOnlineResponseSerializer},
        operation_id="workspaces_feast_get_online_features",
    )
    def online_features(self, request: Request, ws: str) -> Response:
        """Feast's ``get-online-features``: the values ``online-features/`` reads, in Feast's
        column-major answer, so Feast's remote online store reads from the platform."""
        body = self._body(request, "features")
        return Response(
            feast_online_features(
                workspace=self.workspace,
                features=body.get("features"),
                entities=body.get("entities"),
                full_feature_names=body.get("full_feature_names", False),
                feature_service=body.get("feature_service"),
            )
        )
