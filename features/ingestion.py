"""Producer pushes: validate a batch against the group's schema, store it once, serve it online.

A batch is all or nothing: the first problems are reported by row and column and nothing is
stored. Every accepted batch lands as Parquet (the record, rebuilt into the online store by the
materialisation task if needed) and, for online groups, in the online store. An Idempotency-Key
makes a retried batch a replay of the first one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from features import offline_store, online_store, sketches
from features.models import (
    Batch,
    BatchFormat,
    DriftSketch,
    Dtype,
    FeatureGroup,
    FeatureGroupVersion,
    Lifecycle,
)
from features.registry import group_locked, touch_ingested
from workspaces.api.parsers import parse_strict_json
from workspaces.db_reconnect import connection_lost
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace, WorkspaceQuota
from workspaces.quota import GIB
from workspaces.selectors import policy_check

logger = logging.getLogger(__name__)

MAX_ERRORS = 10
MAX_ROWS = 1_000_000
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
FUTURE_TOLERANCE = timedelta(days=1)

ARROW_TYPES: dict[str, Callable[[dict], pa.DataType]] = {
    Dtype.INT: lambda spec: pa.int64(),
    Dtype.FLOAT: lambda spec: pa.float64(),
    Dtype.BOOL: lambda spec: pa.bool_(),
    Dtype.STRING: lambda spec: pa.string(),
    Dtype.CATEGORICAL: lambda spec: pa.string(),
    Dtype.EMBEDDING: lambda spec: pa.list_(pa.float32(), spec["dimension"]),
    Dtype.CATEGORICAL_LIST: lambda spec: pa.list_(pa.string()),
}
# A categorical list's bounds: items per row, and characters per item (a category, not text).
MAX_LIST_ITEMS = 1_000
MAX_LIST_ITEM_CHARS = 1_000


class BatchRejected(ValidationError):
    """The batch broke the schema; ``problems`` lists the first ones by row and column."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        self.problems = problems[:MAX_ERRORS]
        first = self.problems[0]
        super().__init__({first["column"] or "rows": first["detail"]})


@dataclass
class IngestResult:
    batch: Batch
    replayed: bool
    online_rows: int = 0
    files: list[str] = field(default_factory=list)


def _problem(row: int | None, column: str | None, detail: str) -> dict[str, Any]:
    return {"row": row, "column": column, "detail": detail}


# --- cell checks (the error-reporting path) -----------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _is_float(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _embedding_check(dimension: int) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return (
            isinstance(value, list) and len(value) == dimension and all(_is_float(v) for v in value)
        )

    return check


def _is_category(value: Any) -> bool:
    return (isinstance(value, str) and len(value) <= MAX_LIST_ITEM_CHARS) or _is_int(value)


def _is_category_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_LIST_ITEMS
        and all(_is_category(v) for v in value)
    )


LIST_EXPECTED = (
    f"a list of at most {MAX_LIST_ITEMS} strings (each at most {MAX_LIST_ITEM_CHARS} "
    "characters) or integers"
)


def _cell_check(spec: dict[str, Any]) -> tuple[Callable[[Any], bool], str]:
    dtype = spec["dtype"]
    if dtype == Dtype.INT:
        return _is_int, "an integer"
    if dtype == Dtype.FLOAT:
        return _is_float, "a finite number"
    if dtype == Dtype.BOOL:
        return (lambda v: isinstance(v, bool)), "true or false"
    if dtype in (Dtype.STRING, Dtype.CATEGORICAL):
        return (lambda v: isinstance(v, str) and len(v) <= 10_000), "a string"
    if dtype == Dtype.CATEGORICAL_LIST:
        return _is_category_list, LIST_EXPECTED
    return _embedding_check(spec["dimension"]), f"a list of {spec['dimension']} finite numbers"


