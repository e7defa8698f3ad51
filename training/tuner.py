"""Hyperparameter tuning with Optuna, without Django: search spaces, the study rebuilt from the
trials recorded so far, the next trial's params, the pruning decision, and ``optimise`` (trials
run in this process one after another).

The platform's tuning jobs (``training.tuning``: trials are child training jobs placed by the
scheduler) and the benchmark (``bench/areas/quality.py``) use the same functions, so what a
tuning job samples and prunes is what the benchmark measured.

**A study is rebuilt, never stored.** ``study_rebuild`` makes an in-memory Optuna study from the
trials recorded (their params, state, final value and intermediate values) with a TPE sampler
seeded from the study's seed and the number of trials so far. Asking it twice for the same
record gives the same params, and a controller that restarts loses and repeats nothing: the
database is the only state. Running trials are in the study too (TPE's ``constant_liar``), so
trials asked while others run do not all land on the same point.

**The test rows choose nothing, by construction.** A trial is a ``TrialRecord``: params, state,
the final *validation* metric and the per-epoch *validation* curve. It has no field for a
held-out (test) metric, and the only way to build its value from a training run's metrics,
``validation_value``, reads the ``validation`` block and nothing else. The objective is the
calibrated validation log loss by default (minimised; cross-fitted, so the calibration does not
score its own fitting rows) or the validation AUC (maximised).

**The trial kept** is the simplest (strongest penalty, fewest parameters: ``simplicity``) whose
per-row validation losses are within one standard error of the lowest trial's (``chosen_trial``;
each run leaves its rows' scores beside its model), not simply the lowest: the lowest of many
trials on a small split is mostly the trial that fitted those rows by chance.

**Pruning** (``MedianPruner`` by default, ``SuccessiveHalvingPruner`` for ``"asha"``) reads a
running trial's intermediate values: its validation metric after each epoch, keyed by the epoch
number (1, 2, ...), so trials with different batch sizes compare at the same point of training.
ASHA keeps its rung bookkeeping in the trial's system attributes; ``prune_decision`` hands back
the attributes it set, and the caller stores them with the trial (``TrialRecord.pruner_attrs``).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

METRICS = {"logloss": "minimize", "auc": "maximize"}
PRUNERS = ("median", "asha", "none")
TRIAL_STATES = ("running", "complete", "pruned", "failed")
MAX_CHOICES = 32


class SpaceError(ValueError):
    """A search space the template's params do not allow; ``errors`` maps
    ``space.<param>`` (or ``space``) to what is wrong."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


@dataclass(frozen=True)
class Dimension:
    """One searched param: a float or int range (``log`` for a log scale) or a list of
    ``choices`` (any JSON values of the param's type, e.g. hidden layers ``[256, 128]``)."""

    name: str
    kind: str  # "float" | "int" | "choice"
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def to_json(self) -> dict[str, Any]:
        if self.kind == "choice":
            return {"choices": [copy.deepcopy(c) for c in self.choices]}
        low, high = (int(self.low), int(self.high)) if self.kind == "int" else (self.low, self.high)
        return {"low": low, "high": high, "log": self.log}

    def distribution(self):
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.kind == "choice":
            return CategoricalDistribution([_encode(c) for c in self.choices])
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(float(self.low), float(self.high), log=self.log)

    def decode(self, value: Any) -> Any:
        """An Optuna value back to the param's value (a choice's original JSON value)."""
        if self.kind == "choice":
            for choice in self.choices:
                if _encode(choice) == value:
                    return copy.deepcopy(choice)
            raise ValueError(f"{value!r} is not a choice of {self.name}")
        if self.kind == "int":
            return int(value)
        return float(value)

    def encode(self, value: Any) -> Any:
        return _encode(value) if self.kind == "choice" else value


def _encode(choice: Any) -> Any:
    """Optuna's categorical choices are scalars: a list (hidden layers) becomes "256,128"."""
    if isinstance(choice, list | tuple):
        return ",".join(str(item) for item in choice)
    if isinstance(choice, dict):
        return json.dumps(choice, sort_keys=True)
    return choice


SearchSpace = dict[str, Dimension]


def _range(name: str, low: float, high: float, *, log: bool = False, kind: str = "float"):
    return Dimension(name=name, kind=kind, low=low, high=high, log=log)


