from django.contrib import admin

from curation.models import RecordSet
from workspaces.admin_base import ServiceManagedAdminMixin, UnscopedAdminMixin


@admin.register(RecordSet)
class RecordSetAdmin(UnscopedAdminMixin, ServiceManagedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "version", "workspace", "source", "status", "row_count", "created_at")
    list_filter = ("status", "source")
    search_fields = ("name",)
