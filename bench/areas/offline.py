"""Offline data at scale: the point-in-time join of a training sample at 1M, 10M and 50M label
rows, on the platform's DuckDB engine and on Feast's ``get_historical_features``.

Data (``write_ads_log``, generated, the same seed for both sides): an ads log over 30 days, laid
out as the offline store lays out a group version (``date=YYYY-MM-DD/batch-<id>.parquet``):

- ``impressions``: the label events, ``user_id``, ``item_id``, ``context_id``, ``event_time``
  (uniform over the 30 days) and ``clicked``; one batch per day.
- three feature groups, 50 features in all: ``users`` (20 features; a third of the users
  updated each day), ``items`` (20; a fifth each day), ``contexts`` (10; every context four times
  a day). Each day also has a correction batch re-sending 1% of that day's rows with new values
  at the same time (the later batch wins), the case that makes a point-in-time join deduplicate.

The entity tables are the same at every size (more traffic over the same users and items), so
the join's work grows with the label rows, as it does in production.

Measures:

- ``pit_rows_per_s_<n>``: label rows / wall time of the build (count, join, Parquet write) as the
  dataset build runs it (``features.samples.write_sample`` on ``DuckDBEngine`` with the default
  memory limit ``OFFLINE_MEMORY_LIMIT``), in a child process of its own;
  ``pit_peak_rss_mb_<n>``: that child's peak resident memory (``ru_maxrss``).
- ``pit_rows_per_s_feast_<n>`` (1M and 10M): Feast 0.67's ``get_historical_features`` on its
  DuckDB offline store (``bench/.venvs/feast-offline``), the same labels as its entity frame and
  the same feature rows (each group as one Parquet file, written before the clock starts),
  ``.to_arrow()``; ``pit_peak_rss_mb_feast_<n>`` likewise.
- ``pit_time_growth_ratio``: (time at the largest size / time at the smallest) / (the ratio of
  their sizes), the goal being <= 1.2 from 1M to 50M.
- ``drift_run_s_<n>``: one drift run, as the health check runs it every minute, on the label
  group's numeric ``dwell`` (the last day against the 7 before) from the hourly sketches the
  pushes leave (``features.sketches``); ``drift_parquet_run_s_<n>``: the same read from the
  Parquet of those 8 days (the fallback for batches older than sketches); both PSIs go to
  ``parameters.drift_psi``.
- ``materialize_rows_per_s``: ``group_materialize`` of the ``users`` group (100,000 entities,
  the latest of about a million rows each) into the online store (Redis with ``REDIS_URL``), in
  bounded batches; the rows were pushed first, untimed.
- ``build_request_ms_<n>`` and ``build_s_<n>`` (at ``BENCH_OFFLINE_BUILD_SIZE``, default 10M):
  the labels and the three groups pushed through ``batch_ingest`` into groups of a workspace
  (untimed), then ``POST .../datasets/`` as the page sends it, which answers 202 once the build
  is queued (its time), and the build as the worker runs it, in a thread, while the API's
  ``rows_done``, ``partitions_done`` and the page's progress bar are polled each second (counts
  of what was seen in ``parameters.background_build``).
- ``pit_vs_feast_10m_ratio``: ours / Feast's rows per second at 10M (goal >= 5).

Sizes: ``BENCH_OFFLINE_SIZES`` (comma-separated label rows, default ``1000000,10000000,50000000``)
and ``BENCH_OFFLINE_FEAST_SIZES`` (default ``1000000,10000000``); a Feast run longer than
``BENCH_OFFLINE_FEAST_TIMEOUT`` seconds (default 1800) is stopped and recorded under
``parameters.feast_failures``.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.harness import REPO_ROOT, BenchError, Context, peer_venv

DAYS = 30
START = datetime(2026, 10, 1, tzinfo=UTC)
SECONDS = DAYS * 86_400
GROUPS = {
    # name: (key, entities, features, share of entities updated per day, updates a day each)
    "users": ("user_id", 100_000, 20, 1 / 3, 1),
    "items": ("item_id", 50_000, 20, 1 / 5, 1),
    "contexts": ("context_id", 500, 10, 1.0, 4),
}
LABEL_GROUP = "impressions"
CORRECTION_SHARE = 0.01
# Feast's join holds its inputs and result in pandas (11 GB at 1M labels here); past this address
# space its run fails with a MemoryError, recorded as a failure, rather than the machine's OOM
# killer choosing a process.
FEAST_MEMORY_CAP_BYTES = 18 * 1024**3
DEFAULT_SIZES = (1_000_000, 10_000_000, 50_000_000)
DEFAULT_FEAST_SIZES = (1_000_000, 10_000_000)
FEAST_OFFLINE_REQUIREMENTS = [
    "feast[duckdb]==0.67.0",
    "ibis-framework[duckdb]==12.0.0",
    "sqlglot==30.31.0",
    "duckdb==2.0.1",
    "pandas==2.3.3",
    "pyarrow==26.0.1",
    "numpy==2.4.6",
]


def _keys(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64()).cast(pa.string())


def _times(seconds: np.ndarray) -> pa.Array:
    base = int(START.timestamp() * 1_000_000)
    return pa.array(base + seconds.astype(np.int64) * 1_000_000, pa.timestamp("us", tz="UTC"))


def _write(folder: Path, day: int, batch: int, table: pa.Table) -> None:
    target = folder / f"date={(START + timedelta(days=day)).date().isoformat()}"
    target.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target / f"batch-{batch}.parquet", compression="zstd")


def feature_names(group: str) -> list[str]:
    return [f"{group[0]}_f{i}" for i in range(GROUPS[group][2])]


def write_ads_log(
    root: Path,
    *,
    labels: int,
    seed: int = 7,
    scale: float = 1.0,
    groups: bool = True,
) -> dict[str, Any]:
    """Write the ads log under ``root/<group>/`` (see the module docstring); ``scale`` shrinks
    the entity tables (tests use small ones), ``groups=False`` writes the labels only (the
    feature groups of an earlier call are kept). Returns the layout: per group, its key, its
    features and its files."""
    rng = np.random.default_rng(seed)
    layout: dict[str, Any] = {}
    batch = 1
    sizes = {name: max(2, int(spec[1] * scale)) for name, spec in GROUPS.items()}
    for name, (key, _entities, _width, share, per_day) in GROUPS.items():
        folder = root / name
        layout[name] = {"key": key, "features": feature_names(name), "folder": str(folder)}
        if not groups:
            batch += 2 * DAYS
            continue
        entities = sizes[name]
        for day in range(DAYS):
            updated = rng.random(entities * per_day) < share
            ids = np.tile(np.arange(entities), per_day)[updated]
            seconds = day * 86_400 + rng.integers(0, 86_400, ids.size)
            columns: dict[str, Any] = {key: _keys(ids), "event_time": _times(seconds)}
            for index, feature in enumerate(feature_names(name)):
                if index % 4 == 3:
                    columns[feature] = pa.array(rng.integers(0, 1000, ids.size), pa.int64())
                else:
                    columns[feature] = pa.array(rng.standard_normal(ids.size), pa.float64())
            table = pa.table(columns)
            _write(folder, day, batch, table)
            # The correction batch: 1% of the day's rows again, same entity and time, new values.
            picked = np.flatnonzero(rng.random(ids.size) < CORRECTION_SHARE)
            corrected = table.take(pa.array(picked, pa.int64()))
            for feature in feature_names(name)[:3]:
                kind = corrected.schema.field(feature).type
                fresh = rng.standard_normal(picked.size) if kind == pa.float64() else None
                if fresh is not None:
                    corrected = corrected.set_column(
                        corrected.schema.get_field_index(feature), feature, pa.array(fresh)
                    )
            _write(folder, day, batch + 1, corrected)
            batch += 2
    folder = root / LABEL_GROUP
    per_day = np.full(DAYS, labels // DAYS)
    per_day[: labels % DAYS] += 1
    for day, count in enumerate(per_day):
        seconds = day * 86_400 + np.sort(rng.integers(0, 86_400, int(count)))
        table = pa.table(
            {
                "user_id": _keys(rng.integers(0, sizes["users"], count)),
                "item_id": _keys(rng.integers(0, sizes["items"], count)),
                "context_id": _keys(rng.integers(0, sizes["contexts"], count)),
                "event_time": _times(seconds),
                "clicked": pa.array(rng.random(count) < 0.05, pa.bool_()),
                # Seconds on the ad after the impression: the numeric column drift is measured on.
                "dwell": pa.array(rng.exponential(8.0, count), pa.float64()),
            }
        )
        _write(folder, day, batch, table)
        batch += 1
    layout[LABEL_GROUP] = {"folder": str(folder)}
    return layout


def _files(folder: str | Path) -> tuple[str, ...]:
    return tuple(sorted(str(p) for p in Path(folder).glob("date=*/batch-*.parquet")))


def ads_plan(
    layout: dict[str, Any], *, start: datetime | None = None, end: datetime | None = None
) -> Any:
    """The platform's join plan of the ads log: every feature of the three groups for each
    impression, ``clicked`` as the label."""
    from features.offline_engine import Column, FeatureInput, JoinPlan, LabelInput

    labels = LabelInput(
        files=_files(layout[LABEL_GROUP]["folder"]),
        keys=("user_id", "item_id", "context_id"),
        time_column="event_time",
        columns=(Column("clicked", "clicked", "bool"),),
        start_time=start,
        end_time=end,
    )
    sources = []
    for index, name in enumerate(GROUPS):
        group = layout[name]
        columns = tuple(
            Column(
                feature,
                f"{name}__{feature}",
                "int" if position % 4 == 3 else "float",
            )
            for position, feature in enumerate(group["features"])
        )
        sources.append(
            FeatureInput(
                alias=f"s{index}",
                files=_files(group["folder"]),
                keys=(group["key"],),
                time_column="event_time",
                columns=columns,
            )
        )
    return JoinPlan(labels=labels, sources=tuple(sources)).pruned()


# --- the children ----------------------------------------------------------------------------

OURS_CHILD = """
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
import django
django.setup()
from bench.areas.offline import ads_plan
from features.offline_engine import DuckDBEngine
from features.samples import write_sample
layout = json.loads({layout!r})
engine = DuckDBEngine(memory_limit={memory!r}, temp_directory={scratch!r}, threads=2)
started = time.monotonic()
rows, present = write_sample(engine, ads_plan(layout), Path({out!r}))
seconds = time.monotonic() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps({{"rows": rows, "seconds": seconds, "peak_mb": peak,
                  "present": sum(present.values())}}))
