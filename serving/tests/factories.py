"""Test helpers: real feature groups with online values, a real dataset, and a logreg bundle
(built with training's template and ``save_bundle``, no training run needed)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch
from django.conf import settings

from features import registry as feature_registry
from features import samples
from features.ingestion import batch_ingest
from features.models import EntityKind
from training.bundle import BundleSpec, FeatureSpec, build_model, save_bundle
from training.models import JobState, TrainingJob

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
_n = itertools.count(1)


@dataclass
class Scene:
    workspace: object
    users: object
    items: object
    labels: object
    dataset: object
    user_ids: list[str]
    item_ids: list[str]


def ingest_rows(actor, group, rows):
    body = json.dumps({"rows": rows}).encode()
    return batch_ingest(
        actor=actor, group=group, body=body, format="json", now=T0 + timedelta(days=1)
    )


def make_scene(workspace, actor, *, users: int = 12, items: int = 20, labels: int = 60) -> Scene:
    n = next(_n)
    ug = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name=f"users_{n}",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[
            {"name": "age", "dtype": "int"},
            {"name": "ctr", "dtype": "float"},
            {"name": "city", "dtype": "categorical"},
        ],
    )
    ig = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name=f"items_{n}",
        entity=EntityKind.ITEM,
        entity_keys=["item_id"],
        features=[{"name": "price", "dtype": "float"}, {"name": "cat", "dtype": "categorical"}],
    )
    lg = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name=f"clicks_{n}",
        entity=EntityKind.LABEL,
        entity_keys=["user_id", "item_id"],
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )
    ts = T0.isoformat()
    user_ids = [f"u{i}" for i in range(users)]
    item_ids = [f"i{i}" for i in range(items)]
    ingest_rows(
        actor,
        ug,
        [
            {"user_id": u, "event_time": ts, "age": 20 + i, "ctr": 0.01 * i, "city": f"c{i % 3}"}
            for i, u in enumerate(user_ids)
        ],
    )
    ingest_rows(
        actor,
        ig,
        [
            {"item_id": it, "event_time": ts, "price": 1.5 * i, "cat": f"k{i % 4}"}
            for i, it in enumerate(item_ids)
        ],
    )
    later = (T0 + timedelta(hours=1)).isoformat()
    ingest_rows(
        actor,
        lg,
        [
            {
                "user_id": user_ids[i % users],
                "item_id": item_ids[(i * 7) % items],
                "event_time": later,
                "clicked": i % 2,
            }
            for i in range(labels)
        ],
    )
    dataset = samples.dataset_create(
        actor=actor,
        workspace=workspace,
        name=f"sample_{n}",
        label_group=lg,
        label_columns=["clicked"],
        feature_refs=[
            f"{ug.name}:age",
            f"{ug.name}:ctr",
            f"{ug.name}:city",
            f"{ig.name}:price",
            f"{ig.name}:cat",
        ],
    )
    assert dataset.status == "ready", dataset.error
    return Scene(workspace, ug, ig, lg, dataset, user_ids, item_ids)


def make_spec(scene: Scene, *, serving_transforms: dict | None = None) -> BundleSpec:
    u, i = scene.users.name, scene.items.name
    extra = {"serving_transforms": serving_transforms} if serving_transforms else {}
    return BundleSpec(
        template="logreg",
        features=[
            FeatureSpec(
                ref=f"{u}:age", column=f"{u}__age", dtype="int", entity="user", mean=25, std=5
            ),
            FeatureSpec(ref=f"{u}:ctr", column=f"{u}__ctr", dtype="float", entity="user"),
            FeatureSpec(
                ref=f"{u}:city", column=f"{u}__city", dtype="categorical", entity="user", buckets=16
            ),
            FeatureSpec(
                ref=f"{i}:price", column=f"{i}__price", dtype="float", entity="item", mean=10, std=8
            ),
            FeatureSpec(
                ref=f"{i}:cat", column=f"{i}__cat", dtype="categorical", entity="item", buckets=16
            ),
        ],
        label="clicked",
        entity_keys={"user": ["user_id"], "item": ["item_id"]},
        extra=extra,
    )


def make_bundle(spec: BundleSpec, *, seed: int = 0, name: str | None = None) -> Path:
    torch.manual_seed(seed)
    model = build_model(spec)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    path = Path(settings.ARTIFACT_ROOT) / "test-bundles" / (name or f"b{next(_n)}")
    return save_bundle(path, model, spec)


def make_job(scene: Scene, bundle_dir: Path, *, name: str | None = None) -> TrainingJob:
    rel = str(bundle_dir.relative_to(Path(settings.ARTIFACT_ROOT)))
    return TrainingJob.objects.create(
        workspace=scene.workspace,
        name=name or f"job-{next(_n)}",
        template="logreg",
        dataset=scene.dataset,
        state=JobState.SUCCEEDED,
        model_path=rel,
        metrics={"holdout": {"auc": 0.71, "logloss": 0.6}, "importance": {"age": 0.3}},
    )
