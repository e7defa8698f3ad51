"""REST views of the scheduler under /api/v1/workspaces/{ws}/scheduler/."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import exceptions, mixins, permissions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from features.models import Dataset
from training.models import JobState, PriorityClass
from training.scheduler import selectors, services
from training.scheduler.recommend import recommend
from workspaces import services as workspace_services
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import QuotaRequest, Role, WorkspaceQuota


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
    pagination_class = None  # the whole queue, in order

    def get_workspace_queryset(self) -> QuerySet:
        return WorkspaceQuota.objects.for_workspace(self.workspace)

    def list(self, request: Request, *args, **kwargs) -> Response:
        rows = selectors.queue_of(workspace=self.workspace)
        return Response(QueueEntrySerializer(rows, many=True).data)


@extend_schema_serializer(many=False)  # `list` answers one recommendation, not a page
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
    storage_gb = serializers.IntegerField(
        allow_null=True, min_value=0, default=None, help_text="All-types row only."
    )
    used_cpu_milli = serializers.IntegerField(read_only=True)
    used_memory_mb = serializers.IntegerField(read_only=True)
    used_gpu_milli = serializers.IntegerField(read_only=True)
    used_storage_gb = serializers.FloatField(read_only=True, allow_null=True)
    updated_at = serializers.DateTimeField(read_only=True)


class PlatformAdminWrites(permissions.BasePermission):
    """Unsafe methods only for platform admins (superusers); workspace admins ask instead."""

    message = (
        "Quotas are changed by platform admins only; ask for a change with "
        "POST scheduler/quota-requests/."
    )

    def has_permission(self, request: Request, view) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return bool(request.user and request.user.is_superuser)


class QuotaViewSet(WorkspaceScopedViewSet):
    """Quotas per GPU type (blank: all types) and what the workspace uses of them now.

    Work beyond a quota still runs, as preemptible, and is flagged for the admin console.
    Only platform admins change quotas (each change is an event); a workspace admin files a
    quota request instead.
    """

    serializer_class = SchedulerQuotaSerializer
    permission_classes = [*WorkspaceScopedViewSet.permission_classes, PlatformAdminWrites]
    action_roles = {"create": Role.ADMIN}

    def get_workspace_queryset(self) -> QuerySet:
        return WorkspaceQuota.objects.for_workspace(self.workspace)

    pagination_class = None  # one row per GPU type, never a page

    def list(self, request: Request, *args, **kwargs) -> Response:
        return Response(
            SchedulerQuotaSerializer(selectors.quotas_of(workspace=self.workspace), many=True).data
        )

    @extend_schema(responses={201: SchedulerQuotaSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        """Set (create or replace) the quota of one GPU type (platform admins only); recorded
        in the event log."""
        body = SchedulerQuotaSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.quota_set(actor=request.user, workspace=self.workspace, **body.validated_data)
        row = next(
            r
            for r in selectors.quotas_of(workspace=self.workspace)
            if r["gpu_type"] == body.validated_data["gpu_type"]
        )
        return Response(SchedulerQuotaSerializer(row).data, status=status.HTTP_201_CREATED)


class QuotaRequestSerializer(serializers.ModelSerializer):
    requested_by = serializers.CharField(source="requested_by.username", read_only=True)
    decided_by = serializers.CharField(
        source="decided_by.username", read_only=True, allow_null=True
    )

    class Meta:
        model = QuotaRequest
        fields = [
            "id",
            "gpu_type",
            "cpu_milli",
            "memory_mb",
            "gpu_milli",
            "reason",
            "status",
            "requested_by",
            "requested_at",
            "decided_by",
            "decided_at",
        ]
        read_only_fields = ["status", "requested_at", "decided_at"]
        extra_kwargs = {"reason": {"max_length": 2000}}


class QuotaRequestViewSet(mixins.ListModelMixin, WorkspaceScopedViewSet):
    """Requests for a different scheduler quota: workspace admins file them, platform admins
    approve (which sets the quota) or reject them in the admin console."""

    serializer_class = QuotaRequestSerializer
    read_role = Role.ADMIN
    action_roles = {"create": Role.ADMIN}

    def get_workspace_queryset(self) -> QuerySet:
        return QuotaRequest.objects.for_workspace(self.workspace).select_related(
            "requested_by", "decided_by"
        )

    @extend_schema(responses={201: QuotaRequestSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        """Ask for a quota (one GPU type, blank: all types); nothing changes until approved."""
        body = QuotaRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not any(
            body.validated_data.get(k) is not None for k in ("cpu_milli", "memory_mb", "gpu_milli")
        ):
            raise exceptions.ValidationError({"gpu_milli": "Ask for at least one limit."})
        made = workspace_services.quota_request_create(
            actor=request.user, workspace=self.workspace, **body.validated_data
        )
        return Response(QuotaRequestSerializer(made).data, status=status.HTTP_201_CREATED)