def _choice(name: str, *choices: Any) -> Dimension:
    return Dimension(name=name, kind="choice", choices=tuple(choices))


HIDDEN_CHOICES = ([256, 128], [128, 64], [64, 32])

# Sensible ranges per built-in template, by param name (each checked against the template's
# param schema when used: a template without one of these params leaves it out). The networks
# and logistic regression also choose the numeric encoding (``numeric_transform``): on the Criteo
# sample's heavy-tailed counts log(1 + x) took logreg from 0.62 to 0.71 test AUC at the same
# penalty, and validation showed it too; boosted trees split on ranks, so they do not need it.
DEFAULT_SPACES: dict[str, list[Dimension]] = {
    # The convex fit (its default solver) depends on the penalty and the encoding alone.
    "logreg": [
        # Up to 10: on a few hundred rows the best penalty is that strong (scikit-learn's C
        # of 0.003-0.03 on the Criteo sample's 140 training rows is l2 0.24-2.4).
        _range("l2", 1e-7, 10.0, log=True),
        _choice("vocab_min_count", 1, 2, 3),
        _choice("numeric_transform", "standard", "log"),
    ],
    "fine_ranking": [
        _range("lr", 1e-4, 0.1, log=True),
        _choice("embedding_dim", 4, 8, 16, 32),
        _range("cross_layers", 0, 3, kind="int"),
        _choice("hidden", *HIDDEN_CHOICES),
        _range("dropout", 0.0, 0.5),
        _range("weight_decay", 1e-8, 1e-3, log=True),
        _choice("numeric_transform", "standard", "log"),
    ],
    "deepfm": [
        _range("lr", 1e-4, 0.1, log=True),
        _choice("embedding_dim", 4, 8, 16, 32),
        _choice("hidden", *HIDDEN_CHOICES),
        _range("dropout", 0.0, 0.5),
        _range("embedding_l2", 1e-8, 1e-3, log=True),
        _range("weight_decay", 1e-8, 1e-3, log=True),
        _choice("numeric_transform", "standard", "log"),
    ],
    "two_tower": [
        _range("lr", 1e-4, 0.1, log=True),
        _choice("embedding_dim", 4, 8, 16, 32),
        _choice("tower_dim", 16, 32, 64),
        _choice("hidden", 32, 64, 128),
        _range("temperature", 0.02, 1.0, log=True),
    ],
    "lightgbm": [
        _range("learning_rate", 0.01, 0.3, log=True),
        _range("num_leaves", 8, 256, log=True, kind="int"),
        _range("min_data_in_leaf", 5, 200, log=True, kind="int"),
        _range("feature_fraction", 0.5, 1.0),
        _range("bagging_fraction", 0.5, 1.0),
        _range("lambda_l2", 1e-8, 10.0, log=True),
    ],
}


def _schema(template: str) -> dict[str, Any]:
    """The template's params (its own and the shared ones), no database: ``{}`` when the
    template is not registered here."""
    from training.params import params_schema, template_schemas

    if template not in template_schemas():
        return {}
    return params_schema(template, policy=False)


def default_space(template: str) -> SearchSpace:
    """The default search space of ``template``: ``DEFAULT_SPACES`` less what its schema lacks
    (nothing when neither knows the template)."""
    schema = _schema(template)
    dims = DEFAULT_SPACES.get(template, [_range("lr", 1e-4, 0.3, log=True)])
    return {d.name: d for d in dims if not schema or d.name in schema}


