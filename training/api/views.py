"""REST views of the training app: jobs (with cancel and metrics), entry points, pipelines."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from curation.models import RecordSet
from features.models import Dataset
from training import candidates, notebooks, pipelines, services, tuning
from training import models as m
from training.api import serializers as s
from training.params import params_schema, template_names
from training.templates import DESCRIPTIONS
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Role
from workspaces.selectors import workspace_object

MAX_METRIC_ROWS = 5000
MAX_LOG_CHUNK = 256 * 1024


def check_dataset_params(workspace, params, *, attr: str) -> None:
    """Dataset ids and names in pipeline params name datasets of this workspace: checked when the
    run is asked for (404 naming the param, like any body reference), not when its stage runs. A
    value of the wrong type is bad input (400)."""
    if not isinstance(params, dict):
        return  # the service says what is wrong with the shape
    datasets = Dataset.objects.for_workspace(workspace)
    for key, value in params.items():
        param = str(key).rsplit(".", 1)[-1]  # "dataset_id" or "<stage>.dataset_id"
        where = f"{attr}.{key}"
        if param == "dataset_id":
            number = str(value) if isinstance(value, (int, str)) else ""
            if isinstance(value, bool) or not number.isdigit():
                raise ValidationError({where: "give a dataset id"})
            found = datasets.filter(pk=int(number)).exists()
        elif param == "dataset":
            if not isinstance(value, str):
                raise ValidationError({where: "give a dataset name"})
            found = datasets.filter(name=value).exists()
        else:
            continue
        if not found:
            raise ReferenceNotFound("no such dataset in this workspace", attr=where)


def job_inputs(workspace, data: dict) -> dict:
    """A job request's ``dataset``, ``record_set`` and ``base_job`` ids resolved to the
    workspace's objects (404 naming the field for a missing one or another workspace's; None
    stays None)."""
    references = (("dataset", Dataset), ("record_set", RecordSet), ("base_job", m.TrainingJob))
    for attr, model in references:
        if attr == "record_set" and attr not in data:
            continue  # a request that takes no record set (a tuning job's)
        if data.get(attr) is not None:
            data[attr] = workspace_object(
                model, workspace=workspace, ref=data[attr], attr=attr, name_field=None
            )
        else:
            data[attr] = None
    return data


class TrainingJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Training jobs: a template or entry point, a dataset, resources and a priority class."""

    serializer_class = s.TrainingJobSerializer
    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.DEVELOPER, "cancel": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        jobs = m.TrainingJob.objects.for_workspace(self.workspace).select_related(
            "dataset", "node", "created_by"
        )
        if self.action == "list":
            state = self.request.query_params.get("state")
            if state:
                jobs = jobs.filter(state=state)
        return jobs

    @extend_schema(request=s.TrainingJobCreateSerializer, responses={201: s.TrainingJobSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = s.TrainingJobCreateSerializer(
            data=request.data, context=self.get_serializer_context()
        )
        serializer.is_valid(raise_exception=True)
        data = job_inputs(self.workspace, dict(serializer.validated_data))
        job = services.job_create(actor=request.user, workspace=self.workspace, **data)
        fresh = self.get_workspace_queryset().get(pk=job.pk)
        return Response(s.TrainingJobSerializer(fresh).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: s.TrainingJobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, ws: str, pk: str) -> Response:
        job = self.get_object()
        services.job_request_stop(
            job=job, mode="cancel", reason=f"cancelled by {request.user}", actor=request.user
        )
        fresh = self.get_workspace_queryset().get(pk=job.pk)
        return Response(s.TrainingJobSerializer(fresh).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "offset", int, description="Byte offset to read from (next_offset of the last)."
            )
        ],
        responses={200: s.JobLogSerializer},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def log(self, request: Request, ws: str, pk: str) -> Response:
        """The job's log from ``offset`` (at most 256 KiB of whole lines): poll with the answer's
        ``next_offset`` until ``done`` to follow it (``rankops jobs logs -f``)."""
        job = self.get_object()
        raw = request.query_params.get("offset", "0")
        if not raw.isdigit():
            raise ValidationError({"offset": "a byte offset: a whole number, 0 or more"})
        return Response(_log_chunk(job, int(raw)))

    @extend_schema(
        parameters=[OpenApiParameter("name", str, description="Only this metric (e.g. loss).")],
        responses={200: s.JobMetricSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def metrics(self, request: Request, ws: str, pk: str) -> Response:
        job = self.get_object()
        rows = m.JobMetric.objects.for_workspace(self.workspace).filter(job=job)
        name = request.query_params.get("name")
        if name:
            rows = rows.filter(name=name)
        rows = rows.order_by("name", "step", "id")[:MAX_METRIC_ROWS]
        return Response(s.JobMetricSerializer(rows, many=True).data)


def _log_chunk(job: m.TrainingJob, offset: int) -> dict:
    from training.agent import LOG_FILE

    path = services.job_work_dir(job) / LOG_FILE
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    start = min(offset, size)
    data = b""
    if start < size:
        with path.open("rb") as log:
            log.seek(start)
            data = log.read(MAX_LOG_CHUNK)
        cut = data.rfind(b"\n")
        if 0 <= cut < len(data) - 1 and start + len(data) < size:
            data = data[: cut + 1]  # whole lines, unless one line is longer than a chunk
    return {
        "offset": start,
        "next_offset": start + len(data),
        "size": size,
        "text": data.decode("utf-8", errors="replace"),
        "done": job.is_terminal and start + len(data) >= size,
        "state": job.state,
    }


class TrainingTemplateViewSet(WorkspaceScopedViewSet):
    """The built-in templates with their description and parameter schema (shared params
    included, the training length bounded by this workspace's policy), so that a client can
    build a form: a job of a template may be given only these params."""

    serializer_class = s.TrainingTemplateSerializer
    pagination_class = None  # a handful of built-ins, always all of them
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9_]+"

    def get_workspace_queryset(self) -> QuerySet:
        return m.EntryPoint.objects.for_workspace(self.workspace).none()

    def _row(self, name: str) -> dict:
        schema = params_schema(name, workspace=self.workspace)
        return {
            "name": name,
            "description": DESCRIPTIONS.get(name, ""),
            "params": {param: spec.describe(param) for param, spec in schema.items()},
        }

    def list(self, request: Request, ws: str) -> Response:
        return Response(
            s.TrainingTemplateSerializer(
                [self._row(name) for name in template_names()], many=True
            ).data
        )

    def retrieve(self, request: Request, ws: str, name: str) -> Response:
        if name not in template_names():
            raise NotFound("No such template.")
        return Response(s.TrainingTemplateSerializer(self._row(name)).data)


class EntryPointViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """User training code registered in the workspace (see ``training.models.EntryPoint``)."""

    serializer_class = s.EntryPointSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z][a-z0-9_-]*"
    action_roles = {"create": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        return m.EntryPoint.objects.for_workspace(self.workspace)

    @extend_schema(request=s.EntryPointCreateSerializer, responses={201: s.EntryPointSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = s.EntryPointCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        entry = services.entry_point_register(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            module=data["module"],
            script=data["script"].encode() if data["script"] else None,
            description=data["description"],
        )
        return Response(s.EntryPointSerializer(entry).data, status=status.HTTP_201_CREATED)


class PipelineViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Pipelines: a DAG of stages defined once per workspace; ``runs`` starts one."""

    serializer_class = s.PipelineSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z][a-z0-9_-]*"
    action_roles = {"create": Role.DEVELOPER, "run": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        return m.Pipeline.objects.for_workspace(self.workspace)

    @extend_schema(request=s.PipelineSerializer, responses={201: s.PipelineSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = s.PipelineSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        stages = data.get("stages")
        for index, stage in enumerate(stages if isinstance(stages, list) else []):
            if isinstance(stage, dict):
                check_dataset_params(
                    self.workspace, stage.get("params"), attr=f"stages.{index}.params"
                )
        pipeline = pipelines.pipeline_create(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            description=data.get("description", ""),
            stages=data.get("stages") or None,
        )
        return Response(s.PipelineSerializer(pipeline).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.PipelineRunCreateSerializer, responses={201: s.PipelineRunSerializer})
    @action(detail=True, methods=["post"])
    def run(self, request: Request, ws: str, name: str) -> Response:
        pipeline = self.get_object()
        serializer = s.PipelineRunCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        check_dataset_params(self.workspace, serializer.validated_data["params"], attr="params")
        run = pipelines.pipeline_run_start(
            actor=request.user, pipeline=pipeline, params=serializer.validated_data["params"]
        )
        return Response(s.PipelineRunSerializer(run).data, status=status.HTTP_201_CREATED)


class PipelineRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Runs of the workspace's pipelines, with each stage's state; ``retry`` reruns from the
    failed stage."""

    serializer_class = s.PipelineRunSerializer
    lookup_value_regex = r"\d+"
    action_roles = {"retry": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        return (
            m.PipelineRun.objects.for_workspace(self.workspace)
            .select_related("pipeline")
            .prefetch_related("stage_runs")
        )

    @extend_schema(request=None, responses={200: s.PipelineRunSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, ws: str, pk: str) -> Response:
        run = self.get_object()
        pipelines.pipeline_run_retry(actor=request.user, run=run)
        fresh = self.get_workspace_queryset().get(pk=run.pk)
        return Response(s.PipelineRunSerializer(fresh).data)


class CandidateEvaluationViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet
):
    """F11: upload a not-yet-registered feature's values (multipart ``file``), joined onto a
    dataset and evaluated with and without; nothing is registered."""

    serializer_class = s.CandidateEvaluationSerializer
    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.DEVELOPER}
    parser_classes = [MultiPartParser, FormParser]

    def get_workspace_queryset(self) -> QuerySet:
        return m.CandidateEvaluation.objects.for_workspace(self.workspace)

    @extend_schema(
        request={"multipart/form-data": s.CandidateEvaluationCreateSerializer},
        responses={201: s.CandidateEvaluationSerializer},
    )
    def create(self, request: Request, ws: str) -> Response:
        serializer = s.CandidateEvaluationCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        dataset = workspace_object(
            Dataset, workspace=self.workspace, ref=data["dataset"], attr="dataset", name_field=None
        )
        upload = data["file"]
        if upload.size > candidates.MAX_UPLOAD_BYTES:
            raise ValidationError({"file": f"at most {candidates.MAX_UPLOAD_BYTES} bytes"})
        evaluation = candidates.candidate_evaluation_create(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            dataset=dataset,
            key_column=data["key_column"],
            content=upload.read(),
            filename=upload.name or "values.csv",
            dtype=data["dtype"],
            params={"template": data["template"]},
        )
        return Response(
            s.CandidateEvaluationSerializer(evaluation).data, status=status.HTTP_201_CREATED
        )


class TuningJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Tuning jobs: Optuna (TPE, median or ASHA pruning) samples each trial's params from the
    search space; trials are training jobs placed by the scheduler, ``parallelism`` at once;
    the best trial by the validation metric is registered as a model version."""

    serializer_class = s.TuningJobSerializer
    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.DEVELOPER, "cancel": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        return (
            m.TuningJob.objects.for_workspace(self.workspace)
            .select_related("created_by", "best_trial")
            .prefetch_related("trials__job")
        )

    def get_serializer_class(self):
        return s.TuningJobDetailSerializer if self.action != "list" else s.TuningJobSerializer

    @extend_schema(
        request=s.TuningJobCreateSerializer, responses={201: s.TuningJobDetailSerializer}
    )
    def create(self, request: Request, ws: str) -> Response:
        serializer = s.TuningJobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = job_inputs(self.workspace, dict(serializer.validated_data))
        created = tuning.tuning_job_create(actor=request.user, workspace=self.workspace, **data)
        fresh = self.get_workspace_queryset().get(pk=created.pk)
        return Response(s.TuningJobDetailSerializer(fresh).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: s.TuningJobDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, ws: str, pk: str) -> Response:
        tuning.tuning_job_cancel(actor=request.user, tuning_job=self.get_object())
        fresh = self.get_workspace_queryset().get(pk=pk)
        return Response(s.TuningJobDetailSerializer(fresh).data)


class NotebookServerViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet
):
    """The caller's JupyterLab servers in the workspace (X1). ``POST`` opens one (or answers the
    live one, 200); its kernels get the ``rankops`` client set up with a short-lived token
    narrowed to this workspace. ``stop`` ends it and revokes that token; an idle server stops
    itself after ``idle_timeout_s``."""

    serializer_class = s.NotebookServerSerializer
    lookup_value_regex = r"\d+"
    action_roles = {"create": Role.VIEWER, "stop": Role.VIEWER}

    def get_workspace_queryset(self) -> QuerySet:
        return m.NotebookServer.objects.for_workspace(self.workspace).filter(
            user_id=self.request.user.pk
        )

    def list(self, request: Request, ws: str) -> Response:
        notebooks.notebooks_of(self.workspace, request.user)
        return super().list(request, ws)

    def retrieve(self, request: Request, ws: str, pk: str) -> Response:
        server = self.get_object()
        notebooks.notebook_refresh(server)
        return Response(self.get_serializer(server).data)

    @extend_schema(
        request=None, responses={200: s.NotebookServerSerializer, 201: s.NotebookServerSerializer}
    )
    def create(self, request: Request, ws: str) -> Response:
        server, started = notebooks.notebook_open(
            actor=request.user,
            workspace=self.workspace,
            platform_url=request.build_absolute_uri("/"),
        )
        return Response(
            self.get_serializer(server).data,
            status=status.HTTP_201_CREATED if started else status.HTTP_200_OK,
        )

    @extend_schema(request=None, responses={200: s.NotebookServerSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, ws: str, pk: str) -> Response:
        server = notebooks.notebook_stop(actor=request.user, server=self.get_object())
        return Response(self.get_serializer(server).data)
