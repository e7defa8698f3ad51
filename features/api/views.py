"""REST views of the feature registry, producer pushes and online lookups."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from features import ingestion, registry
from features.api.serializers import (
    BatchAcceptedSerializer,
    BatchSerializer,
    FeatureGroupCreateSerializer,
    FeatureGroupDetailSerializer,
    FeatureGroupSerializer,
    FeatureGroupUpdateSerializer,
    FeatureSerializer,
    FeatureStatusSerializer,
    OnlineLookupResultSerializer,
    OnlineLookupSerializer,
)
from features.lookup import online_lookup
from features.models import BatchFormat, Feature, FeatureGroup, FeatureGroupVersion, Lifecycle
from features.selectors import (
    batches_of,
    feature_group_detail,
    feature_group_get,
    feature_groups_of,
)
from workspaces.api.errors import error_body
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Role
from workspaces.selectors import role_at_least, role_from_perms

User = get_user_model()


def _member_user(workspace, username: str | None, *, attr: str):
    if not username:
        return None
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None or not user.has_perm("workspaces.view_workspace", workspace):
        raise ValidationError({attr: f"'{username}' is not a member of this workspace"})
    return user


class FeatureGroupFilter(filters.FilterSet):
    """``?search=`` (part of the name), ``?status=``, ``?entity=``, ``?health_status=``."""

    search = filters.CharFilter(field_name="name", lookup_expr="icontains")

    class Meta:
        model = FeatureGroup
        fields = ["search", "status", "entity", "health_status"]


class FeatureGroupViewSet(WorkspaceScopedViewSet):
    """Feature groups of a workspace: register, read, change schema (new version), lifecycle."""

    lookup_field = "name"
    lookup_url_kwarg = "name"
    lookup_value_regex = "[a-z][a-z0-9_]*"
    serializer_class = FeatureGroupSerializer
    queryset = FeatureGroup.objects.none()  # the model, for the schema; requests use the scoped one
    filterset_class = FeatureGroupFilter
    action_roles = {
        "create": Role.DEVELOPER,
        "partial_update": Role.DEVELOPER,
        "destroy": Role.MAINTAINER,
    }

    def get_workspace_queryset(self) -> QuerySet:
        return feature_groups_of(workspace=self.workspace)

    def list(self, request: Request, ws: str) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        live = {(g.pk, g.current_version) for g in page}
        current = {
            v.group_id: v.features
            for v in FeatureGroupVersion.objects.for_workspace(self.workspace).filter(
                group__in=page
            )
            if (v.group_id, v.version) in live
        }
        data = FeatureGroupSerializer(page, many=True, context={"current_features": current}).data
        return self.get_paginated_response(data)

    def retrieve(self, request: Request, ws: str, name: str) -> Response:
        group = feature_group_detail(workspace=self.workspace, name=name)
        return Response(FeatureGroupDetailSerializer(group).data)

    @extend_schema(
        request=FeatureGroupCreateSerializer, responses={201: FeatureGroupDetailSerializer}
    )
    def create(self, request: Request, ws: str) -> Response:
        serializer = FeatureGroupCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        data["producer"] = _member_user(self.workspace, data.pop("producer", None), attr="producer")
        group = registry.feature_group_register(
            actor=request.user, workspace=self.workspace, **data
        )
        detail = feature_group_detail(workspace=self.workspace, name=group.name)
        return Response(FeatureGroupDetailSerializer(detail).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=FeatureGroupUpdateSerializer, responses={200: FeatureGroupDetailSerializer}
    )
    def partial_update(self, request: Request, ws: str, name: str) -> Response:
        group = feature_group_get(workspace=self.workspace, name=name)
        serializer = FeatureGroupUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        new_status = data.get("status")
        if new_status in (Lifecycle.RETIRED, Lifecycle.DEPRECATED) and not role_at_least(
            role_from_perms(self.workspace_perms), Role.MAINTAINER
        ):
            self.permission_denied(request, message="Deprecating or retiring needs a maintainer.")
        fields = {k: data[k] for k in ("description", "tags", "freshness_sla_seconds") if k in data}
        if "producer" in data:
            fields["producer"] = _member_user(self.workspace, data["producer"], attr="producer")
        # One PATCH, one transaction: a later part refused (a bad successor, a lifecycle move the
        # group cannot make) leaves none of the earlier parts written.
        with transaction.atomic():
            if fields:
                registry.feature_group_update(actor=request.user, group=group, **fields)
            if "features" in data:
                registry.feature_group_new_version(
                    actor=request.user, group=group, features=data["features"]
                )
            if "successor" in data:
                successor = (
                    feature_groups_of(workspace=self.workspace)
                    .filter(name=data["successor"])
                    .first()
                )
                if successor is None:
                    raise ReferenceNotFound(
                        f"no feature group '{data['successor']}'", attr="successor"
                    )
                registry.feature_group_link_successor(
                    actor=request.user, group=group, successor=successor
                )
            if new_status:
                registry.feature_group_set_status(
                    actor=request.user, group=group, status=new_status
                )
        detail = feature_group_detail(workspace=self.workspace, name=name)
        return Response(FeatureGroupDetailSerializer(detail).data)

    @extend_schema(responses={204: OpenApiResponse(description="Deleted.")})
    def destroy(self, request: Request, ws: str, name: str) -> Response:
        registry.feature_group_delete(
            actor=request.user, group=feature_group_get(workspace=self.workspace, name=name)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class FeatureViewSet(mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """One feature of a group; its lifecycle can be changed on its own."""

    lookup_field = "name"
    lookup_url_kwarg = "feature"
    lookup_value_regex = "[a-z][a-z0-9_]*"
    serializer_class = FeatureSerializer
    action_roles = {"partial_update": Role.DEVELOPER}

    def get_workspace_queryset(self) -> QuerySet:
        group = feature_group_get(workspace=self.workspace, name=self.kwargs["name"])
        return (
            Feature.objects.for_workspace(self.workspace)
            .filter(group=group)
            .select_related("group")
        )

    @extend_schema(request=FeatureStatusSerializer, responses={200: FeatureSerializer})
    def partial_update(self, request: Request, ws: str, name: str, feature: str) -> Response:
        target = self.get_object()
        serializer = FeatureStatusSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        new_status = serializer.validated_data["status"]
        if new_status == Lifecycle.RETIRED and not role_at_least(
            role_from_perms(self.workspace_perms), Role.MAINTAINER
        ):
            self.permission_denied(request, message="Retiring needs a maintainer.")
        updated = registry.feature_set_status(actor=request.user, feature=target, status=new_status)
        return Response(FeatureSerializer(updated).data)


RAW_FORMATS = {
    "application/json": BatchFormat.JSON,
    "text/csv": BatchFormat.CSV,
    "application/vnd.apache.parquet": BatchFormat.PARQUET,
    "application/x-parquet": BatchFormat.PARQUET,
    "application/octet-stream": BatchFormat.PARQUET,
}


class RawBatchParser(BaseParser):
    """Any non-multipart body, kept as its bytes: the view picks the format from the content type.

    Session authentication's CSRF check reads the request's form data, which parses the body. With
    ``FileUploadParser`` (which matches every content type) a JSON or CSV body without a
    Content-Disposition filename was refused there with 400 "Missing filename", so a logged-in
    browser could not push. Reading ``request.body`` keeps Django's upload size limit."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None) -> bytes:
        return parser_context["request"].body


