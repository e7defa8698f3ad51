"""The gradient-boosted-trees path of the training child (template ``lightgbm``).

``runner.train`` hands a job here when its template keeps its own model file
(``bundle.template_kind``). The contract is the torch path's: the same loader and splits
(``data.load``: train | validation | test, encoded by ``FeatureEncoder``), the same events
(``start``, ``progress``, ``metric``, ``checkpoint``, ``stopped``, ``done``), the same exit
codes, the same calibration and evaluation, and a ``done`` payload with the same blocks, so the
agent, the job page, the quality gate and the registry need not know which kind ran.

- Steps are boosting rounds (one tree each): ``progress`` every ``log_every_steps`` rounds with
  ``total_steps = num_boost_round``; its ``loss`` is the training log loss (LightGBM keeps the
  training scores, so it costs one pass over them); ``epoch`` is the round, since each round
  reads every training row once.
- Early stopping reads only the validation rows: LightGBM scores them after every round
  (``auc`` and ``binary_logloss``), the round with the best ``early_stopping_metric`` is kept
  and training stops ``early_stopping_rounds`` rounds after it; the bundle holds the trees up
  to that round only. ``val_auc``/``val_logloss`` are emitted every ``log_every_steps`` rounds
  and at the last one; those points, plus the best round's, are the ``validation.curve`` of the
  ``done`` metrics. The test rows are never given to LightGBM (no per-round held-out curve):
  they are scored once, by ``evaluation.evaluate``.
- Checkpoints (``checkpoint.pt``, the agent's file name) hold the booster's text model, the
  round, the fitted bundle spec and the early-stopping state (a dict of strings and numbers,
  saved with ``torch.save`` and read back with ``weights_only=True``), written to a temporary
  name and renamed, every ``checkpoint_every_steps`` rounds or ``checkpoint_every_s`` seconds
  and when stopped. A restarted run passes the saved booster to LightGBM as ``init_model`` and
  boosts the remaining rounds.
- Exactness of a resume: LightGBM restarts its random generators with a new ``train`` call, so
  the runner reseeds the column sampling before every round from (``seed``, round): with
  ``feature_fraction`` < 1 a resumed run draws the same columns as an uninterrupted one, and
  (measured with ``bagging_freq`` 0) ends with the same trees. Bagging (``bagging_freq`` > 0)
  cannot be reseeded that way: a resumed run's later rounds draw other bags than an
  uninterrupted run would, so its trees differ (equally good ones, not the same ones).
- Incremental training (``base_job``): a LightGBM base model's trees are the ``init_model``; the
  new rounds boost on top of them on the new data, with the base model's encoding. A torch base
  model cannot seed trees (the job check refuses that pair with a 400).
- ``seed`` is LightGBM's ``seed`` (with ``deterministic`` and column-wise histograms, so a seed
  gives the same model on the same machine), ``threads`` its ``num_threads`` (0: its default).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from training.runner import CheckpointedStopping

GBDT_CHECKPOINT_FORMAT = "rankops-gbdt-checkpoint/1"
LIGHTGBM_METRICS = {"auc": "auc", "logloss": "binary_logloss"}


class RoundStopping(CheckpointedStopping):
    """Early stopping over boosting rounds: the best round by a validation metric, the rounds
    since it, and the curve of sampled points; ``stopped`` once ``rounds`` rounds in a row did
    not improve (0: never)."""

    STATE = ("best_value", "best_round", "best_values", "bad_rounds", "stopped", "curve")
    COUNTER = "bad_rounds"

    def __init__(self, *, metric: str, rounds: int) -> None:
        if metric not in LIGHTGBM_METRICS:
            raise ValueError(f"unknown early_stopping_metric {metric!r}; use auc or logloss")
        self.metric = metric
        self.rounds = rounds
        self.best_value: float | None = None
        self.best_round: int | None = None
        self.best_values: dict[str, float | None] = {}
        self.bad_rounds = 0
        self.stopped = False
        self.curve: list[list[float]] = []  # [round, value of ``metric``]

    def update(self, at: int, values: dict[str, float | None]) -> bool:
        """See round ``at``'s validation ``values``; True when it is the new best."""
        value = values.get(self.metric)
        if self._better(value):
            self.best_value, self.best_round, self.bad_rounds = value, at, 0
            self.best_values = dict(values)
            return True
        self.bad_rounds += 1
        if self.rounds and self.bad_rounds >= self.rounds:
            self.stopped = True
        return False

    def restore(self, state: dict[str, Any] | None) -> None:
        """Back to a checkpoint's state; one written before ``best_values`` has none."""
        super().restore(state)
        self.best_values = dict(self.best_values or {})

    def final_curve(self) -> list[list[float]]:
        """The sampled curve, with the best round's point in it when early stopping keeps
        that round (the curve's best is then the kept model's value)."""
        points = {int(r): v for r, v in self.curve}
        if self.rounds and self.best_round is not None:
            points[int(self.best_round)] = self.best_value
        return [[r, points[r]] for r in sorted(points)]


