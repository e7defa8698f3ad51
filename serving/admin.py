from django.contrib import admin

from serving.models import Deployment, DeploymentChange, ModelVersion, RegisteredModel


class UnscopedAdmin(admin.ModelAdmin):
    def get_queryset(self, request):
        return super().get_queryset(request).unscoped()


@admin.register(RegisteredModel)
class RegisteredModelAdmin(UnscopedAdmin):
    list_display = ["name", "workspace", "created_at"]


@admin.register(ModelVersion)
class ModelVersionAdmin(UnscopedAdmin):
    list_display = ["model", "version", "workspace", "gate_status", "created_at"]
    readonly_fields = ["artifact_path", "spec", "gates"]


@admin.register(Deployment)
class DeploymentAdmin(UnscopedAdmin):
    list_display = ["name", "workspace", "version", "backend", "replicas", "state"]


@admin.register(DeploymentChange)
class DeploymentChangeAdmin(UnscopedAdmin):
    list_display = ["deployment", "kind", "from_version", "to_version", "actor", "created_at"]
