"""REST views for notifications: a workspace's webhooks (admins) and each user's own inbox."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from workspaces import notifications
from workspaces.api.viewsets import WorkspaceScopedViewSet, request_token
from workspaces.models import Notification, Role, WebhookDelivery, WebhookEndpoint
from workspaces.selectors import signed_in


class WebhookSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", default=None)

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "active",
            "created_by",
            "created_at",
            "last_attempt_at",
            "last_status",
            "last_error",
        ]
        read_only_fields = fields


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(
        help_text="Signs each delivery (HMAC-SHA256 of the body, header X-RankOps-Signature). "
        "Shown only in this response."
    )

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookCreateSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=notifications.WEBHOOK_MAX_URL_LENGTH)
    secret = serializers.CharField(
        required=False,
        min_length=notifications.MIN_SECRET_LENGTH,
        max_length=200,
        help_text="Optional; a random one is generated when omitted.",
    )


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """One attempt of the delivery log (the body sent is not shown: it names recipients)."""

    class Meta:
        model = WebhookDelivery
        fields = ["id", *WebhookDelivery.SHOWN_FIELDS]
        read_only_fields = fields


class NotificationSerializer(serializers.ModelSerializer):
    workspace = serializers.CharField(source="workspace.slug")
    read = serializers.SerializerMethodField()

    class Meta:
        model = Notification
        fields = [
            "id",
            "workspace",
            "verb",
            "title",
            "body",
            "link",
            "event_id",
            "created_at",
            "read_at",
            "read",
        ]
        read_only_fields = fields

    def get_read(self, notification: Notification) -> bool:
        return notification.read_at is not None


class WebhookViewSet(mixins.ListModelMixin, WorkspaceScopedViewSet):
    """Outbound webhooks of a workspace: every notification in it is posted as signed JSON."""

    serializer_class = WebhookSerializer
    lookup_value_regex = "[0-9]+"
    read_role = Role.ADMIN
    action_roles = {"create": Role.ADMIN, "destroy": Role.ADMIN}

    def get_workspace_queryset(self) -> QuerySet:
        return notifications.webhooks_of(workspace=self.workspace)

    @extend_schema(request=WebhookCreateSerializer, responses={201: WebhookCreatedSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = WebhookCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        webhook, secret = notifications.webhook_create(
            actor=request.user, workspace=self.workspace, **serializer.validated_data
        )
        webhook.secret = secret
        return Response(WebhookCreatedSerializer(webhook).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: WebhookDeliverySerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="deliveries")
    def deliveries(self, request: Request, ws: str, pk: str) -> Response:
        """The webhook's delivery log, newest attempt first (read-only): one row per attempt,
        with the event id receivers dedup on, the answer and when the next attempt is due."""
        log = notifications.webhook_deliveries_of(webhook=self.get_object()).order_by("-id")
        page = self.paginate_queryset(log)
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)

    @extend_schema(responses={204: OpenApiResponse(description="Deleted.")})
    def destroy(self, request: Request, ws: str, pk: str) -> Response:
        notifications.webhook_delete(actor=request.user, webhook=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


def _unread_filter(raw: str | None) -> bool | None:
    if raw is None or raw == "":
        return None
    value = raw.strip().lower()
    if value in {"1", "true", "yes"}:
        return True
    if value in {"0", "false", "no"}:
        return False
    raise ValidationError({"unread": "true or false"})


class NotificationViewSet(viewsets.GenericViewSet):
    """The caller's own notifications, newest first; ``?unread=true`` for the unread ones."""

    serializer_class = NotificationSerializer
    queryset = Notification.objects.none()
    lookup_value_regex = "[0-9]+"

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return Notification.objects.none()
        return notifications.notifications_of(
            user=signed_in(self.request.user), token=request_token(self.request)
        )

    @extend_schema(
        parameters=[OpenApiParameter("unread", OpenApiTypes.BOOL, OpenApiParameter.QUERY)]
    )
    def list(self, request: Request) -> Response:
        inbox = self.get_queryset()
        unread = _unread_filter(request.query_params.get("unread"))
        if unread is not None:
            inbox = inbox.filter(read_at__isnull=unread)
        page = self.paginate_queryset(inbox)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        request=None,
        responses={
            200: OpenApiResponse(
                inline_serializer("MarkedRead", {"marked_read": serializers.IntegerField()}),
                description="How many unread notifications were marked read.",
            )
        },
    )
    @action(detail=False, methods=["post"], url_path="read-all")
    def read_all(self, request: Request) -> Response:
        count = notifications.notifications_mark_all_read(
            user=signed_in(request.user), token=request_token(request)
        )
        return Response({"marked_read": count})

    @extend_schema(request=None, responses={200: NotificationSerializer})
    @action(detail=True, methods=["post"], url_path="read")
    def read(self, request: Request, pk: str) -> Response:
        notification = notifications.notification_mark_read(
            user=signed_in(request.user), notification=self.get_object()
        )
        return Response(self.get_serializer(notification).data)
