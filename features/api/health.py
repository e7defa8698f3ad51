"""REST view of a feature group's health: its current state and the history of its checks."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from features.models import FeatureGroup, HealthCheck, HealthStatus
from features.selectors import feature_group_get, health_history
from workspaces.api.viewsets import WorkspaceScopedViewSet


class HealthCheckSerializer(serializers.ModelSerializer):
    class Meta:
        model = HealthCheck
        fields = [
            "id",
            "checked_at",
            "status",
            "freshness_lag_seconds",
            "coverage",
            "drift_psi",
            "consistency",
            "problems",
        ]
        read_only_fields = fields


class HealthReportSerializer(serializers.Serializer):
    """The group's current health, its latest check, and a page of its check history."""

    name = serializers.CharField()
    health_status = serializers.ChoiceField(choices=HealthStatus.choices)
    health_changed_at = serializers.DateTimeField(allow_null=True)
    freshness_sla_seconds = serializers.IntegerField()
    last_ingested_at = serializers.DateTimeField(allow_null=True)
    last_event_time = serializers.DateTimeField(allow_null=True)
    online_materialized_at = serializers.DateTimeField(allow_null=True)
    latest = HealthCheckSerializer(allow_null=True)
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = HealthCheckSerializer(many=True)


class FeatureGroupHealthViewSet(WorkspaceScopedViewSet):
    """Health of one feature group: freshness, coverage, drift and consistency over time."""

    serializer_class = HealthCheckSerializer
    group: FeatureGroup

    def get_workspace_queryset(self) -> QuerySet:
        self.group = feature_group_get(workspace=self.workspace, name=self.kwargs["name"])
        self.group.workspace = self.workspace  # already loaded: spare the selector a query
        return health_history(group=self.group).order_by("-checked_at", "-id")

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=HealthStatus.values, description="Only these.")
        ],
        responses={200: HealthReportSerializer},
    )
    def list(self, request: Request, ws: str, name: str) -> Response:
        history = self.get_queryset()
        latest = history.first()
        wanted = request.query_params.get("status")
        if wanted:
            if wanted not in HealthStatus.values:
                raise serializers.ValidationError(
                    {"status": f"one of {', '.join(HealthStatus.values)}"}
                )
            history = history.filter(status=wanted)
        page = self.paginate_queryset(history)
        response = self.get_paginated_response(HealthCheckSerializer(page, many=True).data)
        group = self.group
        response.data = {
            "name": group.name,
            "health_status": group.health_status,
            "health_changed_at": group.health_changed_at,
            "freshness_sla_seconds": group.freshness_sla_seconds,
            "last_ingested_at": group.last_ingested_at,
            "last_event_time": group.last_event_time,
            "online_materialized_at": group.online_materialized_at,
            "latest": HealthCheckSerializer(latest).data if latest else None,
            **response.data,
        }
        return response
