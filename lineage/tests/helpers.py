"""Build a small platform through real services (features) and recorded events (the apps to the
right of features, emulated with the refs their services record)."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

from django.db import transaction

from features import registry, samples
from features.ingestion import batch_ingest
from features.models import EntityKind
from lineage.models import AuditItem, Edge, Node, Reach, Usage
from workspaces.events import Ref, event_record

_ids = itertools.count(1000)
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def record(workspace, verb, refs=(), *, actor=None, resources=None, payload=None):
    with transaction.atomic():
        return event_record(
            actor=actor,
            workspace=workspace,
            verb=verb,
            refs=list(refs),
            resources=resources,
            payload=payload,
        )


def group(workspace, name, features, *, actor=None, keys=("user_id",)):
    return registry.feature_group_register(
        actor=actor,
        workspace=workspace,
        name=name,
        entity=EntityKind.USER,
        entity_keys=list(keys),
        features=[{"name": f, "dtype": "float"} for f in features],
        online=False,
    )


def ingest(actor, grp, rows):
    body = json.dumps({"rows": rows}).encode()
    return batch_ingest(actor=actor, group=grp, body=body, format="json", now=T0)


def build_scene(workspace, actor):
    """Two feature groups, a label group, a dataset, a job, a model version, a deployment and an
    experiment, linked the way the services link them."""
    users = group(workspace, "users", ["age", "ctr"], actor=actor)
    unused = group(workspace, "unused_stats", ["x"], actor=actor)
    labels = group(workspace, "impressions", ["clicked"], actor=actor)
    when = "2026-10-01T00:00:00Z"
    ingest(actor, users, [{"user_id": "u1", "event_time": when, "age": 30.0, "ctr": 0.1}])
    ingest(actor, labels, [{"user_id": "u1", "event_time": "2026-10-02T00:00:00Z", "clicked": 1.0}])
    dataset = samples.dataset_create(
        actor=actor,
        workspace=workspace,
        name="clicks",
        label_group=labels,
        label_columns=["clicked"],
        feature_refs=["users:age", "users:ctr"],
    )
    job_id, model_id, deploy_id, exp_id = (next(_ids) for _ in range(4))
    job = Ref("training_job", job_id, f"job-{job_id}")
    data_in = Ref("dataset", dataset.pk, str(dataset), role="input")
    record(workspace, "training.job.pending", [job, data_in], actor=actor)
    record(workspace, "training.job.running", [job, data_in], actor=actor)
    record(
        workspace,
        "training.job.succeeded",
        [job, data_in],
        actor=actor,
        resources={"cpu_hours": 2.0, "gpu_hours": 1.0, "memory_gb_hours": 8.0},
        payload={"samples": 3600},
    )
    record(
        workspace,
        "serving.model_version.registered",
        [
            Ref("training_job", job_id, f"job-{job_id}", role="input"),
            Ref("model_version", model_id, "ctr-model v1", role="output"),
        ],
        actor=actor,
    )
    registry.consumer_register(
        actor=actor,
        group=users,
        kind="model",
        object_id=model_id,
        label="ctr-model v1",
        feature_name="age",
    )
    record(
        workspace,
        "serving.deployment.created",
        [
            Ref("model_version", model_id, "ctr-model v1", role="input"),
            Ref("deployment", deploy_id, "ctr-prod", role="output"),
        ],
        actor=actor,
        resources={"cpu_hours": 4.0, "memory_gb_hours": 16.0, "storage_gb": 1.0},
    )
    registry.consumer_register(
        actor=actor, group=users, kind="deployment", object_id=deploy_id, label="ctr-prod"
    )
    record(
        workspace,
        "experiments.experiment.started",
        [
            Ref("deployment", deploy_id, "ctr-prod", role="input"),
            Ref("experiment", exp_id, "ctr-ab", role="output"),
        ],
        actor=actor,
    )
    return {
        "users": users,
        "unused": unused,
        "labels": labels,
        "dataset": dataset,
        "job": job_id,
        "model": model_id,
        "deployment": deploy_id,
        "experiment": exp_id,
    }


def snapshot(workspace=None):
    """The projection as comparable sets (ids replaced by node keys)."""

    def scoped(model):
        return model.objects.for_workspace(workspace) if workspace else model.objects.unscoped()

    keys = {n.pk: (n.workspace_id, n.kind, n.object_id) for n in scoped(Node)}
    nodes = {
        (
            n.workspace_id,
            n.kind,
            n.object_id,
            n.label,
            n.owner_name,
            n.live,
            n.status,
            n.first_seen_at,
            n.last_seen_at,
            n.first_event_id,
            n.last_event_id,
        )
        for n in scoped(Node)
    }
    edges = {
        (
            keys[e.src_id],
            keys[e.dst_id],
            e.type,
            e.active,
            e.created_at,
            e.ended_at,
            e.first_event_id,
            e.last_event_id,
        )
        for e in scoped(Edge)
    }
    usage = {
        (
            keys[u.node_id],
            u.event_id,
            u.verb,
            u.cpu_hours,
            u.gpu_hours,
            u.memory_gb_hours,
            u.storage_gb,
            u.cost,
        )
        for u in scoped(Usage)
    }
    audit = {
        (
            a.workspace_id,
            a.category,
            a.kind,
            a.object_id,
            a.status,
            a.flag_event_id,
            a.decided_by,
            a.decided_at,
        )
        for a in scoped(AuditItem)
    }
    reach = {
        (keys[r.src_id], keys[r.dst_id], r.dst_kind, r.dst_owner, r.depth) for r in scoped(Reach)
    }
    return {"nodes": nodes, "edges": edges, "usage": usage, "audit": audit, "reach": reach}
