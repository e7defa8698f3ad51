"""The offline engines on the offline bench's ads log: DuckDB's sample equals a brute-force join on
10,000 labels, partition pruning changes nothing it should not, and Spark (local mode) gives the
same sample as DuckDB, typed columns and a time window included."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.areas.offline import GROUPS, LABEL_GROUP, START, ads_plan, write_ads_log
from features.offline_engine import (
    Column,
    DuckDBEngine,
    FeatureInput,
    JoinPlan,
    LabelInput,
    SparkEngine,
    label_partitions,
    prune_by_day,
    spark_stop,
)
from features.samples import sample_files, write_sample


@pytest.fixture(scope="module")
def ads_log(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("adslog")
    return write_ads_log(root, labels=10_000, seed=11, scale=0.002)


def _rows(folder: str) -> list[tuple[int, int, dict]]:
    """Every row of a group with its batch id and position in its file."""
    rows = []
    for path in sorted(Path(folder).glob("date=*/batch-*.parquet")):
        batch = int(path.stem.removeprefix("batch-"))
        for position, row in enumerate(pq.read_table(path).to_pylist()):
            rows.append((batch, position, row))
    return rows


def _brute_force(layout: dict) -> list[dict]:
    """For each label, per group, the row with the largest (time, batch, position) at or before
    the label's time, by scanning every row of the label's entity."""
    by_entity: dict[str, dict[str, list]] = {}
    for name in GROUPS:
        key = layout[name]["key"]
        index: dict[str, list] = defaultdict(list)
        for batch, position, row in _rows(layout[name]["folder"]):
            index[row[key]].append((row["event_time"], batch, position, row))
        by_entity[name] = index
    labels = sorted(
        _rows(layout[LABEL_GROUP]["folder"]),
        key=lambda r: (r[2]["event_time"], r[0], r[1]),
    )
    expected = []
    for _batch, _position, label in labels:
        out = {
            "user_id": label["user_id"],
            "item_id": label["item_id"],
            "context_id": label["context_id"],
            "event_time": label["event_time"],
            "clicked": label["clicked"],
        }
        for name in GROUPS:
            key = layout[name]["key"]
            seen = [c for c in by_entity[name][label[key]] if c[0] <= label["event_time"]]
            best = max(seen, key=lambda c: c[:3])[3] if seen else None
            for feature in layout[name]["features"]:
                out[f"{name}__{feature}"] = best[feature] if best is not None else None
        expected.append(out)
    return expected


def _sample(engine, plan, path: Path, partitions: list | None = None) -> pa.Table:
    record = None if partitions is None else (lambda *seen: partitions.append(seen))
    write_sample(engine, plan, path, on_partition=record)
    return pq.read_table(path)


@pytest.mark.parametrize(("partition_rows", "parts"), [(0, 30), (2_000, 5), (1_000_000, 1)])
def test_duckdb_sample_equals_a_brute_force_join_on_10000_labels(
    ads_log, tmp_path, partition_rows, parts
):
    """Joined a day at a time, a few days at a time, or all at once: the same rows in order,
    written as one Parquet part per group of days (read back as one table, parts by name)."""
    engine = DuckDBEngine(threads=2, partition_rows=partition_rows)
    seen: list[tuple[int, int]] = []
    table = _sample(engine, ads_plan(ads_log), tmp_path / "s", seen)
    assert seen == [(parts, done) for done in range(parts + 1)]
    files = sample_files(tmp_path / "s")
    assert [f.name for f in files] == [f"part-{i:05d}.parquet" for i in range(parts)]
    assert sum(pq.read_metadata(f).num_rows for f in files) == table.num_rows == 10_000
    days = [
        {t.date() for t in pq.read_table(f, columns=["event_time"]).column(0).to_pylist()}
        for f in files
    ]
    assert all(max(a) < min(b) for a, b in itertools.pairwise(days))  # a day in one part only
    expected = _brute_force(ads_log)
    got = table.to_pylist()
    assert len(table.column_names) == 5 + sum(g[2] for g in GROUPS.values())
    mismatched = [i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert mismatched == [], f"first mismatch at {mismatched[:1]}: {got[mismatched[0]]}"
    # The correction batches make ties: some labels read a corrected (later-batch) value.
    assert sum(1 for row in got if row["users__u_f0"] is None) < table.num_rows


def test_a_window_prunes_partitions_and_the_sample_is_the_same(ads_log, tmp_path):
    start = START + timedelta(days=10, hours=6)
    end = START + timedelta(days=12, hours=18)
    plan = ads_plan(ads_log, start=start, end=end)
    assert len(plan.labels.files) == 3  # days 10, 11 and 12 of 30
    users = next(s for s in plan.sources if s.keys == ("user_id",))
    assert len(users.files) == 2 * 13  # every day up to the end's, two batches a day
    unpruned = JoinPlan(
        labels=LabelInput(
            **{**plan.labels.__dict__, "files": tuple(_all(ads_log[LABEL_GROUP]["folder"]))}
        ),
        sources=tuple(
            FeatureInput(**{**s.__dict__, "files": tuple(_all(ads_log[name]["folder"]))})
            for s, name in zip(plan.sources, GROUPS, strict=True)
        ),
    )
    engine = DuckDBEngine(threads=2)
    pruned_table = _sample(engine, plan, tmp_path / "a")
    full_table = _sample(engine, unpruned, tmp_path / "b")
    assert pruned_table.num_rows > 0
    assert pruned_table.equals(full_table)
    times = pruned_table.column("event_time").to_pylist()
    assert min(times) >= start and max(times) < end


def _all(folder: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).glob("date=*/batch-*.parquet"))


def test_label_partitions_group_days_in_order_up_to_a_row_count(ads_log):
    files = ads_plan(ads_log).labels.files
    per_day = label_partitions(files)
    assert len(per_day) == 30 and [len(group) for group in per_day] == [1] * 30
    assert [f for group in per_day for f in group] == sorted(files, key=_day)
    # 334 labels on each of the first 10 days, 333 after: 6 days reach 2,000 (2,004 and 2,002),
    # then 333 x 6 = 1,998 falls short and a seventh day is added; the rest is the last group.
    grouped = label_partitions(files, min_rows=2_000)
    assert [len(group) for group in grouped] == [6, 6, 7, 7, 4]
    assert label_partitions((*files, "/elsewhere/x.parquet")) == [(*files, "/elsewhere/x.parquet")]


def _day(path: str) -> str:
    return path.split("date=")[1][:10]


def test_prune_by_day_keeps_files_outside_date_folders():
    files = ("a/date=2026-01-01/batch-1.parquet", "a/date=2026-01-03/batch-2.parquet", "b/x.pq")
    first, last = datetime(2026, 1, 2).date(), datetime(2026, 1, 3).date()
    assert prune_by_day(files, first, last) == (files[1], files[2])
    assert prune_by_day(files, None, None) == files


def test_a_memory_limit_far_below_the_join_spills_and_gives_the_same_sample(ads_log, tmp_path):
    plan = ads_plan(ads_log)
    roomy = _sample(DuckDBEngine(threads=2), plan, tmp_path / "a")
    tight = DuckDBEngine(memory_limit="48MB", temp_directory=str(tmp_path / "spill"), threads=1)
    assert _sample(tight, plan, tmp_path / "b").equals(roomy)


# --- Spark -----------------------------------------------------------------------------------


def _typed_log(root: Path) -> JoinPlan:
    """A small log with every column type, nulls, a column missing from the first batch (added
    later), a same-time tie inside one batch and across batches, and a source with no files."""
    t = datetime(2026, 3, 1, 23, 59, 58, tzinfo=UTC)
    ts = pa.timestamp("us", tz="UTC")

    def write(folder: str, day: str, batch: int, table: pa.Table) -> str:
        path = root / folder / f"date={day}" / f"batch-{batch}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        return str(path)

    at = [t + timedelta(seconds=s) for s in range(6)]  # crosses midnight at s=2
    labels = [
        write(
            "labels",
            "2026-03-01",
            1,
            pa.table(
                {
                    "user_id": ["u0", "u1", "u0", None],
                    "event_time": pa.array(at[:2] + at[1:3], ts),
                    "clicked": [1, 0, None, 1],
                }
            ),
        ),
        write(
            "labels",
            "2026-03-02",
            2,
            pa.table(
                {
                    "user_id": ["u0", "u1", "u2"],
                    "event_time": pa.array([at[3], at[4], at[5]], ts),
                    "clicked": [0, 1, 1],
                }
            ),
        ),
    ]
    users = [
        write(
            "users",
            "2026-03-01",
            3,
            pa.table(
                {
                    "user_id": ["u0", "u0", "u1"],
                    "event_time": pa.array([at[0], at[0], at[1]], ts),
                    "age": [30, 31, None],  # two rows for u0 at at[0]: the last one counts
                    "tags": [["a"], ["b", "c"], None],
                    "vec": pa.array([[1.0, 2.0], [3.0, 4.0], None], pa.list_(pa.float32())),
                }
            ),
        ),
        write(
            "users",
            "2026-03-02",
            4,
            pa.table(
                {
                    "user_id": ["u0", "u1"],
                    "event_time": pa.array([at[3], at[4]], ts),
                    "age": [40, 41],
                    "tags": [[], ["d"]],
                    "vec": pa.array([[5.0, 6.0], [7.0, 8.0]], pa.list_(pa.float32())),
                    "score": [0.5, 2.5],  # a column the first batch lacks
                }
            ),
        ),
        write(  # the same time as batch 4's u0 row, a later batch: it wins
            "users",
            "2026-03-02",
            5,
            pa.table({"user_id": ["u0"], "event_time": pa.array([at[3]], ts), "age": [99]}),
        ),
    ]
    return JoinPlan(
        labels=LabelInput(
            files=tuple(labels),
            keys=("user_id",),
            time_column="event_time",
            columns=(Column("clicked", "clicked", "int"),),
        ),
        sources=(
            FeatureInput(
                alias="s0",
                files=tuple(users),
                keys=("user_id",),
                time_column="event_time",
                columns=(
                    Column("age", "users__age", "int"),
                    Column("tags", "users__tags", "categorical_list"),
                    Column("vec", "users__vec", "embedding", 2),
                    Column("score", "users__score", "float"),
                ),
            ),
            FeatureInput(
                alias="s1",
                files=(),
                keys=("user_id",),
                time_column="event_time",
                columns=(Column("price", "items__price", "float"),),
            ),
        ),
    )


@pytest.fixture(scope="module")
def spark():
    yield SparkEngine(master="local[2]")
    spark_stop()


@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_spark_gives_the_same_typed_sample_as_duckdb(spark, tmp_path):
    plan = _typed_log(tmp_path / "log")
    ours = _sample(DuckDBEngine(threads=2), plan, tmp_path / "d")
    theirs = _sample(spark, plan, tmp_path / "s")
    assert theirs.to_pylist() == ours.to_pylist()
    rows = ours.to_pylist()
    assert [r["users__age"] for r in rows] == [31, None, 31, None, 99, 41, None]
    assert rows[0]["users__tags"] == ["b", "c"] and rows[0]["users__vec"] == [3.0, 4.0]
    # u0 at at[3]: batch 5 wins and has no score, a null there is a null in the sample.
    assert [r["users__score"] for r in rows] == [None, None, None, None, None, 2.5, None]
    assert all(r["items__price"] is None for r in rows)


@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_spark_and_duckdb_give_identical_samples_of_the_ads_log_in_a_window(
    spark, ads_log, tmp_path
):
    start = START + timedelta(days=3, hours=12)
    end = START + timedelta(days=5)
    plan = ads_plan(ads_log, start=start, end=end)
    ours = _sample(DuckDBEngine(threads=2), plan, tmp_path / "d")
    theirs = _sample(spark, plan, tmp_path / "s")
    assert ours.num_rows > 400  # a day and a half of about 333 labels a day
    assert theirs.schema.equals(ours.schema)
    assert theirs.equals(ours)
    assert spark.count(plan) == ours.num_rows