def parse_event_time(value: Any, *, now: datetime) -> datetime:
    """ISO 8601 with a time zone, or unix seconds; between 1970 and a day from now."""
    if isinstance(value, bool):
        raise ValueError("must be an ISO 8601 time with a zone or unix seconds")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("must be finite")
        # Range first: fromtimestamp overflows (OverflowError, not ValueError) on e.g. 1e20.
        if value < 0:
            raise ValueError("is before 1970")
        if value > (now + FUTURE_TOLERANCE).timestamp():
            raise ValueError("is more than a day in the future")
        moment = datetime.fromtimestamp(value, tz=UTC)
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError(f"'{value[:40]}' is not an ISO 8601 time") from exc
        if moment.tzinfo is None:
            raise ValueError("has no time zone; add Z or an offset")
    elif isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("has no time zone")
        moment = value
    else:
        raise ValueError("must be an ISO 8601 time with a zone or unix seconds")
    if moment < EARLIEST:
        raise ValueError("is before 1970")
    if moment > now + FUTURE_TOLERANCE:
        raise ValueError("is more than a day in the future")
    return moment.astimezone(UTC)


# --- building the Arrow table ---------------------------------------------------------------------


def _schema(group: FeatureGroup, version: FeatureGroupVersion) -> pa.Schema:
    fields = [pa.field(key, pa.string(), nullable=False) for key in group.entity_keys]
    fields.append(pa.field(group.event_time_column, pa.timestamp("us", tz="UTC"), nullable=False))
    fields.extend(pa.field(s["name"], ARROW_TYPES[s["dtype"]](s)) for s in version.features)
    return pa.schema(fields)


# Control characters (NUL first of all) in an entity key break the stores' key encodings and
# every tool that shows the key; keys are identifiers, not text.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _key_text(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= 256 and not _CONTROL.search(value):
        return value
    if _is_int(value):
        return str(value)
    return None


def _rows_check(count: int, group: FeatureGroup) -> None:
    """At most MAX_ROWS rows, and at most the workspace policy's ``max_batch_rows`` (413)."""
    if count > MAX_ROWS:
        raise BatchRejected([_problem(None, "rows", f"at most {MAX_ROWS} rows per batch")])
    policy_check(
        workspace=group.workspace_id, limit_name="max_batch_rows", attr="rows", asked=count
    )


def table_from_rows(
    rows: Any, *, group: FeatureGroup, version: FeatureGroupVersion, now: datetime
) -> pa.Table:
    """Validate JSON rows (a list of objects) and build the batch's Arrow table."""
    if not isinstance(rows, list):
        raise BatchRejected([_problem(None, "rows", "must be a list of objects")])
    if not rows:
        raise BatchRejected([_problem(None, "rows", "the batch is empty")])
    _rows_check(len(rows), group)
    problems: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(_problem(index, None, "each row must be an object"))
            if len(problems) >= MAX_ERRORS:
                break
    if problems:
        raise BatchRejected(problems)
    allowed = {*group.entity_keys, group.event_time_column, *version.feature_map()}
    seen_columns: set[str] = set().union(*rows)
    unknown = sorted(seen_columns - allowed)
    if unknown:
        first = next(i for i, row in enumerate(rows) if unknown[0] in row)
        raise BatchRejected(
            [_problem(first, column, "unknown column (not in the schema)") for column in unknown]
        )

    columns: dict[str, list[Any]] = {}
    for key in group.entity_keys:
        values = [row.get(key) for row in rows]
        texts = [_key_text(v) for v in values]
        for index, text in enumerate(texts):
            if text is None:
                problems.append(
                    _problem(
                        index,
                        key,
                        "entity key must be an integer or a string of 1-256 characters "
                        "without control characters",
                    )
                )
                if len(problems) >= MAX_ERRORS:
                    raise BatchRejected(problems)
        columns[key] = texts

    time_column = group.event_time_column
    times: list[datetime | None] = []
    for index, row in enumerate(rows):
        try:
            times.append(parse_event_time(row.get(time_column), now=now))
        except ValueError as exc:
            times.append(None)
            problems.append(_problem(index, time_column, f"event time {exc}"))
            if len(problems) >= MAX_ERRORS:
                raise BatchRejected(problems) from exc
    columns[time_column] = times

    for spec in version.features:
        name = spec["name"]
        check, expected = _cell_check(spec)
        values = [row.get(name) for row in rows]
        for index, value in enumerate(values):
            if value is not None and not check(value):
                problems.append(_problem(index, name, f"expected {expected}, got {value!r:.60}"))
                if len(problems) >= MAX_ERRORS:
                    raise BatchRejected(problems)
        if spec["dtype"] == Dtype.CATEGORICAL_LIST and not problems:
            # One category, one text: 7 and "7" are the same item for training and serving.
            values = [None if v is None else [str(item) for item in v] for v in values]
        columns[name] = values
    if problems:
        raise BatchRejected(problems)
    schema = _schema(group, version)
    return pa.Table.from_arrays(
        [pa.array(columns[f.name], type=f.type) for f in schema], schema=schema
    )


