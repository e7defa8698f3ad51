"""Training samples (F6): labelled events joined point-in-time with feature values.

A dataset is a label source (a feature group whose rows are labelled events, e.g. impressions
keyed by ``user_id`` and ``item_id`` with a ``clicked`` column) plus feature references. Building
it reads the label group's current version from the offline store and, for each referenced group
version, takes the latest feature row at or before each label event with DuckDB's
``ASOF LEFT JOIN``: a sample never sees a value from its label's future.

The sample lands in ``ARTIFACT_ROOT/datasets/ws=<id>/<name>/v=<version>/data/`` as Parquet parts
``part-00000.parquet``, ``part-00001.parquet``, ... (the folder is written under a temporary name,
then renamed), one part per run of label days the engine joined at a time, so the parts in name
order are the sample in event-time order; any Parquet reader takes the folder as one table.
Datasets built before partitioned samples are one file, ``.../v=<version>/data.parquet``; every
reader here takes either. One row per label event, ordered by event time, with the columns:

1. the label group's entity keys (strings),
2. ``event_time``: the label event's time (UTC),
3. the label columns, as named in the label group,
4. one column per feature reference, named ``<group>__<feature>`` (``group@v2:feature`` too).
   An embedding is stored as ``list<float32>`` with its ``dimension`` in the field metadata
   (PyArrow 25 cannot read a null ``fixed_size_list`` row back); ``dataset_table`` reads the
   file with embeddings typed ``fixed_size_list<float32, dimension>``.

Ties: a feature row whose time equals the label's time counts as at or before it. When several
feature rows share an entity and a time, the one from the latest batch wins (the batch id comes
from the file name ``batch-<id>.parquet``), and within one batch the last row. The value of the
winning row is taken as it is: a null there is a null in the sample, not an older value.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, cast

import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from features import offline_engine, offline_store
from features.lookup import MAX_FEATURES, FeatureRef, parse_refs, resolve_refs
from features.models import (
    ConsumerKind,
    Dataset,
    DatasetStatus,
    Feature,
    FeatureGroup,
    FeatureGroupVersion,
    Lifecycle,
    name_validator,
)
from features.registry import consumer_register, consumer_release
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Workspace
from workspaces.services import workspace_update

logger = logging.getLogger(__name__)

DATASETS_DIR = "datasets"
DATA_FOLDER = "data"
PART_FILE = "part-{:05d}.parquet"
TIME_COLUMN = "event_time"
MAX_LABEL_COLUMNS = 100
MAX_ERROR_CHARS = 2000
READ_BATCH_ROWS = 64 * 1024
# A preview measures coverage on at most this many label rows (a reproducible sample): its cost
# stays bounded however large the window; the label count itself is exact.
PREVIEW_SAMPLE_ROWS = 10_000
PREVIEW_SEED = 7
# DuckDB's Parquet reader exposes the row position as a virtual column of this name; a real column
# of the same name would silently shadow it and break the tie-break, so such groups are refused.
ROW_NUMBER_COLUMN = offline_engine.ROW_NUMBER_COLUMN
# Field metadata key of an embedding column in a dataset file (see ``file_schema``).
EMBEDDING_DIMENSION = b"dimension"


def output_column(ref: FeatureRef) -> str:
    """The dataset column that holds a feature reference's values: ``<group>__<feature>``."""
    return f"{ref.group}__{ref.feature}"


def dataset_relative_path(*, workspace_id: int, name: str, version: int) -> str:
    return f"{DATASETS_DIR}/ws={workspace_id}/{name}/v={version}/{DATA_FOLDER}"


def dataset_file(dataset: Dataset) -> Path:
    """Where a dataset's sample lives on this server (never shown through the API): a folder of
    Parquet parts, or one Parquet file for a dataset built before partitioned samples."""
    return Path(settings.ARTIFACT_ROOT) / (
        dataset.path
        or dataset_relative_path(
            workspace_id=dataset.workspace_id, name=dataset.name, version=dataset.version
        )
    )


