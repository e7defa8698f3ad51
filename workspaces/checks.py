"""System checks that keep tenant scoping fail-closed as new models are added."""

from __future__ import annotations

from django.apps import apps
from django.core import checks
from django.core.exceptions import FieldDoesNotExist

from workspaces.scoping import WorkspaceScopedQuerySet


@checks.register(checks.Tags.models)
def workspace_models_are_scoped(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every model with a ``workspace`` foreign key must default to a WorkspaceScopedQuerySet."""
    return unscoped_workspace_models(apps.get_models())


def unscoped_workspace_models(models) -> list[checks.CheckMessage]:
    problems: list[checks.CheckMessage] = []
    for model in models:
        try:
            field = model._meta.get_field("workspace")
        except FieldDoesNotExist:
            continue
        if not field.many_to_one and not field.one_to_one:
            continue
        if field.related_model._meta.label != "workspaces.Workspace":
            continue
        queryset = model._default_manager.get_queryset()
        if not isinstance(queryset, WorkspaceScopedQuerySet):
            problems.append(
                checks.Error(
                    f"{model._meta.label} belongs to a workspace but its default manager does not "
                    "use WorkspaceScopedQuerySet.",
                    hint="objects = WorkspaceScopedQuerySet.as_manager()",
                    obj=model,
                    id="workspaces.E001",
                )
            )
    return problems
