"""REST views of experiments, layers and feedback under /api/v1/workspaces/{ws}/."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import Http404
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from experiments import loop, services
from experiments.api.serializers import (
    ConcludeSerializer,
    ExperimentCreateSerializer,
    ExperimentSerializer,
    FeedbackBatchSerializer,
    FeedbackResultSerializer,
    LayerCreateSerializer,
    LayerSerializer,
    LoopCreateSerializer,
    LoopRetrySerializer,
    LoopSerializer,
    NoteSerializer,
    SnapshotSerializer,
    StopSerializer,
)
from experiments.models import Experiment, ExperimentState, Layer, Snapshot
from workspaces.api.viewsets import ROLE_PERMISSION, WorkspaceScopedViewSet
from workspaces.models import Role

KEY_REGEX = "[a-z][a-z0-9_-]*"


def _body(request: Request) -> dict:
    if not isinstance(request.data, dict):
        raise ValidationError({"detail": "send a JSON object"})
    return request.data


def _valid(serializer_class, request: Request) -> dict:
    """The request's JSON object checked by ``serializer_class`` (400 naming the field)."""
    serializer = serializer_class(data=_body(request))
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _answer(exp: Experiment) -> Response:
    return Response(ExperimentSerializer(exp).data)


class ExperimentFilter(filters.FilterSet):
    """``?state=``: the experiments in one state."""

    state = filters.ChoiceFilter(
        choices=ExperimentState.choices,
        error_messages={"invalid_choice": f"one of {', '.join(ExperimentState.values)}"},
    )

    class Meta:
        model = Experiment
        fields = ["state"]


class ExperimentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Experiments: request, review, ramp, read and conclude."""

    lookup_field = "key"
    lookup_url_kwarg = "key"
    lookup_value_regex = KEY_REGEX
    serializer_class = ExperimentSerializer
    queryset = Experiment.objects.none()  # the model, for the schema; requests use the scoped one
    filterset_class = ExperimentFilter
    action_roles = {
        "create": Role.DEVELOPER,
        "submit": Role.DEVELOPER,
        "stop": Role.DEVELOPER,
        "approve": Role.MAINTAINER,
        "ramp": Role.MAINTAINER,
        "conclude": Role.MAINTAINER,
    }

    def get_workspace_queryset(self) -> QuerySet:
        return (
            Experiment.objects.for_workspace(self.workspace)
            .select_related("deployment", "layer", "owner", "workspace")
            .order_by("-created_at", "-id")
        )

    @extend_schema(request=ExperimentCreateSerializer, responses={201: ExperimentSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = ExperimentCreateSerializer(data=_body(request))
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        data["guardrails"] = [dict(g) for g in data["guardrails"]]
        exp = services.experiment_create(actor=request.user, workspace=self.workspace, **data)
        return Response(ExperimentSerializer(exp).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ExperimentSerializer})
    @action(detail=True, methods=["post"])
    def submit(self, request: Request, ws: str, key: str) -> Response:
        return _answer(services.experiment_submit(actor=request.user, experiment=self.get_object()))

    @extend_schema(request=NoteSerializer, responses={200: ExperimentSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, ws: str, key: str) -> Response:
        note = _valid(NoteSerializer, request).get("note", "")
        exp = services.experiment_approve(
            actor=request.user, experiment=self.get_object(), note=note
        )
        return _answer(exp)

    @extend_schema(request=None, responses={200: ExperimentSerializer})
    @action(detail=True, methods=["post"])
    def ramp(self, request: Request, ws: str, key: str) -> Response:
        return _answer(services.experiment_ramp(actor=request.user, experiment=self.get_object()))

    @extend_schema(request=StopSerializer, responses={200: ExperimentSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, ws: str, key: str) -> Response:
        reason = _valid(StopSerializer, request)["reason"]
        exp = services.experiment_stop(
            actor=request.user,
            experiment=self.get_object(),
            reason=f"stopped by {request.user.username}: {reason}",
        )
        return _answer(exp)

    @extend_schema(request=ConcludeSerializer, responses={200: ExperimentSerializer})
    @action(detail=True, methods=["post"])
    def conclude(self, request: Request, ws: str, key: str) -> Response:
        data = _valid(ConcludeSerializer, request)
        exp = services.experiment_conclude(
            actor=request.user,
            experiment=self.get_object(),
            action=data["action"],
            arm=data.get("arm"),
            note=data.get("note", ""),
        )
        return _answer(exp)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "cuped", bool, description="Add clicks per unit adjusted with pre-period clicks."
            )
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"])
    def analysis(self, request: Request, ws: str, key: str) -> Response:
        """The live read-out: per-arm metrics, effects (fixed and sequential), SRM, guardrails."""
        exp = self.get_object()
        cuped = request.query_params.get("cuped", "").lower() in ("1", "true", "yes")
        return Response(
            {
                "experiment": exp.key,
                "state": exp.state,
                **services.experiment_analyze(exp, cuped=cuped),
            }
        )

    @extend_schema(responses={200: SnapshotSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])  # ?state= is the list's filter
    def snapshots(self, request: Request, ws: str, key: str) -> Response:
        exp = self.get_object()
        rows = Snapshot.objects.for_workspace(self.workspace).filter(experiment=exp)
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(SnapshotSerializer(page, many=True).data)


class LayerViewSet(mixins.ListModelMixin, WorkspaceScopedViewSet):
    """Layers: hashing namespaces, and the bucket blocks their experiments hold."""

    lookup_field = "name"
    lookup_url_kwarg = "name"
    lookup_value_regex = KEY_REGEX
    serializer_class = LayerSerializer
    action_roles = {"create": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        return Layer.objects.for_workspace(self.workspace).order_by("name")

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def retrieve(self, request: Request, ws: str, name: str) -> Response:
        layer = self.get_object()
        return Response({**LayerSerializer(layer).data, **services.layer_traffic(layer)})

    @extend_schema(request=LayerCreateSerializer, responses={201: LayerSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = LayerCreateSerializer(data=_body(request))
        serializer.is_valid(raise_exception=True)
        layer = services.layer_create(
            actor=request.user, workspace=self.workspace, **serializer.validated_data
        )
        return Response(LayerSerializer(layer).data, status=status.HTTP_201_CREATED)


class FeedbackViewSet(WorkspaceScopedViewSet):
    """What happened after served requests, keyed by request id; batched and idempotent."""

    action_roles = {"create": Role.DEVELOPER}
    serializer_class = FeedbackBatchSerializer
    # The key names the batch's events (``<key>:<i>``): a retry reports them as duplicates.
    handles_idempotency_key = True

    def get_workspace_queryset(self) -> QuerySet:  # write-only
        raise Http404

    @extend_schema(request=FeedbackBatchSerializer, responses={200: FeedbackResultSerializer})
    def create(self, request: Request, ws: str) -> Response:
        body = _body(request)
        result = services.feedback_record(
            actor=request.user,
            workspace=self.workspace,
            events=body.get("events"),
            idempotency_key=request.headers.get("Idempotency-Key", ""),
        )
        return Response(result)


class LoopViewSet(WorkspaceScopedViewSet):
    """The one action (X2 loop): a feature group to a running A/B experiment. ``create`` starts
    the workspace's ``ab-loop`` pipeline; ``retry`` reruns from the failed stage (a maintainer
    may pass ``quality_override`` with a reason to let a candidate past the quality gate)."""

    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.DEVELOPER, "retry": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        return loop.loops_of(self.workspace).prefetch_related("stage_runs")

    @extend_schema(
        operation_id="v1_workspaces_loops_list",
        responses={200: LoopSerializer(many=True)},
        description="The workspace's loops, newest first (paginated: count, next, results); "
        "each stage's linked object is in the loop's own resource.",
    )
    def list(self, request: Request, ws: str) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([loop.loop_summary(run, links=False) for run in page])

    @extend_schema(responses={200: LoopSerializer})
    def retrieve(self, request: Request, ws: str, pk: str) -> Response:
        return Response(loop.loop_summary(self.get_object()))

    @extend_schema(request=LoopCreateSerializer, responses={202: LoopSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = LoopCreateSerializer(data=_body(request))
        serializer.is_valid(raise_exception=True)
        run = loop.loop_start(
            actor=request.user, workspace=self.workspace, **serializer.validated_data
        )
        fresh = self.get_queryset().get(pk=run.pk)
        return Response(
            loop.loop_summary(fresh),
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": f"/api/v1/workspaces/{self.workspace.slug}/loops/{run.pk}/"},
        )

    @extend_schema(request=LoopRetrySerializer, responses={200: LoopSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, ws: str, pk: str) -> Response:
        serializer = LoopRetrySerializer(data=_body(request) if request.data else {})
        serializer.is_valid(raise_exception=True)
        reason = serializer.validated_data.get("quality_override", "")
        if reason.strip() and ROLE_PERMISSION[Role.MAINTAINER] not in self.workspace_perms:
            raise PermissionDenied("only a maintainer may override the quality gate")
        run = loop.loop_retry(actor=request.user, run=self.get_object(), quality_override=reason)
        return Response(loop.loop_summary(self.get_queryset().get(pk=run.pk)))