"""

FEAST_CHILD = """
import json, os, resource, sys, time
from datetime import timedelta
import pandas as pd, pyarrow.parquet as pq
from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
from feast.repo_config import RepoConfig
from feast.types import Float64, Int64
spec = json.loads(sys.argv[1])
store = FeatureStore(config=RepoConfig(
    project="offline_bench", provider="local", registry=os.path.join(spec["repo"], "registry.db"),
    offline_store={{"type": "duckdb"}}, online_store={{"type": "sqlite",
    "path": os.path.join(spec["repo"], "online.db")}}, entity_key_serialization_version=3,
    repo_path=spec["repo"]))
objects, refs = [], []
for name, group in spec["groups"].items():
    entity = Entity(name=group["key"], join_keys=[group["key"]], value_type=ValueType.STRING)
    source = FileSource(path=group["file"], timestamp_field="event_time")
    fields = [Field(name=f, dtype=(Int64 if i % 4 == 3 else Float64))
              for i, f in enumerate(group["features"])]
    view = FeatureView(name=name, entities=[entity], ttl=timedelta(days=400), schema=fields,
                       source=source, online=False)
    objects += [entity, view]
    refs += [f"{{name}}:{{f}}" for f in group["features"]]
store.apply(objects)
entity_df = pq.read_table(spec["labels"],
    columns=["user_id", "item_id", "context_id", "event_time"]).to_pandas()