def table_from_arrow(
    table: pa.Table, *, group: FeatureGroup, version: FeatureGroupVersion, now: datetime
) -> pa.Table:
    """Validate an uploaded Parquet/CSV table column by column and cast it to the schema."""
    if table.num_rows == 0:
        raise BatchRejected([_problem(None, "rows", "the batch is empty")])
    _rows_check(table.num_rows, group)
    schema = _schema(group, version)
    unknown = sorted(set(table.column_names) - set(schema.names))
    if unknown:
        raise BatchRejected(
            [_problem(None, c, "unknown column (not in the schema)") for c in unknown]
        )
    specs = version.feature_map()
    arrays = []
    for target in schema:
        name = target.name
        if name not in table.column_names:
            if name in group.entity_keys or name == group.event_time_column:
                raise BatchRejected([_problem(None, name, "required column is missing")])
            arrays.append(pa.nulls(table.num_rows, type=target.type))
            continue
        column = table[name].combine_chunks()
        if name in group.entity_keys:
            arrays.append(_arrow_keys(column, name))
        elif name == group.event_time_column:
            arrays.append(_arrow_times(column, name, now=now))
        else:
            arrays.append(_arrow_feature(column, specs[name], target.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _first_index(mask: pa.Array) -> int | None:
    indices = pc.indices_nonzero(mask.fill_null(False))
    return indices[0].as_py() if len(indices) else None


def _arrow_keys(column: pa.Array, name: str) -> pa.Array:
    if not (
        pa.types.is_integer(column.type)
        or pa.types.is_string(column.type)
        or pa.types.is_large_string(column.type)
    ):
        raise BatchRejected([_problem(None, name, f"entity key has type {column.type}")])
    texts = column.cast(pa.string())
    bad = _first_index(pc.or_kleene(pc.is_null(texts), pc.equal(pc.utf8_length(texts), 0)))
    if bad is not None:
        raise BatchRejected([_problem(bad, name, "entity key is missing or empty")])
    bad = _first_index(
        pc.or_kleene(
            pc.match_substring_regex(texts, _CONTROL.pattern),
            pc.greater(pc.utf8_length(texts), 256),
        )
    )
    if bad is not None:
        raise BatchRejected(
            [_problem(bad, name, "entity key has control characters or over 256 characters")]
        )
    return texts


def _arrow_times(column: pa.Array, name: str, *, now: datetime) -> pa.Array:
    target = pa.timestamp("us", tz="UTC")
    if pa.types.is_timestamp(column.type):
        if column.type.tz is None:
            raise BatchRejected([_problem(None, name, "event time has no time zone")])
        times = column.cast(target)
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        seconds = column.cast(pa.float64())
        bad = _first_index(pc.invert(pc.is_finite(seconds)))
        if bad is not None:
            raise BatchRejected([_problem(bad, name, "event time must be finite")])
        bad = _first_index(pc.less(seconds, 0))
        if bad is not None:
            raise BatchRejected([_problem(bad, name, "event time is before 1970")])
        bad = _first_index(pc.greater(seconds, (now + FUTURE_TOLERANCE).timestamp()))
        if bad is not None:
            raise BatchRejected(
                [_problem(bad, name, "event time is more than a day in the future")]
            )
        times = pc.multiply(seconds, 1_000_000).cast(pa.int64()).cast(target)
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        parsed = []
        for index, value in enumerate(column.to_pylist()):
            try:
                parsed.append(parse_event_time(value, now=now))
            except ValueError as exc:
                raise BatchRejected([_problem(index, name, f"event time {exc}")]) from exc
        return pa.array(parsed, type=target)
    else:
        raise BatchRejected([_problem(None, name, f"event time has type {column.type}")])
    bad = _first_index(pc.is_null(times))
    if bad is not None:
        raise BatchRejected([_problem(bad, name, "event time is missing")])
    early = _first_index(pc.less(times, pa.scalar(EARLIEST, type=target)))
    if early is not None:
        raise BatchRejected([_problem(early, name, "event time is before 1970")])
    late = _first_index(pc.greater(times, pa.scalar(now + FUTURE_TOLERANCE, type=target)))
    if late is not None:
        raise BatchRejected([_problem(late, name, "event time is more than a day in the future")])
    return times


def _arrow_feature(column: pa.Array, spec: dict[str, Any], target: pa.DataType) -> pa.Array:
    name, dtype = spec["name"], spec["dtype"]
    compatible = {
        Dtype.INT: pa.types.is_integer,
        Dtype.FLOAT: lambda t: pa.types.is_floating(t) or pa.types.is_integer(t),
        Dtype.BOOL: pa.types.is_boolean,
        Dtype.STRING: lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        Dtype.CATEGORICAL: lambda t: (
            pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)
        ),
        Dtype.EMBEDDING: lambda t: (
            pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t)
        ),
        Dtype.CATEGORICAL_LIST: lambda t: (
            (pa.types.is_list(t) or pa.types.is_large_list(t))
            and (
                pa.types.is_string(t.value_type)
                or pa.types.is_large_string(t.value_type)
                or pa.types.is_integer(t.value_type)
                or pa.types.is_null(t.value_type)
            )
        ),
    }[dtype]
    if not compatible(column.type):
        raise BatchRejected([_problem(None, name, f"has type {column.type}, expected {dtype}")])
    if dtype == Dtype.FLOAT:
        values = column.cast(pa.float64())
        bad = _first_index(pc.invert(pc.is_finite(values)))
        if bad is not None:
            raise BatchRejected([_problem(bad, name, "expected a finite number")])
        return values
    if dtype == Dtype.EMBEDDING:
        lengths = pc.list_value_length(column)
        bad = _first_index(pc.not_equal(lengths, spec["dimension"]))
        if bad is not None:
            raise BatchRejected(
                [_problem(bad, name, f"expected a list of {spec['dimension']} numbers")]
            )
        flat = pc.list_flatten(column).cast(pa.float64())
        if len(flat) and _first_index(pc.invert(pc.is_finite(flat))) is not None:
            raise BatchRejected([_problem(None, name, "embedding values must be finite")])
    if dtype == Dtype.CATEGORICAL_LIST:
        _arrow_category_lists(column, name)
    try:
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise BatchRejected([_problem(None, name, f"cannot be read as {dtype}: {exc}")]) from exc


