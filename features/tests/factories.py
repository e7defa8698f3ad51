"""Helpers for feature tests: a registered group and rows that fit it."""

from __future__ import annotations

import itertools
from typing import Any

from features import registry
from features.models import EntityKind, FeatureGroup

_numbers = itertools.count(1)

USER_FEATURES = [
    {"name": "age", "dtype": "int"},
    {"name": "ctr_7d", "dtype": "float"},
    {"name": "is_new", "dtype": "bool"},
    {"name": "city", "dtype": "categorical"},
    {"name": "emb", "dtype": "embedding", "dimension": 3},
]


def make_group(workspace, *, actor=None, name: str | None = None, **extra: Any) -> FeatureGroup:
    defaults: dict[str, Any] = {
        "entity": EntityKind.USER,
        "entity_keys": ["user_id"],
        "features": USER_FEATURES,
    }
    defaults.update(extra)
    return registry.feature_group_register(
        actor=actor, workspace=workspace, name=name or f"group_{next(_numbers)}", **defaults
    )


def user_row(index: int, *, when: str = "2026-11-01T00:00:00Z", **overrides: Any) -> dict:
    row = {
        "user_id": f"u{index}",
        "event_time": when,
        "age": 20 + index,
        "ctr_7d": 0.01 * index,
        "is_new": index % 2 == 0,
        "city": f"c{index % 3}",
        "emb": [0.5, 1.5, float(index)],
    }
    row.update(overrides)
    return row
