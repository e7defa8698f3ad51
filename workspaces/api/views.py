"""REST views for workspaces, members, activity, tokens and service accounts."""

from __future__ import annotations

import django_filters
from django.contrib.auth import authenticate, get_user_model
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from workspaces import services
from workspaces.api.serializers import (
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    EventSerializer,
    MembershipRoleSerializer,
    MembershipSerializer,
    MembershipWriteSerializer,
    ServiceAccountCreateSerializer,
    ServiceAccountSerializer,
    TokenIssuedSerializer,
    TokenObtainSerializer,
    WorkspaceSerializer,
    WorkspaceUpdateSerializer,
)
from workspaces.api.viewsets import WorkspaceScopedViewSet, request_token
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import ApiToken, Event, Membership, Role, ServiceAccount
from workspaces.selectors import (
    events_of,
    members_of,
    signed_in,
    tokens_of,
    workspace_access,
    workspace_get_visible,
    workspaces_visible_to,
)

User = get_user_model()


def _issued(token, key: str) -> dict:
    return {
        "token": key,
        "id": token.pk,
        "prefix": token.prefix,
        "name": token.name,
        "expires_at": token.expires_at,
        "workspaces": [w.slug for w in token.workspaces.all()],
    }


class TokenObtainView(APIView):
    """Exchange a username and password for an API token (shown once)."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth"

    def get_authenticate_header(self, request: Request) -> str:
        # No authenticator runs here, but a wrong password is still a 401, not a 403.
        return 'Token realm="api"'

    @extend_schema(request=TokenObtainSerializer, responses={201: TokenIssuedSerializer})
    def post(self, request: Request) -> Response:
        serializer = TokenObtainSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = authenticate(
            request._request,
            username=serializer.validated_data["username"],
            password=serializer.validated_data["password"],
        )
        if user is None or not user.is_active:
            raise AuthenticationFailed("Wrong username or password.")
        token, key = services.api_token_create(
            actor=user, user=user, name=serializer.validated_data["name"]
        )
        return Response(_issued(token, key), status=status.HTTP_201_CREATED)


class ApiTokenViewSet(mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The caller's own API tokens: list, create (key shown once) and revoke."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return tokens_of(user=self.request.user)

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: TokenIssuedSerializer})
    def create(self, request: Request) -> Response:
        serializer = ApiTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        slugs = serializer.validated_data.get("workspaces") or []
        visible = workspaces_visible_to(user=request.user, token=request_token(request))
        scope = list(visible.filter(slug__in=slugs))
        missing = sorted(set(slugs) - {w.slug for w in scope})
        if missing:
            raise ReferenceNotFound(f"no such workspace: {missing[0]}", attr="workspaces")
        caller_token = request_token(request)
        if not scope and caller_token is not None:
            # A narrowed token may only mint tokens as narrow as itself.
            scope = list(caller_token.workspaces.all())
        token, key = services.api_token_create(
            actor=request.user,
            user=signed_in(request.user),
            name=serializer.validated_data["name"],
            workspaces=scope,
            expires_at=serializer.validated_data.get("expires_at"),
        )
        return Response(_issued(token, key), status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance) -> None:
        services.api_token_revoke(actor=self.request.user, token=instance)


class WorkspaceViewSet(viewsets.GenericViewSet):
    """Workspaces the caller can see; workspace admins may edit name, description and template."""

    serializer_class = WorkspaceSerializer
    lookup_field = "slug"
    lookup_url_kwarg = "ws"
    lookup_value_regex = "[a-z0-9-]+"
    pagination_class = None

    def get_queryset(self) -> QuerySet:
        return workspaces_visible_to(user=self.request.user, token=request_token(self.request))

    def _roles(self, workspaces) -> dict[int, str]:
        user = self.request.user
        memberships = (
            Membership.objects.for_workspaces(workspaces)
            .filter(user=user)
            .values_list("workspace_id", "role")
        )
        roles = dict(memberships)
        if user.is_superuser:
            roles = {w.pk: roles.get(w.pk, Role.ADMIN) for w in workspaces}
        return roles

    def list(self, request: Request) -> Response:
        workspaces = list(self.get_queryset())
        context = self.get_serializer_context() | {"roles": self._roles(workspaces)}
        return Response(WorkspaceSerializer(workspaces, many=True, context=context).data)

    def retrieve(self, request: Request, ws: str) -> Response:
        workspace = workspace_get_visible(user=request.user, slug=ws, token=request_token(request))
        context = self.get_serializer_context() | {"roles": self._roles([workspace])}
        return Response(WorkspaceSerializer(workspace, context=context).data)

    @extend_schema(request=WorkspaceUpdateSerializer, responses={200: WorkspaceSerializer})
    def partial_update(self, request: Request, ws: str) -> Response:
        workspace, perms = workspace_access(
            user=request.user, slug=ws, token=request_token(request)
        )
        if "administer_workspace" not in perms:
            self.permission_denied(request, message="Only workspace admins can edit a workspace.")
        serializer = WorkspaceUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        workspace = services.workspace_update(
            actor=request.user, workspace=workspace, **serializer.validated_data
        )
        context = self.get_serializer_context() | {"roles": self._roles([workspace])}
        return Response(WorkspaceSerializer(workspace, context=context).data)


class MemberViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Members of a workspace and their roles; admins add, change and remove them."""

    serializer_class = MembershipSerializer
    lookup_field = "user__username"
    lookup_url_kwarg = "username"
    lookup_value_regex = "[^/]+"
    action_roles = {"create": Role.ADMIN, "partial_update": Role.ADMIN, "destroy": Role.ADMIN}

    def get_workspace_queryset(self) -> QuerySet:
        return members_of(workspace=self.workspace)

    @extend_schema(request=MembershipWriteSerializer, responses={201: MembershipSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = MembershipWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = services.membership_grant(
            actor=request.user,
            workspace=self.workspace,
            user=serializer.validated_data["username"],
            role=serializer.validated_data["role"],
        )
        return Response(self.get_serializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=MembershipRoleSerializer, responses={200: MembershipSerializer})
    def partial_update(self, request: Request, ws: str, username: str) -> Response:
        membership = self.get_object()
        serializer = MembershipRoleSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = services.membership_grant(
            actor=request.user,
            workspace=self.workspace,
            user=membership.user,
            role=serializer.validated_data["role"],
        )
        return Response(self.get_serializer(membership).data)

    @extend_schema(responses={204: OpenApiResponse(description="Removed.")})
    def destroy(self, request: Request, ws: str, username: str) -> Response:
        membership = self.get_object()
        services.membership_revoke(
            actor=request.user, workspace=self.workspace, user=membership.user
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class EventFilter(django_filters.FilterSet):
    verb = django_filters.CharFilter(field_name="verb", lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor_name")
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    object = django_filters.CharFilter(method="filter_object", help_text="kind:id, e.g. user:4")

    class Meta:
        model = Event
        fields = ["verb", "actor", "since", "until", "object"]

    def filter_object(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        kind, _, object_id = value.partition(":")
        if not kind or not object_id:
            raise ValidationError({"object": "use kind:id, e.g. workspace:3"})
        return queryset.filter(refs__kind=kind, refs__object_id=object_id).distinct()


class ActivityViewSet(mixins.ListModelMixin, WorkspaceScopedViewSet):
    """The workspace's event log, newest first. Read-only: events are never changed."""

    serializer_class = EventSerializer
    filterset_class = EventFilter

    def get_workspace_queryset(self) -> QuerySet:
        return events_of(workspace=self.workspace)


class ServiceAccountViewSet(mixins.ListModelMixin, WorkspaceScopedViewSet):
    """Service accounts (feature producers, automation) of a workspace; admins create them."""

    serializer_class = ServiceAccountSerializer
    read_role = Role.ADMIN
    action_roles = {"create": Role.ADMIN}

    def get_workspace_queryset(self) -> QuerySet:
        return (
            ServiceAccount.objects.for_workspace(self.workspace)
            .select_related("user", "created_by")
            .order_by("user__username")
        )

    @extend_schema(request=ServiceAccountCreateSerializer, responses={201: TokenIssuedSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = ServiceAccountCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        account, key = services.service_account_create(
            actor=request.user, workspace=self.workspace, **serializer.validated_data
        )
        token = account.user.api_tokens.get()
        return Response(_issued(token, key), status=status.HTTP_201_CREATED)
