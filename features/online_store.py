"""The online store: the latest row per entity and group version, for low-latency lookups.

Redis when REDIS_URL is set: one string per (group version, entity) holding the row as JSON with
its event time; a write replaces it only when its event time is not older (a Lua script, so
concurrent producers cannot regress a value). A lookup of many entities across many groups is one
pipeline round trip (an MGET per group) that also counts requests and hits for coverage.
Without Redis an embedded SQLite file in VAR_DIR plays the same part for `make run`.

Versions are separate namespaces; a group's current version in the database decides which one
lookups read, so a new version goes live in one atomic update.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from itertools import repeat
from typing import Any, Protocol

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from django.conf import settings

COVERAGE_TTL_SECONDS = 3 * 24 * 3600
WRITE_CHUNK = 500

# Replace the stored row only if the new one is at least as recent. Each value starts with its
# event time ("<ts>|<json>"), so one argument per key carries both.
_WRITE_IF_NEWER = """
local written = 0
local current = redis.call('MGET', unpack(KEYS))
local sets = {}
for i = 1, #KEYS do
  local newer = true
  local stored = current[i]
  if stored then
    local a = string.find(stored, '|', 1, true)
    local b = string.find(ARGV[i], '|', 1, true)
    local old_ts = a and tonumber(string.sub(stored, 1, a - 1))
    local new_ts = b and tonumber(string.sub(ARGV[i], 1, b - 1))
    if old_ts and new_ts and old_ts > new_ts then newer = false end
  end
  if newer then
    sets[#sets + 1] = KEYS[i]
    sets[#sets + 1] = ARGV[i]
    written = written + 1
  end
end
if #sets > 0 then redis.call('MSET', unpack(sets)) end
return written
"""


# Read the rows and count requests and hits for coverage, in one round trip.
_READ_AND_COUNT = """
local values = redis.call('MGET', unpack(KEYS, 2))
local found = 0
for _, v in ipairs(values) do
  if v then found = found + 1 end
end
redis.call('HINCRBY', KEYS[1], 'requested', #KEYS - 1)
redis.call('HINCRBY', KEYS[1], 'found', found)
redis.call('EXPIRE', KEYS[1], ARGV[1])
return values
"""


def namespace(*, workspace_id: int, group_id: int, version: int) -> str:
    return f"{workspace_id}:{group_id}:v{version}"


def entity_id(values: Sequence[Any]) -> str:
    """A stable string for a (possibly composite) entity key."""
    return "|".join(str(v) for v in values)


def _encode(ts: float, row: dict[str, Any]) -> bytes:
    return repr(ts).encode() + b"|" + orjson.dumps(row)


def _decode(raw: bytes | None) -> tuple[float, dict[str, Any]] | None:
    if raw is None:
        return None
    ts, _, body = raw.partition(b"|")
    return float(ts), orjson.loads(body)


def _split(
    rows: Iterable[tuple[str, float, dict[str, Any]]],
) -> tuple[list[str], list[float], list[str]]:
    entities: list[str] = []
    stamps: list[float] = []
    payloads: list[str] = []
    for entity, stamp, row in rows:
        entities.append(entity)
        stamps.append(stamp)
        payloads.append(orjson.dumps(row).decode())
    return entities, stamps, payloads


def hour_bucket(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y%m%d%H")


@dataclass(frozen=True)
class Lookup:
    """Entities to read from one group version; ``counter`` names the group for coverage."""

    namespace: str
    entities: list[str]
    counter: str


class OnlineStore(Protocol):
    def write(
        self, *, namespace: str, rows: Iterable[tuple[str, float, dict[str, Any]]]
    ) -> int: ...

    def write_encoded(
        self, *, namespace: str, entities: list[str], stamps: list[float], payloads: list[str]
    ) -> int: ...

    def write_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> int: ...

    def read(self, lookups: list[Lookup]) -> list[list[dict[str, Any] | None]]: ...

    def coverage(self, *, counter: str, buckets: list[str]) -> tuple[int, int]: ...

    def drop_namespace(self, namespace: str) -> None: ...


class RedisOnlineStore:
    """Online store on Redis (production and CI)."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.prefix = prefix
        self._write_script = self.client.register_script(_WRITE_IF_NEWER)
        self._read_script = self.client.register_script(_READ_AND_COUNT)

    def _key(self, ns: str, entity: str) -> str:
        return f"{self.prefix}:ol:{ns}:{entity}"

    def write(self, *, namespace: str, rows: Iterable[tuple[str, float, dict[str, Any]]]) -> int:
        entities, stamps, payloads = _split(rows)
        return self.write_encoded(
            namespace=namespace, entities=entities, stamps=stamps, payloads=payloads
        )

    def write_encoded(
        self, *, namespace: str, entities: list[str], stamps: list[float], payloads: list[str]
    ) -> int:
        """Rows already encoded as JSON text, with their event times (unix seconds)."""
        prefix = f"{self.prefix}:ol:{namespace}:"
        keys = [prefix + entity for entity in entities]
        values = [f"{stamp!r}|{payload}" for stamp, payload in zip(stamps, payloads, strict=True)]
        return self._write_values(keys, values)

    def write_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> int:
        """The same from Arrow columns: keys and values are assembled in C++."""
        prefix = pa.scalar(f"{self.prefix}:ol:{namespace}:")
        keys = pc.binary_join_element_wise(prefix, entities, "").to_pylist()
        values = pc.binary_join_element_wise(
            pc.cast(stamps, pa.string()), payloads, "|"
        ).to_pylist()
        return self._write_values(keys, values)

    def _write_values(self, keys: list[str], values: list[str]) -> int:
        written = 0
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(keys), WRITE_CHUNK):
            stop = start + WRITE_CHUNK
            self._write_script(keys=keys[start:stop], args=values[start:stop], client=pipe)
            if len(pipe) >= 20:
                written += sum(pipe.execute())
        if len(pipe):
            written += sum(pipe.execute())
        return written

    def read(self, lookups: list[Lookup]) -> list[list[dict[str, Any] | None]]:
        pipe = self.client.pipeline(transaction=False)
        bucket = hour_bucket()
        for lookup in lookups:
            keys = [f"{self.prefix}:cov:{lookup.counter}:{bucket}"]
            keys.extend(self._key(lookup.namespace, e) for e in lookup.entities)
            self._read_script(keys=keys, args=[COVERAGE_TTL_SECONDS], client=pipe)
        results = pipe.execute()
        decoded = []
        for values in results:
            rows = []
            for raw in values:
                row = _decode(raw)
                rows.append(row[1] if row else None)
            decoded.append(rows)
        return decoded

    def coverage(self, *, counter: str, buckets: list[str]) -> tuple[int, int]:
        pipe = self.client.pipeline(transaction=False)
        for bucket in buckets:
            pipe.hmget(f"{self.prefix}:cov:{counter}:{bucket}", ["requested", "found"])
        requested = found = 0
        for values in pipe.execute():
            requested += int(values[0] or 0)
            found += int(values[1] or 0)
        return requested, found

    def drop_namespace(self, namespace: str) -> None:
        for key in self.client.scan_iter(match=f"{self.prefix}:ol:{namespace}:*", count=1000):
            self.client.delete(key)


class SQLiteOnlineStore:
    """Embedded online store for `make run`: one SQLite file, no server."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        with self._connection() as connection:
            connection.executescript(
                """
                CREATE TABLE IF NOT EXISTS online_row (
                    ns TEXT NOT NULL, entity TEXT NOT NULL, ts REAL NOT NULL, row TEXT NOT NULL,
                    PRIMARY KEY (ns, entity)
                ) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS online_coverage (
                    counter TEXT NOT NULL, bucket TEXT NOT NULL,
                    requested INTEGER NOT NULL DEFAULT 0, found INTEGER NOT NULL DEFAULT 0,
                    PRIMARY KEY (counter, bucket)
                ) WITHOUT ROWID;
                """
            )

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            self._local.connection = connection
        return connection

    def write(self, *, namespace: str, rows: Iterable[tuple[str, float, dict[str, Any]]]) -> int:
        entities, stamps, payloads = _split(rows)
        return self.write_encoded(
            namespace=namespace, entities=entities, stamps=stamps, payloads=payloads
        )

    def write_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> int:
        return self.write_encoded(
            namespace=namespace,
            entities=entities.to_pylist(),
            stamps=stamps.to_pylist(),
            payloads=payloads.to_pylist(),
        )

    def write_encoded(
        self, *, namespace: str, entities: list[str], stamps: list[float], payloads: list[str]
    ) -> int:
        connection = self._connection()
        before = connection.total_changes
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.executemany(
                "INSERT INTO online_row (ns, entity, ts, row) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (ns, entity) DO UPDATE SET ts = excluded.ts, row = excluded.row "
                "WHERE excluded.ts >= online_row.ts",
                zip(repeat(namespace), entities, stamps, payloads),
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        return connection.total_changes - before

    def read(self, lookups: list[Lookup]) -> list[list[dict[str, Any] | None]]:
        connection = self._connection()
        bucket = hour_bucket()
        results: list[list[dict[str, Any] | None]] = []
        counts: list[tuple[str, str, int, int]] = []
        for lookup in lookups:
            found: dict[str, dict[str, Any]] = {}
            unique = list(dict.fromkeys(lookup.entities))
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for entity, row in connection.execute(
                    f"SELECT entity, row FROM online_row WHERE ns = ? AND entity IN ({marks})",  # noqa: S608 - placeholders only
                    [lookup.namespace, *chunk],
                ):
                    found[entity] = orjson.loads(row)
            rows = [found.get(e) for e in lookup.entities]
            results.append(rows)
            hits = sum(1 for r in rows if r is not None)
            counts.append((lookup.counter, bucket, len(rows), hits))
        connection.executemany(
            "INSERT INTO online_coverage (counter, bucket, requested, found) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (counter, bucket) DO UPDATE SET "
            "requested = requested + excluded.requested, "
            "found = found + excluded.found",
            counts,
        )
        return results

    def coverage(self, *, counter: str, buckets: list[str]) -> tuple[int, int]:
        marks = ",".join("?" * len(buckets))
        row = (
            self._connection()
            .execute(
                "SELECT coalesce(sum(requested), 0), coalesce(sum(found), 0) "  # noqa: S608
                f"FROM online_coverage WHERE counter = ? AND bucket IN ({marks})",
                [counter, *buckets],
            )
            .fetchone()
        )
        return int(row[0]), int(row[1])

    def drop_namespace(self, namespace: str) -> None:
        self._connection().execute("DELETE FROM online_row WHERE ns = ?", [namespace])


@cache
def _store_for(redis_url: str, prefix: str, sqlite_path: str) -> OnlineStore:
    if redis_url:
        return RedisOnlineStore(redis_url, prefix)
    return SQLiteOnlineStore(sqlite_path)


def get_online_store() -> OnlineStore:
    """The configured online store (cached per configuration, so tests can switch settings)."""
    return _store_for(
        settings.REDIS_URL,
        settings.CACHE_KEY_PREFIX,
        str(settings.ONLINE_STORE_SQLITE_PATH),
    )
