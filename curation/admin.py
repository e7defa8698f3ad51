from django.contrib import admin

from curation.models import AnnotationTask, RecordSet
from workspaces.admin_base import ServiceManagedAdminMixin, UnscopedAdminMixin


@admin.register(RecordSet)
class RecordSetAdmin(UnscopedAdminMixin, ServiceManagedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "version", "workspace", "source", "status", "row_count", "created_at")
    list_filter = ("status", "source")
    search_fields = ("name",)


@admin.register(AnnotationTask)
class AnnotationTaskAdmin(UnscopedAdminMixin, ServiceManagedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "workspace", "source", "annotators_per_item", "item_count", "status")
    list_filter = ("status",)
    search_fields = ("name",)