def sample_files(path: Path) -> list[Path]:
    """A sample's Parquet files in row order: a folder's parts by name, or the file itself."""
    if path.is_dir():
        return sorted(path.glob("part-*.parquet"))
    return [path]


def sample_schema(path: Path) -> pa.Schema:
    """A sample's schema from its first file's footer (no rows read)."""
    files = sample_files(path)
    if not files:
        raise FileNotFoundError(path)
    return pq.read_schema(files[0])


def sample_single_file(path: Path) -> BinaryIO:
    """The sample as one Parquet file, open for reading: the file itself, or a folder's parts
    copied row group by row group into an anonymous temporary file (removed once closed)."""
    if not path.is_dir():
        return path.open("rb")
    # returned open to the caller (a FileResponse closes it), so no context manager here
    merged = tempfile.TemporaryFile(dir=path.parent)  # noqa: SIM115
    try:
        files = sample_files(path)
        schema = pq.read_schema(files[0])
        with pq.ParquetWriter(merged, schema, compression="zstd") as writer:
            for item in files:
                source = pq.ParquetFile(item)
                for group in range(source.num_row_groups):
                    writer.write_table(source.read_row_group(group))
    except BaseException:
        merged.close()
        raise
    merged.seek(0)
    return cast(BinaryIO, merged)


def sample_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in sample_files(path))