def _arrow_category_lists(column: pa.Array, name: str) -> None:
    """A categorical list column's rows: at most MAX_LIST_ITEMS items, none null or too long."""
    bad = _first_index(pc.greater(pc.list_value_length(column), MAX_LIST_ITEMS))
    if bad is not None:
        raise BatchRejected([_problem(bad, name, f"expected {LIST_EXPECTED}")])
    flat = pc.list_flatten(column)
    if not len(flat):
        return
    parents = pc.list_parent_indices(column)
    bad = _first_index(pc.is_null(flat))
    if bad is None and not pa.types.is_integer(flat.type) and not pa.types.is_null(flat.type):
        bad = _first_index(pc.greater(pc.utf8_length(flat), MAX_LIST_ITEM_CHARS))
    if bad is not None:
        row = parents[bad].as_py()
        raise BatchRejected([_problem(row, name, f"expected {LIST_EXPECTED}")])


def table_from_csv(
    raw: bytes, *, group: FeatureGroup, version: FeatureGroupVersion, now: datetime
) -> pa.Table:
    """CSV: each cell is read as text, then checked and converted like a JSON value."""
    try:
        text_table = pacsv.read_csv(
            io.BytesIO(raw),
            convert_options=pacsv.ConvertOptions(
                column_types={}, strings_can_be_null=True, auto_dict_encode=False
            ),
            read_options=pacsv.ReadOptions(autogenerate_column_names=False),
        )
    except pa.ArrowInvalid as exc:
        raise BatchRejected([_problem(None, "file", f"not a readable CSV file: {exc}")]) from exc
    text_table = text_table.cast(
        pa.schema([pa.field(n, pa.string()) for n in text_table.column_names])
    )
    specs = version.feature_map()
    rows = text_table.to_pylist()
    for row in rows:
        for name, value in row.items():
            if value is None or name not in specs:
                continue
            # Text that does not convert stays text: the checks below name its row and column.
            with contextlib.suppress(ValueError):
                row[name] = _from_csv_text(value, specs[name])
    return table_from_rows(rows, group=group, version=version, now=now)


