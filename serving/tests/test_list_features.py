"""A model with a vocabulary and a list-of-categories feature serves what it was trained on:
the consistency gate encodes the dataset's rows (Arrow lists from the Parquet file) and the
online store's rows (JSON lists) through the bundle's ``FeatureEncoder`` and finds them equal,
and the gateway's scores move with a user's list."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest

from features import registry as feature_registry
from features import samples
from features.ingestion import batch_ingest
from features.models import EntityKind
from serving import registry
from serving.gates import version_gates_run
from serving.models import GateStatus
from serving.tests.factories import T0, make_bundle, make_job
from training.bundle import BundleSpec, FeatureSpec, load_bundle
from workspaces.models import Role

TOPICS = ["sports", "travel", "food"]


def ingest_rows(actor, group, rows):
    body = json.dumps({"rows": rows}).encode()
    batch_ingest(actor=actor, group=group, body=body, format="json", now=T0 + timedelta(days=1))


@pytest.mark.django_db
def test_a_list_feature_passes_the_consistency_gate(workspace, members):
    actor = members[Role.MAINTAINER]
    users = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="readers",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[
            {"name": "recent", "dtype": "categorical_list"},
            {"name": "city", "dtype": "categorical"},
        ],
    )
    labels = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="reads",
        entity=EntityKind.LABEL,
        entity_keys=["user_id", "item_id"],
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )
    user_ids = [f"u{i}" for i in range(15)]
    lists = [TOPICS[: i % 4] + (["unseen"] if i % 5 == 0 else []) for i in range(15)]
    lists[3] = None
    ingest_rows(
        actor,
        users,
        [
            {"user_id": u, "event_time": T0.isoformat(), "recent": lists[i], "city": f"c{i % 4}"}
            for i, u in enumerate(user_ids)
        ],
    )
    later = (T0 + timedelta(hours=1)).isoformat()
    ingest_rows(
        actor,
        labels,
        [
            {"user_id": u, "item_id": "i0", "event_time": later, "clicked": i % 2}
            for i, u in enumerate(user_ids)
        ],
    )
    dataset = samples.dataset_create(
        actor=actor,
        workspace=workspace,
        name="reads",
        label_group=labels,
        label_columns=["clicked"],
        feature_refs=["readers:recent", "readers:city"],
    )
    assert dataset.status == "ready", dataset.error
    spec = BundleSpec(
        template="fine_ranking",
        features=[
            FeatureSpec(
                "readers:recent",
                "readers__recent",
                "categorical_list",
                "user",
                dim=2,
                vocab=TOPICS,
                buckets=len(TOPICS) + 1,
            ),
            # "c3" is out of the vocabulary: the OOV index, on both paths.
            FeatureSpec(
                "readers:city",
                "readers__city",
                "categorical",
                "user",
                vocab=["c0", "c1", "c2"],
                buckets=4,
            ),
        ],
        label="clicked",
        entity_keys={"user": ["user_id"], "item": ["item_id"]},
    )
    bundle_dir = make_bundle(spec)

    scene = SimpleNamespace(workspace=workspace, dataset=dataset)  # what make_job reads
    version = registry.model_version_register(
        actor=actor, workspace=workspace, name="lists", job=make_job(scene, bundle_dir)
    )
    version = version_gates_run(actor=actor, workspace=workspace, version=version)
    consistency = version.gates["consistency"]
    assert consistency["status"] == GateStatus.PASSED, consistency
    assert consistency["entities"] == 15 and consistency["categorical_mismatches"] == 0

    # What the gate compared is not empty: the dataset's lists hold known and unknown items.
    bundle = load_bundle(bundle_dir)
    table = samples.dataset_table(samples.dataset_file(dataset))
    _, trained = bundle.encoder.encode({c: table[c] for c in table.column_names}, table.num_rows)
    # Two slots: "food" (index 3) is only ever a third item, so it is cut off.
    assert set(trained[:, :2].ravel().tolist()) == {0, 1, 2, 4}
    assert 4 in trained[:, 2].tolist()  # "c3": out of the city vocabulary
    _, cat = bundle.encoder.encode({"readers:recent": [["sports", "unseen"], None]}, 2)
    assert cat[:, :2].tolist() == [[1, 4], [0, 0]]
    scores = bundle.predict({"readers:recent": [["sports"], ["food"], None]}, 3)
    assert len(set(scores.round(6).tolist())) == 3
