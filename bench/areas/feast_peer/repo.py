"""Feast definitions of the features bench: one entity, one Parquet source, one feature view.

Copied into a generated feature repo by bench/areas/features.py and imported by Feast (in the
peer's virtualenv, never the platform's). What it defines comes from ``bench_spec.json`` beside
it: the entity's join key, the view's name, the Parquet file and the features with their dtypes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

SPEC = json.loads((Path(__file__).resolve().parent / "bench_spec.json").read_text())
DTYPES = {"int": Int64, "float": Float64}

entity = Entity(name=SPEC["entity"], join_keys=[SPEC["entity"]], value_type=ValueType.INT64)

source = FileSource(
    name=f"{SPEC['view']}_source",
    path=SPEC["parquet_path"],
    timestamp_field=SPEC["timestamp_field"],
)

view = FeatureView(
    name=SPEC["view"],
    entities=[entity],
    ttl=timedelta(0),  # no expiry: the bench compares values, not freshness
    schema=[Field(name=f["name"], dtype=DTYPES[f["dtype"]]) for f in SPEC["features"]],
    online=True,
    source=source,
)
