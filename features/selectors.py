"""Reads of the feature registry, always within one workspace."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet
from django.http import Http404

from features.lookup import FeatureRef as FeatureRef
from features.lookup import online_lookup as online_lookup
from features.models import (
    Batch,
    Consumer,
    Dataset,
    Feature,
    FeatureGroup,
    FeatureGroupVersion,
    HealthCheck,
)
from features.samples import check_feature_refs as check_feature_refs
from features.samples import dataset_file as dataset_file
from features.samples import output_column as output_column
from workspaces.models import Workspace


def feature_groups_of(*, workspace: Workspace) -> QuerySet[FeatureGroup]:
    return (
        FeatureGroup.objects.for_workspace(workspace)
        .select_related("owner", "producer", "successor")
        .order_by("name")
    )


def feature_group_get(*, workspace: Workspace, name: str) -> FeatureGroup:
    group = feature_groups_of(workspace=workspace).filter(name=name).first()
    if group is None:
        raise Http404(f"No feature group '{name}'.")
    return group


def feature_group_detail(*, workspace: Workspace, name: str) -> FeatureGroup:
    """One group with its versions, features and live consumers loaded."""
    group = (
        feature_groups_of(workspace=workspace)
        .prefetch_related(
            Prefetch(
                "versions",
                queryset=FeatureGroupVersion.objects.for_workspace(workspace).order_by("version"),
            ),
            Prefetch(
                "feature_set", queryset=Feature.objects.for_workspace(workspace).order_by("name")
            ),
            Prefetch(
                "consumers",
                queryset=Consumer.objects.for_workspace(workspace)
                .filter(live=True)
                .select_related("owner"),
            ),
        )
        .filter(name=name)
        .first()
    )
    if group is None:
        raise Http404(f"No feature group '{name}'.")
    return group


def group_version(*, group: FeatureGroup, version: int | None = None) -> FeatureGroupVersion:
    found = (
        FeatureGroupVersion.objects.for_workspace(group.workspace)
        .filter(group=group, version=version or group.current_version)
        .first()
    )
    if found is None:
        raise Http404(f"'{group.name}' has no version {version}.")
    return found


def batches_of(*, group: FeatureGroup) -> QuerySet[Batch]:
    return (
        Batch.objects.for_workspace(group.workspace)
        .filter(group=group)
        .select_related("producer")
        .order_by("-created_at", "-id")
    )


def datasets_of(*, workspace: Workspace) -> QuerySet[Dataset]:
    return (
        Dataset.objects.for_workspace(workspace)
        .select_related("label_group", "created_by")
        .order_by("name", "-version")
    )


def health_history(*, group: FeatureGroup) -> QuerySet[HealthCheck]:
    return HealthCheck.objects.for_workspace(group.workspace).filter(group=group)


def consumers_of(*, group: FeatureGroup, live_only: bool = True) -> QuerySet[Consumer]:
    consumers = Consumer.objects.for_workspace(group.workspace).filter(group=group)
    if live_only:
        consumers = consumers.filter(live=True)
    return consumers.select_related("owner").order_by("kind", "label")


def dataset_columns(dataset: Dataset) -> list[str] | None:
    """The column names of the dataset's Parquet file, read from its footer (no rows); None when
    the file cannot be read from here (a remote store, a file not yet written)."""
    from features.samples import dataset_file, sample_schema

    if not dataset.path:
        return None
    try:
        return list(sample_schema(dataset_file(dataset)).names)
    except (OSError, ValueError):
        return None
