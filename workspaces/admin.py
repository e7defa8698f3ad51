"""Admin console: workspaces with their quota and members, tokens, service accounts, events,
notifications, webhooks and workspace policies (the base classes every app's admin uses are in
``workspaces.admin_base``).

Writes made here go through the same services as the API, so each one records its event. Events
are read-only here, as everywhere.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet

from workspaces import notifications, services
from workspaces.admin_base import (
    ReadOnlyAdminMixin,
    ServiceManagedAdminMixin,
    UnscopedAdminMixin,
    model_field_names,
)
from workspaces.exceptions import ConflictError
from workspaces.models import (
    ApiToken,
    ConsumerCursor,
    Event,
    EventRef,
    Membership,
    Notification,
    ServiceAccount,
    WebhookDelivery,
    WebhookEndpoint,
    Workspace,
    WorkspacePolicy,
    WorkspaceQuota,
)
from workspaces.quota import quota_summary


class WorkspaceRowsFormSet(BaseInlineFormSet):
    """Rows of the workspace being edited: the hidden ``id`` field looks each row up in that
    workspace (Django's default lookup is unnarrowed, which scoping refuses with a 500)."""

    def add_fields(self, form, index) -> None:
        super().add_fields(form, index)
        pk_field = form.fields.get(self.model._meta.pk.name)
        if pk_field is not None and hasattr(pk_field, "queryset"):
            pk_field.queryset = self.model.objects.for_workspace(self.instance)


def _usage_text(quota: WorkspaceQuota, summary: dict) -> str:
    """The row's live usage as ``quota_summary`` (the dashboard's and queue page's) has it."""
    row = next((r for r in summary["rows"] if r["gpu_type"] == quota.gpu_type), None)
    if row is None:
        return "-"
    text = (
        f"CPU {row['used_cpu_milli'] / 1000:g} cores, memory {row['used_memory_mb'] / 1024:g} GiB,"
        f" GPU {row['used_gpu_milli'] / 1000:g}"
    )
    if row["used_storage_gb"] is not None:
        text += f", storage {row['used_storage_gb']:g} GB"
    return text


class QuotaRowsFormSet(WorkspaceRowsFormSet):
    @classmethod
    def get_default_prefix(cls) -> str:
        return "quotas"  # the foreign key has no reverse name ("+"), which would leave none


class KeyedRowForm(forms.ModelForm):
    """An inline row whose ``key_field`` says which row it is: a new row picks it, an existing
    one keeps it (the field is disabled) and may change the rest."""

    key_field: str

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields[self.key_field].disabled = True


class QuotaInlineForm(KeyedRowForm):
    """A new row picks its GPU type; an existing row keeps it and may change its limits."""

    key_field = "gpu_type"

    class Meta:
        model = WorkspaceQuota
        fields = ["gpu_type", "cpu_milli", "memory_mb", "gpu_milli", "storage_gb"]


class QuotaInline(UnscopedAdminMixin, admin.TabularInline):
    """The workspace's quota rows (per GPU type); saved by ``quota_set`` (``quota.changed``)."""

    model = WorkspaceQuota
    form = QuotaInlineForm
    formset = QuotaRowsFormSet
    extra = 0
    can_delete = False
    fields = ["gpu_type", "cpu_milli", "memory_mb", "gpu_milli", "storage_gb", "used_now"]
    readonly_fields = ["used_now"]

    @admin.display(description="in use now")
    def used_now(self, quota: WorkspaceQuota) -> str:
        if not quota.pk:
            return "-"
        return _usage_text(quota, quota_summary(workspace=quota.workspace))

    def has_add_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser


class MembershipInlineForm(KeyedRowForm):
    """A new row picks its user; an existing member keeps theirs and may change role."""

    key_field = "user"

    class Meta:
        model = Membership
        fields = ["user", "role"]


class MembershipInline(UnscopedAdminMixin, admin.TabularInline):
    """Grant a role (or change one) from the workspace's page; saved by ``membership_grant``."""

    model = Membership
    form = MembershipInlineForm
    formset = WorkspaceRowsFormSet
    extra = 0
    fields = ["user", "role", "granted_by", "granted_at"]
    readonly_fields = ["granted_by", "granted_at"]
    autocomplete_fields = ["user"]
    can_delete = False  # removal is the Memberships list's recorded "Remove" action
    show_change_link = True


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "scene", "prediction_type", "created_at"]
    list_filter = ["prediction_type", "scene"]
    search_fields = ["slug", "name", "scene"]
    readonly_fields = ["created_at", "created_by"]
    inlines = [QuotaInline, MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # Slug and scene identify the workspace in URLs, tokens and events: fixed once created.
        if obj:
            return [*self.readonly_fields, "slug", "scene", "prediction_type"]
        return self.readonly_fields

    def get_inlines(self, request, obj):
        return self.inlines if obj else []

    def save_model(self, request, obj: Workspace, form, change: bool) -> None:
        if change:
            services.workspace_update(
                actor=request.user,
                workspace=Workspace.objects.get(pk=obj.pk),
                name=obj.name,
                description=obj.description,
                template=obj.template,
            )
        else:
            created = services.workspace_create(
                actor=request.user,
                slug=obj.slug,
                name=obj.name,
                scene=obj.scene,
                prediction_type=obj.prediction_type,
                description=obj.description,
                template=obj.template,
            )
            obj.pk = created.pk

    def save_formset(self, request, form, formset, change: bool) -> None:
        if formset.model not in (WorkspaceQuota, Membership):
            super().save_formset(request, form, formset, change)
            return
        # Saved through the services (each writes its event), not formset.save(); the lists
        # below are what formset.save() would leave for the admin's change message.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for row in formset.forms:
            if not row.has_changed():
                continue
            saved: WorkspaceQuota | Membership
            try:
                if formset.model is WorkspaceQuota:
                    saved = services.quota_set(
                        actor=request.user,
                        workspace=form.instance,
                        gpu_type=row.cleaned_data.get("gpu_type", ""),
                        **{name: row.cleaned_data.get(name) for name in WorkspaceQuota.LIMITS},
                    )
                else:
                    saved = services.membership_grant(
                        actor=request.user,
                        workspace=form.instance,
                        user=row.cleaned_data["user"],
                        role=row.cleaned_data["role"],
                    )
            except (ValidationError, ConflictError, PermissionDenied) as exc:
                messages.error(request, str(exc))
                continue
            if row.instance.pk:
                formset.changed_objects.append((saved, row.changed_data))
            else:
                formset.new_objects.append(saved)

    def has_delete_permission(self, request, obj=None) -> bool:
        # Workspaces own an immutable event log; they are never deleted.
        return False


class MembershipAdminForm(forms.ModelForm):
    class Meta:
        model = Membership
        fields = ["workspace", "user", "role"]


@admin.register(Membership)
class MembershipAdmin(UnscopedAdminMixin, admin.ModelAdmin):
    form = MembershipAdminForm
    list_display = ["workspace", "user", "role", "granted_by", "granted_at"]
    list_filter = ["role", "workspace"]
    search_fields = ["user__username", "workspace__slug"]
    autocomplete_fields = ["user", "workspace"]
    actions = ["revoke_selected"]

    def get_readonly_fields(self, request, obj=None):
        return ["workspace", "user"] if obj else []

    def save_model(self, request, obj: Membership, form, change: bool) -> None:
        try:
            saved = services.membership_grant(
                actor=request.user, workspace=obj.workspace, user=obj.user, role=obj.role
            )
        except (ValidationError, ConflictError) as exc:
            messages.error(request, str(exc))
            return
        obj.pk = saved.pk

    def delete_model(self, request, obj: Membership) -> None:
        services.membership_revoke(actor=request.user, workspace=obj.workspace, user=obj.user)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.action(description="Remove selected members (recorded in the event log)")
    def revoke_selected(self, request, queryset: QuerySet) -> None:
        for membership in queryset.select_related("workspace", "user"):
            try:
                services.membership_revoke(
                    actor=request.user, workspace=membership.workspace, user=membership.user
                )
            except (ValidationError, ConflictError) as exc:
                messages.error(request, str(exc))


@admin.register(WorkspaceQuota)
class WorkspaceQuotaAdmin(UnscopedAdminMixin, admin.ModelAdmin):
    """The one quota (per workspace and GPU type): what admission reads, with its live usage.

    Changed by superusers only, through ``quota_set`` (a ``quota.changed`` event each)."""

    list_display = [
        "workspace",
        "gpu_type",
        "cpu_milli",
        "memory_mb",
        "gpu_milli",
        "storage_gb",
        "used_now",
        "updated_at",
    ]
    list_filter = ["gpu_type"]
    list_select_related = ["workspace"]
    fields = ["workspace", "gpu_type", "cpu_milli", "memory_mb", "gpu_milli", "storage_gb"]

    def get_fields(self, request, obj=None):
        return [*self.fields, "used_now"] if obj else self.fields

    def get_readonly_fields(self, request, obj=None):
        return ["workspace", "gpu_type", "used_now"] if obj else []

    @admin.display(description="in use now")
    def used_now(self, quota: WorkspaceQuota) -> str:
        return _usage_text(quota, quota_summary(workspace=quota.workspace))

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj: WorkspaceQuota, form, change: bool) -> None:
        saved = services.quota_set(
            actor=request.user,
            workspace=obj.workspace,
            gpu_type=obj.gpu_type,
            **{name: form.cleaned_data.get(name) for name in WorkspaceQuota.LIMITS},
        )
        obj.pk = saved.pk


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "prefix",
        "name",
        "user",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "user__username"]
    readonly_fields = model_field_names(ApiToken, exclude=("id", "key_hash"))
    actions = ["revoke_selected"]

    def has_add_permission(self, request) -> bool:
        return False  # keys are issued by `manage.py token create`, the API or the UI

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke_selected(self, request, queryset: QuerySet) -> None:
        for token in queryset:
            services.api_token_revoke(actor=request.user, token=token)
        messages.success(request, f"Revoked {queryset.count()} token(s).")


