"""Datasets in the platform's format built straight from the demo generator (tests, bench).

``demo_table`` lays the generated ads log out exactly like a ``features`` dataset file (entity
keys, ``event_time``, the label, ``<group>__<feature>`` columns as of each impression) and keeps
the generator's true click probability in ``_p_click`` so the oracle AUC can be computed.
The profile values are static over the week in the generator, so the point-in-time join is a
plain lookup here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

# (ref, dtype, entity, dim)
DEMO_FEATURES: list[tuple[str, str, str, int]] = [
    ("user_profile:age_bucket", "categorical", "user", 1),
    ("user_profile:gender", "categorical", "user", 1),
    ("user_profile:activity_level", "categorical", "user", 1),
    ("ad_profile:category", "categorical", "item", 1),
    ("ad_profile:price", "float", "item", 1),
    ("ad_profile:ctr_prior", "float", "item", 1),
    ("ad_profile:is_video", "bool", "item", 1),
    ("user_embedding:interest", "embedding", "semantic", 8),
    ("impressions:hour", "int", "context", 1),
    ("impressions:device", "categorical", "context", 1),
]
ANCHOR = datetime(2026, 11, 23, tzinfo=UTC)


def column_of(ref: str) -> str:
    group, feature = ref.split(":", 1)
    return f"{group.split('@')[0]}__{feature}"


def feature_dicts(features=DEMO_FEATURES) -> list[dict[str, Any]]:
    return [
        {"ref": ref, "column": column_of(ref), "dtype": dtype, "entity": entity, "dim": dim}
        for ref, dtype, entity, dim in features
    ]


def demo_table(*, scale: float = 1.0, seed: int | None = None):
    import pyarrow as pa

    from features import demo

    log = demo.generate(anchor=ANCHOR, scale=scale, seed=demo.SEED if seed is None else seed)
    users, ads, imp = log.users, log.ads, log.impressions
    u = {uid: i for i, uid in enumerate(users["user_id"].tolist())}
    a = {aid: i for i, aid in enumerate(ads["ad_id"].tolist())}
    ui = np.array([u[x] for x in imp["user_id"].tolist()])
    ai = np.array([a[x] for x in imp["ad_id"].tolist()])
    embedding = users["embedding"][ui].astype(np.float32)
    return pa.table(
        {
            "user_id": pa.array(imp["user_id"].tolist(), pa.string()),
            "ad_id": pa.array(imp["ad_id"].tolist(), pa.string()),
            "event_time": pa.array(
                (imp["timestamp"] * 1_000_000).tolist(), pa.timestamp("us", tz="UTC")
            ),
            "click": pa.array(imp["click"].astype(np.int64).tolist(), pa.int64()),
            "user_profile__age_bucket": pa.array(users["age_bucket"][ui].tolist()),
            "user_profile__gender": pa.array(users["gender"][ui].tolist()),
            "user_profile__activity_level": pa.array(users["activity_level"][ui].tolist()),
            "ad_profile__category": pa.array(ads["category"][ai].tolist()),
            "ad_profile__price": pa.array(ads["price"][ai].astype(float).tolist()),
            "ad_profile__ctr_prior": pa.array(ads["ctr_prior"][ai].astype(float).tolist()),
            "ad_profile__is_video": pa.array(ads["is_video"][ai].tolist(), pa.bool_()),
            "user_embedding__interest": pa.array(embedding.tolist(), pa.list_(pa.float32())),
            "impressions__hour": pa.array(imp["hour"].astype(np.int64).tolist()),
            "impressions__device": pa.array(imp["device"].tolist()),
            "impressions__context_id": pa.array(imp["context_id"].tolist()),
            "_p_click": pa.array(imp["p_click"].astype(float).tolist()),
        }
    )


def write_demo_dataset(path: str | Path, *, scale: float = 1.0, seed: int | None = None) -> Path:
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(demo_table(scale=scale, seed=seed), path)
    return path


def oracle_auc(path: str | Path, holdout_fraction: float) -> float | None:
    """AUC of the generator's true probabilities on the held-out tail (same split as training)."""

    from training import data, evaluation

    table = data.read_table(path, ["click", "_p_click"])
    n = table.num_rows
    held = data.holdout_rows(n, holdout_fraction)
    tail = table.slice(n - held, held)
    return evaluation.auc(
        np.asarray(tail.column("click").to_numpy(), dtype=float),
        np.asarray(tail.column("_p_click").to_numpy(), dtype=float),
    )
