"""REST views of the registry and deployments (the gateway itself is ``serving.gateway``)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import Max, QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from serving import deployments as dep_services
from serving import quality, registry
from serving.api.serializers import (
    AliasSerializer,
    DeploymentChangeSerializer,
    DeploymentCreateSerializer,
    DeploymentSerializer,
    DeploymentStopSerializer,
    ModelVersionSerializer,
    QualityOverrideSerializer,
    QuantizeSerializer,
    RegisteredModelSerializer,
    ReleaseSerializer,
    RollbackSerializer,
    ScaleSerializer,
    TryResultSerializer,
    TrySerializer,
    VersionRegisterSerializer,
)
from serving.gates import version_gates_request
from serving.models import Deployment, DeploymentChange, ModelVersion, RegisteredModel
from serving.observability import deployment_stats
from serving.routing import routing_table
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Role
from workspaces.selectors import workspace_object


class ModelVersionFilter(filters.FilterSet):
    """``?model=<name>``: the versions of one registered model."""

    model = filters.CharFilter(field_name="model__name", help_text="A registered model's name.")

    class Meta:
        model = ModelVersion
        fields = ["model"]


class RegisteredModelViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet
):
    """Registered models of a workspace with their aliases."""

    lookup_field = "name"
    lookup_value_regex = "[a-z][a-z0-9_-]*"
    serializer_class = RegisteredModelSerializer
    queryset = RegisteredModel.objects.none()
    action_roles = {"alias": Role.MAINTAINER}

    def get_workspace_queryset(self) -> QuerySet:
        return RegisteredModel.objects.for_workspace(self.workspace).annotate(
            latest=Max("versions__version")
        )

    @extend_schema(request=AliasSerializer, responses={200: RegisteredModelSerializer})
    @action(detail=True, methods=["post"])
    def alias(self, request: Request, ws: str, name: str) -> Response:
        model = self.get_object()
        body = AliasSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        number = body.validated_data["version"]
        version = None
        if number is not None:
            version = (
                ModelVersion.objects.for_workspace(self.workspace)
                .filter(model=model, version=number)
                .first()
            )
            if version is None:
                raise ReferenceNotFound(f"'{model.name}' has no version {number}", attr="version")
        registry.model_alias_set(
            actor=request.user,
            workspace=self.workspace,
            model=model,
            alias=body.validated_data["alias"],
            version=version,
        )
        return Response(RegisteredModelSerializer(self.get_queryset().get(pk=model.pk)).data)


class ModelVersionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Model versions: register from a training job or import from MLflow; run release gates."""

    serializer_class = ModelVersionSerializer
    queryset = ModelVersion.objects.none()  # the model, for the schema; requests use the scoped one
    lookup_value_regex = "[0-9]+"
    # Re-running the gates can change whether a version may be (or stay) released.
    action_roles = {
        "create": Role.DEVELOPER,
        "gates": Role.MAINTAINER,
        "quality_override": Role.MAINTAINER,
        "quantize": Role.DEVELOPER,
        "trial": Role.DEVELOPER,
    }

    filterset_class = ModelVersionFilter

    def get_workspace_queryset(self) -> QuerySet:
        return (
            ModelVersion.objects.for_workspace(self.workspace)
            .select_related("model")
            .order_by("-created_at", "-id")
        )

    @extend_schema(request=VersionRegisterSerializer, responses={201: ModelVersionSerializer})
    def create(self, request: Request, ws: str) -> Response:
        from training.models import TrainingJob

        body = VersionRegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if ("job_id" in data) == ("source" in data):
            raise ValidationError({"job_id": "give either job_id or an MLflow source"})
        target = data.get("auto_deploy") or ""
        serving = (
            Deployment.objects.for_workspace(self.workspace)
            .filter(name=target)
            .values_list("model__name", flat=True)
            .first()
        )
        if serving is not None and serving != data["model"]:
            # Refused before anything is registered, not after the version is written.
            raise ValidationError(
                {"auto_deploy": f"deployment '{target}' serves model '{serving}'"}
            )
        if "job_id" in data:
            job = workspace_object(
                TrainingJob,
                workspace=self.workspace,
                ref=data["job_id"],
                attr="job_id",
                name_field=None,
            )
            version = registry.model_version_register(
                actor=request.user,
                workspace=self.workspace,
                name=data["model"],
                job=job,
                description=data.get("description", ""),
            )
        else:
            dataset = None
            if "dataset_id" in data:
                from features.models import Dataset

                dataset = workspace_object(
                    Dataset,
                    workspace=self.workspace,
                    ref=data["dataset_id"],
                    attr="dataset_id",
                    name_field=None,
                )
            version = registry.model_version_import_mlflow(
                actor=request.user,
                workspace=self.workspace,
                name=data["model"],
                source=data["source"],
                description=data.get("description", ""),
                inputs=data.get("inputs"),
                dataset=dataset,
                architecture=data.get("architecture"),
                output=data.get("output") or "probability",
            )
        if data.get("run_gates") or data.get("auto_deploy"):
            from serving.pipeline import gates_and_deploy

            version = gates_and_deploy(
                actor=request.user,
                workspace=self.workspace,
                version=version,
                deployment=data.get("auto_deploy") or "",
            )
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: ModelVersionSerializer})
    @action(detail=True, methods=["post"])
    def gates(self, request: Request, ws: str, pk: str) -> Response:
        """Run the release gates again on a worker; ``gates.run`` follows the request and the
        results replace the gates when it is done (409 while a run is under way)."""
        version = self.get_object()
        version = version_gates_request(
            actor=request.user, workspace=self.workspace, version=version
        )
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=QuantizeSerializer, responses={201: ModelVersionSerializer})
    @action(detail=True, methods=["post"])
    def quantize(self, request: Request, ws: str, pk: str) -> Response:
        """Register the version's int8 variant as the model's next version (ONNX Runtime dynamic
        int8 for a neural ranker, torch.ao dynamic int8 for a language model); its release gates
        (with the ``quantization`` gate: both on the same held-out rows, speed beside speed)
        run on a worker. 409 naming the variant when there is one already, or naming why the
        version takes no int8 method."""
        from serving.quantization import model_version_quantize

        version = self.get_object()
        body = QuantizeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        variant = model_version_quantize(
            actor=request.user,
            workspace=self.workspace,
            version=version,
            method=body.validated_data.get("method") or "",
        )
        return Response(ModelVersionSerializer(variant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TrySerializer, responses={200: TryResultSerializer})
    @action(detail=True, methods=["post"], url_path="try")
    def trial(self, request: Request, ws: str, pk: str) -> Response:
        """The playground: score ``rows`` of raw feature values with a sandbox replica of a
        ranking version (never a production replica), or continue ``prompt`` with a language
        model version; 400 naming the row, the key and what it takes."""
        from serving import playground

        version = self.get_object()
        body = TrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if playground.is_language(version):
            if "rows" in data:
                raise ValidationError({"rows": f"{version} is a language model: give a prompt"})
            result = playground.try_language(
                actor=request.user,
                workspace=self.workspace,
                version=version,
                prompt=data.get("prompt", ""),
                max_new_tokens=data["max_new_tokens"],
            )
        else:
            if "prompt" in data:
                raise ValidationError({"prompt": f"{version} is a ranking model: give rows"})
            result = playground.try_ranker(
                actor=request.user,
                workspace=self.workspace,
                version=version,
                rows=data.get("rows"),
            )
        return Response(TryResultSerializer(result).data)

    @extend_schema(request=QualityOverrideSerializer, responses={200: ModelVersionSerializer})
    @action(detail=True, methods=["post"], url_path="quality-override")
    def quality_override(self, request: Request, ws: str, pk: str) -> Response:
        """A maintainer lets a version past a failed quality gate, with a reason (recorded as an
        event and flagged for audit); 409 when the version has not failed the gate."""
        version = self.get_object()
        body = QualityOverrideSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = quality.version_checked(
            workspace=self.workspace,
            version=version,
            deployment=body.validated_data.get("deployment"),
        )
        version = quality.quality_override(
            actor=request.user,
            workspace=self.workspace,
            version=version,
            reason=body.validated_data["reason"],
        )
        return Response(ModelVersionSerializer(version).data)


ACCEPTED = OpenApiResponse(
    DeploymentSerializer,
    description="Accepted: the desired state is recorded and the routing table published; the "
    "backend's controller makes it so. Poll the deployment (the Location header) until "
    "``status.phase`` is Ready (or Stopped), or Failed with a message.",
)


class DeploymentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Deployments: create, release a version, roll back, scale, stop (each answers 202 with the
    status to follow); routing table, stats and history."""

    lookup_field = "name"
    lookup_value_regex = "[a-z][a-z0-9_-]*"
    serializer_class = DeploymentSerializer
    queryset = Deployment.objects.none()
    action_roles = {
        "create": Role.MAINTAINER,
        "release": Role.MAINTAINER,
        "rollback": Role.MAINTAINER,
        "scale": Role.MAINTAINER,
        "stop": Role.MAINTAINER,
    }

    def get_workspace_queryset(self) -> QuerySet:
        return Deployment.objects.for_workspace(self.workspace).select_related(
            "model", "version", "previous_version", "observed"
        )

    def accepted(self, dep: Deployment) -> Response:
        """202 with the deployment as it is now (its ``status`` says what the controller has
        done so far) and where to poll it."""
        fresh = self.get_queryset().get(pk=dep.pk)
        location = reverse(
            "v1:serving-deployment-detail",
            kwargs={"ws": self.workspace.slug, "name": fresh.name},
            request=self.request,
        )
        return Response(
            DeploymentSerializer(fresh).data,
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": location},
        )

    @extend_schema(request=DeploymentCreateSerializer, responses={202: ACCEPTED})
    def create(self, request: Request, ws: str) -> Response:
        body = DeploymentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        dep = dep_services.deployment_create(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            version=data["version_id"],
            backend=data["backend"],
            replicas=data["replicas"],
            device=data["device"],
            scaling=data.get("scaling"),
        )
        return self.accepted(dep)

    def _change(self, request: Request, body_class, service) -> Response:
        """The write actions on one deployment alike: validate the body, call the deployments
        service with it (the body's fields are the service's arguments), answer 202 with the
        deployment's status to follow."""
        dep = self.get_object()
        body = body_class(data=request.data)
        body.is_valid(raise_exception=True)
        service(actor=request.user, workspace=self.workspace, deployment=dep, **body.validated_data)
        return self.accepted(dep)

    @extend_schema(request=ReleaseSerializer, responses={202: ACCEPTED})
    @action(detail=True, methods=["post"])
    def release(self, request: Request, ws: str, name: str) -> Response:
        return self._change(request, ReleaseSerializer, dep_services.deployment_release)

    @extend_schema(request=RollbackSerializer, responses={202: ACCEPTED})
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, ws: str, name: str) -> Response:
        return self._change(request, RollbackSerializer, dep_services.deployment_rollback)

    @extend_schema(request=ScaleSerializer, responses={202: ACCEPTED})
    @action(detail=True, methods=["post"])
    def scale(self, request: Request, ws: str, name: str) -> Response:
        return self._change(request, ScaleSerializer, dep_services.deployment_scale)

    @extend_schema(request=DeploymentStopSerializer, responses={202: ACCEPTED})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, ws: str, name: str) -> Response:
        return self._change(request, DeploymentStopSerializer, dep_services.deployment_stop)

    @extend_schema(responses={200: OpenApiResponse(description="The published routing table.")})
    @action(detail=True, methods=["get"])
    def routing(self, request: Request, ws: str, name: str) -> Response:
        dep = self.get_object()
        table = routing_table(self.workspace, dep)
        table.pop("_compiled", None)
        return Response(table)

    @extend_schema(
        responses={200: OpenApiResponse(description="QPS, latency, errors, version mix.")}
    )
    @action(detail=True, methods=["get"])
    def stats(self, request: Request, ws: str, name: str) -> Response:
        dep = self.get_object()
        return Response(deployment_stats(dep))

    @extend_schema(responses={200: DeploymentChangeSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)
    def history(self, request: Request, ws: str, name: str) -> Response:
        dep = self.get_object()
        changes = (
            DeploymentChange.objects.for_workspace(self.workspace)
            .filter(deployment=dep)
            .select_related("actor", "from_version", "to_version")[:100]
        )
        return Response(DeploymentChangeSerializer(changes, many=True).data)