@admin.register(ServiceAccount)
class ServiceAccountAdmin(UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["user", "workspace", "created_by", "created_at"]
    list_filter = ["workspace"]
    readonly_fields = ["user", "workspace", "created_by", "created_at"]

    def has_add_permission(self, request) -> bool:
        return False  # created with its token by the API or `manage.py serviceaccount create`


class EventRefInline(admin.TabularInline):
    model = EventRef
    fields = ["role", "kind", "object_id", "label"]
    readonly_fields = ["role", "kind", "object_id", "label"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Event)
class EventAdmin(UnscopedAdminMixin, ServiceManagedAdminMixin, admin.ModelAdmin):
    """The audit trail: filter by workspace, verb, actor and time; nothing can be changed."""

    list_display = ["created_at", "workspace", "actor_name", "verb", "resources"]
    list_filter = ["workspace", "verb", ("created_at", admin.DateFieldListFilter), "actor_name"]
    search_fields = ["verb", "actor_name", "refs__label", "refs__object_id"]
    date_hierarchy = "created_at"
    inlines = [EventRefInline]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("workspace")


@admin.register(Notification)
class NotificationAdmin(UnscopedAdminMixin, ServiceManagedAdminMixin, admin.ModelAdmin):
    """Notifications as sent; read-only (``workspaces.notifications.notify`` writes them)."""

    list_display = ["created_at", "workspace", "recipient", "verb", "title", "read_at"]
    list_filter = ["verb", "workspace", ("created_at", admin.DateFieldListFilter)]
    search_fields = ["title", "verb", "recipient__username"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("workspace", "recipient")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(UnscopedAdminMixin, admin.ModelAdmin):
    """Webhooks of every workspace; added through the API (which checks the URL), removable here
    through the same service, so the removal is recorded."""

    list_display = ["workspace", "url", "active", "last_status", "last_attempt_at", "created_by"]
    list_filter = ["active", "workspace"]
    readonly_fields = model_field_names(WebhookEndpoint, exclude=("id", "secret"))
    exclude = ["secret"]
    actions = ["delete_webhooks"]

    def has_add_permission(self, request) -> bool:
        return False

    def delete_model(self, request, obj: WebhookEndpoint) -> None:
        notifications.webhook_delete(actor=request.user, webhook=obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.action(description="Delete selected webhooks (recorded in the event log)")
    def delete_webhooks(self, request, queryset: QuerySet) -> None:
        for webhook in queryset.select_related("workspace"):
            notifications.webhook_delete(actor=request.user, webhook=webhook)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """The webhook delivery log: one row per attempt, written by the sender; read-only."""

    list_display = [
        "id",
        "workspace",
        "webhook",
        "event_id",
        "attempt",
        "status_code",
        "next_attempt_at",
        "attempted_at",
        "delivered_at",
    ]
    list_filter = ["workspace", ("delivered_at", admin.EmptyFieldListFilter)]
    search_fields = ["=event_id", "error"]
    readonly_fields = ["workspace", "webhook", *WebhookDelivery.SHOWN_FIELDS]
    exclude = ["payload", "claimed_until"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("workspace", "webhook")


@admin.register(ConsumerCursor)
class ConsumerCursorAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Where each consumer of the event log stands (and its last handler error); read-only."""

    list_display = ["name", "last_event_id", "has_gaps", "failures", "updated_at"]
    readonly_fields = ["name", "last_event_id", "has_gaps", "failures", "last_error", "updated_at"]


class PlatformAdminOnlyMixin:
    """Fair-use limits are the platform's, not a workspace's: only superusers change them
    (staff may look)."""

    def has_add_permission(self, request, *args) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_staff


@admin.register(WorkspacePolicy)
class WorkspacePolicyAdmin(PlatformAdminOnlyMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """Per-workspace fair-use limits; a blank field is the platform default (shown as help)."""

    list_display = ["workspace", *services.POLICY_FIELDS, "updated_at"]
    search_fields = ["workspace__slug"]
    autocomplete_fields = ["workspace"]

    def get_readonly_fields(self, request, obj=None):
        return ["workspace", "updated_at"] if obj else ["updated_at"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        from workspaces.selectors import policy_defaults

        form = super().get_form(request, obj, change=change, **kwargs)
        defaults = policy_defaults()
        for name in services.POLICY_FIELDS:
            if name in form.base_fields:
                default = defaults[name]
                form.base_fields[name].help_text = f"Blank: the platform default ({default})."
        return form

    def save_model(self, request, obj: WorkspacePolicy, form, change: bool) -> None:
        saved = services.workspace_policy_set(
            actor=request.user,
            workspace=obj.workspace,
            **{name: getattr(obj, name) for name in services.POLICY_FIELDS},
        )
        obj.pk = saved.pk