def file_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a dataset file is written with: embeddings as ``list<float32>``.

    PyArrow before 26 cannot read back a Parquet ``fixed_size_list`` column that holds a null row
    (apache/arrow#35692: "Expected all lists to be of size=2 but index 1 had size=0"), and a
    missing embedding is a null row. So the file stores each embedding as a variable list whose
    field metadata carries its ``dimension``; ``dataset_table`` restores the fixed-size type.
    """
    fields = []
    for item in schema:
        if pa.types.is_fixed_size_list(item.type):
            metadata = {**(item.metadata or {}), EMBEDDING_DIMENSION: str(item.type.list_size)}
            item = pa.field(item.name, pa.list_(item.type.value_type), True, metadata)
        fields.append(item)
    return pa.schema(fields, metadata=schema.metadata)


def dataset_table(path: Path | str, columns: list[str] | None = None) -> pa.Table:
    """A dataset file as a table, embeddings typed ``fixed_size_list<float32, dimension>``."""
    table = pq.read_table(path, columns=columns)
    fields = []
    for item in table.schema:
        dimension = (item.metadata or {}).get(EMBEDDING_DIMENSION)
        if dimension is not None and pa.types.is_list(item.type):
            item = pa.field(item.name, pa.list_(item.type.value_type, int(dimension)), True)
        fields.append(item)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


def dataset_columns(dataset: Dataset) -> list[str]:
    """The dataset file's columns, in order (see the module docstring)."""
    refs = [FeatureRef.parse(text, index=i) for i, text in enumerate(dataset.feature_refs)]
    return [
        *dataset.label_group.entity_keys,
        TIME_COLUMN,
        *dataset.label_columns,
        *(output_column(ref) for ref in refs),
    ]


# --- validation ------------------------------------------------------------------------------


def _current_version(group: FeatureGroup) -> FeatureGroupVersion:
    return (
        FeatureGroupVersion.objects.for_workspace(group.workspace_id)
        .filter(group=group, version=group.current_version)
        .get()
    )


def _check_reader_columns(group: FeatureGroup, version: FeatureGroupVersion, *, attr: str) -> None:
    if ROW_NUMBER_COLUMN in {*group.entity_keys, group.event_time_column, *version.feature_map()}:
        reason = f"'{group.name}' has a column named '{ROW_NUMBER_COLUMN}' (reserved)"
        raise ValidationError({attr: reason})


def _check_label_source(
    workspace: Workspace, label_group: FeatureGroup, label_columns: Any
) -> FeatureGroupVersion:
    if label_group.workspace_id != workspace.pk:
        raise ReferenceNotFound(f"no feature group '{label_group.name}'", attr="label_source")
    if label_group.status == Lifecycle.RETIRED:
        raise ValidationError({"label_source": f"feature group '{label_group.name}' is retired"})
    version = _current_version(label_group)
    _check_reader_columns(label_group, version, attr="label_source")
    if not isinstance(label_columns, list) or not label_columns:
        raise ValidationError({"label_columns": "give at least one label column"})
    if len(label_columns) > MAX_LABEL_COLUMNS:
        raise ValidationError({"label_columns": f"at most {MAX_LABEL_COLUMNS} label columns"})
    available = version.feature_map()
    retired = set(
        Feature.objects.for_workspace(workspace)
        .filter(group=label_group, status=Lifecycle.RETIRED)
        .values_list("name", flat=True)
    )
    seen: set[str] = set()
    for index, column in enumerate(label_columns):
        attr = f"label_columns.{index}"
        if not isinstance(column, str) or column not in available:
            shown = column if isinstance(column, str) else repr(column)
            raise ValidationError({attr: f"'{label_group.name}' has no column '{str(shown)[:63]}'"})
        if column in seen:
            raise ValidationError({attr: f"duplicate label column '{column}'"})
        if column in retired:
            raise ValidationError({attr: f"'{label_group.name}:{column}' is retired"})
        seen.add(column)
    return version


Resolved = dict[tuple[str, int | None], tuple[FeatureGroup, FeatureGroupVersion]]


def check_feature_refs(
    workspace: Workspace, label_group: FeatureGroup | None, feature_refs: Any
) -> tuple[list[FeatureRef], Resolved]:
    """Parse and resolve references; each must be live and joinable on the label's keys."""
    refs = parse_refs(feature_refs)
    resolved = resolve_refs(workspace=workspace, refs=refs)
    groups = {group.pk for group, _ in resolved.values()}
    retired = set(
        Feature.objects.for_workspace(workspace)
        .filter(group__in=groups, status=Lifecycle.RETIRED)
        .values_list("group__name", "name")
    )
    for index, ref in enumerate(refs):
        where = f"features.{index}"
        group, version = resolved[(ref.group, ref.version)]
        if (ref.group, ref.feature) in retired:
            raise ValidationError({where: f"feature '{ref}' is retired"})
        missing = [
            key
            for key in group.entity_keys
            if label_group is not None and key not in label_group.entity_keys
        ]
        if label_group is not None and missing:
            raise ValidationError(
                {
                    where: f"'{ref}' joins on {', '.join(group.entity_keys)}, but the label "
                    f"source '{label_group.name}' has no {', '.join(missing)} key"
                }
            )
        _check_reader_columns(group, version, attr=where)
    return refs, resolved


def _check_output_columns(
    label_group: FeatureGroup, label_columns: list[str], refs: list[FeatureRef]
) -> None:
    taken = {*label_group.entity_keys, TIME_COLUMN}
    for index, column in enumerate(label_columns):
        if column in taken:
            raise ValidationError(
                {f"label_columns.{index}": f"'{column}' clashes with a key or time column"}
            )
        taken.add(column)
    for index, ref in enumerate(refs):
        column = output_column(ref)
        if column in taken:
            raise ValidationError(
                {f"features.{index}": f"'{ref}' would repeat the column '{column}'"}
            )
        taken.add(column)


def _check_window(
    start_time: datetime | None, end_time: datetime | None
) -> tuple[datetime | None, datetime | None]:
    for attr, moment in (("start_time", start_time), ("end_time", end_time)):
        if moment is not None and (not isinstance(moment, datetime) or moment.tzinfo is None):
            raise ValidationError({attr: "give a time with a time zone"})
    if start_time is not None and end_time is not None and end_time <= start_time:
        raise ValidationError({"end_time": "must be after start_time"})
    return start_time, end_time


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise ValidationError({"name": "required"})
    try:
        name_validator(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from exc
    return name


# --- create ----------------------------------------------------------------------------------


def dataset_create(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    label_group: FeatureGroup,
    label_columns: list[str],
    feature_refs: list[str],
    start_time: datetime | None = None,
    end_time: datetime | None = None,
    background: bool = False,
) -> Dataset:
    """Create the next version of a named training sample over ``[start_time, end_time)`` and
    build it; the dataset is registered as a consumer of every feature and label it reads.

    Internal callers that need the data now (a pipeline stage) build it here and get it ready or
    failed. With ``background`` (the page and the API) the dataset is returned ``building`` and
    a Celery task builds it after the commit, recording its progress on the row."""
    with transaction.atomic():
        _check_name(name)
        label_version = _check_label_source(workspace, label_group, label_columns)
        refs, resolved = check_feature_refs(workspace, label_group, feature_refs)
        _check_output_columns(label_group, label_columns, refs)
        start_time, end_time = _check_window(start_time, end_time)
        latest = (
            Dataset.objects.for_workspace(workspace)
            .filter(name=name)
            .aggregate(latest=Max("version"))["latest"]
        )
        version = (latest or 0) + 1
        try:
            with transaction.atomic():
                dataset = Dataset.objects.create(
                    workspace=workspace,
                    name=name,
                    version=version,
                    label_group=label_group,
                    label_columns=list(label_columns),
                    feature_refs=[str(ref) for ref in refs],
                    start_time=start_time,
                    end_time=end_time,
                    status=DatasetStatus.BUILDING,
                    path=dataset_relative_path(
                        workspace_id=workspace.pk, name=name, version=version
                    ),
                    created_by=actor_user(actor),
                )
        except IntegrityError as exc:
            raise ConflictError(
                f"dataset '{name}' v{version} was created at the same moment; try again",
                attr="name",
            ) from exc
        used_groups = {label_group.pk: label_group}
        used_groups.update({group.pk: group for group, _ in resolved.values()})
        event_record(
            actor=actor,
            workspace=workspace,
            verb="dataset.created",
            refs=[
                _dataset_ref(dataset),
                *(Ref.to(group, role="input") for group in used_groups.values()),
            ],
            payload={
                "name": name,
                "version": version,
                "label_source": label_group.name,
                "label_version": label_version.version,
                "label_columns": list(label_columns),
                "features": [str(ref) for ref in refs],
                "feature_versions": {
                    str(ref): resolved[(ref.group, ref.version)][1].version for ref in refs
                },
                "start_time": start_time,
                "end_time": end_time,
            },
        )
        label = str(dataset)
        for column in label_columns:
            consumer_register(
                actor=actor,
                group=label_group,
                kind=ConsumerKind.DATASET,
                object_id=dataset.pk,
                label=label,
                feature_name=column,
            )
        for ref in refs:
            consumer_register(
                actor=actor,
                group=resolved[(ref.group, ref.version)][0],
                kind=ConsumerKind.DATASET,
                object_id=dataset.pk,
                label=label,
                feature_name=ref.feature,
            )
        if background:
            transaction.on_commit(partial(_enqueue_build, dataset.pk))
    if background:
        return dataset
    return dataset_build(dataset.pk) or dataset


def _enqueue_build(dataset_id: int) -> None:
    """Queue the build task; a broker that refuses it fails the dataset with the reason, so the
    page never shows a build that nothing will run."""
    from features.tasks import dataset_build_task

    try:
        dataset_build_task.apply_async(args=[dataset_id])
    except Exception as exc:  # the broker is down or refuses the message
        logger.warning("could not queue the build of dataset %s", dataset_id, exc_info=True)
        _finish_failed(
            dataset_id,
            f"the build could not be queued ({type(exc).__name__}); create the dataset again",
        )


def _dataset_ref(dataset: Dataset, *, role: str = "subject") -> Ref:
    return Ref(kind=Dataset.event_kind, object_id=dataset.pk, label=str(dataset), role=role)


# --- preview ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetPreview:
    """What a dataset would hold, measured before anything is created."""

    label_rows: int  # label events in the window: the dataset's row count (exact)
    sampled_rows: int  # label rows the coverage was measured on
    coverage: dict[str, float | None]  # feature ref -> share of sampled rows with a value

    @property
    def exact(self) -> bool:
        return self.sampled_rows == self.label_rows


def dataset_preview(
    *,
    workspace: Workspace,
    label_group: FeatureGroup,
    label_columns: list[str],
    feature_refs: list[str],
    start_time: datetime | None = None,
    end_time: datetime | None = None,
    sample_rows: int = PREVIEW_SAMPLE_ROWS,
) -> DatasetPreview:
    """The row count and per-feature coverage a dataset of these inputs would have, read from
    the offline store with the build's own point-in-time join (on DuckDB, whatever engine builds),
    and writing nothing. The count is exact; coverage is measured on a reproducible sample of at
    most ``sample_rows`` labels (all of them when there are fewer), joined against only their
    entities' feature rows."""
    _check_label_source(workspace, label_group, label_columns)
    refs, _resolved = check_feature_refs(workspace, label_group, feature_refs)
    _check_output_columns(label_group, label_columns, refs)
    start_time, end_time = _check_window(start_time, end_time)
    draft = Dataset(  # never saved: the plan reads only these fields
        workspace=workspace,
        label_group=label_group,
        label_columns=list(label_columns),
        feature_refs=[str(ref) for ref in refs],
        start_time=start_time,
        end_time=end_time,
    )
    plan, outputs, _versions = join_plan(draft)
    engine = offline_engine.duckdb_engine()
    label_rows = engine.count(plan)
    sampled, present = engine.coverage_sample(plan, sample_rows=sample_rows)
    coverage = {
        text: (count / sampled if sampled else None)
        for (_column, text), count in zip(outputs, present, strict=True)
    }
    return DatasetPreview(label_rows=label_rows, sampled_rows=sampled, coverage=coverage)


# --- build -----------------------------------------------------------------------------------


@dataclass
class _Source:
    """One group version read by a build, with the features taken from it."""

    group: FeatureGroup
    version: FeatureGroupVersion
    alias: str
    # (feature name, output column, reference text)
    features: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class _Built:
    rows: int
    bytes: int
    partitions: int
    coverage: dict[str, float | None]
    versions: dict[str, int]
    engine: str = "duckdb"
    seconds: float = 0.0


class DatasetBuildError(Exception):
    """The dataset cannot be built as recorded (a group or version vanished, ...)."""


def _column(name: str, output: str, spec: dict[str, Any]) -> offline_engine.Column:
    dimension = spec.get("dimension")
    return offline_engine.Column(
        name=name,
        output=output,
        dtype=str(spec["dtype"]),
        dimension=int(dimension) if dimension is not None else None,
    )


def _files(group: FeatureGroup, version: int) -> tuple[str, ...]:
    pattern = offline_store.parquet_glob(
        workspace_id=group.workspace_id, group_id=group.pk, version=version
    )
    return tuple(pattern or ())


def _sources(dataset: Dataset) -> list[_Source]:
    """The group versions a dataset reads, resolved again at build time (lifecycle aside)."""
    workspace_id = dataset.workspace_id
    sources: dict[tuple[str, int], _Source] = {}
    for index, text in enumerate(dataset.feature_refs):
        ref = FeatureRef.parse(text, index=index)
        group = FeatureGroup.objects.for_workspace(workspace_id).filter(name=ref.group).first()
        if group is None:
            raise DatasetBuildError(f"feature group '{ref.group}' no longer exists")
        number = ref.version or group.current_version
        key = (group.name, number)
        if key not in sources:
            version = (
                FeatureGroupVersion.objects.for_workspace(workspace_id)
                .filter(group=group, version=number)
                .first()
            )
            if version is None:
                raise DatasetBuildError(f"'{group.name}' has no version {number}")
            _check_reader_columns(group, version, attr="features")
            sources[key] = _Source(group=group, version=version, alias=f"s{len(sources)}")
        source = sources[key]
        if ref.feature not in source.version.feature_map():
            raise DatasetBuildError(f"'{ref}' is not in version {number} of '{group.name}'")
        source.features.append((ref.feature, output_column(ref), text))
    return list(sources.values())


def join_plan(
    dataset: Dataset,
) -> tuple[offline_engine.JoinPlan, list[tuple[str, str]], dict[str, int]]:
    """The dataset's point-in-time join as an engine plan (partitions outside its window pruned),
    with its (output column, ref) pairs and the group versions it reads."""
    label_group = dataset.label_group
    label_version = _current_version(label_group)
    specs = label_version.feature_map()
    missing = [c for c in dataset.label_columns if c not in specs]
    if missing:
        raise DatasetBuildError(f"'{label_group.name}' has no column '{missing[0]}' any more")
    _check_reader_columns(label_group, label_version, attr="label_source")
    labels = offline_engine.LabelInput(
        files=_files(label_group, label_version.version),
        keys=tuple(label_group.entity_keys),
        time_column=label_group.event_time_column,
        columns=tuple(_column(c, c, specs[c]) for c in dataset.label_columns),
        start_time=dataset.start_time,
        end_time=dataset.end_time,
    )
    inputs = []
    outputs: list[tuple[str, str]] = []
    versions = {label_group.name: label_version.version}
    for source in _sources(dataset):
        versions[source.group.name] = source.version.version
        feature_specs = source.version.feature_map()
        inputs.append(
            offline_engine.FeatureInput(
                alias=source.alias,
                files=_files(source.group, source.version.version),
                keys=tuple(source.group.entity_keys),
                time_column=source.group.event_time_column,
                columns=tuple(
                    _column(feature, column, feature_specs[feature])
                    for feature, column, _ in source.features
                ),
            )
        )
        outputs.extend((column, text) for _, column, text in source.features)
    plan = offline_engine.JoinPlan(labels=labels, sources=tuple(inputs), time_output=TIME_COLUMN)
    return plan.pruned(), outputs, versions


def _record_progress(dataset_id: int, **fields: int) -> None:
    """Store how far a build got, outside its transaction so the page sees it move."""
    Dataset.objects.unscoped().filter(pk=dataset_id, status=DatasetStatus.BUILDING).update(**fields)


def write_sample(
    engine: offline_engine.OfflineEngine,
    plan: offline_engine.JoinPlan,
    final: Path,
    *,
    on_progress: Any = None,
    on_partition: Any = None,
) -> tuple[int, dict[str, int]]:
    """Run the plan on the engine and write the sample to the folder ``final`` as one Parquet
    part per engine part (a temporary folder renamed into place, so a reader never sees half a
    sample); returns the rows written and, per output column, the rows with a value.
    ``on_progress(rows_total, rows_done)`` is called after the count and after every batch,
    ``on_partition(partitions_total, partitions_done)`` before the first part and after each.
    A part with no rows writes no file; an empty sample is one empty part of its schema."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.parent / f".{final.name}-{uuid.uuid4().hex}.tmp"
    temporary.mkdir()
    columns = [c.output for s in plan.sources for c in s.columns]
    present = dict.fromkeys(columns, 0)
    rows = written = 0
    schema: pa.Schema | None = None
    try:
        total = engine.count(plan)  # one row per label event: the size of the sample to come
        if on_progress is not None:
            on_progress(total, 0)
        partitions = engine.part_count(plan)
        if on_partition is not None:
            on_partition(partitions, 0)
        for done, part in enumerate(engine.parts(plan, batch_rows=READ_BATCH_ROWS), start=1):
            writer = None
            try:
                for chunk in part:
                    if schema is None:
                        schema = file_schema(chunk.schema)
                    if writer is None:
                        writer = pq.ParquetWriter(
                            temporary / PART_FILE.format(written), schema, compression="zstd"
                        )
                        written += 1
                    writer.write_batch(chunk.cast(schema))
                    rows += chunk.num_rows
                    for column in columns:
                        values = chunk.column(column)
                        present[column] += len(values) - values.null_count
                    if on_progress is not None:
                        on_progress(total, rows)
            finally:
                if writer is not None:
                    writer.close()
            if on_partition is not None:
                on_partition(partitions, done)
        if not written:  # no rows: an empty part of the sample's schema
            empty = file_schema(plan.arrow_schema())
            pq.ParquetWriter(temporary / PART_FILE.format(0), empty, compression="zstd").close()
        if final.exists():  # a build retried after its rename and before its commit
            shutil.rmtree(final) if final.is_dir() else final.unlink()
        os.replace(temporary, final)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return rows, present


def _write_file(dataset: Dataset) -> _Built:
    plan, outputs, versions = join_plan(dataset)
    engine = offline_engine.engine()
    started = time.monotonic()
    rows, present = write_sample(
        engine,
        plan,
        dataset_file(dataset),
        on_progress=partial(_rows_callback, dataset.pk),
        on_partition=partial(_partitions_callback, dataset.pk),
    )
    coverage = {text: (present[column] / rows if rows else None) for column, text in outputs}
    return _Built(
        rows=rows,
        bytes=sample_bytes(dataset_file(dataset)),
        partitions=len(sample_files(dataset_file(dataset))),
        coverage=coverage,
        versions=versions,
        engine=engine.name,
        seconds=time.monotonic() - started,
    )


def _rows_callback(dataset_id: int, rows_total: int, rows_done: int) -> None:
    _record_progress(dataset_id, rows_total=rows_total, rows_done=rows_done)


def _partitions_callback(dataset_id: int, partitions_total: int, partitions_done: int) -> None:
    _record_progress(dataset_id, partitions_total=partitions_total, partitions_done=partitions_done)


def _public_error(exc: Exception) -> str:
    """The error text a user may see: server paths under the artifact root are cut out."""
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DatasetBuildError) else str(exc)
    return text.replace(str(Path(settings.ARTIFACT_ROOT)), "<artifacts>")[:MAX_ERROR_CHARS]


def _lock(dataset_id: int) -> Dataset | None:
    # Builds run from the platform's own ids (the create service, a Celery task), never from a
    # request, so the row is found by primary key across workspaces; it carries its workspace.
    return (
        Dataset.objects.unscoped()
        .select_for_update(of=("self",))
        .select_related("workspace", "label_group", "created_by")
        .filter(pk=dataset_id)
        .first()
    )


def dataset_build(dataset_id: int) -> Dataset | None:
    """Build a dataset that is still ``building``: write its file, then mark it ready (or
    failed, with the reason). Safe to call twice: a dataset that is no longer building is left
    as it is, so a redelivered task does nothing."""
    with transaction.atomic():
        dataset = _lock(dataset_id)
        if dataset is None or dataset.status != DatasetStatus.BUILDING:
            return dataset
    try:
        built = _write_file(dataset)
    except Exception as exc:  # any build failure is recorded on the dataset
        logger.warning("dataset %s failed to build", dataset_id, exc_info=True)
        return _finish_failed(dataset_id, _public_error(exc))
    return _finish_ready(dataset_id, built)


@transaction.atomic
def _finish_ready(dataset_id: int, built: _Built) -> Dataset | None:
    dataset = _lock(dataset_id)
    if dataset is None or dataset.status != DatasetStatus.BUILDING:
        return dataset
    dataset.status = DatasetStatus.READY
    dataset.row_count = dataset.rows_total = dataset.rows_done = built.rows
    dataset.partitions_total = dataset.partitions_done = built.partitions
    dataset.coverage = built.coverage
    dataset.error = ""
    dataset.built_at = timezone.now()
    dataset.engine = built.engine
    dataset.build_seconds = round(built.seconds, 3)
    dataset.save(
        update_fields=[
            "status",
            "row_count",
            "rows_total",
            "rows_done",
            "partitions_total",
            "partitions_done",
            "coverage",
            "error",
            "built_at",
            "engine",
            "build_seconds",
        ]
    )
    event_record(
        actor=dataset.created_by,
        workspace=dataset.workspace,
        verb="dataset.built",
        refs=[_dataset_ref(dataset, role="output"), Ref.to(dataset.label_group, role="input")],
        resources={"rows": built.rows, "bytes": built.bytes},
        payload={
            "name": dataset.name,
            "version": dataset.version,
            "rows": built.rows,
            "bytes": built.bytes,
            "partitions": built.partitions,
            "engine": built.engine,
            "seconds": round(built.seconds, 3),
            "coverage": built.coverage,
            "group_versions": built.versions,
            "path": dataset.path,
        },
    )
    return dataset


@transaction.atomic
def _finish_failed(dataset_id: int, error: str) -> Dataset | None:
    dataset = _lock(dataset_id)
    if dataset is None or dataset.status != DatasetStatus.BUILDING:
        return dataset
    dataset.status = DatasetStatus.FAILED
    dataset.error = error
    dataset.save(update_fields=["status", "error"])
    event_record(
        actor=dataset.created_by,
        workspace=dataset.workspace,
        verb="dataset.failed",
        refs=[_dataset_ref(dataset)],
        payload={"name": dataset.name, "version": dataset.version, "error": error},
    )
    # A dataset without data uses nothing: it must not block retiring what it named.
    consumer_release(
        actor=dataset.created_by,
        workspace=dataset.workspace,
        kind=ConsumerKind.DATASET,
        object_id=dataset.pk,
    )
    return dataset


# --- the workspace's default sample stream ---------------------------------------------------


def _stream_of(template: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    template = copy.deepcopy(template) if isinstance(template, dict) else {}
    stream = template.get("sample_stream")
    if not isinstance(stream, dict):
        stream = {"label_source": None, "features": []}
    stream = {**stream, "features": list(stream.get("features") or [])}
    template["sample_stream"] = stream
    return template, stream


def _relabel(exc: ValidationError, attr: str) -> ValidationError:
    messages = [m for errors in exc.message_dict.values() for m in errors]
    return ValidationError({attr: messages})


@transaction.atomic
def sample_stream_add_feature(
    *, actor: Actor, workspace: Workspace, feature_ref: str
) -> dict[str, Any]:
    """Add one feature to the workspace's default sample stream (its template) and record the
    stream as a consumer of it; returns the new template. Adding it again changes nothing, and a
    ref to the same feature with another version pin replaces the old one."""
    locked = Workspace.objects.select_for_update().get(pk=workspace.pk)
    template, stream = _stream_of(locked.template)
    label_source = stream.get("label_source")
    label_group = (
        FeatureGroup.objects.for_workspace(workspace).filter(name=label_source).first()
        if isinstance(label_source, str)
        else None
    )
    try:
        refs, resolved = check_feature_refs(workspace, label_group, [feature_ref])
    except ReferenceNotFound as exc:
        raise ReferenceNotFound(exc.detail, attr="feature") from exc
    except ValidationError as exc:
        raise _relabel(exc, "feature") from exc
    ref = refs[0]
    group = resolved[(ref.group, ref.version)][0]
    features: list[Any] = stream["features"]
    same_column = [
        i
        for i, text in enumerate(features)
        if isinstance(text, str)
        and (parsed := _parse_or_none(text)) is not None
        and output_column(parsed) == output_column(ref)
    ]
    if same_column:
        features[same_column[0]] = str(ref)
    else:
        if len(features) >= MAX_FEATURES:
            raise ValidationError({"feature": f"a sample stream holds at most {MAX_FEATURES}"})
        features.append(str(ref))
    updated = workspace_update(actor=actor, workspace=locked, template=template)
    consumer_register(
        actor=actor,
        group=group,
        kind=ConsumerKind.SAMPLE_STREAM,
        object_id=workspace.slug,
        label=f"{workspace.slug} sample stream",
        feature_name=ref.feature,
    )
    workspace.template = updated.template
    return updated.template


def _parse_or_none(text: str) -> FeatureRef | None:
    try:
        return FeatureRef.parse(text, index=0)
    except ValidationError:
        return None