class BatchViewSet(mixins.ListModelMixin, WorkspaceScopedViewSet):
    """Producer pushes into a group: JSON rows, or a CSV or Parquet file (body or multipart)."""

    # A batch's Idempotency-Key is its identity in the offline store (features.ingestion).
    handles_idempotency_key = True

    serializer_class = BatchSerializer
    action_roles = {"create": Role.DEVELOPER}
    parser_classes = [MultiPartParser, RawBatchParser]

    def get_workspace_queryset(self) -> QuerySet:
        return batches_of(
            group=feature_group_get(workspace=self.workspace, name=self.kwargs["name"])
        )

    def _payload(self, request: Request) -> tuple[bytes, str]:
        content_type = (request.content_type or "").split(";")[0].strip().lower()
        if content_type in RAW_FORMATS:
            return request.body, RAW_FORMATS[content_type]
        if content_type == "multipart/form-data":
            upload = request.FILES.get("file")
            if upload is None:
                raise ValidationError({"file": "attach the batch as the 'file' field"})
            declared = request.data.get("format") or upload.name.rsplit(".", 1)[-1].lower()
            if declared not in BatchFormat.values:
                raise ValidationError({"format": "one of json, csv, parquet"})
            return upload.read(), declared
        raise UnsupportedMediaType(content_type or "none")

    @extend_schema(
        request={
            "application/json": {
                "type": "object",
                "properties": {"rows": {"type": "array", "items": {"type": "object"}}},
            },
            "text/csv": {"type": "string", "format": "binary"},
            "application/vnd.apache.parquet": {"type": "string", "format": "binary"},
            "multipart/form-data": {
                "type": "object",
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "format": {"type": "string"},
                },
            },
        },
        parameters=[
            OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)
        ],
        responses={201: BatchAcceptedSerializer, 200: BatchAcceptedSerializer},
    )
    def create(self, request: Request, ws: str, name: str) -> Response:
        group = feature_group_get(workspace=self.workspace, name=name)
        body, batch_format = self._payload(request)
        try:
            result = ingestion.batch_ingest_retrying(
                actor=request.user,
                group=group,
                body=body,
                format=batch_format,
                idempotency_key=request.headers.get("Idempotency-Key"),
            )
        except ingestion.BatchRejected as exc:
            first = exc.problems[0]
            where = ", ".join(
                part
                for part in (
                    f"row {first['row']}" if first["row"] is not None else "",
                    f"column '{first['column']}'" if first["column"] else "",
                )
                if part
            )
            return Response(
                error_body(
                    status_code=400,
                    code="invalid_batch",
                    detail=f"{where}: {first['detail']}" if where else first["detail"],
                    attr=first["column"],
                    errors=exc.problems,
                ),
                status=status.HTTP_400_BAD_REQUEST,
            )
        data = BatchSerializer(result.batch).data | {"replayed": result.replayed}
        return Response(
            data, status=status.HTTP_200_OK if result.replayed else status.HTTP_201_CREATED
        )


class OnlineFeaturesViewSet(WorkspaceScopedViewSet):
    """Online lookup of many features for many entities."""

    action_roles = {"create": Role.VIEWER}
    serializer_class = OnlineLookupSerializer

    def get_workspace_queryset(self) -> QuerySet:  # no rows of its own
        raise Http404

    @extend_schema(request=OnlineLookupSerializer, responses={200: OnlineLookupResultSerializer})
    def create(self, request: Request, ws: str) -> Response:
        body = request.data if isinstance(request.data, dict) else {}
        if not isinstance(request.data, dict):
            raise ValidationError({"entities": 'send {"entities": [...], "features": [...]}'})
        return Response(
            online_lookup(
                workspace=self.workspace,
                entities=body.get("entities"),
                features=body.get("features"),
            )
        )
