"""The resource-audit console in the Django admin (A1-A3).

- Audit items ("use first, audit later"): over-quota jobs, idle deployments, low-utilisation
  jobs, with approve / revoke / mark-reviewed actions that are recorded as events.
- Resource usage: usage and cost per workspace and day against the workspace's quota.
- Audit trail: every event, filtered by workspace, verb, actor and time, exportable as CSV.
- The graph itself (nodes, edges), read-only.
"""

from __future__ import annotations

import csv
from datetime import datetime, timedelta

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from lineage.audit import audit_item_decide
from lineage.cost import platform_usage
from lineage.models import AuditItem, AuditStatus, Edge, Node, Usage
from lineage.projection import catch_up
from workspaces.admin_base import UnscopedAdminMixin
from workspaces.humanize import key_values
from workspaces.models import Event, Workspace, WorkspaceQuota

TRAIL_LIMIT = 500
CSV_LIMIT = 100_000


class _ReadOnly:
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def _decide(decision: str, label: str):
    def action(modeladmin, request: HttpRequest, queryset: QuerySet) -> None:
        count = 0
        for item in queryset.select_related("workspace"):
            audit_item_decide(actor=request.user, item=item, decision=decision)
            count += 1
        modeladmin.message_user(request, f"{label}: {count} item(s), recorded as events.")

    action.__name__ = f"mark_{decision}"
    return admin.action(description=f"{label} (recorded as an event)")(action)


def _since(request: HttpRequest, default_days: int = 30):
    raw = request.GET.get("since", "")
    try:
        return timezone.make_aware(datetime.fromisoformat(raw)) if raw else None
    except ValueError:
        return None