def space_to_json(space: Mapping[str, Dimension]) -> dict[str, Any]:
    return {name: dim.to_json() for name, dim in space.items()}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _dimension(name: str, spec: Any, param) -> Dimension:
    """One dimension from its JSON, checked against its param (``ValueError``: why not)."""
    if not isinstance(spec, dict):
        raise ValueError('give {"low": .., "high": .., "log": false} or {"choices": [..]}')
    unknown = set(spec) - {"low", "high", "log", "choices"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}; use low, high, log or choices")
    if "choices" in spec:
        if set(spec) - {"choices"}:
            raise ValueError("give either choices or low/high, not both")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES:
            raise ValueError(f"choices: a list of 1-{MAX_CHOICES} values")
        cleaned = []
        for value in choices:
            if param is not None:
                try:
                    value = param.clean(value)
                except ValueError as exc:
                    raise ValueError(f"choice {value!r}: {exc}") from None
            if _encode(value) in [_encode(c) for c in cleaned]:
                raise ValueError(f"choice {value!r} is given twice")
            cleaned.append(value)
        return Dimension(name=name, kind="choice", choices=tuple(cleaned))
    if "low" not in spec or "high" not in spec:
        raise ValueError("a range needs low and high (or give choices)")
    low, high, log = spec["low"], spec["high"], spec.get("log", False)
    if not _number(low) or not _number(high):
        raise ValueError("low and high must be numbers")
    if not isinstance(log, bool):
        raise ValueError("log must be true or false")
    if low >= high:
        raise ValueError(f"low ({low}) must be below high ({high})")
    if log and low <= 0:
        raise ValueError("a log range needs low > 0")
    kind = "float"
    if param is not None:
        if param.type not in {"int", "float"}:
            raise ValueError(f"a {param.type} param takes choices, not a range")
        kind = param.type
        for label, value in (("low", low), ("high", high)):
            try:
                param.clean(int(value) if kind == "int" and float(value).is_integer() else value)
            except ValueError as exc:
                raise ValueError(f"{label} {value}: {exc}") from None
    elif isinstance(low, int) and isinstance(high, int):
        kind = "int"
    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise ValueError("an int param's range needs whole numbers")
    return Dimension(name=name, kind=kind, low=low, high=high, log=log)


def space_from_json(template: str, spec: Any, *, free: bool = False) -> SearchSpace:
    """A user's search space (``{"lr": {"low": 1e-4, "high": 0.1, "log": true},
    "embedding_dim": {"choices": [8, 16]}}``) checked against ``template``'s param schema:
    an unknown param, a bound outside the param's, a choice it refuses, or a malformed entry
    raises ``SpaceError`` naming ``space.<param>``. ``free`` (an entry point's free-form
    params) lets names outside the schema through."""
    if not isinstance(spec, dict) or not spec:
        raise SpaceError({"space": "give an object of at least one param to search"})
    schema = _schema(template)
    errors: dict[str, str] = {}
    space: SearchSpace = {}
    for name, entry in spec.items():
        param = schema.get(name)
        if param is None and not free:
            allowed = ", ".join(sorted(schema)) if schema else "none known"
            errors[f"space.{name}"] = f"unknown param; use one of: {allowed}"
            continue
        if param is not None and param.type == "object":
            errors[f"space.{name}"] = "an object param cannot be searched"
            continue
        try:
            space[name] = _dimension(name, entry, param)
        except ValueError as exc:
            errors[f"space.{name}"] = str(exc)
    if errors:
        raise SpaceError(errors)
    return space


