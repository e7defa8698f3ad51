"""Drift from per-batch hourly sketches: the split by hour, the agreement with the exact measure
over the Parquet, the push that leaves sketches, and the fallback to the Parquet when a batch in
the window has none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import health, sketches

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def _table(start: datetime, hours: int, per_hour: int, mean: float, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    times = [
        start + timedelta(hours=h, seconds=int(s))
        for h in range(hours)
        for s in rng.integers(0, 3600, per_hour)
    ]
    values = rng.normal(mean, 0.01, len(times))
    values[::17] = np.nan  # nulls are left out of the sketch and of the exact histogram
    ages = rng.integers(18, 65, len(times))
    return pa.table(
        {
            "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
            "ctr": pa.array(values, pa.float64(), mask=np.isnan(values)),
            "age": pa.array(ages, pa.int64()),
        }
    )


def _psi(tables: list[pa.Table], tmp_path) -> tuple[dict, dict]:
    """(from sketches, exact over the Parquet) for the same rows."""
    hours = []
    files = []
    for index, table in enumerate(tables):
        hours += [
            (hour, encoded)
            for hour, _rows, encoded in sketches.hourly_sketches(
                table, time_column="event_time", numeric=["ctr", "age"]
            )
        ]
        path = tmp_path / f"batch-{index}.parquet"
        pq.write_table(table, path)
        files.append(str(path))
    sketched = health.drift_psi_of_sketches(hours, numeric=["ctr", "age"], now=NOW)
    exact = health.drift_psi(files=files, time_column="event_time", numeric=["ctr", "age"], now=NOW)
    return sketched, exact


def test_a_batch_is_sketched_per_hour_of_event_time_without_its_nulls():
    start = datetime(2026, 11, 1, 10, tzinfo=UTC)
    table = _table(start, hours=3, per_hour=100, mean=0.05, seed=1)
    hourly = sketches.hourly_sketches(table, time_column="event_time", numeric=["ctr", "age"])
    assert [(hour, rows) for hour, rows, _ in hourly] == [
        (start, 100),
        (start + timedelta(hours=1), 100),
        (start + timedelta(hours=2), 100),
    ]
    merged = sketches._merged(encoded["ctr"] for _, _, encoded in hourly)
    assert merged.n == 300 - len(range(0, 300, 17))
    assert sketches._merged(encoded["age"] for _, _, encoded in hourly).n == 300


@pytest.mark.parametrize("recent_mean", [0.05, 0.09])
def test_sketched_drift_agrees_with_the_exact_measure(tmp_path, recent_mean):
    reference = _table(NOW - timedelta(days=8), hours=7 * 24, per_hour=12, mean=0.05, seed=2)
    recent = _table(NOW - timedelta(hours=24), hours=24, per_hour=40, mean=recent_mean, seed=3)
    sketched, exact = _psi([reference, recent], tmp_path)
    assert set(sketched) == set(exact) == {"ctr", "age"}
    for name in exact:
        # Same verdict, and close: KLL's rank error and whole-hour windows are all that differ.
        assert (sketched[name] > health.DRIFT_PSI_THRESHOLD) == (
            exact[name] > health.DRIFT_PSI_THRESHOLD
        )
        assert sketched[name] == pytest.approx(exact[name], abs=0.05, rel=0.15)
    assert (exact["ctr"] > health.DRIFT_PSI_THRESHOLD) == (recent_mean != 0.05)


def test_too_few_rows_in_a_window_measure_nothing(tmp_path):
    reference = _table(NOW - timedelta(days=8), hours=2, per_hour=10, mean=0.05, seed=4)
    recent = _table(NOW - timedelta(hours=2), hours=2, per_hour=40, mean=0.05, seed=5)
    sketched, exact = _psi([reference, recent], tmp_path)
    assert sketched == exact == {}
