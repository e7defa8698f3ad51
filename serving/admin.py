"""Admin console views of the registry and deployments (platform-wide, deliberately unscoped).

Versions, deployments and their changes are written only by the registry, the release gates and
the deployment services (each with its event): here every field is read-only, so a version
cannot be marked deployable without its gates, nor a deployment moved without a change record.
"""

from django.contrib import admin

from serving.models import (
    Deployment,
    DeploymentChange,
    DeploymentStatus,
    ModelVersion,
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
