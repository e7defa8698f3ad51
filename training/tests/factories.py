"""Test helpers: a ready dataset in the platform's format built from the demo generator.

The feature groups are registered for real (so dtypes and entities come from the registry);
the Parquet file is written where ``features.samples.dataset_file`` expects it, with the same
columns a built dataset has (see ``training.synthetic``).
"""

from __future__ import annotations

import itertools

from features import registry
from features.models import Dataset, DatasetStatus, FeatureGroup
from features.samples import dataset_file, dataset_relative_path
from training import data, synthetic
from training.models import JobState, Node, TrainingJob
from training.services import job_transition

_numbers = itertools.count(1)

GROUPS = {
    "user_profile": ("user", ["user_id"]),
    "ad_profile": ("item", ["ad_id"]),
    "user_embedding": ("semantic", ["user_id"]),
}


def _group(workspace, name: str, entity: str, keys: list[str], features: list[dict]):
    existing = FeatureGroup.objects.for_workspace(workspace).filter(name=name).first()
    if existing is not None:
        return existing
    return registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name=name,
        entity=entity,
        entity_keys=keys,
        features=features,
        online=entity != "label",
    )


def make_demo_dataset(workspace, *, scale: float = 0.05, name: str | None = None) -> Dataset:
    per_group: dict[str, list[dict]] = {}
    for ref, dtype, _entity, dim in synthetic.DEMO_FEATURES:
        group, feature = ref.split(":")
        spec = {"name": feature, "dtype": dtype}
        if dtype == "embedding":
            spec["dimension"] = dim
        per_group.setdefault(group, []).append(spec)
    for group, (entity, keys) in GROUPS.items():
        _group(workspace, group, entity, keys, per_group[group])
    labels = _group(
        workspace,
        "impressions",
        "label",
        ["user_id", "ad_id"],
        [{"name": "click", "dtype": "int"}, *per_group["impressions"]],
    )
    name = name or f"demo_samples_{next(_numbers)}"
    path = dataset_relative_path(workspace_id=workspace.pk, name=name, version=1)
    dataset = Dataset.objects.create(
        workspace=workspace,
        name=name,
        version=1,
        label_group=labels,
        label_columns=["click"],
        feature_refs=[ref for ref, *_ in synthetic.DEMO_FEATURES],
        status=DatasetStatus.READY,
        path=path,
    )
    table_path = synthetic.write_demo_dataset(dataset_file(dataset), scale=scale)
    import pyarrow.parquet as pq

    dataset.row_count = pq.read_metadata(table_path).num_rows
    dataset.save(update_fields=["row_count"])
    return dataset


def make_node(name: str | None = None, *, queue: str | None = None) -> Node:
    name = name or f"test-node-{next(_numbers)}"
    return Node.objects.create(
        name=name, queue=queue or f"node.{name}", cpu_milli=2000, memory_mb=4096
    )


def place(job: TrainingJob, node: Node) -> TrainingJob:
    """What the scheduler does: admit and place the job on ``node``."""
    job_transition(job=job, to=JobState.ADMITTED, expect=JobState.PENDING, reason="test")
    return job_transition(job=job, to=JobState.PLACED, expect=JobState.ADMITTED, node=node)


FAST = {"epochs": 2, "batch_size": 128, "threads": 1, "log_every_steps": 2}


# --- training children in-process (no database) ---------------------------------------------


def demo_job_spec(
    path, work_dir, template: str = "fine_ranking", *, job_id: int = 1, slice_column: str = "",
    **params,
) -> data.JobSpec:  # fmt: skip
    """A job spec over the demo dataset at ``path`` (``training.synthetic``'s features and
    label), one thread, seed 0, no importance pass; ``params`` over those."""
    return data.JobSpec(
        job_id=job_id,
        template=template,
        dataset_path=str(path),
        features=synthetic.feature_dicts(),
        work_dir=str(work_dir),
        label="click",
        params={"threads": 1, "seed": 0, "importance": False, **params},
        slice_column=slice_column,
    )


def run_spec(job: data.JobSpec, stop=None) -> tuple[int, list[dict]]:
    """Train ``job`` in this process (``training.runner.train``): its exit code and events."""
    from training import runner

    events: list[dict] = []
    code = runner.train(job, emit=runner.Emitter(sink=events.append), stop=stop)
    return code, events
