"""Admin console: quota requests, scheduling records, the over-quota audit list, lending."""

from __future__ import annotations

from django.contrib import admin, messages

from training.models import NodeState
from training.scheduler import services
from training.scheduler.lending import reclaim_node, utilisation
from training.scheduler.models import (
    JobScheduling,
    LendingLease,
    ManagedNode,
    NodeHealth,
    NodeLending,
    OverQuotaJob,
)
from workspaces.admin_base import ServiceManagedAdminMixin, UnscopedAdminMixin
from workspaces.models import QuotaRequest


@admin.register(QuotaRequest)
class QuotaRequestAdmin(UnscopedAdminMixin, admin.ModelAdmin):
    """Workspace admins' quota requests; a superuser approves (the quota is set) or rejects."""

    list_display = (
        "workspace",
        "gpu_type",
        "cpu_milli",
        "memory_mb",
        "gpu_milli",
        "status",
        "requested_by",
        "requested_at",
        "decided_by",
    )
    list_filter = ("status",)
    readonly_fields = [f.name for f in QuotaRequest._meta.fields]
    actions = ("approve", "reject")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _decide(self, request, queryset, *, approve: bool) -> None:
        done = [
            services.quota_request_decide(actor=request.user, quota_request=item, approve=approve)
            for item in queryset
        ]
        self.message_user(request, f"{len(done)} request(s) decided.", messages.SUCCESS)

    @admin.action(description="Approve (set the quota as asked)", permissions=["change"])
    def approve(self, request, queryset) -> None:
        self._decide(request, queryset, approve=True)

    @admin.action(description="Reject", permissions=["change"])
    def reject(self, request, queryset) -> None:
        self._decide(request, queryset, approve=False)


@admin.register(JobScheduling)
class JobSchedulingAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """The scheduler's record of each job: written by admission and the tick only."""

    list_display = ("job", "workspace", "reason", "policy", "placements", "preemptions", "borrowed")
    list_filter = ("policy", "borrowed", "over_quota")


@admin.register(OverQuotaJob)
class OverQuotaJobAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """Flagged by admission; closed by the "Mark as reviewed" action (``over_quota_review``)."""

    list_display = (
        "job",
        "workspace",
        "job_priority",
        "job_state",
        "flagged_at",
        "reviewed_at",
        "reviewed_by",
    )
    list_filter = ("reviewed_at",)
    actions = ["mark_reviewed"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(over_quota=True).select_related("job")

    @admin.display(description="class")
    def job_priority(self, obj):
        return obj.job.priority_class

    @admin.display(description="state")
    def job_state(self, obj):
        return obj.job.state

    @admin.action(description="Mark as reviewed")
    def mark_reviewed(self, request, queryset):
        for item in queryset:
            services.over_quota_review(actor=request.user, scheduling=item)


@admin.register(LendingLease)
class LendingLeaseAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """Leases the scheduler opens and ends (``scheduler.lending``): shown, never written here."""

    list_display = ("node", "job", "gpu_milli", "started_at", "ended_at", "end_reason")
    change_list_template = "scheduler/admin_lending_changelist.html"

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "lending": utilisation(days=7)}
        return super().changelist_view(request, extra_context=extra_context)


@admin.register(NodeLending)
class NodeLendingAdmin(admin.ModelAdmin):
    list_display = ("node", "reclaimed_until", "reclaim_reason")


@admin.register(NodeHealth)
class NodeHealthAdmin(admin.ModelAdmin):
    list_display = ("node", "acknowledged_failures", "cordoned_at")


@admin.register(ManagedNode)
class ManagedNodeAdmin(admin.ModelAdmin):
    """Cordon or make ready, declare inference nodes and their lending windows, reclaim."""

    list_display = (
        "name",
        "kind",
        "state",
        "state_reason",
        "cpu_milli",
        "memory_mb",
        "gpu_count",
        "failure_count",
        "last_heartbeat",
    )
    list_filter = ("kind", "state")
    fields = (
        "name",
        "queue",
        "kind",
        "state",
        "state_reason",
        "lending_windows",
        "labels",
        "cpu_milli",
        "memory_mb",
        "gpus",
        "failure_count",
        "last_heartbeat",
    )
    readonly_fields = ("name", "queue", "cpu_milli", "memory_mb", "gpus", "last_heartbeat")
    actions = ["cordon", "make_ready", "reclaim"]

    def has_add_permission(self, request):
        return False  # nodes register themselves through their agent's heartbeat

    @admin.action(description="Cordon (no new jobs)")
    def cordon(self, request, queryset):
        queryset.update(state=NodeState.CORDONED, state_reason=f"cordoned by {request.user}")

    @admin.action(description="Make ready")
    def make_ready(self, request, queryset):
        queryset.update(state=NodeState.READY, state_reason=f"made ready by {request.user}")

    @admin.action(description="Reclaim lent capacity (preempt borrowed jobs)")
    def reclaim(self, request, queryset):
        for node in queryset:
            reclaim_node(node=node, reason=f"reclaimed by {request.user}")
