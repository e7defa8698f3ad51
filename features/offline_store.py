"""The offline store: Parquet partitions under ARTIFACT_ROOT, read with DuckDB.

Layout: ``offline/ws=<id>/group=<id>/v=<version>/date=<YYYY-MM-DD>/batch-<id>.parquet``.
A batch is written to a temporary name and renamed into place, so a reader never sees half a file
and a crash leaves no partial partition behind; readers take only files whose batch row committed
(``parquet_glob``), so a crash between the file and the commit leaves nothing a reader sees.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from django.conf import settings


def offline_root() -> Path:
    return Path(settings.ARTIFACT_ROOT) / "offline"


def group_dir(*, workspace_id: int, group_id: int, version: int) -> Path:
    return offline_root() / f"ws={workspace_id}" / f"group={group_id}" / f"v={version}"


def write_batch(
    *,
    workspace_id: int,
    group_id: int,
    version: int,
    batch_id: int,
    table: pa.Table,
    time_column: str,
) -> list[str]:
    """Write one batch, split into date partitions by event time; returns the files written."""
    base = group_dir(workspace_id=workspace_id, group_id=group_id, version=version)
    # Event times are UTC; their calendar day names the partition.
    days = table[time_column].cast(pa.timestamp("us")).cast(pa.date32())
    written: list[str] = []
    for day in pc.unique(days).to_pylist():
        part = table.filter(pc.equal(days, pa.scalar(day, type=pa.date32())))
        folder = base / f"date={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"batch-{batch_id}.parquet"
        temporary = folder / f".batch-{batch_id}-{uuid.uuid4().hex}.tmp"
        # zstd level 1: as small as the default level here, at less than half the CPU time.
        pq.write_table(part, temporary, compression="zstd", compression_level=1)
        os.replace(temporary, final)
        written.append(str(final))
    return written


def remove_files(paths: list[str]) -> None:
    """Undo a batch whose database transaction failed after its files were written."""
    for path in paths:
        Path(path).unlink(missing_ok=True)


def batch_id_of(path: Path) -> int | None:
    """The batch id in a file name ``batch-<id>.parquet`` (None for any other name)."""
    stem = path.name.removeprefix("batch-").removesuffix(".parquet")
    return int(stem) if stem.isdigit() and path.name.startswith("batch-") else None


def parquet_glob(*, workspace_id: int, group_id: int, version: int) -> list[str] | None:
    """The group version's Parquet files whose batch is committed (None when there are none).

    A batch's files are written inside its database transaction, before the commit; a process
    killed between the two leaves files whose batch row never committed. Readers therefore take
    only the files of batches the database has (one indexed query per read), never a bare glob,
    and ``sweep_uncommitted`` removes the leftovers later."""
    from features.models import Batch

    base = group_dir(workspace_id=workspace_id, group_id=group_id, version=version)
    files: dict[int, list[Path]] = {}  # a batch has one file per event-time day
    for path in base.glob("date=*/batch-*.parquet"):
        batch_id = batch_id_of(path)
        if batch_id is not None:
            files.setdefault(batch_id, []).append(path)
    if not files:
        return None
    committed = set(
        Batch.objects.unscoped()
        .filter(workspace_id=workspace_id, group_id=group_id, version=version)
        .filter(pk__in=list(files))
        .values_list("pk", flat=True)
    )
    kept = sorted(str(path) for i in committed for path in files[i])
    return kept or None


def sweep_uncommitted(*, older_than_s: float = 3600.0) -> list[str]:
    """Remove batch files whose batch row does not exist and that are older than
    ``older_than_s`` (a younger one may belong to a transaction still committing); returns the
    files removed."""
    import time

    from features.models import Batch

    root = offline_root()
    if not root.is_dir():
        return []
    cutoff = time.time() - older_than_s
    candidates: dict[int, list[Path]] = {}
    for path in root.glob("ws=*/group=*/v=*/date=*/batch-*.parquet"):
        batch_id = batch_id_of(path)
        if batch_id is not None and path.stat().st_mtime < cutoff:
            candidates.setdefault(batch_id, []).append(path)
    if not candidates:
        return []
    known = set(
        Batch.objects.unscoped().filter(pk__in=list(candidates)).values_list("pk", flat=True)
    )
    removed = []
    for batch_id, paths in candidates.items():
        if batch_id in known:
            continue
        for path in paths:
            path.unlink(missing_ok=True)
            removed.append(str(path))
    return removed


# The partition folders (ws=, group=, v=, date=) are layout, not columns.
READ_OPTIONS = "union_by_name = true, hive_partitioning = false"


_database: tuple[int, duckdb.DuckDBPyConnection] | None = None
_database_lock = threading.Lock()


def connect() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's in-memory DuckDB database; close it when done.

    Opening a database costs about 10 ms, a connection (a cursor) about 50 us, and a push opens
    one. Settings (SET) and registered tables stay with their connection; a forked child opens
    its own database.
    """
    global _database
    with _database_lock:
        if _database is None or _database[0] != os.getpid():
            database = duckdb.connect(database=":memory:")
            database.execute("SET threads TO 2")
            _database = (os.getpid(), database)
        return _database[1].cursor()