def _from_csv_text(value: str, spec: dict[str, Any]) -> Any:
    dtype = spec["dtype"]
    if dtype == Dtype.INT:
        return int(value)
    if dtype == Dtype.FLOAT:
        return float(value)
    if dtype == Dtype.BOOL:
        lowered = value.strip().lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
        raise ValueError(value)
    if dtype in (Dtype.EMBEDDING, Dtype.CATEGORICAL_LIST):
        # A JSON array in the cell, e.g. ["sports", "travel"].
        return json.loads(value)
    return value


def table_from_parquet(
    raw: bytes, *, group: FeatureGroup, version: FeatureGroupVersion, now: datetime
) -> pa.Table:
    try:
        table = pq.read_table(io.BytesIO(raw))
    except (pa.ArrowInvalid, OSError) as exc:
        raise BatchRejected(
            [_problem(None, "file", f"not a readable Parquet file: {exc}")]
        ) from exc
    return table_from_arrow(table, group=group, version=version, now=now)


# --- storing -----------------------------------------------------------------------------


def _sketches_of(sketching: Any, batch: Batch) -> list:
    """The batch's drift sketches; a failure to sketch never fails the push: the batch is then
    marked unsketched and drift over its hours reads the Parquet."""
    try:
        return sketching.result()
    except Exception:  # a bug in sketching must not refuse a producer's data
        logger.exception("could not sketch batch %s; drift reads its Parquet", batch.pk)
        Batch.objects.for_workspace(batch.workspace_id).filter(pk=batch.pk).update(sketched=False)
        return []


def write_online(
    *,
    group: FeatureGroup,
    version: int,
    table: pa.Table,
    spec: FeatureGroupVersion | None = None,
) -> int:
    """Write a validated batch (or materialised rows) to the online store.

    DuckDB turns each row into its JSON text in one vectorised pass and keeps the newest row of
    each entity; the store compares event times so an older row never replaces a newer one.
    A caller writing many batches of one version passes its ``spec`` (read once).
    """
    schema = spec if spec is not None else group.versions.get(version=version)
    prepared = prepare_online(
        group=group, version=version, table=table, features=online_columns(schema)
    )
    return 0 if prepared is None else online_store.get_online_store().write_prepared(prepared)


def online_columns(version: FeatureGroupVersion) -> list[str]:
    """The features of a stored online row of ``version``, in their order (its schema's)."""
    return [spec["name"] for spec in version.features]


