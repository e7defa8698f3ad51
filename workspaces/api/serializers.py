"""Serializers for workspaces, members, tokens, service accounts and the activity log."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from workspaces.models import ApiToken, Event, EventRef, Membership, Role, Workspace
from workspaces.quota import quota_summaries, quota_summary

User = get_user_model()


class QuotaRowSerializer(serializers.Serializer):
    """One quota row (per GPU type; blank: all types). Limits ``null``: unlimited."""

    gpu_type = serializers.CharField()
    cpu_milli = serializers.IntegerField(allow_null=True)
    memory_mb = serializers.IntegerField(allow_null=True)
    gpu_milli = serializers.IntegerField(allow_null=True)
    storage_gb = serializers.IntegerField(allow_null=True)
    used_cpu_milli = serializers.IntegerField()
    used_memory_mb = serializers.IntegerField()
    used_gpu_milli = serializers.IntegerField()
    used_storage_gb = serializers.FloatField(allow_null=True)
    updated_at = serializers.DateTimeField()


class QuotaSerializer(serializers.Serializer):
    """``workspaces.quota.quota_summary``: what the dashboard, queue page and admin show."""

    limited = serializers.BooleanField(help_text="False: no quota, the workspace is unlimited.")
    rows = QuotaRowSerializer(many=True)
    used_cpu_milli = serializers.IntegerField()
    used_memory_mb = serializers.IntegerField()
    used_gpu_milli = serializers.IntegerField()
    used_storage_gb = serializers.FloatField()


class WorkspaceListSerializer(serializers.ListSerializer):
    """Reads the quota summaries of every listed workspace together (``quota_summaries``), so
    the list runs the same queries for two workspaces as for twenty."""

    def to_representation(self, data):
        workspaces = list(data.all() if hasattr(data, "all") else data)
        self.context["quotas"] = quota_summaries(workspaces=workspaces)
        return super().to_representation(workspaces)


class WorkspaceSerializer(serializers.ModelSerializer):
    quota = serializers.SerializerMethodField()
    role = serializers.SerializerMethodField()

    class Meta:
        model = Workspace
        list_serializer_class = WorkspaceListSerializer
        fields = [
            "slug",
            "name",
            "scene",
            "prediction_type",
            "description",
            "template",
            "quota",
            "role",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(QuotaSerializer)
    def get_quota(self, workspace: Workspace) -> dict:
        summary = self.context.get("quotas", {}).get(workspace.pk)
        if summary is None:
            summary = quota_summary(workspace=workspace)
        return QuotaSerializer(summary).data

    def get_role(self, workspace: Workspace) -> str | None:
        roles = self.context.get("roles", {})
        return roles.get(workspace.pk)


class WorkspaceUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    template = serializers.JSONField(required=False)

    def validate_template(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    email = serializers.EmailField(source="user.email", read_only=True)
    granted_by = serializers.CharField(source="granted_by.username", read_only=True, default=None)
    is_service_account = serializers.SerializerMethodField()

    class Meta:
        model = Membership
        fields = ["username", "email", "role", "granted_by", "granted_at", "is_service_account"]
        read_only_fields = fields

    def get_is_service_account(self, membership: Membership) -> bool:
        return hasattr(membership.user, "service_account")


class MembershipWriteSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)

    def validate_username(self, value: str):
        user = User.objects.filter(username=value, is_active=True).first()
        if user is None:
            raise serializers.ValidationError(f"no active user '{value}'")
        return user


class MembershipRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class EventRefSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="object_id")

    class Meta:
        model = EventRef
        fields = ["role", "kind", "id", "label"]


class EventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name")
    refs = EventRefSerializer(many=True)

    class Meta:
        model = Event
        fields = ["id", "created_at", "actor", "verb", "refs", "resources", "payload"]
        read_only_fields = fields


class TokenObtainSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, style={"input_type": "password"})
    name = serializers.CharField(max_length=100, required=False, default="api")


class TokenIssuedSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="The key. It is shown only in this response.")
    id = serializers.IntegerField()
    prefix = serializers.CharField()
    name = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)
    workspaces = serializers.ListField(child=serializers.CharField())


class ApiTokenSerializer(serializers.ModelSerializer):
    # many=True makes it a ManyRelatedField at run time; the stubs cannot infer its type.
    workspaces = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)  # type: ignore[var-annotated]
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "workspaces",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "is_active",
        ]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    workspaces = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, max_length=100
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class ServiceAccountCreateSerializer(serializers.Serializer):
    username = serializers.RegexField(r"^[A-Za-z0-9@.+_-]{3,150}$", max_length=150)
    role = serializers.ChoiceField(
        choices=[Role.VIEWER, Role.DEVELOPER, Role.MAINTAINER], default=Role.DEVELOPER
    )
    description = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class ServiceAccountSerializer(serializers.Serializer):
    username = serializers.CharField(source="user.username")
    description = serializers.CharField()
    created_at = serializers.DateTimeField()
    created_by = serializers.CharField(source="created_by.username", default=None)
