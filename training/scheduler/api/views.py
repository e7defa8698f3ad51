"""REST views of the scheduler under /api/v1/workspaces/{ws}/scheduler/."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from features.models import Dataset
from training.models import JobState, PriorityClass
from training.scheduler import selectors, services
from training.scheduler.models import WorkspaceQuota
from training.scheduler.recommend import recommend
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Role


class QueueEntrySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)
    priority_class = serializers.ChoiceField(choices=PriorityClass.choices)
    position = serializers.IntegerField(allow_null=True, help_text="Place among waiting jobs.")
    request = serializers.CharField(help_text='e.g. "2 x V100" or "0.40 of a GPU".')
    cpu_milli = serializers.IntegerField()
    memory_mb = serializers.IntegerField()
    gpu_count = serializers.IntegerField()
    gpu_milli = serializers.IntegerField()
    gpu_type = serializers.CharField()
    workers = serializers.IntegerField()
    node = serializers.CharField(allow_null=True)
    over_quota = serializers.BooleanField()
    preemptible = serializers.BooleanField()
    borrowed = serializers.BooleanField()
    preemptions = serializers.IntegerField()
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()


class QueueViewSet(WorkspaceScopedViewSet):
    """The workspace's scheduling queue: waiting jobs in order, then running ones, with reasons."""

    serializer_class = QueueEntrySerializer

    def get_workspace_queryset(self) -> QuerySet:
        return WorkspaceQuota.objects.for_workspace(self.workspace)

    def list(self, request: Request, *args, **kwargs) -> Response:
        rows = selectors.queue_of(workspace=self.workspace)
        return Response(QueueEntrySerializer(rows, many=True).data)


class RecommendationSerializer(serializers.Serializer):
    template = serializers.CharField()
    dataset_rows = serializers.IntegerField()
    based_on_jobs = serializers.IntegerField()
    headroom = serializers.FloatField(required=False)
    observed_peak = serializers.DictField(required=False)
    cpu_milli = serializers.IntegerField(required=False)
    memory_mb = serializers.IntegerField(required=False)
    gpu_count = serializers.IntegerField(required=False)
    gpu_milli = serializers.IntegerField(required=False)
    savings = serializers.DictField(
        required=False, help_text="Requested-but-unused capacity it would have saved."
    )
    detail = serializers.CharField(required=False)


class RecommendationViewSet(WorkspaceScopedViewSet):
    """Right-sized resources for a new job from the peaks of similar past jobs (T6)."""

    serializer_class = RecommendationSerializer

    def get_workspace_queryset(self) -> QuerySet:
        return Dataset.objects.for_workspace(self.workspace)

    @extend_schema(
        parameters=[
            OpenApiParameter("template", str, required=True, description="e.g. logreg"),
            OpenApiParameter("dataset", int, required=False, description="Dataset id."),
        ]
    )
    def list(self, request: Request, *args, **kwargs) -> Response:
        template = request.query_params.get("template", "").strip()
        if not template:
            raise ValidationError({"template": "This query parameter is required."})
        dataset = None
        raw = request.query_params.get("dataset", "").strip()
        if raw:
            if not raw.isdigit():
                raise ValidationError({"dataset": "Use the dataset's id."})
            dataset = self.get_queryset().filter(pk=int(raw)).first()
            if dataset is None:
                raise ReferenceNotFound("No such dataset in this workspace.", attr="dataset")
        rec = recommend(workspace=self.workspace, template=template, dataset=dataset)
        return Response(RecommendationSerializer(rec).data)


class SchedulerQuotaSerializer(serializers.Serializer):
    gpu_type = serializers.CharField(allow_blank=True, max_length=40, default="")
    cpu_milli = serializers.IntegerField(allow_null=True, min_value=0, default=None)
    memory_mb = serializers.IntegerField(allow_null=True, min_value=0, default=None)
    gpu_milli = serializers.IntegerField(allow_null=True, min_value=0, default=None)
    used_cpu_milli = serializers.IntegerField(read_only=True)
    used_memory_mb = serializers.IntegerField(read_only=True)
    used_gpu_milli = serializers.IntegerField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)


class QuotaViewSet(WorkspaceScopedViewSet):
    """Quotas per GPU type (blank: all types) and what the workspace uses of them now.

    Work beyond a quota still runs, as preemptible, and is flagged for the admin console.
    """

    serializer_class = SchedulerQuotaSerializer
    action_roles = {"create": Role.ADMIN}

    def get_workspace_queryset(self) -> QuerySet:
        return WorkspaceQuota.objects.for_workspace(self.workspace)

    def list(self, request: Request, *args, **kwargs) -> Response:
        return Response(
            SchedulerQuotaSerializer(selectors.quotas_of(workspace=self.workspace), many=True).data
        )

    @extend_schema(responses={201: SchedulerQuotaSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        """Set (create or replace) the quota of one GPU type; recorded in the event log."""
        body = SchedulerQuotaSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.quota_set(actor=request.user, workspace=self.workspace, **body.validated_data)
        row = next(
            r
            for r in selectors.quotas_of(workspace=self.workspace)
            if r["gpu_type"] == body.validated_data["gpu_type"]
        )
        return Response(SchedulerQuotaSerializer(row).data, status=status.HTTP_201_CREATED)