def lightgbm_params(job, spec) -> dict[str, Any]:
    """LightGBM's params for ``job`` (its template params, ``seed``, ``threads``)."""
    from training.templates.lightgbm import hparams

    h = hparams(job.params)
    params: dict[str, Any] = {
        "objective": "binary",
        "metric": ["auc", "binary_logloss"],
        "learning_rate": float(h["learning_rate"]),
        "num_leaves": int(h["num_leaves"]),
        "min_data_in_leaf": int(h["min_data_in_leaf"]),
        "feature_fraction": float(h["feature_fraction"]),
        "bagging_fraction": float(h["bagging_fraction"]),
        "bagging_freq": int(h["bagging_freq"]),
        "lambda_l1": float(h["lambda_l1"]),
        "lambda_l2": float(h["lambda_l2"]),
        "max_bin": int(h["max_bin"]),
        "seed": int(job.param("seed", 0)),
        "deterministic": True,
        "force_col_wise": True,
        "verbosity": -1,
    }
    threads = int(job.param("threads", 0))
    if threads:
        params["num_threads"] = threads
    return params


def _load_checkpoint(job) -> dict[str, Any] | None:
    import torch

    if not job.checkpoint_file.exists():
        return None
    checkpoint = torch.load(job.checkpoint_file, map_location="cpu", weights_only=True)
    return checkpoint if checkpoint.get("format") == GBDT_CHECKPOINT_FORMAT else None


