"""REST views of record sets: upload, run a data-building pipeline, read rows and reports."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import FileResponse
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from curation import services, stages
from curation.models import RecordSet, RecordSetStatus
from curation.selectors import record_set_rows, record_sets_of
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ConflictError
from workspaces.models import Role

MAX_PREVIEW_ROWS = 200


class RecordSetSerializer(serializers.ModelSerializer):
    built_from = serializers.SerializerMethodField(
        help_text="The record set a pipeline built this one from (null for an upload)."
    )
    created_by = serializers.CharField(source="created_by.username", default=None)
    stages_total = serializers.SerializerMethodField()

    class Meta:
        model = RecordSet
        fields = [
            "id",
            "name",
            "version",
            "source",
            "built_from",
            "status",
            "row_count",
            "columns",
            "bytes",
            "stages",
            "stages_total",
            "stages_done",
            "reports",
            "error",
            "created_by",
            "created_at",
            "built_at",
        ]
        read_only_fields = fields

    def get_built_from(self, record_set: RecordSet) -> dict | None:
        parent = record_set.parent
        if parent is None:
            return None
        return {"id": parent.pk, "name": parent.name, "version": parent.version}

    def get_stages_total(self, record_set: RecordSet) -> int:
        return len(record_set.stages)


class UploadSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    file = serializers.FileField(help_text="JSON Lines (one object a line), Parquet or CSV.")
    format = serializers.ChoiceField(
        choices=services.UPLOAD_FORMATS,
        required=False,
        help_text="Taken from the file name when not given (.jsonl, .parquet, .csv).",
    )


class RecordSetPipelineSerializer(serializers.Serializer):
    name = serializers.CharField(
        max_length=63, help_text="The output record set (its next version is built)."
    )
    stages = serializers.ListField(
        child=serializers.DictField(),
        min_length=1,
        max_length=stages.MAX_STAGES,
        help_text="Stages in order, each an object with a `kind`: "
        + ", ".join(stages.KINDS)
        + ". See the data-building docs for each kind's parameters.",
    )


class RecordSetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Versioned tables of records (text, instructions, chats) and the pipelines that build them."""

    serializer_class = RecordSetSerializer
    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.DEVELOPER, "pipeline": Role.DEVELOPER}
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_workspace_queryset(self) -> QuerySet:
        found = record_sets_of(workspace=self.workspace)
        if self.action == "list":
            for field in ("name", "status"):
                value = self.request.query_params.get(field)
                if value:
                    found = found.filter(**{field: value})
        return found

    def _located(self, record_set: RecordSet, code: int) -> Response:
        fresh = record_sets_of(workspace=self.workspace).get(pk=record_set.pk)
        location = reverse(
            "v1:record-set-detail", kwargs={"ws": self.workspace.slug, "pk": record_set.pk}
        )
        return Response(
            RecordSetSerializer(fresh).data, status=code, headers={"Location": location}
        )

    @extend_schema(
        request={"multipart/form-data": UploadSerializer},
        responses={201: RecordSetSerializer},
        description="Upload records as the next version of `name` (ready at once).",
    )
    def create(self, request: Request, ws: str) -> Response:
        serializer = UploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        upload = data["file"]
        record_set = services.record_set_upload(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            content=upload.read(),
            fmt=data.get("format") or services.format_of(upload.name),
        )
        return self._located(record_set, status.HTTP_201_CREATED)

    @extend_schema(
        request=RecordSetPipelineSerializer,
        responses={202: RecordSetSerializer},
        description="Run a data-building pipeline over this record set: the stages are checked "
        "against its columns (400 naming the field, e.g. `stages[1].rules[0].rule`), the next "
        "version of `name` is created `building` and built on a worker; poll it until `status` "
        "is `ready` or `failed` (`stages_done` of `stages_total`, each stage's `reports`).",
    )
    @action(detail=True, methods=["post"])
    def pipeline(self, request: Request, ws: str, pk: str) -> Response:
        source = self.get_object()
        serializer = RecordSetPipelineSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        output = services.pipeline_run(
            actor=request.user,
            workspace=self.workspace,
            source=source,
            name=serializer.validated_data["name"],
            stages=serializer.validated_data["stages"],
        )
        return self._located(output, status.HTTP_202_ACCEPTED)

    @extend_schema(
        parameters=[OpenApiParameter("limit", int, description=f"At most {MAX_PREVIEW_ROWS}.")],
        responses={200: {"type": "array", "items": {"type": "object"}}},
        description="The first rows of a ready record set.",
    )
    @action(detail=True, methods=["get"])
    def rows(self, request: Request, ws: str, pk: str) -> Response:
        record_set = self.get_object()
        raw = request.query_params.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_PREVIEW_ROWS:
            raise serializers.ValidationError(
                {"limit": f"must be a whole number from 1 to {MAX_PREVIEW_ROWS}"}
            )
        if record_set.status != RecordSetStatus.READY:
            raise ConflictError(f"the record set is {record_set.status}, not ready", attr="status")
        return Response(record_set_rows(record_set, limit=int(raw)))

    @extend_schema(
        responses={(200, "application/vnd.apache.parquet"): bytes},
        description="The record set's Parquet file. 409 while it is not `ready`.",
    )
    @action(detail=True, methods=["get"])
    def file(self, request: Request, ws: str, pk: str) -> FileResponse:
        record_set = self.get_object()
        if record_set.status != RecordSetStatus.READY:
            raise ConflictError(f"the record set is {record_set.status}, not ready", attr="status")
        path = services.record_set_file(record_set)
        if not path.exists():
            raise ConflictError("the record set's file is missing on this server", attr="path")
        return FileResponse(
            path.open("rb"),
            content_type="application/vnd.apache.parquet",
            filename=f"{record_set.name}-v{record_set.version}.parquet",
        )
