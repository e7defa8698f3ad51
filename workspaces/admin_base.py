"""The admin console's shared base classes, for every app's ``admin.py``.

A module of its own (not ``workspaces.admin``) so that importing a base class registers no model
admin as a side effect.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpRequest


def model_field_names(model, *, exclude: tuple[str, ...] = ()) -> list[str]:
    """Every field of a model by name (concrete, then many-to-many), less ``exclude``: the
    read-only list of an admin that shows a row whole, without writing the list out again."""
    opts = model._meta
    return [f.name for f in (*opts.concrete_fields, *opts.many_to_many) if f.name not in exclude]


class UnscopedAdminMixin:
    """The admin console sees every workspace's rows, deliberately."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # a mixin for ModelAdmin subclasses, which define get_queryset.
        queryset = super().get_queryset(request)  # type: ignore[misc]
        return queryset.unscoped() if hasattr(queryset, "unscoped") else queryset


class ReadOnlyAdminMixin:
    """Rows the admin shows and never adds, changes or deletes (delivery logs, cursors)."""

    def has_add_permission(self, request: HttpRequest, *args) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class ServiceManagedAdminMixin(ReadOnlyAdminMixin):
    """Rows whose every field is set by services and gates (a version's gate status, an
    experiment's state and decision, a job's scheduling record): the admin shows them and never
    writes them, since a write here would skip the service's checks and its event.

    Every field is read-only, nothing is added or deleted here, and a change form POST is
    refused (403). Changes are made where the service is: the UI, the API or an admin action
    that calls it."""

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> list[str]:
        # a mixin for ModelAdmin subclasses, which have .model and get_readonly_fields.
        names = model_field_names(self.model)  # type: ignore[attr-defined]
        return [*dict.fromkeys([*names, *super().get_readonly_fields(request, obj)])]  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj=None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)
