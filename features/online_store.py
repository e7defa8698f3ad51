"""The online store: the latest row per entity and group version, for low-latency lookups.

Redis when REDIS_URL is set: one string per (group version, entity) holding the row as JSON with
its event time; a write replaces it only when its event time is not older (a Lua script, so
concurrent producers cannot regress a value). A lookup of many entities across many groups is one
round trip (one Lua script: an MGET per group) that also counts requests and hits for coverage.
Without Redis an embedded SQLite file in VAR_DIR plays the same part for `make run`. On a Redis
Cluster (``ONLINE_STORE_REDIS_CLUSTER``) each row key carries a hash tag, its group version and a
shard of the entity, so every script touches one slot (``RedisClusterOnlineStore``).

Versions are separate namespaces; a group's current version in the database decides which one
lookups read, so a new version goes live in one atomic update.
"""

from __future__ import annotations

import sqlite3
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from itertools import repeat
from typing import Any, Protocol

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from django.conf import settings
from redis.exceptions import NoScriptError, ResponseError

COVERAGE_TTL_SECONDS = 3 * 24 * 3600
WRITE_CHUNK = 1000  # rows per write command
WRITE_GROUP_ROWS = 50_000  # rows framed and sent together (bounds the memory of a push)

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


# Read the rows of every lookup and count requests and hits for coverage, in one round trip.
# KEYS: a guard key, then one coverage counter per lookup, then each lookup's row keys in turn.
# ARGV: the guard's expected text ('' for none), the counters' TTL, then each lookup's key count.
# With a guard, nothing is read or counted unless the guard key's value contains the expected
# text: the hot lookup path checks the access generation it cached under this way (fastpath.py).
_READ_AND_COUNT = """
if ARGV[1] ~= '' then
  local current = redis.call('GET', KEYS[1])
  if not current or not string.find(current, ARGV[1], 1, true) then return false end
end
local lookups = #ARGV - 2
local out = {}
local at = lookups + 1
for g = 1, lookups do
  local n = tonumber(ARGV[g + 2])
  local found = 0
  for first = 1, n, 1000 do
    local last = math.min(first + 999, n)
    local values = redis.call('MGET', unpack(KEYS, at + first, at + last))
    for i = 1, #values do
      local v = values[i]
      if v then found = found + 1 end
      out[#out + 1] = v
    end
  end
  at = at + n
  redis.call('HINCRBY', KEYS[g + 1], 'requested', n)
  redis.call('HINCRBY', KEYS[g + 1], 'found', found)
  redis.call('EXPIRE', KEYS[g + 1], ARGV[2])
end
return out
"""


def namespace(*, workspace_id: int, group_id: int, version: int) -> str:
    return f"{workspace_id}:{group_id}:v{version}"


def entity_id(values: Sequence[Any]) -> str:
    """A stable string for a (possibly composite) entity key."""
    return "|".join(str(v) for v in values)


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

    def prepare_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> Any:
        """Everything ``write_arrow`` does before it talks to the store (no side effects)."""

    def write_prepared(self, prepared: Any) -> int: ...

    def read(
        self, lookups: list[Lookup], *, guard: tuple[str, str] | None = None
    ) -> list[list[Any]] | None: ...

    def coverage(self, *, counter: str, buckets: list[str]) -> tuple[int, int]: ...

    def drop_namespace(self, namespace: str) -> None: ...


def row_mapping(stored: Any, features: Sequence[str]) -> dict[str, Any] | None:
    """A stored row by feature name: rows are JSON arrays in the order of their version's
    ``features`` (see ``features.ingestion.prepare_online``); rows stored before that are JSON
    objects already."""
    if type(stored) is list:
        return dict(zip(features, stored, strict=False))
    return stored


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _command_head(name: bytes, arguments: int) -> bytes:
    """The start of a Redis protocol command of ``arguments`` arguments after its name."""
    return b"*%d\r\n" % (arguments + 1) + _bulk(name)


