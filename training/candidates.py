"""Quick evaluation of a candidate feature (F11), before anyone registers it.

Upload values (CSV or Parquet: a key column named like one of the dataset's entity keys, e.g.
``user_id``, and a ``value`` column) for a feature that does not exist yet. The platform joins
them onto a ready dataset of the workspace (latest value per key; the file has no event times,
so it is treated as a static attribute), trains the baseline twice with the same seed (without
and with the candidate), scores both on the same time-ordered held-out rows and reports the AUC
and logloss differences with a bootstrap confidence interval. Nothing is registered: the values
live in the evaluation's own folder.
"""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from features.models import Dataset, DatasetStatus
from training.models import CandidateEvaluation, RunState
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ReferenceNotFound

logger = logging.getLogger(__name__)

CANDIDATES_DIR = "training/candidates"
VALUE_COLUMN = "value"
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
BOOTSTRAP = 200
DTYPES = {"float", "int", "bool", "categorical", "string"}


def _folder(evaluation: CandidateEvaluation) -> Path:
    return (
        Path(settings.ARTIFACT_ROOT)
        / CANDIDATES_DIR
        / f"ws={evaluation.workspace_id}"
        / f"eval={evaluation.pk}"
    )


def _read_values(content: bytes, filename: str):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if filename.lower().endswith(".parquet") or content[:4] == b"PAR1":
            return pq.read_table(io.BytesIO(content))
        return pacsv.read_csv(io.BytesIO(content))
    except Exception as exc:
        raise ValidationError({"file": f"not a readable CSV or Parquet file: {exc}"}) from exc


@transaction.atomic
def candidate_evaluation_create(
    *,
    actor: Actor,
    workspace,
    name: str,
    dataset: Dataset,
    key_column: str,
    content: bytes,
    filename: str = "values.csv",
    dtype: str = "float",
    params: dict[str, Any] | None = None,
    dispatch: bool = True,
) -> CandidateEvaluation:
    import pyarrow.parquet as pq

    if dataset.workspace_id != workspace.pk:
        raise ReferenceNotFound("no such dataset in this workspace", attr="dataset")
    errors: dict[str, str] = {}
    if dataset.status != DatasetStatus.READY:
        errors["dataset"] = f"dataset is {dataset.status}, not ready"
    elif key_column not in (dataset.label_group.entity_keys or []):
        errors["key_column"] = f"use one of the dataset's keys {dataset.label_group.entity_keys}"
    if dtype not in DTYPES:
        errors["dtype"] = f"use one of {sorted(DTYPES)}"
    if len(content) > MAX_UPLOAD_BYTES:
        errors["file"] = f"at most {MAX_UPLOAD_BYTES} bytes"
    if errors:
        raise ValidationError(errors)
    table = _read_values(content, filename)
    missing = [c for c in (key_column, VALUE_COLUMN) if c not in table.column_names]
    if missing:
        raise ValidationError({"file": f"missing column(s) {missing}"})
    if table.num_rows == 0:
        raise ValidationError({"file": "no rows"})
    evaluation = CandidateEvaluation(
        workspace=workspace,
        name=name,
        dataset=dataset,
        key_column=key_column,
        dtype=dtype,
        result={"params": params or {}},
        created_by=actor_user(actor),
    )
    try:
        evaluation.full_clean(exclude=["workspace", "dataset", "created_by"])
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    evaluation.save()
    folder = _folder(evaluation)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.select([key_column, VALUE_COLUMN]), folder / "values.parquet")
    evaluation.values_path = str((folder / "values.parquet").relative_to(settings.ARTIFACT_ROOT))
    evaluation.save(update_fields=["values_path"])
    event_record(
        actor=actor,
        workspace=workspace,
        verb="training.candidate_feature.evaluation_started",
        refs=[Ref.to(evaluation), Ref.to(dataset, role="input")],
        payload={"name": name, "key_column": key_column, "rows": table.num_rows},
    )
    if dispatch:
        from training.tasks import run_candidate_evaluation

        pk = evaluation.pk
        transaction.on_commit(lambda: run_candidate_evaluation.apply_async(args=[pk]))
    return evaluation


def _join(dataset_path: Path, values_path: Path, key: str, column: str, out: Path) -> None:
    import duckdb

    connection = duckdb.connect()
    try:
        connection.execute(
            f"""
            COPY (
              SELECT d.*, v.{VALUE_COLUMN} AS "{column}"
              FROM read_parquet(?) AS d
              LEFT JOIN (
                SELECT "{key}" AS k, last({VALUE_COLUMN}) AS {VALUE_COLUMN}
                FROM read_parquet(?) GROUP BY 1
              ) AS v ON CAST(d."{key}" AS VARCHAR) = CAST(v.k AS VARCHAR)
              ORDER BY d.event_time
            ) TO '{out}' (FORMAT parquet)
            """,  # noqa: S608 - the key is checked against the dataset's keys, column is ours
            [
                # a folder of parts, read as one table in part order, or one file
                (
                    str(dataset_path / "part-*.parquet")
                    if dataset_path.is_dir()
                    else str(dataset_path)
                ),
                str(values_path),
            ],
        )
    finally:
        connection.close()