started = time.monotonic()
result = store.get_historical_features(entity_df=entity_df, features=refs).to_arrow()
seconds = time.monotonic() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps({{"rows": result.num_rows, "seconds": seconds, "peak_mb": peak}}))
"""


def _child(
    command: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    memory_cap_bytes: int | None = None,
) -> dict:
    def cap() -> None:  # in the child, before it runs: past the cap its allocations fail
        if memory_cap_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap_bytes, memory_cap_bytes))

    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        preexec_fn=cap,
    )
    if done.returncode != 0:
        raise BenchError(f"{command[0]} failed ({done.returncode}): {done.stderr[-3000:]}")
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not results:
        raise BenchError(f"{command[0]} printed no result: {done.stdout[-2000:]}")
    return json.loads(results[-1].removeprefix("RESULT "))


def run_ours(layout: dict[str, Any], workdir: Path, *, memory_limit: str) -> dict[str, Any]:
    code = OURS_CHILD.format(
        repo=str(REPO_ROOT),
        layout=json.dumps(layout),
        memory=memory_limit,
        scratch=str(workdir / "spill"),
        out=str(workdir / "sample"),
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    try:
        return _child([sys.executable, "-c", code], timeout=3600, env=env)
    finally:
        shutil.rmtree(workdir / "sample", ignore_errors=True)


def _concat(folder: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(path) for path in _files(folder))


def _feast_inputs(layout: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Each feature group as one Parquet file and the labels as one (Feast reads a file per
    source); written before any clock starts."""
    spec: dict[str, Any] = {"repo": str(workdir / "feast"), "groups": {}}
    Path(spec["repo"]).mkdir(parents=True, exist_ok=True)
    for name in GROUPS:
        target = workdir / f"feast-{name}.parquet"
        if not target.exists():
            pq.write_table(_concat(layout[name]["folder"]), target)
        spec["groups"][name] = {
            "key": layout[name]["key"],
            "features": layout[name]["features"],
            "file": str(target),
        }
    target = workdir / "feast-labels.parquet"
    pq.write_table(_concat(layout[LABEL_GROUP]["folder"]), target)
    spec["labels"] = str(target)
    return spec