def _error(reply: Any) -> bool:
    return isinstance(reply, Exception)


class _Frames:
    """Strings as Redis protocol bulk strings (``$<bytes>\r\n<string>\r\n``), back to back in
    one Arrow buffer: the frames of rows ``a`` to ``b`` are one slice of it, no Python string per
    row (``to_pylist`` and per-argument packing cost more than Redis' own work on a push)."""

    def __init__(self, framed: pa.Array) -> None:
        if not pa.types.is_string(framed.type):
            raise TypeError(f"frames are strings, not {framed.type}")
        self.array = framed
        _, offsets, data = framed.buffers()
        self.offsets = np.frombuffer(offsets, np.int32)[
            framed.offset : framed.offset + len(framed) + 1
        ]
        self.data = memoryview(data) if data is not None else memoryview(b"")

    @classmethod
    def of(cls, strings: pa.Array) -> _Frames:
        lengths = pc.cast(pc.binary_length(strings), pa.string())
        crlf = pa.scalar("\r\n")
        return cls(pc.binary_join_element_wise(pa.scalar("$"), lengths, crlf, strings, crlf, ""))

    def rows(self, a: int, b: int) -> memoryview:
        return self.data[self.offsets[a] : self.offsets[b]]


class _Group:
    """Up to ``WRITE_GROUP_ROWS`` keys and values of a write, framed once when first needed."""

    def __init__(self, keys: pa.Array, values: pa.Array) -> None:
        self.keys = keys
        self.values = values
        self._frames: tuple[_Frames, _Frames, _Frames] | None = None

    def frames(self) -> tuple[_Frames, _Frames, _Frames]:
        """Frames of the keys, of the values, and of each key followed by its value."""
        if self._frames is None:
            key_frames, value_frames = _Frames.of(self.keys), _Frames.of(self.values)
            pairs = pc.binary_join_element_wise(key_frames.array, value_frames.array, "")
            self._frames = (key_frames, value_frames, _Frames(pairs))
        return self._frames

    def release(self) -> None:
        self._frames = None


class _RedisRows:
    """What both Redis stores share: the write entry points, which frame rows as Arrow columns
    for the store's ``prepare_arrow`` and ``write_prepared``, and the coverage counters."""

    client: Any
    prefix: str

    def prepare_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> Any:
        raise NotImplementedError

    def write_prepared(self, prepared: Any) -> int:
        raise NotImplementedError

    def write(self, *, namespace: str, rows: Iterable[tuple[str, float, dict[str, Any]]]) -> int:
        entities, stamps, payloads = _split(rows)
        return self.write_encoded(
            namespace=namespace, entities=entities, stamps=stamps, payloads=payloads
        )

    def write_encoded(
        self, *, namespace: str, entities: list[str], stamps: list[float], payloads: list[str]
    ) -> int:
        """Rows already encoded as JSON text, with their event times (unix seconds)."""
        return self.write_arrow(
            namespace=namespace,
            entities=pa.array(entities, pa.string()),
            stamps=pa.array(stamps, pa.float64()),
            payloads=pa.array(payloads, pa.string()),
        )

    def write_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> int:
        """The same from Arrow columns (distinct entities; ``write_online`` keeps the newest row
        of each)."""
        prepared = self.prepare_arrow(
            namespace=namespace, entities=entities, stamps=stamps, payloads=payloads
        )
        return self.write_prepared(prepared)

    def coverage(self, *, counter: str, buckets: list[str]) -> tuple[int, int]:
        pipe = self.client.pipeline(transaction=False)
        for bucket in buckets:
            pipe.hmget(f"{self.prefix}:cov:{counter}:{bucket}", ["requested", "found"])
        requested = found = 0
        for values in pipe.execute():
            requested += int(values[0] or 0)
            found += int(values[1] or 0)
        return requested, found