def train(job, *, emit, stop) -> int:
    """Run (or resume) a LightGBM job; returns the runner's exit code."""
    import lightgbm as lgb
    import torch

    from training.bundle import load_bundle
    from training.runner import EXIT_STOPPED, checkpoint_write, finish_run, job_data
    from training.templates.lightgbm import (
        LightGBMModel,
        feature_layout,
        feature_matrix,
        hparams,
    )

    seed = int(job.param("seed", 0))
    threads = int(job.param("threads", 0))
    if threads:
        torch.set_num_threads(threads)  # the model's predictions (evaluation) use as many
    work = Path(job.work_dir)
    work.mkdir(parents=True, exist_ok=True)

    checkpoint = _load_checkpoint(job)
    base = load_bundle(job.base_model_path) if job.base_model_path and checkpoint is None else None
    if base is not None and not isinstance(base.model, LightGBMModel):
        emit("error", message="a lightgbm job continues only from a lightgbm model")
        return 2
    loaded = job_data(job, checkpoint=checkpoint, base=base, emit=emit)
    if loaded is None:
        return 2
    spec = loaded.spec
    # The bundle records what this job ran with (an incremental job: its own params).
    spec.hparams = {k: v for k, v in job.params.items() if not isinstance(v, dict)}
    validation = loaded.validation
    names, categorical = feature_layout(spec)
    if not names:
        emit("error", message="a lightgbm job needs at least one feature")
        return 2

    h = hparams(job.params)
    params = lightgbm_params(job, spec)
    total = int(h["num_boost_round"])
    val_y = validation.label.numpy()
    two_classes = bool(validation.n) and val_y.min() != val_y.max()
    stopping = RoundStopping(
        metric=str(job.param("early_stopping_metric", "logloss")),
        rounds=int(h["early_stopping_rounds"]) if validation.n else 0,
    )
    # ``offset``: the base model's rounds, which this job's steps do not count.
    init_model = None
    offset = 0
    step = 0
    if checkpoint is not None:
        init_model = lgb.Booster(model_str=checkpoint["model"])
        offset, step = int(checkpoint["offset"]), int(checkpoint["step"])
        stopping.restore(checkpoint.get("early_stopping"))
        emit("log", message=f"resumed from checkpoint at round {step}")
    elif base is not None:
        init_model = base.model.booster
        offset = int(init_model.current_iteration())
        emit("log", message=f"incremental: boosting on {job.base_model_path} ({offset} rounds)")

    use_categorical = bool(h["categorical"]) and bool(categorical)
    dataset_params = {k: params[k] for k in ("max_bin", "min_data_in_leaf", "verbosity", "seed")}
    train_set = lgb.Dataset(
        feature_matrix(loaded.train.dense, loaded.train.cat),
        label=loaded.train.label.numpy(),
        feature_name=names,
        categorical_feature=categorical if use_categorical else [],
        params=dataset_params,
        free_raw_data=False,
    )
    valid_sets = []
    if validation.n:
        valid_sets.append(
            lgb.Dataset(
                feature_matrix(validation.dense, validation.cat),
                label=val_y,
                reference=train_set,
                free_raw_data=False,
            )
        )

    every_steps = int(job.param("checkpoint_every_steps", 200))
    every_s = float(job.param("checkpoint_every_s", 30.0))
    log_every = max(1, int(job.param("log_every_steps", 10)))
    reseed = float(params["feature_fraction"]) < 1.0

    def save_checkpoint(booster, at: int) -> None:
        parts = {
            "format": GBDT_CHECKPOINT_FORMAT,
            "model": booster.model_to_string(num_iteration=-1),
            "offset": offset,
        }
        checkpoint_write(job, emit, step=at, spec=spec, stopping=stopping, parts=parts)

    emit(
        "start",
        total_steps=total,
        step=step,
        steps_per_epoch=1,
        train_rows=loaded.train.n,
        validation_rows=validation.n,
        holdout_rows=loaded.holdout.n,
        device="cpu",
    )
    clock = {"start": time.monotonic(), "checkpoint": time.monotonic(), "first": step}
    halted = {"stopped": False}

    def before_round(env) -> None:
        if reseed:  # the column sample of a round depends on (seed, round) alone
            env.model.reset_parameter({"feature_fraction_seed": seed * 100_003 + env.iteration})

    before_round.before_iteration = True  # type: ignore[attr-defined]
    before_round.order = 0  # type: ignore[attr-defined]

    def after_round(env) -> None:
        at = env.iteration + 1 - offset  # this job's rounds so far
        values: dict[str, float | None] = {}
        for data_name, metric, value, _ in env.evaluation_result_list or []:
            if data_name == "validation":
                key = "auc" if metric == "auc" else "logloss" if metric == "binary_logloss" else ""
                if key:
                    values[key] = float(value)
        if values and not two_classes:
            values["auc"] = None  # one class: LightGBM's AUC is meaningless, ours is None
        if values:
            stopping.update(at, values)
        if values and (at % log_every == 0 or at == total or stopping.stopped):
            stopping.curve.append([at, values.get(stopping.metric)])
            for key in ("auc", "logloss"):
                emit("metric", step=at, name=f"val_{key}", value=values.get(key))
        if at % log_every == 0 or at == total:
            now = time.monotonic()
            done_rounds = max(at - clock["first"], 1)
            per_round = (now - clock["start"]) / done_rounds
            train_loss = next(
                (v for _, m, v, _ in env.model.eval_train() if m == "binary_logloss"), math.nan
            )
            emit(
                "progress",
                step=at,
                total_steps=total,
                epoch=at,
                loss=float(train_loss),
                samples_per_s=loaded.train.n / per_round if per_round > 0 else 0.0,
                eta_s=(total - at) * per_round,
                gpu_memory_mb=0,
            )
        if stopping.stopped:
            raise lgb.callback.EarlyStopException(env.iteration, env.evaluation_result_list or [])
        if stop.requested:
            halted["stopped"] = True
            save_checkpoint(env.model, at)
            raise lgb.callback.EarlyStopException(env.iteration, env.evaluation_result_list or [])
        if at < total and (
            at % every_steps == 0 or time.monotonic() - clock["checkpoint"] >= every_s
        ):
            save_checkpoint(env.model, at)
            clock["checkpoint"] = time.monotonic()

    if stop.requested:  # before any round: what a checkpoint holds (if any) stays
        emit("stopped", step=step)
        return EXIT_STOPPED
    remaining = 0 if stopping.stopped else max(total - step, 0)
    train_start = time.monotonic()
    if remaining:
        booster = lgb.train(
            params,
            train_set,
            num_boost_round=remaining,
            valid_sets=valid_sets,
            valid_names=["validation"][: len(valid_sets)],
            init_model=init_model,
            keep_training_booster=True,
            callbacks=[before_round, after_round],
        )
    else:  # a finished run's checkpoint: nothing left to boost, only to save
        booster = init_model
    rounds = int(booster.current_iteration()) - offset
    if halted["stopped"]:
        emit("stopped", step=rounds)
        return EXIT_STOPPED
    elapsed = time.monotonic() - train_start
    trained = max(rounds - step, 0)
    train_rate = trained * loaded.train.n / elapsed if elapsed > 0 and trained else 0.0
    save_checkpoint(booster, rounds)

    # Keep the best round's trees (and the base model's, which come first).
    keep = rounds
    if stopping.rounds and stopping.best_round is not None:
        keep = int(stopping.best_round)
    model = LightGBMModel(
        spec, lgb.Booster(model_str=booster.model_to_string(num_iteration=offset + keep))
    )
    metrics: dict[str, Any] = {
        "train_samples_per_s": train_rate,
        "steps": rounds,
        "step_unit": "round",
        "epoch_eval_s": 0.0,
        "best_epoch": stopping.best_round if stopping.rounds else None,
        "best_iteration": keep,
        "trees": model.num_trees,
        "stopped_early": stopping.stopped,
    }
    return finish_run(job, model, loaded, metrics, stopping, step=rounds, seed=seed, emit=emit)