def prepare_online(
    *, group: FeatureGroup, version: int, table: pa.Table, features: list[str]
) -> Any:
    """Everything of ``write_online`` before it writes (no side effects, no database): the rows
    as the store's prepared write, or None when there are none.

    A stored row is a JSON array of the version's ``features`` in their order (a feature the
    table lacks is null): the names are the version's, not repeated in every row, which makes
    rows about a third of the size of a JSON object and their writes and reads that much lighter.
    """
    keys = list(group.entity_keys)
    time_column = group.event_time_column
    if table.num_rows == 0:
        return None
    entity_sql = (
        offline_store.quote(keys[0])
        if len(keys) == 1
        else "concat_ws('|', " + ", ".join(offline_store.quote(k) for k in keys) + ")"
    )
    present = set(table.column_names)
    values = ", ".join(offline_store.quote(n) if n in present else "NULL" for n in features)
    payload_sql = f"json_array({values})" if features else "'[]'"
    with offline_store.connect() as connection:
        connection.register("batch", table)
        encoded = connection.sql(
            f"SELECT CAST({entity_sql} AS VARCHAR) AS entity, "  # noqa: S608 - quoted identifiers
            f"epoch_us({offline_store.quote(time_column)}) / 1e6 AS stamp, "
            f"CAST({payload_sql} AS VARCHAR) AS payload FROM batch"
        ).to_arrow_table()
        if pc.count_distinct(encoded["entity"]).as_py() < encoded.num_rows:
            # Several rows of one entity: only the newest is served (on a tie, the last row).
            connection.register(
                "encoded", encoded.append_column("__i", pa.array(range(encoded.num_rows)))
            )
            encoded = connection.sql(
                "SELECT entity, stamp, payload FROM encoded "
                "QUALIFY row_number() OVER (PARTITION BY entity ORDER BY stamp DESC, __i DESC) = 1"
            ).to_arrow_table()
    return online_store.get_online_store().prepare_arrow(
        namespace=online_store.namespace(
            workspace_id=group.workspace_id, group_id=group.pk, version=version
        ),
        entities=encoded["entity"].combine_chunks(),
        stamps=encoded["stamp"].combine_chunks(),
        payloads=encoded["payload"].combine_chunks(),
    )


