"""REST views of benchmark sets and their scores (``serving.benchmarks``)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from serving import benchmarks
from serving.models import BenchmarkScore, BenchmarkSet, name_validator
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.models import Role
from workspaces.selectors import workspace_object


class BenchmarkSetSerializer(serializers.ModelSerializer):
    dataset_id = serializers.IntegerField(allow_null=True, read_only=True)
    record_set_id = serializers.IntegerField(allow_null=True, read_only=True)

    class Meta:
        model = BenchmarkSet
        fields = [
            "id",
            "name",
            "version",
            "kind",
            "dataset_id",
            "record_set_id",
            "label_column",
            "group_column",
            "ndcg_k",
            "max_new_tokens",
            "rows",
            "description",
            "created_at",
        ]
        read_only_fields = fields


class BenchmarkSetCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, validators=[name_validator])
    dataset_id = serializers.IntegerField(
        required=False, help_text="A ready dataset of the workspace (a ranking set)."
    )
    record_set_id = serializers.IntegerField(
        required=False,
        help_text="A ready record set: instruction or chat rows make a language set, a ranking "
        "sample (format to: ranking) a ranking set.",
    )
    label_column = serializers.CharField(
        max_length=200, required=False, allow_blank=True, help_text="0/1 labels (ranking)."
    )
    group_column = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="Rows of one request or user, for NDCG (default: a dataset's entity key).",
    )
    ndcg_k = serializers.IntegerField(required=False, default=10, min_value=1, max_value=1000)
    max_new_tokens = serializers.IntegerField(
        required=False, default=64, min_value=1, max_value=256
    )
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class BenchmarkScoreSerializer(serializers.ModelSerializer):
    benchmark = serializers.CharField(source="benchmark.__str__", read_only=True)
    benchmark_id = serializers.IntegerField(read_only=True)
    model = serializers.CharField(source="version.model.name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True)
    version_id = serializers.IntegerField(read_only=True)

    class Meta:
        model = BenchmarkScore
        fields = [
            "id",
            "benchmark",
            "benchmark_id",
            "model",
            "version",
            "version_id",
            "state",
            "metrics",
            "detail",
            "requested_at",
            "scored_at",
        ]
        read_only_fields = fields


class BenchmarkSetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Versioned evaluation sets; every new model version of their kind is scored on the
    newest version of each, on a worker, without anyone asking."""

    serializer_class = BenchmarkSetSerializer
    queryset = BenchmarkSet.objects.none()
    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        found = BenchmarkSet.objects.for_workspace(self.workspace)
        name = self.request.query_params.get("name") if self.action == "list" else None
        return found.filter(name=name) if name else found

    @extend_schema(request=BenchmarkSetCreateSerializer, responses={201: BenchmarkSetSerializer})
    def create(self, request: Request, ws: str) -> Response:
        from curation.models import RecordSet
        from features.models import Dataset

        body = BenchmarkSetCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        dataset = record_set = None
        if "dataset_id" in data:
            dataset = workspace_object(
                Dataset.objects.select_related("label_group"),
                workspace=self.workspace,
                ref=data["dataset_id"],
                attr="dataset_id",
                name_field=None,
            )
        if "record_set_id" in data:
            record_set = workspace_object(
                RecordSet,
                workspace=self.workspace,
                ref=data["record_set_id"],
                attr="record_set_id",
                name_field=None,
            )
        if dataset is None and record_set is None:
            from django.core.exceptions import ValidationError

            raise ValidationError({"dataset_id": "give dataset_id or record_set_id"})
        created = benchmarks.benchmark_set_create(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            dataset=dataset,
            record_set=record_set,
            label_column=data.get("label_column", ""),
            group_column=data.get("group_column", ""),
            ndcg_k=data["ndcg_k"],
            max_new_tokens=data["max_new_tokens"],
            description=data.get("description", ""),
        )
        location = reverse(
            "v1:serving-benchmark-detail", kwargs={"ws": self.workspace.slug, "pk": created.pk}
        )
        return Response(
            BenchmarkSetSerializer(created).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": location},
        )


class BenchmarkScoreViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet
):
    """Scores of model versions on benchmark sets: ``?version=<model version id>``,
    ``?benchmark=<set id>``."""

    serializer_class = BenchmarkScoreSerializer
    queryset = BenchmarkScore.objects.none()
    lookup_value_regex = r"\d+"
    action_roles = {"rescore": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        found = BenchmarkScore.objects.for_workspace(self.workspace).select_related(
            "benchmark", "version", "version__model"
        )
        if self.action == "list":
            for param, field in (("version", "version_id"), ("benchmark", "benchmark_id")):
                value = self.request.query_params.get(param)
                if value is None:
                    continue
                if not value.isdigit():
                    from django.core.exceptions import ValidationError

                    raise ValidationError({param: "an id (a whole number)"})
                found = found.filter(**{field: int(value)})
        return found.order_by("-requested_at", "-id")

    @extend_schema(request=None, responses={202: BenchmarkScoreSerializer})
    @action(detail=True, methods=["post"])
    def rescore(self, request: Request, ws: str, pk: str) -> Response:
        """Score again (after a failure, or once the set's source was rebuilt elsewhere)."""
        score = self.get_object()
        again = benchmarks.benchmark_rescore(
            actor=request.user, workspace=self.workspace, score=score
        )
        return Response(BenchmarkScoreSerializer(again).data, status=status.HTTP_202_ACCEPTED)