def bootstrap_deltas(
    y: np.ndarray, base: np.ndarray, cand: np.ndarray, *, rounds: int = BOOTSTRAP, seed: int = 0
) -> dict[str, Any]:
    from training.evaluation import auc, logloss

    rng = np.random.default_rng(seed)
    auc_d, loss_d = [], []
    n = len(y)
    for _ in range(rounds):
        idx = rng.integers(0, n, n)
        a, b = auc(y[idx], cand[idx]), auc(y[idx], base[idx])
        if a is not None and b is not None:
            auc_d.append(a - b)
        loss_d.append(logloss(y[idx], cand[idx]) - logloss(y[idx], base[idx]))
    base_auc, cand_auc = auc(y, base), auc(y, cand)

    def interval(values: list[float]) -> list[float] | None:
        if not values:
            return None
        return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]

    return {
        "baseline": {"auc": base_auc, "logloss": logloss(y, base)},
        "candidate": {"auc": cand_auc, "logloss": logloss(y, cand)},
        "auc_delta": None if base_auc is None or cand_auc is None else cand_auc - base_auc,
        "auc_delta_ci95": interval(auc_d),
        "logloss_delta": logloss(y, cand) - logloss(y, base),
        "logloss_delta_ci95": interval(loss_d),
        "bootstrap_rounds": rounds,
        "holdout_rows": n,
    }


def compare(job_base, job_cand, *, seed: int) -> dict[str, Any]:
    """Train both specs (same seed and rows), score both on the same held-out rows."""
    from training import data, evaluation, runner
    from training.bundle import load_bundle

    for job in (job_base, job_cand):
        code = runner.train(job, emit=runner.Emitter(sink=lambda event: None))
        if code != 0:
            raise RuntimeError(f"training {job.work_dir} exited with {code}")
    preds = []
    y = None
    for job in (job_base, job_cand):
        bundle = load_bundle(job.model_dir)
        held = data.load(job, spec=bundle.spec).holdout
        preds.append(evaluation.predict_bundle(bundle, held))
        y = held.label.numpy().astype(np.float64)
    return bootstrap_deltas(y, preds[0], preds[1], seed=seed)


def candidate_evaluate(evaluation_id: int) -> str:
    from features.selectors import dataset_file
    from training.agent import feature_dicts
    from training.data import JobSpec

    evaluation = (
        CandidateEvaluation.objects.unscoped()
        .select_related("dataset", "dataset__label_group", "workspace")
        .get(pk=evaluation_id)
    )
    if evaluation.state not in {RunState.PENDING, RunState.FAILED}:
        return evaluation.state
    CandidateEvaluation.objects.unscoped().filter(pk=evaluation.pk).update(state=RunState.RUNNING)
    folder = _folder(evaluation)
    params = dict((evaluation.result or {}).get("params") or {})
    column = f"candidate__{evaluation.name.replace('-', '_')}"
    try:
        joined = folder / "joined.parquet"
        _join(
            dataset_file(evaluation.dataset),
            Path(settings.ARTIFACT_ROOT) / evaluation.values_path,
            evaluation.key_column,
            column,
            joined,
        )

        class _Job:  # only what feature_dicts reads
            dataset = evaluation.dataset
            workspace_id = evaluation.workspace_id

        features = feature_dicts(_Job)
        label = (evaluation.dataset.label_columns or ["clicked"])[0]
        train_params = {"epochs": 2, "batch_size": 256, "seed": 0, "importance": False}
        train_params.update(params)
        template = str(train_params.pop("template", "logreg"))
        common = {
            "job_id": 0,
            "template": template,
            "dataset_path": str(joined),
            "label": label,
            "params": train_params,
        }
        candidate = {
            "ref": f"candidate:{evaluation.name}",
            "column": column,
            "dtype": evaluation.dtype,
            "entity": "user" if evaluation.key_column.startswith("user") else "item",
            "dim": 1,
        }
        base = JobSpec(features=features, work_dir=str(folder / "baseline"), **common)
        cand = JobSpec(
            features=[*features, candidate], work_dir=str(folder / "candidate"), **common
        )
        for job in (base, cand):
            shutil.rmtree(job.work_dir, ignore_errors=True)
        result = compare(base, cand, seed=int(train_params.get("seed", 0)))
        import pyarrow.parquet as pq

        table = pq.read_table(joined, columns=[column])
        result["coverage"] = 1 - table.column(column).null_count / max(table.num_rows, 1)
        result["template"] = template
        result["params"] = params
        state, error = RunState.SUCCEEDED, ""
    except Exception as exc:
        logger.info("candidate evaluation %s failed", evaluation.pk, exc_info=True)
        result, state, error = {"params": params}, RunState.FAILED, f"{type(exc).__name__}: {exc}"
    with transaction.atomic():
        CandidateEvaluation.objects.unscoped().filter(pk=evaluation.pk).update(
            state=state, result=result, error=error[:5000], finished_at=timezone.now()
        )
        event_record(
            actor=None,
            workspace=evaluation.workspace,
            verb=f"training.candidate_feature.evaluation_{state}",
            refs=[Ref.to(evaluation)],
            payload={k: result.get(k) for k in ("auc_delta", "auc_delta_ci95", "logloss_delta")},
        )
    return state
