"""Admin console views of experiments (platform-wide, deliberately unscoped).

An experiment's state, ramp and decision move only through ``experiments.services`` (submit,
approve, ramp, stop, conclude: each checked and recorded); layers' salts and the feedback and
snapshots the analysis reads are never edited. So every field is read-only here.
"""

from django.contrib import admin

from experiments.models import Experiment, FeedbackEvent, Layer, Snapshot
from workspaces.admin_base import ServiceManagedAdminMixin, UnscopedAdminMixin


@admin.register(Layer)
class LayerAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "workspace", "salt", "created_at"]


@admin.register(Experiment)
class ExperimentAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["key", "workspace", "state", "ramp_step", "created_at"]
    list_filter = ["state"]


@admin.register(FeedbackEvent)
class FeedbackEventAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["event_id", "workspace", "experiment", "arm", "impressions", "clicks"]


@admin.register(Snapshot)
class SnapshotAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["experiment", "workspace", "created_at", "traffic_percent", "srm_mismatch"]
