"""Admin console views of the registry and deployments (platform-wide, deliberately unscoped).

Versions, deployments and their changes are written only by the registry, the release gates and
the deployment services (each with its event): here every field is read-only, so a version
cannot be marked deployable without its gates, nor a deployment moved without a change record.
"""

from django.contrib import admin

from serving.models import Deployment, DeploymentChange, ModelVersion, RegisteredModel
from workspaces.admin import ServiceManagedAdminMixin


class UnscopedAdmin(admin.ModelAdmin):
    def get_queryset(self, request):
        return super().get_queryset(request).unscoped()


@admin.register(RegisteredModel)
class RegisteredModelAdmin(UnscopedAdmin):
    list_display = ["name", "workspace", "created_at"]


@admin.register(ModelVersion)
class ModelVersionAdmin(ServiceManagedAdminMixin, UnscopedAdmin):
    list_display = ["model", "version", "workspace", "gate_status", "created_at"]


@admin.register(Deployment)
class DeploymentAdmin(ServiceManagedAdminMixin, UnscopedAdmin):
    list_display = ["name", "workspace", "version", "backend", "replicas", "state"]


@admin.register(DeploymentChange)
class DeploymentChangeAdmin(ServiceManagedAdminMixin, UnscopedAdmin):
    list_display = ["deployment", "kind", "from_version", "to_version", "actor", "created_at"]
