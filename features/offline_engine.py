"""Offline engines: the point-in-time join of a training sample, from one plan, run by DuckDB on
this machine or by Spark beyond it.

``features.samples`` turns a dataset into a ``JoinPlan``: plain data naming the Parquet files of
the label group and of each feature group version, their keys, time columns and the columns to
take, typed. An engine runs the plan and streams the sample's rows, ordered by the label's time
(then its batch and row), as Arrow record batches; the samples module writes them to the dataset
file. Both engines implement the same rules (see ``features.samples``): for each label event and
each feature group, the latest feature row at or before the label's time (a tie in time counts
as before), and among feature rows sharing an entity and a time, the one of the latest batch and,
within it, the last row.

DuckDB (the default, ``OFFLINE_ENGINE=duckdb``) runs it as one ``ASOF LEFT JOIN`` query on a
database of its own with a memory limit (``OFFLINE_MEMORY_LIMIT``) and a spill folder under the
artifact root, so a build larger than memory spills to disk instead of failing; it reads only
the partitions the window can need (``JoinPlan.pruned``: label files of days inside the window,
feature files of days up to its end) and only the columns it names (DuckDB pushes the
projection into the Parquet scan).

Spark (``OFFLINE_ENGINE=spark``; ``SPARK_MASTER``, ``local[2]`` when unset, or a cluster URL whose
executors see the artifact root at the same path) has no as-of join; it unions each feature
group's deduplicated rows with the label rows and carries the last feature value forward over a
window per entity ordered by time (feature rows first on a tie), the usual sort-based way of
doing it in a distributed engine, then joins the values back to the labels by a row id.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Protocol

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

TIME = "__t"
BATCH = "__batch"
ROW = "__row"
ROW_NUMBER_COLUMN = "file_row_number"  # DuckDB's virtual row position of a Parquet scan
BATCH_ID_SQL = "CAST(regexp_extract(\"__source\", 'batch-([0-9]+)[.]parquet$', 1) AS BIGINT)"
# Label days are joined and sorted together until a group holds this many rows: fewer, smaller
# sorts than the whole sample at once (bounded memory), few enough that restaging costs little.
# Measured on the offline bench (2 cores, 2 GB): one query over 10M labels ran at 69k rows/s and
# 2.5 GB peak; a day at a time at 116k rows/s and 1.5 GB, but 52k rows/s at 1M (30 small joins).
PARTITION_ROWS = 1_000_000
DATE_FOLDER = re.compile(r"(?:^|/)date=(\d{4}-\d{2}-\d{2})(?:/|$)")

DUCKDB_TYPES = {
    "int": "BIGINT",
    "float": "DOUBLE",
    "bool": "BOOLEAN",
    "string": "VARCHAR",
    "categorical": "VARCHAR",
    "categorical_list": "VARCHAR[]",
}
SPARK_TYPES = {
    "int": "bigint",
    "float": "double",
    "bool": "boolean",
    "string": "string",
    "categorical": "string",
    "categorical_list": "array<string>",
    "embedding": "array<float>",
}
ARROW_TYPES = {
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "categorical": pa.string(),
    "categorical_list": pa.list_(pa.string()),
}


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


@dataclass(frozen=True)
class Column:
    """A column read from the files (``name``) and written to the sample as ``output``."""

    name: str
    output: str
    dtype: str
    dimension: int | None = None

    def duckdb_type(self) -> str:
        if self.dtype == "embedding":
            return f"FLOAT[{int(self.dimension or 0)}]"
        return DUCKDB_TYPES[self.dtype]

    def spark_type(self) -> str:
        return SPARK_TYPES[self.dtype]

    def arrow_type(self) -> pa.DataType:
        if self.dtype == "embedding":
            return pa.list_(pa.float32(), int(self.dimension or 0))
        return ARROW_TYPES[self.dtype]


@dataclass(frozen=True)
class LabelInput:
    """The labelled events: files (empty when nothing was ingested), keys, time, label columns."""

    files: tuple[str, ...]
    keys: tuple[str, ...]
    time_column: str
    columns: tuple[Column, ...]
    start_time: datetime | None = None
    end_time: datetime | None = None


@dataclass(frozen=True)
class FeatureInput:
    """One feature group version: its files (empty when nothing was ingested) and the features
    taken from it."""

    alias: str
    files: tuple[str, ...]
    keys: tuple[str, ...]
    time_column: str
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class JoinPlan:
    labels: LabelInput
    sources: tuple[FeatureInput, ...]
    time_output: str = "event_time"

    def output_columns(self) -> list[str]:
        return [
            *self.labels.keys,
            self.time_output,
            *(c.output for c in self.labels.columns),
            *(c.output for source in self.sources for c in source.columns),
        ]

    def arrow_schema(self) -> pa.Schema:
        """The sample's schema: keys as strings, the time in UTC, each column by its type."""
        return pa.schema(
            [
                *(pa.field(k, pa.string()) for k in self.labels.keys),
                pa.field(self.time_output, pa.timestamp("us", tz="UTC")),
                *(
                    pa.field(c.output, c.arrow_type())
                    for c in (*self.labels.columns, *(c for s in self.sources for c in s.columns))
                ),
            ]
        )

    def pruned(self) -> JoinPlan:
        """The plan reading only the date partitions its window can need: label files of days
        from the start's day to the end's, feature files of days up to the end's (a feature row
        after the window cannot be at or before any of its labels). Files outside a ``date=``
        folder are kept."""
        first = _utc_day(self.labels.start_time)
        last = _utc_day(self.labels.end_time)
        labels = replace(self.labels, files=prune_by_day(self.labels.files, first, last))
        sources = tuple(
            replace(source, files=prune_by_day(source.files, None, last)) for source in self.sources
        )
        return replace(self, labels=labels, sources=sources)