@admin.register(AuditItem)
class AuditItemAdmin(UnscopedAdminMixin, admin.ModelAdmin):
    list_display = [
        "flagged_at",
        "workspace",
        "category",
        "kind",
        "object_id",
        "label",
        "owner_name",
        "reason",
        "resources_used",
        "status",
        "decided_by",
    ]
    list_filter = ["status", "category", "workspace", ("flagged_at", admin.DateFieldListFilter)]
    search_fields = ["label", "object_id", "owner_name", "reason"]
    exclude = ["resources"]
    readonly_fields = [f.name for f in AuditItem._meta.fields if f.name != "resources"] + [
        "resources_used"
    ]
    actions = [
        _decide(AuditStatus.APPROVED, "Approve"),
        _decide(AuditStatus.REVOKED, "Revoke"),
        _decide(AuditStatus.REVIEWED, "Mark reviewed"),
    ]
    change_list_template = "lineage/admin_audit_changelist.html"

    @admin.display(description="Resources")
    def resources_used(self, obj: AuditItem) -> str:
        """The flagged event's resource figures as a key/value list, not a dict."""
        return key_values(obj.resources)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("workspace")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None  # the actions need it; the rows themselves are read-only

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        catch_up()
        return super().changelist_view(request, extra_context)

    def get_urls(self):
        own = [
            path(
                "usage/",
                self.admin_site.admin_view(self.usage_view),
                name="lineage_audit_usage",
            ),
            path(
                "trail/",
                self.admin_site.admin_view(self.trail_view),
                name="lineage_audit_trail",
            ),
        ]
        return own + super().get_urls()

    def usage_view(self, request: HttpRequest) -> HttpResponse:
        """Usage and cost per workspace and day, against the quota's capacity over the days."""
        catch_up()
        try:
            days = max(1, min(int(request.GET.get("days", 30)), 3650))
        except ValueError:
            days = 30
        since = timezone.now() - timedelta(days=days)
        rows = platform_usage(since=since)
        # The one quota's all-types row, in human units (None: unlimited, no share to show).
        quotas = {
            q.workspace.slug: {
                "cpu_cores": None if q.cpu_milli is None else q.cpu_milli / 1000,
                "gpus": None if q.gpu_milli is None else q.gpu_milli / 1000,
                "memory_gb": None if q.memory_mb is None else q.memory_mb / 1024,
            }
            for q in WorkspaceQuota.objects.unscoped()
            .filter(gpu_type="")
            .select_related("workspace")
        }
        totals: dict[str, dict] = {}
        for row in rows:
            t = totals.setdefault(
                row["workspace"],
                {"cpu_hours": 0.0, "gpu_hours": 0.0, "memory_gb_hours": 0.0, "cost": 0.0},
            )
            for key in t:
                t[key] += row[key]
        summary = []
        for ws in Workspace.objects.order_by("slug"):
            t = totals.get(
                ws.slug, {"cpu_hours": 0, "gpu_hours": 0, "memory_gb_hours": 0, "cost": 0}
            )
            quota = quotas.get(ws.slug, dict.fromkeys(("cpu_cores", "gpus", "memory_gb")))
            hours = days * 24
            capacity = {
                "cpu_hours": (quota.get("cpu_cores") or 0) * hours,
                "gpu_hours": (quota.get("gpus") or 0) * hours,
                "memory_gb_hours": (quota.get("memory_gb") or 0) * hours,
            }
            summary.append(
                {
                    "workspace": ws.slug,
                    "quota": quota,
                    "usage": t,
                    "share": {
                        key: (100 * t[key] / capacity[key]) if capacity[key] else None
                        for key in capacity
                    },
                    "over": any(
                        t[key] > capacity[key] for key in capacity if capacity[key] or t[key]
                    ),
                }
            )
        if request.GET.get("format") == "csv":
            columns = [
                "workspace",
                "day",
                "cpu_hours",
                "gpu_hours",
                "memory_gb_hours",
                "storage_gb",
                "cost",
            ]
            return _csv("usage.csv", columns, ([r[k] for k in columns] for r in rows))
        context = {
            **self.admin_site.each_context(request),
            "title": "Resource usage and cost against quota",
            "days": days,
            "rows": rows,
            "summary": summary,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "lineage/admin_usage.html", context)

    def trail_view(self, request: HttpRequest) -> HttpResponse:
        """Every event, filtered; ``format=csv`` exports the filtered trail."""
        events = Event.objects.unscoped().select_related("workspace").order_by("-id")
        filters = {k: request.GET.get(k, "").strip() for k in ("workspace", "verb", "actor")}
        if filters["workspace"]:
            events = events.filter(workspace__slug=filters["workspace"])
        if filters["verb"]:
            events = events.filter(verb__startswith=filters["verb"])
        if filters["actor"]:
            events = events.filter(actor_name=filters["actor"])
        since = _since(request)
        if since:
            events = events.filter(created_at__gte=since)
        if request.GET.get("format") == "csv":
            return _csv(
                "audit-trail.csv",
                ["id", "created_at", "workspace", "actor", "token", "verb", "resources", "payload"],
                (
                    [
                        e.pk,
                        e.created_at.isoformat(),
                        e.workspace.slug if e.workspace else "",
                        e.actor_name,
                        e.token_prefix,
                        e.verb,
                        e.resources,
                        e.payload,
                    ]
                    for e in events[:CSV_LIMIT].iterator()
                ),
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Audit trail",
            "events": list(events[:TRAIL_LIMIT]),
            "filters": filters,
            "since": request.GET.get("since", ""),
            "workspaces": Workspace.objects.order_by("slug").values_list("slug", flat=True),
            "csv_query": request.GET.urlencode(),
            "limit": TRAIL_LIMIT,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "lineage/admin_trail.html", context)


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv(filename: str, header: list[str], rows) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())

    def lines():
        yield writer.writerow(header)
        for row in rows:
            yield writer.writerow(
                ["" if v is None else (v if not isinstance(v, str) else _safe(v)) for v in row]
            )

    response = StreamingHttpResponse(lines(), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _safe(value: str) -> str:
    """Neutralise spreadsheet formulas in exported text."""
    return "'" + value if value[:1] in ("=", "+", "-", "@") else value


@admin.register(Node)
class NodeAdmin(UnscopedAdminMixin, _ReadOnly, admin.ModelAdmin):
    list_display = ["kind", "object_id", "label", "workspace", "owner_name", "live", "last_seen_at"]
    list_filter = ["kind", "live", "workspace"]
    search_fields = ["label", "object_id"]

    def view_on_site(self, obj: Node) -> str:
        return reverse("lineage-graph", kwargs={"ws": obj.workspace.slug}) + f"?node={obj.key}"


@admin.register(Edge)
class EdgeAdmin(UnscopedAdminMixin, _ReadOnly, admin.ModelAdmin):
    list_display = ["src", "type", "dst", "workspace", "active", "created_at", "ended_at"]
    list_filter = ["type", "active", "workspace"]
    list_select_related = ["src", "dst", "workspace"]


@admin.register(Usage)
class UsageAdmin(UnscopedAdminMixin, _ReadOnly, admin.ModelAdmin):
    list_display = ["created_at", "workspace", "node", "verb", "cpu_hours", "gpu_hours", "cost"]
    list_filter = ["workspace", "verb", ("created_at", admin.DateFieldListFilter)]
    list_select_related = ["node", "workspace"]
