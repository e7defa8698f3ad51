"""Admin console views of the registry and deployments (platform-wide, deliberately unscoped).

Versions, deployments and their changes are written only by the registry, the release gates and
the deployment services (each with its event): here every field is read-only, so a version
cannot be marked deployable without its gates, nor a deployment moved without a change record.
"""

from django.contrib import admin

from serving.models import (
    BenchmarkScore,
    BenchmarkSet,
    Deployment,
    DeploymentChange,
    DeploymentStatus,
    ModelVersion,
    PairwiseReview,
    RegisteredModel,
)
from workspaces.admin_base import ServiceManagedAdminMixin, UnscopedAdminMixin


@admin.register(RegisteredModel)
class RegisteredModelAdmin(UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "workspace", "created_at"]


@admin.register(ModelVersion)
class ModelVersionAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["model", "version", "workspace", "gate_status", "created_at"]


@admin.register(Deployment)
class DeploymentAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "workspace", "version", "backend", "replicas", "state"]


@admin.register(DeploymentChange)
class DeploymentChangeAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    list_display = ["deployment", "kind", "from_version", "to_version", "actor", "created_at"]


@admin.register(DeploymentStatus)
class DeploymentStatusAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """What the controllers observed; written by them only, so read-only here."""

    list_display = ["deployment", "phase", "observed_generation", "ready_replicas", "reconciled_at"]


@admin.register(PairwiseReview)
class PairwiseReviewAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """Blind human reviews: written by ``serving.review`` only (items and judgements with it)."""

    list_display = ["id", "model", "version_a", "version_b", "status", "item_count", "created_at"]


@admin.register(BenchmarkSet)
class BenchmarkSetAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """Benchmark sets: versions are immutable once created (``serving.benchmarks``)."""

    list_display = ["name", "version", "workspace", "kind", "rows", "created_at"]


@admin.register(BenchmarkScore)
class BenchmarkScoreAdmin(ServiceManagedAdminMixin, UnscopedAdminMixin, admin.ModelAdmin):
    """Scores written by the benchmark worker only."""

    list_display = ["benchmark", "version", "workspace", "state", "scored_at"]