def read_group(
    *, workspace_id: int, group_id: int, version: int, columns: list[str] | None = None
) -> pa.Table | None:
    """All rows of one group version (None when nothing was written yet)."""
    pattern = parquet_glob(workspace_id=workspace_id, group_id=group_id, version=version)
    if pattern is None:
        return None
    selected = ", ".join(quote(c) for c in columns) if columns else "*"
    with connect() as connection:
        return connection.sql(
            f"SELECT {selected} FROM read_parquet(?, {READ_OPTIONS})",  # noqa: S608 - quoted identifiers
            params=[pattern],
        ).to_arrow_table()


def read_batch(
    *, workspace_id: int, group_id: int, version: int, batch_id: int, columns: list[str]
) -> pa.Table | None:
    """The rows of one committed batch (its files, one per event-time day); None when it has
    none left (its group version was removed)."""
    base = group_dir(workspace_id=workspace_id, group_id=group_id, version=version)
    paths = sorted(str(p) for p in base.glob(f"date=*/batch-{int(batch_id)}.parquet"))
    if not paths:
        return None
    selected = ", ".join(quote(c) for c in columns)
    with connect() as connection:
        return connection.sql(
            f"SELECT {selected} FROM read_parquet(?, {READ_OPTIONS})",  # noqa: S608 - quoted
            params=[paths],
        ).to_arrow_table()


def latest_per_entity(
    *,
    workspace_id: int,
    group_id: int,
    version: int,
    entity_keys: list[str],
    time_column: str,
    columns: list[str],
    batch_rows: int = 50_000,
) -> Iterator[pa.RecordBatch]:
    """The latest row per entity (by event time) of one group version, for materialisation, in
    record batches of at most ``batch_rows``: the window runs on a build engine's database (its
    memory limit, spilling past it), and the caller holds one batch at a time, however many
    entities the group has. Nothing when nothing was written yet."""
    from features.offline_engine import duckdb_engine

    pattern = parquet_glob(workspace_id=workspace_id, group_id=group_id, version=version)
    if pattern is None:
        return
    keys = ", ".join(quote(k) for k in entity_keys)
    selected = ", ".join(quote(c) for c in [*entity_keys, time_column, *columns])
    with duckdb_engine().connect() as connection:
        yield from connection.sql(
            f"SELECT {selected} FROM read_parquet(?, {READ_OPTIONS}) "  # noqa: S608 - quoted
            f"QUALIFY row_number() OVER (PARTITION BY {keys} "
            f"ORDER BY {quote(time_column)} DESC) = 1",
            params=[pattern],
        ).to_arrow_reader(batch_rows)


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