def batch_ingest(
    *,
    actor: Actor,
    group: FeatureGroup,
    body: bytes,
    format: str,
    idempotency_key: str | None = None,
    now: datetime | None = None,
) -> IngestResult:
    """Validate and store one producer batch (JSON ``{"rows": [...]}``, CSV or Parquet bytes)."""
    if group.status == Lifecycle.RETIRED:
        raise ConflictError(f"feature group '{group.name}' is retired", attr="name")
    if idempotency_key is not None and not (0 < len(idempotency_key) <= 200):
        raise ValidationError({"Idempotency-Key": "must be 1-200 characters"})
    digest = hashlib.sha256(body).hexdigest()
    if idempotency_key:
        previous = _replay(group, idempotency_key, digest)
        if previous is not None:
            return IngestResult(batch=previous, replayed=True)

    now = now or timezone.now()
    version = group.versions.get(version=group.current_version)
    if format == BatchFormat.JSON:
        try:
            # Every number is checked for finiteness by the schema validation below.
            document = parse_strict_json(body, check_floats=False)
        except ValueError as exc:
            raise BatchRejected([_problem(None, "rows", f"JSON parse error: {exc}")]) from exc
        if not isinstance(document, dict) or set(document) != {"rows"}:
            raise BatchRejected([_problem(None, "rows", 'send {"rows": [...]}')])
        table = table_from_rows(document["rows"], group=group, version=version, now=now)
    elif format == BatchFormat.CSV:
        table = table_from_csv(body, group=group, version=version, now=now)
    elif format == BatchFormat.PARQUET:
        table = table_from_parquet(body, group=group, version=version, now=now)
    else:
        raise ValidationError({"format": "one of json, csv, parquet"})

    times = table[group.event_time_column]
    min_time, max_time = pc.min(times).as_py(), pc.max(times).as_py()
    # Encoding the rows for the online store has no side effects: it runs beside the offline
    # write and the transaction (DuckDB and Arrow release the GIL), and is written after commit.
    prepared = (
        _background().submit(
            prepare_online,
            group=group,
            version=version.version,
            table=table,
            features=online_columns(version),
        )
        if group.online
        else None
    )
    # The drift sketches of its numeric features, per hour of event time: likewise beside it.
    sketching = _background().submit(
        sketches.hourly_sketches,
        table,
        time_column=group.event_time_column,
        numeric=sketches.numeric_features(version),
    )
    files: list[str] = []
    try:
        with transaction.atomic():
            locked = group_locked(group)
            if locked.current_version != version.version:
                raise ConflictError(
                    f"'{group.name}' moved to version {locked.current_version}; resend",
                    attr="version",
                )
            storage_quota_check(workspace=group.workspace, adding=len(body))
            batch = Batch.objects.create(
                workspace=group.workspace,
                group=group,
                version=version.version,
                idempotency_key=idempotency_key or None,
                body_sha256=digest,
                format=format,
                rows=table.num_rows,
                bytes=len(body),
                min_event_time=min_time,
                max_event_time=max_time,
                sketched=True,
                offline_path=str(
                    offline_store.group_dir(
                        workspace_id=group.workspace_id, group_id=group.pk, version=version.version
                    )
                ),
                producer=actor_user(actor),
            )
            files = offline_store.write_batch(
                workspace_id=group.workspace_id,
                group_id=group.pk,
                version=version.version,
                batch_id=batch.pk,
                table=table,
                time_column=group.event_time_column,
            )
            hourly = _sketches_of(sketching, batch)
            DriftSketch.objects.bulk_create(
                DriftSketch(
                    workspace=group.workspace,
                    group=group,
                    version=version.version,
                    batch=batch,
                    hour=hour,
                    rows=rows,
                    sketches=encoded,
                )
                for hour, rows, encoded in hourly
            )
            touch_ingested(group=locked, max_event_time=max_time)
            event_record(
                actor=actor,
                workspace=group.workspace,
                verb="feature_batch.ingested",
                refs=[Ref.to(group, role="output"), Ref.to(batch)],
                resources={"rows": table.num_rows, "bytes": len(body)},
                payload={
                    "group": group.name,
                    "version": version.version,
                    "format": format,
                    "rows": table.num_rows,
                    "bytes": len(body),
                    "producer": actor.get_username() if actor else "system",
                    "min_event_time": min_time,
                    "max_event_time": max_time,
                },
            )
    except IntegrityError:
        offline_store.remove_files(files)
        _discard(prepared)
        previous = _replay(group, idempotency_key, digest) if idempotency_key else None
        if previous is None:
            raise
        return IngestResult(batch=previous, replayed=True)
    except BaseException:
        offline_store.remove_files(files)
        _discard(prepared)
        raise

    online_rows = 0
    if prepared is not None:
        # After commit: the batch is acknowledged once it is durable offline; if this write
        # fails, materialisation rebuilds the online rows from the Parquet record.
        # The producer is told it was stored either way: answering 500 for a batch that was
        # committed invites a retry that a replay answers anyway, and says the opposite of what
        # happened. The batch stays ``online_written=False`` until materialisation writes it.
        try:
            rows = prepared.result()
            store = online_store.get_online_store()
            online_rows = 0 if rows is None else store.write_prepared(rows)
        except Exception:
            logger.warning(
                "batch %s stored; its online write failed and waits for materialisation",
                batch.pk,
                exc_info=True,
            )
            return IngestResult(batch=batch, replayed=False, online_rows=0, files=files)
        try:
            Batch.objects.filter(pk=batch.pk, workspace=group.workspace).update(online_written=True)
        except (OperationalError, InterfaceError):
            # The rows are online; only the flag is unsaved. Materialisation rewrites a batch
            # not flagged (the same rows, newest wins), so a lost connection here is no 503.
            logger.warning("batch %s stored; its online flag waits for materialisation", batch.pk)
            return IngestResult(batch=batch, replayed=False, online_rows=online_rows, files=files)
        batch.online_written = True
    return IngestResult(batch=batch, replayed=False, online_rows=online_rows, files=files)