def run_feast(layout: dict[str, Any], workdir: Path, *, timeout: float) -> dict[str, Any]:
    python = peer_venv("feast-offline", FEAST_OFFLINE_REQUIREMENTS)
    spec = _feast_inputs(layout, workdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON"))}
    env["FEAST_USAGE"] = "False"
    return _child(
        [str(python), "-c", FEAST_CHILD.format(), json.dumps(spec)],
        timeout=timeout,
        env=env,
        memory_cap_bytes=FEAST_MEMORY_CAP_BYTES,
    )


def measure_drift(layout: dict[str, Any]) -> dict[str, float]:
    """Seconds of one drift run over the label group's ``dwell`` (the last day against the 7
    before, at the end of the log), both ways ``features.health.measure_drift`` runs it: from the
    hourly sketches each push leaves (computed here from the files, as the push would, untimed;
    the run merges them) and from the Parquet (its fallback for batches without sketches)."""
    from features import health, sketches

    now = START + timedelta(days=DAYS)
    files = list(_files(layout[LABEL_GROUP]["folder"]))
    hours = [
        (hour, encoded)
        for path in files
        for hour, _rows, encoded in sketches.hourly_sketches(
            pq.read_table(path, columns=["event_time", "dwell"]),
            time_column="event_time",
            numeric=["dwell"],
        )
    ]
    started = time.monotonic()
    from_sketches = health.drift_psi_of_sketches(hours, numeric=["dwell"], now=now)
    sketch_seconds = time.monotonic() - started
    started = time.monotonic()
    exact = health.drift_psi(files=files, time_column="event_time", numeric=["dwell"], now=now)
    parquet_seconds = time.monotonic() - started
    if "dwell" not in exact or "dwell" not in from_sketches:
        raise BenchError(f"drift measured nothing: {exact}, {from_sketches}")
    return {
        "sketch_s": sketch_seconds,
        "parquet_s": parquet_seconds,
        "psi_sketch": from_sketches["dwell"],
        "psi_exact": exact["dwell"],
    }


class Platform:
    """The ads log's groups registered in the throwaway database, in one workspace, with the
    files pushed as producer batches through ``batch_ingest`` (the push's own path: validation,
    offline write, sketches), offline only; nothing here is timed."""

    def __init__(self) -> None:
        from django.contrib.auth import get_user_model

        from workspaces import services
        from workspaces.models import PredictionType, Role

        self.workspace = services.workspace_create(
            actor=None,
            slug="bench-offline",
            name="Bench offline",
            scene="bench-offline",
            prediction_type=PredictionType.FINE_RANK,
        )
        self.producer = get_user_model().objects.create_user("bench-offline-producer")
        services.membership_grant(
            actor=None, workspace=self.workspace, user=self.producer, role=Role.DEVELOPER
        )
        self.groups: dict[str, Any] = {}

    def group(self, layout: dict[str, Any], name: str) -> Any:
        """The group ``name``, registered and pushed the first time it is asked for."""
        from features import registry
        from features.ingestion import batch_ingest

        if name in self.groups:
            return self.groups[name]
        if name == LABEL_GROUP:
            keys = ["user_id", "item_id", "context_id"]
            entity = "label"
            features = [{"name": "clicked", "dtype": "bool"}, {"name": "dwell", "dtype": "float"}]
        else:
            keys = [layout[name]["key"]]
            entity = "user" if name == "users" else "item" if name == "items" else "context"
            features = [
                {"name": feature, "dtype": "int" if index % 4 == 3 else "float"}
                for index, feature in enumerate(layout[name]["features"])
            ]
        group = registry.feature_group_register(
            actor=None,
            workspace=self.workspace,
            name=name,
            entity=entity,
            entity_keys=keys,
            features=features,
            online=False,  # pushes write offline only; a rebuild writes online
        )
        for path in _files(layout[name]["folder"]):
            batch_ingest(
                actor=self.producer, group=group, body=Path(path).read_bytes(), format="parquet"
            )
        self.groups[name] = group
        return group


def measure_materialize(platform: Platform, layout: dict[str, Any]) -> dict[str, float]:
    """Rows per second of ``features.materialization.group_materialize`` over the ``users``
    group: its latest row for each of its entities into the online store."""
    from features.materialization import group_materialize
    from features.models import FeatureGroup

    group = platform.group(layout, "users")
    FeatureGroup.objects.for_workspace(platform.workspace).filter(pk=group.pk).update(online=True)
    group.refresh_from_db()
    started = time.monotonic()
    done = group_materialize(group=group)
    seconds = time.monotonic() - started
    return {"entities": done.entities, "seconds": seconds}


def measure_background_build(platform: Platform, layout: dict[str, Any]) -> dict[str, Any]:
    """A dataset of every label and the 50 features, asked for through the API as the page does:
    the request's time (it answers 202 once the build is queued), then the build as a worker runs
    it (``features.tasks.dataset_build_task``, here in a thread of this process: the queue's
    message is handed to it), with the API's progress and the page's progress bar polled while
    it runs."""
    import threading

    from django.test import Client
    from django.urls import reverse

    from features import tasks
    from features.models import Dataset, DatasetStatus

    for name in (LABEL_GROUP, *GROUPS):
        platform.group(layout, name)
    client = Client()
    client.force_login(platform.producer)
    workers: list[threading.Thread] = []

    def queue(args: list[int], **_options: Any) -> None:
        worker = threading.Thread(target=tasks.dataset_build_task, args=args)
        workers.append(worker)
        worker.start()

    body = {
        "name": "adslog",
        "label_source": LABEL_GROUP,
        "label_columns": ["clicked"],
        "features": [f"{name}:{f}" for name in GROUPS for f in layout[name]["features"]],
    }
    original = tasks.dataset_build_task.apply_async
    tasks.dataset_build_task.apply_async = queue
    try:
        started = time.monotonic()
        response = client.post(
            f"/api/v1/workspaces/{platform.workspace.slug}/datasets/",
            data=json.dumps(body),
            content_type="application/json",
        )
        request_ms = (time.monotonic() - started) * 1000
    finally:
        tasks.dataset_build_task.apply_async = original
    if response.status_code != 202:
        raise BenchError(f"the dataset was refused: {response.status_code} {response.content!r}")
    detail = response["Location"]
    dataset = Dataset.objects.for_workspace(platform.workspace).get(pk=response.json()["id"])
    page = reverse(
        "features-dataset-progress",
        kwargs={"ws": platform.workspace.slug, "name": dataset.name, "version": dataset.version},
    )
    seen: list[tuple[int | None, int]] = []
    partitions: set[int] = set()
    bars = 0
    while any(worker.is_alive() for worker in workers):
        state = client.get(detail).json()
        seen.append((state["rows_total"], state["rows_done"]))
        partitions.add(state["partitions_done"])
        if b"<progress" in client.get(page).content:
            bars += 1
        for worker in workers:
            worker.join(timeout=1.0)  # a poll a second, as the page polls every 2 s
    dataset.refresh_from_db()
    if dataset.status != DatasetStatus.READY:
        raise BenchError(f"the build ended {dataset.status}: {dataset.error}")
    moving = sorted({done for total, done in seen if total and 0 < done < total})
    return {
        "request_ms": request_ms,
        "build_s": dataset.build_seconds,
        "rows": dataset.row_count,
        "polls": len(seen),
        "partial_progress_values": len(moving),
        "partitions": dataset.partitions_total,
        "partitions_done_values_seen": len(partitions),
        "progress_bars_seen": bars,
    }


def _sizes(name: str, default: tuple[int, ...]) -> list[int]:
    raw = os.environ.get(name)
    return [int(v) for v in raw.split(",") if v.strip()] if raw else list(default)


def _label(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else str(n)


def run(ctx: Context) -> dict[str, float]:
    from django.conf import settings

    sizes = _sizes("BENCH_OFFLINE_SIZES", DEFAULT_SIZES)
    feast_sizes = _sizes("BENCH_OFFLINE_FEAST_SIZES", DEFAULT_FEAST_SIZES)
    memory_limit = settings.OFFLINE_MEMORY_LIMIT
    feast_timeout = float(os.environ.get("BENCH_OFFLINE_FEAST_TIMEOUT", "1800"))
    build_size = int(os.environ.get("BENCH_OFFLINE_BUILD_SIZE", "10000000"))
    platform = Platform()
    ctx.parameters.update(
        {
            "sizes": sizes,
            "feast_sizes": feast_sizes,
            "groups": {k: {"entities": v[1], "features": v[2]} for k, v in GROUPS.items()},
            "days": DAYS,
            "memory_limit": memory_limit,
            "engine": "duckdb",
            "feast_timeout_s": feast_timeout,
            "build_size": build_size,
        }
    )
    measures: dict[str, float] = {}
    seconds: dict[int, float] = {}
    root = ctx.workdir / "adslog"
    first = True
    for n in sizes:
        started = time.monotonic()
        layout = write_ads_log(root, labels=n, groups=first)
        first = False
        ctx.log(f"{n:,} labels written in {time.monotonic() - started:.1f} s")
        ours = run_ours(layout, ctx.workdir, memory_limit=memory_limit)
        if ours["rows"] != n:
            raise BenchError(f"the sample has {ours['rows']} rows, not {n}")
        seconds[n] = ours["seconds"]
        measures[f"pit_rows_per_s_{_label(n)}"] = n / ours["seconds"]
        measures[f"pit_peak_rss_mb_{_label(n)}"] = ours["peak_mb"]
        ctx.log(f"ours {n:,}: {ours['seconds']:.1f} s, peak {ours['peak_mb']:.0f} MB")
        drift = measure_drift(layout)
        measures[f"drift_run_s_{_label(n)}"] = drift["sketch_s"]
        measures[f"drift_parquet_run_s_{_label(n)}"] = drift["parquet_s"]
        ctx.parameters.setdefault("drift_psi", {})[str(n)] = {
            "sketches": drift["psi_sketch"],
            "exact": drift["psi_exact"],
        }
        if n == sizes[0]:
            materialized = measure_materialize(platform, layout)
            measures["materialize_rows_per_s"] = materialized["entities"] / materialized["seconds"]
            ctx.parameters["materialize"] = materialized
        if n == build_size:
            build = measure_background_build(platform, layout)
            if build["rows"] != n:
                raise BenchError(f"the built dataset has {build['rows']} rows, not {n}")
            measures[f"build_request_ms_{_label(n)}"] = build["request_ms"]
            measures[f"build_s_{_label(n)}"] = build["build_s"]
            ctx.parameters["background_build"] = build
            ctx.log(f"background build of {n:,}: {build}")
        if n in feast_sizes:
            try:
                feast = run_feast(layout, ctx.workdir, timeout=feast_timeout)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                ctx.log(f"feast {n:,} failed: {str(exc)[-500:]}")
                ctx.parameters.setdefault("feast_failures", {})[str(n)] = str(exc)[-2000:]
            else:
                measures[f"pit_rows_per_s_feast_{_label(n)}"] = n / feast["seconds"]
                measures[f"pit_peak_rss_mb_feast_{_label(n)}"] = feast["peak_mb"]
                ctx.log(f"feast {n:,}: {feast['seconds']:.1f} s, peak {feast['peak_mb']:.0f} MB")
        # The next size rewrites the labels; the feature groups stay.
        for path in _files(layout[LABEL_GROUP]["folder"]):
            Path(path).unlink()
    smallest, largest = min(seconds), max(seconds)
    if largest > smallest:
        measures["pit_time_growth_ratio"] = (seconds[largest] / seconds[smallest]) / (
            largest / smallest
        )
    if "pit_rows_per_s_feast_10m" in measures and "pit_rows_per_s_10m" in measures:
        measures["pit_vs_feast_10m_ratio"] = (
            measures["pit_rows_per_s_10m"] / measures["pit_rows_per_s_feast_10m"]
        )
    peak_largest = measures.get(f"pit_peak_rss_mb_{_label(largest)}")
    ctx.parameters["goals"] = {
        "ours_5x_feast_at_10m": measures.get("pit_vs_feast_10m_ratio", 0) >= 5,
        "time_growth_at_most_1.2x_rows": measures.get("pit_time_growth_ratio", 99) <= 1.2,
        "peak_rss_at_most_4gb_at_largest": peak_largest is not None and peak_largest <= 4096,
    }
    ctx.log(f"goals: {ctx.parameters['goals']}")
    return measures
