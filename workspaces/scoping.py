"""Fail-closed tenant scoping for workspace-owned models.

A queryset of a workspace-owned model must be narrowed to one workspace (``for_workspace``) before
it is evaluated; evaluating an unnarrowed one raises ``UnscopedQueryError`` instead of returning
every tenant's rows. Code that really needs all rows (the admin console, maintenance tasks) says so
with ``unscoped()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self

from django.db import models

if TYPE_CHECKING:
    from workspaces.models import Workspace


class UnscopedQueryError(RuntimeError):
    """A workspace-owned queryset was evaluated without being narrowed to a workspace."""


class WorkspaceScopedQuerySet(models.QuerySet):
    """A queryset that refuses to run until it is narrowed to a workspace."""

    workspace_field = "workspace"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._workspace_scoped = False

    def _clone(self) -> Self:
        # QuerySet._clone is Django's private clone hook; django-stubs leave it out.
        clone = super()._clone()  # type: ignore[misc]
        clone._workspace_scoped = self._workspace_scoped
        return clone

    def for_workspace(self, workspace: Workspace | int) -> Self:
        """Rows of one workspace only."""
        workspace_id = workspace if isinstance(workspace, int) else workspace.pk
        clone = self.filter(**{f"{self.workspace_field}_id": workspace_id})
        clone._workspace_scoped = True
        return clone

    def for_workspaces(self, workspaces: models.QuerySet | Iterable[int]) -> Self:
        """Rows of a set of workspaces (already narrowed to what the caller may see)."""
        clone = self.filter(**{f"{self.workspace_field}__in": workspaces})
        clone._workspace_scoped = True
        return clone

    def _narrowing_keys(self) -> frozenset[str]:
        """Lookups that pin the workspace to one value (or a given set): equality on the
        workspace or its id, pk or slug, and ``__in``. ``workspace__isnull=False``, ranges and
        pattern lookups do not narrow anything and leave the queryset unscoped."""
        field = self.workspace_field
        keys = {field, f"{field}_id", f"{field}__pk", f"{field}__id", f"{field}__slug"}
        return frozenset({*keys, *(f"{k}__exact" for k in keys), f"{field}__in", f"{field}_id__in"})

    def _filter_or_exclude(self, negate: bool, args: Any, kwargs: Any) -> Self:
        # _filter_or_exclude is Django's private hook under filter() and exclude().
        clone = super()._filter_or_exclude(negate, args, kwargs)  # type: ignore[misc]
        # filter(workspace=...) narrows as well (Django's own unique checks filter this way).
        narrowing = self._narrowing_keys()
        if not negate and any(
            key in narrowing and value is not None for key, value in kwargs.items()
        ):
            clone._workspace_scoped = True
        return clone

    def update(self, **kwargs: Any) -> int:
        if not self._is_scoped():
            raise UnscopedQueryError(f"{self.model._meta.label}.update() without for_workspace()")
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        if not self._is_scoped():
            raise UnscopedQueryError(f"{self.model._meta.label}.delete() without for_workspace()")
        return super().delete()

    def bulk_update(self, objs: Any, fields: Any, batch_size: int | None = None) -> int:
        # Django runs it as filter(pk__in=...).update() on this queryset: the objects were
        # loaded (and so scoped) already, and their pks pin the rows.
        return super(WorkspaceScopedQuerySet, self.unscoped()).bulk_update(
            objs, fields, batch_size=batch_size
        )

    def unscoped(self) -> Self:
        """All workspaces' rows: for the admin console and platform maintenance only."""
        clone = self._clone()
        clone._workspace_scoped = True
        return clone

    def _is_scoped(self) -> bool:
        if self._workspace_scoped:
            return True
        # A related manager reached through a workspace (workspace.events.all()) or through an
        # object that belongs to one (group.versions.all()) is scoped by that parent.
        # Django's QuerySet keeps the related-manager hints here (not in the stubs).
        instance = self._hints.get("instance")  # type: ignore[attr-defined]
        if instance is None:
            return False
        return instance._meta.label == "workspaces.Workspace" or hasattr(instance, "workspace_id")

    def _fetch_all(self) -> None:
        if self._result_cache is None and not self._is_scoped():
            raise UnscopedQueryError(
                f"{self.model._meta.label} queryset evaluated without for_workspace(); "
                "narrow it to a workspace or call unscoped() deliberately."
            )
        super()._fetch_all()

    def iterator(self, chunk_size: int | None = None):
        if not self._is_scoped():
            raise UnscopedQueryError(f"{self.model._meta.label}.iterator() without for_workspace()")
        return super().iterator(chunk_size=chunk_size)

    def count(self) -> int:
        if not self._is_scoped():
            raise UnscopedQueryError(f"{self.model._meta.label}.count() without for_workspace()")
        return super().count()

    def exists(self) -> bool:
        if not self._is_scoped():
            raise UnscopedQueryError(f"{self.model._meta.label}.exists() without for_workspace()")
        return super().exists()

    def aggregate(self, *args: Any, **kwargs: Any) -> dict:
        if not self._is_scoped():
            raise UnscopedQueryError(
                f"{self.model._meta.label}.aggregate() without for_workspace()"
            )
        return super().aggregate(*args, **kwargs)