class RedisOnlineStore(_RedisRows):
    """Online store on Redis (production and CI)."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.prefix = prefix
        self._write_script = self.client.register_script(_WRITE_IF_NEWER)
        self._read_script = self.client.register_script(_READ_AND_COUNT)

    def prepare_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> list[_Group]:
        """Keys, values and even their Redis protocol frames, assembled in C++."""
        prefix = pa.scalar(f"{self.prefix}:ol:{namespace}:")
        keys = pc.binary_join_element_wise(prefix, entities, "")
        values = pc.binary_join_element_wise(pc.cast(stamps, pa.string()), payloads, "|")
        if keys.null_count or values.null_count:
            raise ValueError("online rows need an entity, an event time and a payload")
        groups = [
            _Group(keys[start : start + WRITE_GROUP_ROWS], values[start : start + WRITE_GROUP_ROWS])
            for start in range(0, len(keys), WRITE_GROUP_ROWS)
        ]
        if groups:
            groups[0].frames()  # later groups are framed as they are sent (bounded memory)
        return groups

    def write_prepared(self, prepared: list[_Group]) -> int:
        return sum(self._write_group(group) for group in prepared)

    def _write_group(self, group: _Group) -> int:
        """Write rows newer-wins in ``WRITE_CHUNK``-row commands, in at most three round trips.

        Most rows of a push are often new entities. One round trip asks how many keys of each
        chunk exist. A chunk with none goes in with MSETNX, which sets every key or none at once,
        so it never replaces a row (no Lua, no values copied into the script engine); a chunk
        with stored rows goes through the newer-wins script. An MSETNX chunk that a concurrent
        writer got to first (it set nothing) takes the script afterwards.
        """
        keys, values = group.keys, group.values
        key_frames, value_frames, pair_frames = group.frames()
        chunks = [(a, min(a + WRITE_CHUNK, len(keys))) for a in range(0, len(keys), WRITE_CHUNK)]
        stored = self._send_raw(
            [[_command_head(b"EXISTS", b - a), key_frames.rows(a, b)] for a, b in chunks]
        )
        for count in stored:
            if _error(count):
                raise count
        sha = self._write_script.sha.encode()
        commands = []
        for (a, b), count in zip(chunks, stored, strict=True):
            if count:
                head = _command_head(b"EVALSHA", 2 + 2 * (b - a))
                head += _bulk(sha) + _bulk(str(b - a).encode())
                commands.append([head, key_frames.rows(a, b), value_frames.rows(a, b)])
            else:
                commands.append([_command_head(b"MSETNX", 2 * (b - a)), pair_frames.rows(a, b)])
        written = 0
        retry = []
        for (a, b), count, result in zip(chunks, stored, self._send_raw(commands), strict=True):
            if isinstance(result, NoScriptError):  # the script cache was flushed
                retry.append((a, b))
            elif _error(result):
                raise result
            elif count:
                written += result
            elif result:
                written += b - a
            else:  # someone created one of these keys since EXISTS: compare event times
                retry.append((a, b))
        group.release()
        for a, b in retry:  # the script object loads the script when Redis lacks it
            written += self._write_script(keys=keys[a:b].to_pylist(), args=values[a:b].to_pylist())
        return written

    def _send_raw(self, commands: list[list[bytes | memoryview]]) -> list[Any]:
        """Send commands already in the Redis protocol back to back; their replies (errors as
        exception objects), read in full so the connection stays in step."""
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command([b"".join(part for parts in commands for part in parts)])
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        return replies

    def read(
        self, lookups: list[Lookup], *, guard: tuple[str, str] | None = None
    ) -> list[list[Any]] | None:
        """Rows of each lookup, in order; None (nothing read, nothing counted) when ``guard``
        (a key, and text its value must contain) does not hold."""
        bucket = hour_bucket()
        keys = [guard[0] if guard else f"{self.prefix}:noguard"]
        keys.extend(f"{self.prefix}:cov:{lookup.counter}:{bucket}" for lookup in lookups)
        for lookup in lookups:
            base = f"{self.prefix}:ol:{lookup.namespace}:"
            keys.extend([base + e for e in lookup.entities])
        args: list[Any] = [guard[1] if guard else "", COVERAGE_TTL_SECONDS]
        args.extend(len(lookup.entities) for lookup in lookups)
        # A plain EVALSHA (no pipeline object to build): one round trip for every group.
        values = self._read_script(keys=keys, args=args)
        if values is None:
            return None
        decoded: list[list[Any]] = []
        at = 0
        loads = orjson.loads
        for lookup in lookups:
            stop = at + len(lookup.entities)
            decoded.append(
                [None if v is None else loads(v.partition(b"|")[2]) for v in values[at:stop]]
            )
            at = stop
        return decoded

    def drop_namespace(self, namespace: str) -> None:
        for key in self.client.scan_iter(match=f"{self.prefix}:ol:{namespace}:*", count=1000):
            self.client.delete(key)


class RedisClusterOnlineStore(_RedisRows):
    """Online store on a Redis Cluster: the same values, newer-wins script and coverage counters
    as ``RedisOnlineStore``, with keys that name their slot.

    A row's key is ``<prefix>:ol:{<group version>#<shard>}:<entity>``, the shard being
    ``crc32(entity) % ONLINE_STORE_CLUSTER_SHARDS``: a multi-key command or script only ever sees
    keys of one hash tag, and one group version's rows spread over that many slots, hence over
    the masters. Writes send the newer-wins script per chunk of one tag, pipelined per master;
    a lookup is one pipelined MGET per tag (redis-py's ``mget_nonatomic``), then the coverage
    counters, which live on their own slots, in a second pipelined round trip. The cached-access
    guard of ``RedisOnlineStore.read`` needs the cache's Redis and is not offered here.
    """

    def __init__(self, url: str, prefix: str, shards: int) -> None:
        from redis.cluster import RedisCluster

        self.client = RedisCluster.from_url(url)
        self.prefix = prefix
        self.shards = max(int(shards), 1)
        self._write_script = self.client.register_script(_WRITE_IF_NEWER)

    def _tag(self, namespace: str, entity: str) -> str:
        shard = zlib.crc32(entity.encode()) % self.shards
        return f"{self.prefix}:ol:{{{namespace}#{shard}}}:"

    def prepare_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> dict[str, tuple[list[str], list[str]]]:
        """Keys and values grouped by hash tag, the newest row of an entity written twice
        (a script compares with what was stored before it ran, not within its own keys)."""
        values = pc.binary_join_element_wise(pc.cast(stamps, pa.string()), payloads, "|")
        if entities.null_count or values.null_count:
            raise ValueError("online rows need an entity, an event time and a payload")
        newest: dict[str, tuple[float, str]] = {}
        for entity, stamp, value in zip(
            entities.to_pylist(), stamps.to_pylist(), values.to_pylist(), strict=True
        ):
            kept = newest.get(entity)
            if kept is None or stamp >= kept[0]:
                newest[entity] = (stamp, value)
        by_tag: dict[str, tuple[list[str], list[str]]] = {}
        for entity, (_stamp, value) in newest.items():
            tag = self._tag(namespace, entity)
            keys, tagged = by_tag.setdefault(tag, ([], []))
            keys.append(tag + entity)
            tagged.append(value)
        return by_tag

    def write_prepared(self, prepared: dict[str, tuple[list[str], list[str]]]) -> int:
        """Chunks of one tag each, pipelined per master (redis-py's cluster pipeline refuses
        scripts, so each master's own client pipelines them); a chunk the master refuses (a
        slot moved, the script cache flushed) goes again through the cluster client's script
        call, which follows redirections and loads the script."""
        by_node: dict[str, list[tuple[list[str], list[str]]]] = {}
        nodes = {}
        for keys, values in prepared.values():
            node = self.client.get_node_from_key(keys[0])
            nodes[node.name] = node
            by_node.setdefault(node.name, []).extend(
                (keys[a : a + WRITE_CHUNK], values[a : a + WRITE_CHUNK])
                for a in range(0, len(keys), WRITE_CHUNK)
            )
        written = 0
        sha = self._write_script.sha
        for name, chunks in by_node.items():
            pipe = nodes[name].redis_connection.pipeline(transaction=False)
            for keys, values in chunks:
                pipe.evalsha(sha, len(keys), *keys, *values)
            for (keys, values), result in zip(
                chunks, pipe.execute(raise_on_error=False), strict=True
            ):
                if _error(result):
                    result = self._write_script(keys=keys, args=values)
                written += int(result)
        return written

    def read(
        self, lookups: list[Lookup], *, guard: tuple[str, str] | None = None
    ) -> list[list[Any]] | None:
        if guard is not None:
            raise ValueError("the cluster store has no access guard (see the class docstring)")
        keys = [
            self._tag(lookup.namespace, entity) + entity
            for lookup in lookups
            for entity in lookup.entities
        ]
        values = self.client.mget_nonatomic(keys) if keys else []
        decoded: list[list[Any]] = []
        at = 0
        loads = orjson.loads
        pipe = self.client.pipeline()
        bucket = hour_bucket()
        for lookup in lookups:
            stop = at + len(lookup.entities)
            rows = [None if v is None else loads(v.partition(b"|")[2]) for v in values[at:stop]]
            decoded.append(rows)
            at = stop
            counter = f"{self.prefix}:cov:{lookup.counter}:{bucket}"
            pipe.hincrby(counter, "requested", len(rows))
            pipe.hincrby(counter, "found", sum(row is not None for row in rows))
            pipe.expire(counter, COVERAGE_TTL_SECONDS)
        if lookups:
            pipe.execute()
        return decoded

    def drop_namespace(self, namespace: str) -> None:
        for shard in range(self.shards):
            match = f"{self.prefix}:ol:{{{namespace}#{shard}}}:*"
            for key in self.client.scan_iter(match=match, count=1000):
                self.client.delete(key)

    def clear(self) -> None:
        """Delete every key of this store's prefix (tests)."""
        for key in self.client.scan_iter(match=f"{self.prefix}:*", count=1000):
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
        prepared = self.prepare_arrow(
            namespace=namespace, entities=entities, stamps=stamps, payloads=payloads
        )
        return self.write_prepared(prepared)

    def prepare_arrow(
        self, *, namespace: str, entities: pa.Array, stamps: pa.Array, payloads: pa.Array
    ) -> dict[str, Any]:
        return {
            "namespace": namespace,
            "entities": entities.to_pylist(),
            "stamps": stamps.to_pylist(),
            "payloads": payloads.to_pylist(),
        }

    def write_prepared(self, prepared: dict[str, Any]) -> int:
        return self.write_encoded(**prepared)

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

    def read(
        self, lookups: list[Lookup], *, guard: tuple[str, str] | None = None
    ) -> list[list[Any]]:
        """Rows of each lookup, in order (``guard`` is Redis-only: see RedisOnlineStore.read)."""
        if guard is not None:
            raise ValueError("the embedded online store takes no guard")
        connection = self._connection()
        bucket = hour_bucket()
        results: list[list[Any]] = []
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
def _store_for(
    redis_url: str, prefix: str, sqlite_path: str, cluster: bool = False, shards: int = 64
) -> OnlineStore:
    if redis_url and cluster:
        return RedisClusterOnlineStore(redis_url, prefix, shards)
    if redis_url:
        return RedisOnlineStore(redis_url, prefix)
    return SQLiteOnlineStore(sqlite_path)


def get_online_store() -> OnlineStore:
    """The configured online store (cached per configuration, so tests can switch settings)."""
    return _store_for(
        settings.ONLINE_STORE_REDIS_URL,
        settings.CACHE_KEY_PREFIX,
        str(settings.ONLINE_STORE_SQLITE_PATH),
        settings.ONLINE_STORE_REDIS_CLUSTER,
        settings.ONLINE_STORE_CLUSTER_SHARDS,
    )