def derived_params(template: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Params that follow from sampled ones: LightGBM bags only with ``bagging_freq`` > 0, so a
    sampled ``bagging_fraction`` below 1 turns bagging on (when the schema has the param)."""
    out = dict(params)
    if template == "lightgbm" and "bagging_fraction" in out and "bagging_freq" not in out:
        schema = _schema(template)
        if (not schema or "bagging_freq" in schema) and float(out["bagging_fraction"]) < 1.0:
            out["bagging_freq"] = 1
    return out


# --- trials and the study ----------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRecord:
    """What the tuner knows of one trial. Validation only: there is no field for a held-out
    metric (see the module docstring), so the test rows cannot choose anything.

    ``intermediate`` is ``{epoch: validation metric}``; ``value`` the final validation metric
    (complete trials; a pruned trial's last intermediate value)."""

    number: int
    params: dict[str, Any]
    state: str = "running"
    value: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)
    pruner_attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state not in TRIAL_STATES:
            raise ValueError(f"unknown trial state {self.state!r}; use one of {TRIAL_STATES}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["intermediate"] = [[k, v] for k, v in sorted(self.intermediate.items())]
        return out


def validation_value(validation: Mapping[str, Any] | None, metric: str) -> float | None:
    """A trial's objective from a run's ``metrics["validation"]`` block (pass that block, not
    the whole metrics): the validation AUC, or the calibrated validation log loss - its
    cross-fitted value (``crossfit_logloss``: each half of the rows scored through the
    calibration fitted on the other half) where the run reports one, since the in-sample value
    scores the rows the calibration was fitted on and flatters small validation splits; None
    without one."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {sorted(METRICS)}")
    block = validation or {}
    if metric == "logloss" and _number(block.get("crossfit_logloss")):
        return float(block["crossfit_logloss"])
    value = block.get(metric)
    return float(value) if _number(value) else None


def validation_curve(points: Sequence[tuple[int, float]]) -> dict[int, float]:
    """Per-epoch validation values ``{1: v1, 2: v2, ...}`` from the ``val_<metric>`` points a
    run emits after each epoch, ``[(step, value), ...]`` in step order (NaN dropped)."""
    curve: dict[int, float] = {}
    for epoch, (_step, value) in enumerate(sorted(points, key=lambda p: p[0]), start=1):
        if _number(value):
            curve[epoch] = float(value)
    return curve


def direction_of(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {sorted(METRICS)}")
    return METRICS[metric]


def sampler_seed(seed: int, n_trials: int) -> int:
    """The TPE sampler's seed for the trial asked after ``n_trials`` recorded ones."""
    return (int(seed) * 1_000_003 + int(n_trials)) % (2**32)


@dataclass(frozen=True)
class PrunerConfig:
    """``median``: stop a trial whose value after an epoch is worse than the median of the
    finished trials' at that epoch, once ``n_startup_trials`` have finished and not in its first
    ``warmup_epochs`` epochs; ``asha``: asynchronous successive halving (its first rung after
    ``warmup_epochs`` + 1 epochs); ``none``: never."""

    kind: str = "median"
    n_startup_trials: int = 2
    warmup_epochs: int = 1

    def build(self):
        import optuna

        if self.kind == "median":
            # Epochs are numbered from 1: the first judged is warmup_epochs + 1.
            return optuna.pruners.MedianPruner(
                n_startup_trials=self.n_startup_trials, n_warmup_steps=self.warmup_epochs + 1
            )
        if self.kind == "asha":
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=self.warmup_epochs + 1)
        if self.kind == "none":
            return optuna.pruners.NopPruner()
        raise ValueError(f"unknown pruner {self.kind!r}; use one of {PRUNERS}")


def _frozen(record: TrialRecord, space: Mapping[str, Dimension]):
    from optuna.trial import TrialState, create_trial

    params = {name: space[name].encode(v) for name, v in record.params.items() if name in space}
    distributions = {name: space[name].distribution() for name in params}
    state = {
        "running": TrialState.RUNNING,
        "complete": TrialState.COMPLETE,
        "pruned": TrialState.PRUNED,
        "failed": TrialState.FAIL,
    }[record.state]
    value = record.value if record.state == "complete" else None
    if state == TrialState.COMPLETE and value is None:
        state = TrialState.FAIL
    return create_trial(
        state=state,
        value=value,
        params=params,
        distributions=distributions,
        intermediate_values={int(k): float(v) for k, v in record.intermediate.items()},
        system_attrs=dict(record.pruner_attrs),
    )


def study_rebuild(
    space: Mapping[str, Dimension],
    trials: Sequence[TrialRecord],
    *,
    metric: str = "logloss",
    seed: int = 0,
    pruner: PrunerConfig | None = None,
):
    """An in-memory Optuna study holding ``trials`` (in number order), whose TPE sampler is
    seeded from ``seed`` and how many trials there are."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(
        seed=sampler_seed(seed, len(trials)),
        constant_liar=True,
        n_startup_trials=5,
    )
    study = optuna.create_study(
        direction=direction_of(metric),
        sampler=sampler,
        pruner=(pruner or PrunerConfig()).build(),
    )
    for record in sorted(trials, key=lambda t: t.number):
        study.add_trial(_frozen(record, space))
    return study


def ask(
    space: Mapping[str, Dimension],
    trials: Sequence[TrialRecord],
    *,
    metric: str = "logloss",
    seed: int = 0,
) -> dict[str, Any]:
    """The next trial's params (the param values, a choice as its original value): the same
    for the same record of trials."""
    study = study_rebuild(space, trials, metric=metric, seed=seed)
    trial = study.ask({name: dim.distribution() for name, dim in space.items()})
    return {name: space[name].decode(trial.params[name]) for name in space}


def prune_decision(
    space: Mapping[str, Dimension],
    trials: Sequence[TrialRecord],
    number: int,
    *,
    metric: str = "logloss",
    seed: int = 0,
    pruner: PrunerConfig | None = None,
) -> tuple[bool, dict[str, Any]]:
    """Whether the running trial ``number`` should stop now, from its intermediate values and
    the other trials'; and the pruner's bookkeeping for that trial (store it as
    ``pruner_attrs``: ASHA's rungs)."""
    pruner = pruner or PrunerConfig()
    if pruner.kind == "none":
        return False, {}
    study = study_rebuild(space, trials, metric=metric, seed=seed, pruner=pruner)
    ordered = sorted(trials, key=lambda t: t.number)
    index = next((i for i, t in enumerate(ordered) if t.number == number), None)
    if index is None or ordered[index].state != "running" or not ordered[index].intermediate:
        return False, {}
    frozen = study.trials[index]
    decision = bool(study.pruner.prune(study, frozen))
    attrs = study._storage.get_trial(frozen._trial_id).system_attrs
    return decision, dict(attrs)


def best_trial(trials: Sequence[TrialRecord], metric: str) -> TrialRecord | None:
    """The complete trial with the best validation value (ties: the lower number)."""
    done = [t for t in trials if t.state == "complete" and t.value is not None]
    if not done:
        return None
    sign = 1.0 if direction_of(metric) == "minimize" else -1.0
    return min(done, key=lambda t: (sign * float(t.value), t.number))


# Which way a param makes a model simpler (a stronger penalty, fewer free parameters): the
# one-standard-error rule (``chosen_trial``) moves that way among trials validation cannot tell
# apart. Params not named here (learning rates, encodings, sampling fractions) do not count.
SIMPLER_WHEN: dict[str, str] = {
    "l2": "high",
    "weight_decay": "high",
    "embedding_l2": "high",
    "dropout": "high",
    "lambda_l1": "high",
    "lambda_l2": "high",
    "min_data_in_leaf": "high",
    "vocab_min_count": "high",
    "embedding_dim": "low",
    "cross_layers": "low",
    "hidden": "low",
    "tower_dim": "low",
    "num_leaves": "low",
    "max_depth": "low",
}


def _size(value: Any) -> float | None:
    """A param value's size for ordering: a number, or a list of layer widths' total."""
    if _number(value):
        return float(value)
    if isinstance(value, list | tuple) and value and all(_number(v) for v in value):
        return float(sum(value))
    return None


def simplicity(params: Mapping[str, Any], space: Mapping[str, Dimension]) -> float:
    """How simple ``params`` are within ``space``, 0 (most complex) to 1 (simplest): the mean,
    over the searched params ``SIMPLER_WHEN`` names, of the value's position in its range (log
    ranges on the log scale; choices by their size), oriented so that 1 is the simpler end.
    0 when no searched param has a direction."""
    scores = []
    for name, dim in space.items():
        way = SIMPLER_WHEN.get(name)
        value = _size(params.get(name))
        if way is None or value is None:
            continue
        if dim.kind == "choice":
            sizes = [size for size in map(_size, dim.choices) if size is not None]
            if len(sizes) < len(dim.choices) or len(set(sizes)) < 2:
                continue
            low, high, log = min(sizes), max(sizes), False
        elif dim.low is not None and dim.high is not None:
            low, high, log = float(dim.low), float(dim.high), dim.log
        else:
            continue
        if log and low > 0:
            low, high, value = math.log(low), math.log(high), math.log(max(value, low))
        position = min(1.0, max(0.0, (value - low) / (high - low)))
        scores.append(position if way == "high" else 1.0 - position)
    return sum(scores) / len(scores) if scores else 0.0


@dataclass(frozen=True)
class Chosen:
    """The trial a study keeps (``chosen_trial``), the lowest-loss one, and why."""

    trial: TrialRecord
    lowest: TrialRecord
    reason: str


def chosen_trial(
    trials: Sequence[TrialRecord],
    metric: str,
    space: Mapping[str, Dimension],
    row_losses: Mapping[int, Any] | None = None,
) -> Chosen | None:
    """The trial to keep: with the log loss as the objective and each complete trial's per-row
    validation losses (``row_losses[number]``, the rows its value averages: the same rows for
    every trial of a study), the simplest trial (``simplicity``) whose mean loss is within one
    standard error of the lowest, the error being that of the per-row difference to the lowest
    (paired: the rows are shared); else the best value (``best_trial``).

    Why: the lowest of N trials' validation losses is optimistic by about its error times
    sqrt(2 ln N), and on a small split that is most of the differences between trials. On the
    Criteo sample (160 pooled rows, 40 trials) the lowest out-of-fold loss chose logreg's
    weakest penalties (l2 = 0.0019) and lost 0.14 of test log loss to a plain logistic
    regression. This is the one-standard-error rule of ``training.evaluation
    .simplest_within_one_se`` (which chooses between templates), applied within a template."""
    from training.evaluation import paired_gap

    lowest = best_trial(trials, metric)
    if lowest is None:
        return None
    losses = row_losses or {}
    base = losses.get(lowest.number)
    if metric != "logloss" or base is None or len(base) < 2:
        return Chosen(lowest, lowest, f"lowest validation {metric}")
    candidates = [(lowest, 0.0, 0.0)]
    for trial in trials:
        rows = losses.get(trial.number)
        if trial is lowest or trial.state != "complete" or rows is None or len(rows) != len(base):
            continue
        gap, se = paired_gap(rows, base)
        if gap <= se:
            candidates.append((trial, gap, se))
    trial, gap, se = max(
        candidates, key=lambda c: (simplicity(c[0].params, space), -c[1], -c[0].number)
    )
    if trial is lowest:
        return Chosen(lowest, lowest, f"lowest validation {metric}; no simpler trial within one SE")
    return Chosen(
        trial,
        lowest,
        f"simplest trial within one standard error of the lowest validation {metric} "
        f"(trial {lowest.number}): {gap:+.4g} against an error of {se:.4g}",
    )


def param_importances(
    space: Mapping[str, Dimension], trials: Sequence[TrialRecord], *, metric: str, seed: int = 0
) -> dict[str, float]:
    """Optuna's parameter importances (fANOVA) over the complete trials; ``{}`` with fewer than
    two complete trials or when every complete trial has the same value."""
    import optuna

    done = [t for t in trials if t.state == "complete" and t.value is not None]
    if len(done) < 2 or len({t.value for t in done}) < 2:
        return {}
    study = study_rebuild(space, done, metric=metric, seed=seed)
    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=seed)
        importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ValueError, RuntimeError):
        return {}
    return {name: float(value) for name, value in importances.items()}