def _utc_day(moment: datetime | None) -> date | None:
    return moment.astimezone(UTC).date() if moment is not None else None


def prune_by_day(files: tuple[str, ...], first: date | None, last: date | None) -> tuple[str, ...]:
    """The files whose ``date=YYYY-MM-DD`` folder lies in ``[first, last]`` (either end open)."""
    kept = []
    for path in files:
        found = DATE_FOLDER.search(path)
        if found is not None:
            day = date.fromisoformat(found.group(1))
            if (first is not None and day < first) or (last is not None and day > last):
                continue
        kept.append(path)
    return tuple(kept)


def label_partitions(files: tuple[str, ...], *, min_rows: int = 0) -> list[tuple[str, ...]]:
    """The label files grouped by their ``date=`` folder, days in order, consecutive days merged
    until a group holds at least ``min_rows`` rows (from the Parquet footers); all of them as one
    group when any lies outside such a folder (its rows' days are unknown). An empty tuple gives
    one empty group (the typed empty sample)."""
    days: dict[str, list[str]] = {}
    for path in files:
        found = DATE_FOLDER.search(path)
        if found is None:
            return [files]
        days.setdefault(found.group(1), []).append(path)
    groups: list[tuple[str, ...]] = []
    current: list[str] = []
    rows = 0
    for day in sorted(days):
        current.extend(days[day])
        if min_rows:
            rows += sum(pq.read_metadata(path).num_rows for path in days[day])
        if rows >= min_rows:
            groups.append(tuple(current))
            current, rows = [], 0
    if current:
        groups.append(tuple(current))
    return groups or [files]


class OfflineEngine(Protocol):
    name: str

    def count(self, plan: JoinPlan) -> int:
        """The number of label rows in the plan's window (the sample's row count)."""
        ...

    def part_count(self, plan: JoinPlan) -> int:
        """How many parts ``parts`` yields for the plan (known before the join starts)."""
        ...

    def parts(self, plan: JoinPlan, *, batch_rows: int) -> Iterator[Iterator[pa.RecordBatch]]:
        """The sample's rows in order, as consecutive parts (each a run of label days), each
        an iterator of record batches of the plan's schema."""
        ...