def storage_quota_check(*, workspace: Workspace, adding: int) -> None:
    """Refuse (409, ``attr="storage_gb"``) a batch that would take the workspace's stored bytes
    past its quota's ``storage_gb``; nothing is stored. Called in the push's transaction: the
    quota row is locked, so two pushes that each fit but not together are counted one after
    the other. Usage is the sum of ``Batch.bytes``, what the quota summary shows as used.
    A workspace without a storage limit takes no lock and no count."""
    quota = (
        WorkspaceQuota.objects.for_workspace(workspace)
        .select_for_update()
        .filter(gpu_type="", storage_gb__isnull=False)
        .first()
    )
    if quota is None or quota.storage_gb is None:
        return
    stored = Batch.objects.for_workspace(workspace).aggregate(total=Sum("bytes"))["total"] or 0
    limit = quota.storage_gb * GIB
    if stored + adding > limit:
        raise ConflictError(
            f"workspace '{workspace.slug}' would exceed its storage quota: "
            f"{stored / GIB:.3f} GB stored of {quota.storage_gb} GB, this batch adds "
            f"{adding / GIB:.6f} GB; ask a platform admin to raise storage_gb",
            attr="storage_gb",
            storage_gb=quota.storage_gb,
            used_bytes=stored,
            batch_bytes=adding,
        )


def batch_ingest_retrying(
    *,
    actor: Actor,
    group: FeatureGroup,
    body: bytes,
    format: str,
    idempotency_key: str | None = None,
) -> IngestResult:
    """``batch_ingest``, sent once more on a fresh database connection when the connection was
    lost under it (a restarted or failed-over server, ``pg_terminate_backend``).

    Only with an Idempotency-Key, which makes the second try safe whatever the first did: if
    it committed before the connection died, the second is its replay. Without one a push cut
    inside its transaction stays the producer's 503 to retry (a cut before it, on a read, is
    read again on a new connection by ``workspaces.db_reconnect``). (The ``faults`` bench
    terminated every connection under a push loop: each push caught mid-query answered 503.)"""
    try:
        return batch_ingest(
            actor=actor, group=group, body=body, format=format, idempotency_key=idempotency_key
        )
    except (OperationalError, InterfaceError) as exc:
        if not idempotency_key or connection.in_atomic_block or not connection_lost(exc):
            raise
        logger.warning("database connection lost under a push; sending it once more")
        connection.close()
        return batch_ingest(
            actor=actor, group=group, body=body, format=format, idempotency_key=idempotency_key
        )


_executor: tuple[int, ThreadPoolExecutor] | None = None
_executor_lock = threading.Lock()


def _background() -> ThreadPoolExecutor:
    """This process's pool for work that overlaps a push (made again in a forked child, whose
    copy of the parent's pool has no threads)."""
    global _executor
    with _executor_lock:
        if _executor is None or _executor[0] != os.getpid():
            pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ingest")
            _executor = (os.getpid(), pool)
        return _executor[1]


def _discard(prepared: Future | None) -> None:
    """Drop background work whose result is not wanted (it has no side effects)."""
    if prepared is not None and not prepared.cancel():
        with contextlib.suppress(Exception):
            prepared.result()


def _replay(group: FeatureGroup, key: str, digest: str) -> Batch | None:
    previous = (
        Batch.objects.for_workspace(group.workspace)
        .filter(group=group, idempotency_key=key)
        .first()
    )
    if previous is None:
        return None
    if previous.body_sha256 != digest:
        raise ConflictError(
            f"Idempotency-Key '{key[:60]}' was already used for a different batch "
            f"(batch {previous.pk})",
            attr="Idempotency-Key",
        )
    return previous


def batch_size_limit() -> int:
    return settings.FEATURE_BATCH_MAX_BYTES