# --- in-process optimisation -------------------------------------------------------------------

# Small validation splits: the best of N trials by a validation score is optimistic by about
# that score's standard error times sqrt(2 ln N), and the standard error grows as the rows
# shrink, so many trials on few rows choose noise (40 trials on 20 rows chose a LightGBM that
# was worst on the held-out rows). A study runs at most one trial per
# ``VALIDATION_ROWS_PER_TRIAL`` validation rows, and never fewer than TPE's random start-up.
VALIDATION_ROWS_PER_TRIAL = 4
MIN_TRIALS = 5


def trial_budget(n_trials: int, validation_rows: int | None) -> int:
    """``n_trials`` capped by the validation split's size (unknown: not capped)."""
    if validation_rows is None:
        return int(n_trials)
    return min(int(n_trials), max(MIN_TRIALS, int(validation_rows) // VALIDATION_ROWS_PER_TRIAL))


@dataclass
class OptimiseResult:
    """``optimise``'s outcome: the kept trial's (``chosen_trial``: the simplest within one
    standard error of the lowest loss) params, validation value and model folder, why it was
    kept, and every trial (validation only)."""

    metric: str
    direction: str
    chosen_because: str
    best_number: int | None
    best_params: dict[str, Any]
    best_value: float | None
    best_model_dir: str
    trials: list[TrialRecord]
    elapsed_s: float = 0.0
    model_dirs: dict[int, str] = field(default_factory=dict)


def optimise(
    base_job_spec,
    *,
    n_trials: int,
    timeout_s: float | None = None,
    space: Mapping[str, Dimension] | Mapping[str, Any] | None = None,
    metric: str = "logloss",
    seed: int = 0,
    work_root: str | Path,
    threads: int = 0,
    pruner: PrunerConfig | str | None = None,
) -> OptimiseResult:
    """Tune ``base_job_spec`` (a ``training.data.JobSpec``: template, dataset, fixed params) by
    running up to ``n_trials`` trials here, one after another, through ``training.runner.train``
    with the sampler and pruner a tuning job uses. No trial starts after ``timeout_s``. A trial
    the pruner rejects stops at its next epoch boundary. ``space``: a ``SearchSpace`` or its
    JSON (default: the template's). Each trial trains in ``work_root/trial-<n>``. The first
    trial's validation rows cap the trials (``trial_budget``)."""
    from training import runner

    direction = direction_of(metric)
    template = base_job_spec.template
    if space is None:
        space = default_space(template)
    elif space and not all(isinstance(v, Dimension) for v in space.values()):
        space = space_from_json(template, dict(space))
    space = dict(space)
    if isinstance(pruner, str):
        pruner = PrunerConfig(kind=pruner)
    pruner = pruner or PrunerConfig()
    root = Path(work_root)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    records: list[TrialRecord] = []
    model_dirs: dict[int, str] = {}
    budget = int(n_trials)
    for number in range(int(n_trials)):
        if number >= budget:
            break
        if timeout_s is not None and time.monotonic() - started >= timeout_s:
            break
        sampled = ask(space, records, metric=metric, seed=seed)
        params = {**base_job_spec.params, **derived_params(template, sampled)}
        if threads:
            params["threads"] = int(threads)
        spec = replace(
            base_job_spec,
            job_id=number,
            params=params,
            work_dir=str(root / f"trial-{number}"),
        )
        state = _InProcessTrial(number, sampled, metric)

        def sink(event: dict, state=state) -> None:
            state.event(event)
            if state.new_epoch:
                state.new_epoch = False
                current = [*records, state.record()]
                prune, attrs = prune_decision(
                    space, current, state.number, metric=metric, seed=seed, pruner=pruner
                )
                state.pruner_attrs = attrs
                if prune:
                    state.pruned = True
                    state.stop.set()

        code = runner.train(spec, emit=runner.Emitter(sink), stop=state.stop)
        record = state.finish(code)
        records.append(record)
        if state.validation_rows is not None:
            budget = trial_budget(n_trials, state.validation_rows)
        if record.state == "complete":
            model_dirs[number] = str(spec.model_dir)
    losses = {
        number: runner.selection_row_losses(Path(folder).parent)
        for number, folder in model_dirs.items()
    }
    chosen = chosen_trial(
        records, metric, space, {n: rows for n, rows in losses.items() if rows is not None}
    )
    best = chosen.trial if chosen else None
    return OptimiseResult(
        metric=metric,
        direction=direction,
        chosen_because=chosen.reason if chosen else "",
        best_number=best.number if best else None,
        best_params=dict(best.params) if best else {},
        best_value=best.value if best else None,
        best_model_dir=model_dirs.get(best.number, "") if best else "",
        trials=records,
        elapsed_s=time.monotonic() - started,
        model_dirs=model_dirs,
    )


class _InProcessTrial:
    """One in-process trial's validation curve, read from the runner's events."""

    def __init__(self, number: int, params: dict[str, Any], metric: str) -> None:
        from training.runner import StopFlag

        self.number, self.params, self.metric = number, params, metric
        self.points: list[tuple[int, float]] = []
        self.validation: dict[str, Any] | None = None
        self.validation_rows: int | None = None
        self.new_epoch = False
        self.pruned = False
        self.pruner_attrs: dict[str, Any] = {}
        self.stop = StopFlag()

    def event(self, event: dict) -> None:
        if event.get("type") == "start" and _number(event.get("validation_rows")):
            self.validation_rows = int(event["validation_rows"])
        elif event.get("type") == "metric" and event.get("name") == f"val_{self.metric}":
            self.points.append((int(event["step"]), event["value"]))
            self.new_epoch = True
        elif event.get("type") == "done":
            # Only the validation block reaches the tuner; the held-out metrics stay behind.
            self.validation = dict((event.get("metrics") or {}).get("validation") or {})

    def record(self, state: str = "running", value: float | None = None) -> TrialRecord:
        return TrialRecord(
            number=self.number,
            params=dict(self.params),
            state=state,
            value=value,
            intermediate=validation_curve(self.points),
            pruner_attrs=dict(self.pruner_attrs),
        )

    def finish(self, code: int) -> TrialRecord:
        from training.runner import EXIT_STOPPED

        curve = validation_curve(self.points)
        if self.pruned and code == EXIT_STOPPED:
            last = curve[max(curve)] if curve else None
            return self.record("pruned", last)
        value = validation_value(self.validation, self.metric) if code == 0 else None
        return self.record("complete" if value is not None else "failed", value)