def batches(engine: OfflineEngine, plan: JoinPlan, *, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The whole sample in order, its parts one after the other."""
    for part in engine.parts(plan, batch_rows=batch_rows):
        yield from part


# --- DuckDB ----------------------------------------------------------------------------------


def _reader(param: str) -> str:
    return (
        f"read_parquet(${param}, filename = '__source', hive_partitioning = false, "
        "union_by_name = true)"
    )


class DuckDBEngine:
    """The point-in-time join as one DuckDB query, on a database of its own per build."""

    name = "duckdb"

    def __init__(
        self,
        *,
        memory_limit: str | None = None,
        temp_directory: str | None = None,
        threads: int | None = None,
        partition_rows: int = PARTITION_ROWS,
    ) -> None:
        self.partition_rows = partition_rows
        self.memory_limit = memory_limit
        self.temp_directory = temp_directory
        self.threads = threads

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        config: dict[str, Any] = {}
        if self.memory_limit:
            config["memory_limit"] = self.memory_limit
        if self.threads:
            config["threads"] = int(self.threads)
        if self.temp_directory:
            Path(self.temp_directory).mkdir(parents=True, exist_ok=True)
            config["temp_directory"] = self.temp_directory
        connection = duckdb.connect(database=":memory:", config=config)
        try:
            connection.execute("SET TimeZone = 'UTC'")
            # No progress bar: DuckDB draws one on stdout for long queries, into a worker's log.
            connection.execute("SET enable_progress_bar = false")
            yield connection
        finally:
            connection.close()

    # The SQL: labels in the window, each source deduplicated, then one ASOF LEFT JOIN each.

    @staticmethod
    def label_sql(plan: JoinPlan, params: dict[str, Any], *, sample_rows: int | None = None) -> str:
        labels = plan.labels
        if not labels.files:  # nothing ingested yet: no rows, but the columns keep their types
            typed_nulls = [
                *(f"CAST(NULL AS VARCHAR) AS {quote(k)}" for k in labels.keys),
                f"CAST(NULL AS TIMESTAMPTZ) AS {quote(TIME)}",
                *(f"CAST(NULL AS {c.duckdb_type()}) AS {quote(c.name)}" for c in labels.columns),
                f"CAST(NULL AS BIGINT) AS {quote(BATCH)}",
                f"CAST(NULL AS BIGINT) AS {quote(ROW)}",
            ]
            return f"SELECT {', '.join(typed_nulls)} WHERE false"
        params["label_glob"] = list(labels.files)
        time = quote(labels.time_column)
        selected = [
            *(quote(k) for k in labels.keys),
            f"{time} AS {quote(TIME)}",
            *(
                f"CAST({quote(c.name)} AS {c.duckdb_type()}) AS {quote(c.name)}"
                for c in labels.columns
            ),
            f"{BATCH_ID_SQL} AS {quote(BATCH)}",
            f"{ROW_NUMBER_COLUMN} AS {quote(ROW)}",
        ]
        conditions = []
        if labels.start_time is not None:
            params["start_time"] = labels.start_time.isoformat()
            conditions.append(f"{time} >= CAST($start_time AS TIMESTAMPTZ)")
        if labels.end_time is not None:
            params["end_time"] = labels.end_time.isoformat()
            conditions.append(f"{time} < CAST($end_time AS TIMESTAMPTZ)")
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        query = f"SELECT {', '.join(selected)} FROM {_reader('label_glob')}{where}"  # noqa: S608 - quoted identifiers, bound values
        if sample_rows is None:
            return query
        # The sample is taken after the window filter (a subquery), not of the whole file.
        return (
            f"SELECT * FROM ({query}) "  # noqa: S608 - the query above
            f"USING SAMPLE reservoir({int(sample_rows)} ROWS) REPEATABLE (7)"
        )

    @staticmethod
    def feature_sql(
        source: FeatureInput, params: dict[str, Any], *, labelled_only: bool = False
    ) -> str:
        """The source's rows, one per (entity, time): latest batch, then last row, wins; with
        ``labelled_only``, only the entities of the ``labels`` CTE (a preview's sample)."""
        param = f"{source.alias}_glob"
        params[param] = list(source.files)
        keys = [quote(k) for k in source.keys]
        time = quote(source.time_column)
        selected = [
            *keys,
            f"{time} AS {quote(TIME)}",
            *(
                f"CAST({quote(c.name)} AS {c.duckdb_type()}) AS {quote(f'{source.alias}_{i}')}"
                for i, c in enumerate(source.columns)
            ),
        ]
        where = ""
        if labelled_only:
            same = " AND ".join(f'"labels".{k} = "__rows".{k}' for k in keys)
            where = f'WHERE EXISTS (SELECT 1 FROM "labels" WHERE {same}) '  # noqa: S608 - quoted
        return (
            f'SELECT {", ".join(selected)} FROM {_reader(param)} AS "__rows" {where}'  # noqa: S608 - quoted identifiers
            f"QUALIFY row_number() OVER (PARTITION BY {', '.join(keys)}, {time} "
            f"ORDER BY {BATCH_ID_SQL} DESC, {ROW_NUMBER_COLUMN} DESC) = 1"
        )

    def query(
        self,
        plan: JoinPlan,
        *,
        sample_rows: int | None = None,
        staged: dict[str, str] | None = None,
    ) -> tuple[str, dict]:
        """The point-in-time query and its parameters; with ``sample_rows``, over a sample of
        the labels (and only their entities' feature rows), unordered; with ``staged``, each
        source named there is read from that table (its deduplicated rows) instead of its
        files."""
        params: dict[str, Any] = {}
        labels = self.label_sql(plan, params, sample_rows=sample_rows)
        ctes = [f'"labels" AS ({labels})']
        selected = [
            *(f'"labels".{quote(k)}' for k in plan.labels.keys),
            f'"labels".{quote(TIME)} AS {quote(plan.time_output)}',
            *(f'"labels".{quote(c.name)} AS {quote(c.output)}' for c in plan.labels.columns),
        ]
        joins = []
        for source in plan.sources:
            alias = quote(source.alias)
            if source.files:
                if staged and source.alias in staged:
                    rows = f"SELECT * FROM {quote(staged[source.alias])}"  # noqa: S608 - quoted
                else:
                    rows = self.feature_sql(source, params, labelled_only=sample_rows is not None)
                ctes.append(f"{alias} AS ({rows})")
                on = [f'"labels".{quote(k)} = {alias}.{quote(k)}' for k in source.keys]
                on.append(f'"labels".{quote(TIME)} >= {alias}.{quote(TIME)}')
                joins.append(f"ASOF LEFT JOIN {alias} ON {' AND '.join(on)}")
            for index, column in enumerate(source.columns):
                if not source.files:  # nothing ingested yet: every value is missing
                    value = f"CAST(NULL AS {column.duckdb_type()})"
                else:
                    value = f"{alias}.{quote(f'{source.alias}_{index}')}"
                selected.append(f"{value} AS {quote(column.output)}")
        order = (
            ""
            if sample_rows is not None
            else (
                f' ORDER BY "labels".{quote(TIME)}, "labels".{quote(BATCH)}, "labels".{quote(ROW)}'
            )
        )
        query = (
            f'WITH {", ".join(ctes)} SELECT {", ".join(selected)} FROM "labels" '  # noqa: S608
            f"{' '.join(joins)}{order}"
        )
        return query, params

    def count(self, plan: JoinPlan) -> int:
        params: dict[str, Any] = {}
        labels = self.label_sql(plan, params)
        with self.connect() as connection:
            return int(
                connection.sql(f"SELECT count(*) FROM ({labels})", params=params).fetchall()[0][0]  # noqa: S608 - the query above
            )

    def part_count(self, plan: JoinPlan) -> int:
        return len(label_partitions(plan.labels.files, min_rows=self.partition_rows))

    def parts(self, plan: JoinPlan, *, batch_rows: int) -> Iterator[Iterator[pa.RecordBatch]]:
        """The sample a group of label days at a time (``label_partitions``): each source's
        deduplicated rows are staged once in a temporary table (spilled past the memory limit),
        then each group's labels are joined against them and sorted, so no sort is larger than a
        group and the groups come out in order (a label's partition is its event time's day).
        A part must be read to its end before the next is asked for (one connection)."""
        with self.connect() as connection:
            staged = {}
            for source in plan.sources:
                if source.files:
                    params: dict[str, Any] = {}
                    rows = self.feature_sql(source, params)
                    name = f"staged_{source.alias}"
                    connection.execute(f"CREATE TEMP TABLE {quote(name)} AS {rows}", params)
                    staged[source.alias] = name
            for files in label_partitions(plan.labels.files, min_rows=self.partition_rows):
                part = replace(plan, labels=replace(plan.labels, files=files))
                query, params = self.query(part, staged=staged)
                yield iter(connection.sql(query, params=params).to_arrow_reader(batch_rows))

    def coverage_sample(self, plan: JoinPlan, *, sample_rows: int) -> tuple[int, list[int]]:
        """(rows sampled, rows with a value per feature column) over a reproducible sample of
        at most ``sample_rows`` labels."""
        query, params = self.query(plan, sample_rows=sample_rows)
        columns = [c.output for s in plan.sources for c in s.columns]
        counts = "".join(f", count({quote(c)})" for c in columns)
        with self.connect() as connection:
            measured = connection.sql(
                f"SELECT count(*){counts} FROM ({query})",  # noqa: S608 - the query above
                params=params,
            ).fetchall()[0]
        return int(measured[0]), [int(v) for v in measured[1:]]


# --- Spark -----------------------------------------------------------------------------------

_spark_lock = threading.Lock()
_spark_sessions: dict[str, Any] = {}


def spark_session(master: str) -> Any:
    """This process's Spark session for ``master`` (started once; Spark keeps one per JVM)."""
    from pyspark.sql import SparkSession

    # py4j logs its connection closing at INFO, also from finalizers at interpreter exit.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with _spark_lock:
        session = _spark_sessions.get(master)
        if session is None:
            session = (
                SparkSession.builder.master(master)
                .appName("rankops-offline")
                .config("spark.sql.session.timeZone", "UTC")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "8")
                .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
                .config("spark.sql.parquet.mergeSchema", "true")
                .getOrCreate()
            )
            session.sparkContext.setLogLevel("ERROR")
            _spark_sessions[master] = session
        return session


class SparkEngine:
    """The point-in-time join on Spark: per feature group, a union with the labels and the last
    feature value carried forward over a window per entity (see the module docstring)."""

    name = "spark"

    def __init__(self, *, master: str = "local[2]", scratch: str | None = None) -> None:
        self.master = master
        self.scratch = scratch

    def _read(self, spark: Any, files: tuple[str, ...]) -> Any:
        from pyspark.sql import functions as F

        frame = spark.read.option("mergeSchema", "true").parquet(*files)
        return frame.select(
            "*",
            F.regexp_extract(F.col("_metadata.file_name"), r"batch-([0-9]+)[.]parquet$", 1)
            .cast("bigint")
            .alias(BATCH),
            F.col("_metadata.row_index").alias(ROW),
        )

    @staticmethod
    def _value(frame: Any, column: Column) -> Any:
        from pyspark.sql import functions as F

        if column.name in frame.columns:
            return F.col(column.name).cast(column.spark_type())
        return F.lit(None).cast(column.spark_type())

    def _labels(self, spark: Any, plan: JoinPlan) -> Any:
        from pyspark.sql import functions as F

        labels = plan.labels
        raw = self._read(spark, labels.files)
        time = F.col(labels.time_column)
        if labels.start_time is not None:
            raw = raw.filter(time >= F.lit(labels.start_time.astimezone(UTC)))
        if labels.end_time is not None:
            raw = raw.filter(time < F.lit(labels.end_time.astimezone(UTC)))
        return raw.select(
            *(F.col(k).cast("string").alias(k) for k in labels.keys),
            time.alias(TIME),
            *(self._value(raw, c).alias(c.output) for c in labels.columns),
            BATCH,
            ROW,
            F.monotonically_increasing_id().alias("__lid"),
        )

    def _join_source(self, spark: Any, labels: Any, source: FeatureInput) -> Any:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        values = [f"v{i}" for i in range(len(source.columns))]
        if not source.files:
            return labels.select(
                "*",
                *(F.lit(None).cast(c.spark_type()).alias(c.output) for c in source.columns),
            )
        raw = self._read(spark, source.files)
        keys = list(source.keys)
        rows = raw.select(
            *(F.col(k).cast("string").alias(k) for k in keys),
            F.col(source.time_column).alias(TIME),
            *(self._value(raw, c).alias(v) for c, v in zip(source.columns, values, strict=True)),
            BATCH,
            ROW,
        ).filter(F.expr(" AND ".join(f"`{k}` IS NOT NULL" for k in keys)))
        latest = Window.partitionBy(*keys, TIME).orderBy(F.col(BATCH).desc(), F.col(ROW).desc())
        rows = rows.withColumn("__rank", F.row_number().over(latest)).filter("__rank = 1")
        struct = F.struct(*(F.col(v) for v in values))
        feature_part = rows.select(
            *keys,
            TIME,
            F.lit(0).alias("__kind"),
            F.lit(None).cast("bigint").alias("__lid"),
            struct.alias("__v"),
        )
        value_type = feature_part.schema["__v"].dataType
        label_part = labels.select(
            *keys,
            TIME,
            F.lit(1).alias("__kind"),
            "__lid",
            F.lit(None).cast(value_type).alias("__v"),
        )
        carried = (
            Window.partitionBy(*keys)
            .orderBy(TIME, "__kind")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        picked = (
            feature_part.unionByName(label_part)
            .withColumn("__v", F.last("__v", ignorenulls=True).over(carried))
            .filter("__kind = 1")
            .select("__lid", "__v")
        )
        return (
            labels.join(picked, on="__lid", how="left")
            .select(
                *labels.columns,
                *(
                    F.col(f"__v.{v}").alias(c.output)
                    for c, v in zip(source.columns, values, strict=True)
                ),
            )
            .drop("__v")
        )

    def frame(self, plan: JoinPlan) -> Any:
        """The sample as an ordered Spark DataFrame (None when there are no label files)."""
        if not plan.labels.files:
            return None
        spark = spark_session(self.master)
        joined = self._labels(spark, plan)
        for source in plan.sources:
            joined = self._join_source(spark, joined, source)
        return joined.orderBy(TIME, BATCH, ROW).select(
            *plan.labels.keys,
            joined[TIME].alias(plan.time_output),
            *(c.output for c in plan.labels.columns),
            *(c.output for s in plan.sources for c in s.columns),
        )

    def count(self, plan: JoinPlan) -> int:
        if not plan.labels.files:
            return 0
        return int(self._labels(spark_session(self.master), plan).count())

    def part_count(self, plan: JoinPlan) -> int:
        return 1

    def parts(self, plan: JoinPlan, *, batch_rows: int) -> Iterator[Iterator[pa.RecordBatch]]:
        """One part: the whole ordered sample, which Spark range-partitions across its executors
        on its own (``batches``)."""
        yield self.batches(plan, batch_rows=batch_rows)

    def batches(self, plan: JoinPlan, *, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Spark writes the ordered sample as Parquet parts (in order, by part number) to a
        scratch folder the driver reads back batch by batch; the folder is removed after."""
        schema = plan.arrow_schema()
        frame = self.frame(plan)
        if frame is None:
            return
        folder = Path(tempfile.mkdtemp(prefix="spark-sample-", dir=self.scratch))
        try:
            frame.write.mode("overwrite").parquet(str(folder / "out"))
            for part in sorted((folder / "out").glob("part-*.parquet")):
                for batch in pq.ParquetFile(part).iter_batches(batch_size=batch_rows):
                    yield from pa.Table.from_batches([batch]).cast(schema).to_batches()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def spark_stop() -> None:
    """Stop this process's Spark sessions (tests, and a worker shutting down)."""
    with _spark_lock:
        for session in _spark_sessions.values():
            session.stop()
        _spark_sessions.clear()


def _scratch() -> Path:
    from django.conf import settings

    return Path(settings.ARTIFACT_ROOT) / "tmp" / "offline"


def duckdb_engine() -> DuckDBEngine:
    """The DuckDB engine as the settings configure it (memory limit, threads, spill folder)."""
    from django.conf import settings

    return DuckDBEngine(
        memory_limit=settings.OFFLINE_MEMORY_LIMIT,
        temp_directory=str(_scratch()),
        threads=settings.OFFLINE_THREADS,
        partition_rows=settings.OFFLINE_PARTITION_ROWS,
    )


def engine(name: str | None = None) -> OfflineEngine:
    """The engine the settings name (``OFFLINE_ENGINE``), configured from the settings."""
    from django.conf import settings

    name = name or settings.OFFLINE_ENGINE
    if name == "spark":
        _scratch().mkdir(parents=True, exist_ok=True)
        return SparkEngine(master=settings.SPARK_MASTER, scratch=str(_scratch()))
    if name == "duckdb":
        return duckdb_engine()
    raise ValueError(f"unknown offline engine {name!r}: use duckdb or spark")
