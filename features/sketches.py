"""Drift from per-batch sketches: each push leaves, per hour of event time, a KLL quantile sketch
of each numeric feature (Apache DataSketches), and a drift run merges the sketches of the hours it
compares instead of reading those days of Parquet again.

A drift run (``features.health.measure_drift``, every minute for every group) compares the last
24 hours of event time with the 7 days before, over 10 quantile bins of the reference window.
Reading 8 days of Parquet each minute costs in proportion to the rows of those days; merging
sketches costs in proportion to the hours (192) times the batches in each, whatever the rows.
The windows are counted in whole hours: an hour belongs to the recent window when it starts at or
after the recent window's start rounded down to the hour, so a window's edges move by less than
an hour against the exact (Parquet) measure. KLL's rank error at ``K`` = 200 is about 1.65%, so
the bin shares and the PSI differ from the exact ones by little (``features/tests``).

Why hand-written: DataSketches gives the sketch and its merge; the hourly split of a batch and
the PSI over merged sketches are the platform's own rules (the same bins and floor as
``health.population_stability_index``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasketches import kll_doubles_sketch

K = 200
HOUR_US = 3_600_000_000
NUMERIC_DTYPES = ("int", "float")


def numeric_features(version: Any) -> list[str]:
    """The features of a group version drift is measured on (integers and floats)."""
    return [spec["name"] for spec in version.features if spec["dtype"] in NUMERIC_DTYPES]


def hour_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hourly_sketches(
    table: pa.Table, *, time_column: str, numeric: list[str]
) -> list[tuple[datetime, int, dict[str, str]]]:
    """Per hour of event time in the table: (the hour, its rows, {feature: sketch}) with each
    sketch serialised and base64-encoded (a JSON value); null values are left out of a sketch."""
    if table.num_rows == 0 or not numeric:
        return []
    micros = table[time_column].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    hours = pc.divide(micros, pa.scalar(HOUR_US, pa.int64())).to_numpy(zero_copy_only=False)
    order = np.argsort(hours, kind="stable")
    sorted_hours = hours[order]
    starts = np.flatnonzero(np.r_[True, sorted_hours[1:] != sorted_hours[:-1]])
    ends = np.r_[starts[1:], sorted_hours.size]
    columns = {
        name: table[name].cast(pa.float64()).to_numpy(zero_copy_only=False)[order]
        for name in numeric
        if name in table.column_names
    }
    result = []
    for start, end in zip(starts, ends, strict=True):
        hour = datetime.fromtimestamp(int(sorted_hours[start]) * 3600, tz=UTC)
        encoded = {}
        for name, values in columns.items():
            part = values[start:end]
            part = part[~np.isnan(part)]
            if part.size:
                sketch = kll_doubles_sketch(K)
                sketch.update(part)
                encoded[name] = base64.b64encode(sketch.serialize()).decode()
        result.append((hour, int(end - start), encoded))
    return result


def _merged(encoded: Iterable[str]) -> kll_doubles_sketch:
    merged = kll_doubles_sketch(K)
    for text in encoded:
        merged.merge(kll_doubles_sketch.deserialize(base64.b64decode(text)))
    return merged


def drift_psi_from_sketches(
    hours: Iterable[tuple[datetime, dict[str, str]]],
    *,
    numeric: list[str],
    now: datetime,
    recent: timedelta,
    reference: timedelta,
    bins: int,
    min_rows: int,
    epsilon: float,
) -> dict[str, float]:
    """PSI per numeric feature from the sketches of the hours in ``[now - recent - reference,
    now)``: the bins are the reference window's quantiles (deduplicated), the shares each
    window's mass between them (see ``health.measure_drift`` for the exact measure)."""
    recent_start = hour_of(now - recent)
    reference_start = hour_of(now - recent - reference)
    by_window: dict[bool, dict[str, list[str]]] = {True: {}, False: {}}
    for hour, sketches in hours:
        if hour < reference_start or hour >= now:
            continue
        window = by_window[hour >= recent_start]
        for name, text in sketches.items():
            window.setdefault(name, []).append(text)
    result: dict[str, float] = {}
    fractions = [i / bins for i in range(1, bins)]
    for name in numeric:
        reference_sketch = _merged(by_window[False].get(name, []))
        recent_sketch = _merged(by_window[True].get(name, []))
        if reference_sketch.n < min_rows or recent_sketch.n < min_rows:
            continue
        cuts = sorted(set(reference_sketch.get_quantiles(fractions)))
        # Bins as the exact measure cuts them: value <= cut i falls in bin i, above all in the last.
        expected = reference_sketch.get_pmf(cuts, inclusive=True)
        actual = recent_sketch.get_pmf(cuts, inclusive=True)
        psi = 0.0
        for e_share, a_share in zip(expected, actual, strict=True):
            e = max(float(e_share), epsilon)
            a = max(float(a_share), epsilon)
            psi += (a - e) * float(np.log(a / e))
        result[name] = round(psi, 4)
    return result
