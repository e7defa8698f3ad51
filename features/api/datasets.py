"""REST views of training samples (datasets) and the workspace's default sample stream."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import FileResponse, Http404
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from features import samples
from features.lookup import MAX_FEATURES
from features.models import Dataset, DatasetStatus, FeatureGroup
from features.selectors import datasets_of, feature_groups_of
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Role


class DatasetSerializer(serializers.ModelSerializer):
    label_source = serializers.CharField(source="label_group.name")
    features = serializers.ListField(source="feature_refs", child=serializers.CharField())
    columns = serializers.SerializerMethodField(
        help_text="The file's columns in order: label keys, event_time, labels, then one "
        "'<group>__<feature>' column per feature reference."
    )
    created_by = serializers.CharField(source="created_by.username", default=None)
    progress = serializers.FloatField(
        read_only=True,
        help_text="Share of the build done (rows written over rows_total); 1 once ready.",
    )

    class Meta:
        model = Dataset
        fields = [
            "id",
            "name",
            "version",
            "status",
            "label_source",
            "label_columns",
            "features",
            "start_time",
            "end_time",
            "row_count",
            "rows_total",
            "rows_done",
            "partitions_total",
            "partitions_done",
            "progress",
            "coverage",
            "columns",
            "path",
            "error",
            "created_by",
            "created_at",
            "built_at",
            "engine",
            "build_seconds",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "path": {
                "help_text": "The sample, relative to the artifact root: a folder of Parquet "
                "parts (part-00000.parquet, ... in event-time order) for datasets built since "
                "partitioned samples, one Parquet file for older ones."
            },
            "engine": {"help_text": "The offline engine that built it: duckdb or spark."},
            "build_seconds": {"help_text": "How long the point-in-time join and write took."},
        }

    def get_columns(self, dataset: Dataset) -> list[str]:
        return samples.dataset_columns(dataset)


class DatasetCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    label_source = serializers.CharField(
        max_length=63, help_text="The feature group whose rows are the labelled events."
    )
    label_columns = serializers.ListField(
        child=serializers.CharField(max_length=63),
        min_length=1,
        max_length=samples.MAX_LABEL_COLUMNS,
    )
    features = serializers.ListField(
        child=serializers.CharField(max_length=140),
        min_length=1,
        max_length=MAX_FEATURES,
        help_text="'group:feature' or 'group@v2:feature'.",
    )
    start_time = serializers.DateTimeField(required=False, allow_null=True, default=None)
    end_time = serializers.DateTimeField(required=False, allow_null=True, default=None)


class DatasetPreviewRequestSerializer(DatasetCreateSerializer):
    name = serializers.CharField(max_length=63, required=False, help_text="Not needed.")


class DatasetPreviewSerializer(serializers.Serializer):
    label_rows = serializers.IntegerField(help_text="Label events in the window (exact).")
    sampled_rows = serializers.IntegerField(help_text="Label rows the coverage was measured on.")
    exact = serializers.BooleanField(help_text="Coverage was measured on every label row.")
    coverage = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        help_text="Feature reference -> share of the sampled rows with a value.",
    )


class SampleStreamFeatureSerializer(serializers.Serializer):
    feature = serializers.CharField(max_length=140, help_text="'group:feature'.")


class SampleStreamTemplateSerializer(serializers.Serializer):
    sample_stream = serializers.JSONField()
    model = serializers.JSONField(required=False)


class DatasetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Training samples of a workspace: labelled events with point-in-time feature values."""

    serializer_class = DatasetSerializer
    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.DEVELOPER, "preview": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        datasets = datasets_of(workspace=self.workspace)
        if self.action == "list":
            for field in ("name", "status"):
                value = self.request.query_params.get(field)
                if value:
                    datasets = datasets.filter(**{field: value})
        return datasets

    @extend_schema(
        request=DatasetCreateSerializer,
        responses={202: DatasetSerializer},
        description="Validates the request and queues the build: answers 202 with the dataset "
        "`building` and its URL in Location; poll it until `status` is `ready` or `failed` "
        "(`rows_done` of `rows_total`, `progress`).",
    )
    def create(self, request: Request, ws: str) -> Response:
        serializer = DatasetCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        dataset = samples.dataset_create(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            label_group=self._label_group(data["label_source"]),
            label_columns=data["label_columns"],
            feature_refs=data["features"],
            start_time=data["start_time"],
            end_time=data["end_time"],
            background=True,
        )
        fresh = datasets_of(workspace=self.workspace).get(pk=dataset.pk)
        location = reverse(
            "v1:dataset-detail", kwargs={"ws": self.workspace.slug, "pk": dataset.pk}
        )
        return Response(
            DatasetSerializer(fresh).data,
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": location},
        )

    def _label_group(self, name: str) -> FeatureGroup:
        label_group = feature_groups_of(workspace=self.workspace).filter(name=name).first()
        if label_group is None:
            raise ReferenceNotFound(f"no feature group '{name}'", attr="label_source")
        return label_group

    @extend_schema(
        request=DatasetPreviewRequestSerializer,
        responses={200: DatasetPreviewSerializer},
        description="What a dataset of this body would hold (its row count, and each feature's "
        "coverage measured on a bounded sample of the labels), without creating anything.",
    )
    @action(detail=False, methods=["post"])
    def preview(self, request: Request, ws: str) -> Response:
        serializer = DatasetPreviewRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        preview = samples.dataset_preview(
            workspace=self.workspace,
            label_group=self._label_group(data["label_source"]),
            label_columns=data["label_columns"],
            feature_refs=data["features"],
            start_time=data["start_time"],
            end_time=data["end_time"],
        )
        body = {
            "label_rows": preview.label_rows,
            "sampled_rows": preview.sampled_rows,
            "exact": preview.exact,
            "coverage": preview.coverage,
        }
        return Response(DatasetPreviewSerializer(body).data)

    @extend_schema(
        responses={(200, "application/vnd.apache.parquet"): bytes},
        description="The dataset's Parquet file (its `columns`, in order), for clients that load "
        "it as a DataFrame. 409 while the dataset is not `ready`.",
    )
    @action(detail=True, methods=["get"])
    def file(self, request: Request, ws: str, pk: str) -> FileResponse:
        dataset = self.get_object()
        if dataset.status != DatasetStatus.READY:
            raise ConflictError(f"dataset is {dataset.status}, not ready", attr="status")
        path = samples.dataset_file(dataset)
        if not path.exists():
            raise ConflictError("the dataset's file is missing on this server", attr="path")
        return FileResponse(
            samples.sample_single_file(path),
            content_type="application/vnd.apache.parquet",
            filename=f"{dataset.name}-v{dataset.version}.parquet",
        )


class SampleStreamFeaturesViewSet(WorkspaceScopedViewSet):
    """The workspace's default sample stream: add a feature to it in one call."""

    serializer_class = SampleStreamFeatureSerializer
    action_roles = {"create": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:  # no rows of its own
        raise Http404

    @extend_schema(
        request=SampleStreamFeatureSerializer, responses={200: SampleStreamTemplateSerializer}
    )
    def create(self, request: Request, ws: str) -> Response:
        serializer = SampleStreamFeatureSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        template = samples.sample_stream_add_feature(
            actor=request.user,
            workspace=self.workspace,
            feature_ref=serializer.validated_data["feature"],
        )
        return Response(template, status=status.HTTP_200_OK)
