"""Feast definitions of the features bench: per view, one entity, one Parquet source, one view.

Copied into a generated feature repo by bench/areas/features.py and imported by Feast (in the
peer's virtualenv, never the platform's). What it defines comes from ``bench_spec.json`` beside
it: for each view, the entity's join key, the view's name, the Parquet file and the features
with their dtypes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

SPEC = json.loads((Path(__file__).resolve().parent / "bench_spec.json").read_text())
DTYPES = {"int": Int64, "float": Float64}

entities = []
sources = []
views = []
for item in SPEC["views"]:
    entity = Entity(name=item["entity"], join_keys=[item["entity"]], value_type=ValueType.INT64)
    source = FileSource(
        name=f"{item['view']}_source",
        path=item["parquet_path"],
        timestamp_field=item["timestamp_field"],
    )
    entities.append(entity)
    sources.append(source)
    views.append(
        FeatureView(
            name=item["view"],
            entities=[entity],
            ttl=timedelta(0),  # no expiry: the bench compares values, not freshness
            schema=[Field(name=f["name"], dtype=DTYPES[f["dtype"]]) for f in item["features"]],
            online=True,
            source=source,
        )
    )
