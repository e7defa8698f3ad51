"""Benchmark sets (X4's second phase): versioned evaluation sets of the workspace that every new
model version of their kind is scored on without anyone asking, shown on the version page
beside the production version's scores on the same rows.

- A **ranking** set is a frozen sample: a feature-store dataset (its label column and, for NDCG,
  the label group's first entity key as the group) or a ranking record set (``curation``'s
  format ``to: ranking``). A version is scored through its bundle's serving path
  (``Bundle.predict`` on the raw columns, the encoding serving uses): AUC, log loss and ECE
  (``training.evaluation.summary``, the numbers the job page shows), and NDCG@k per group.
- A **language** set is a record set of instruction or chat rows. A version generates a greedy
  response to each prompt (``serving.lm_inference``) and is scored against the reference
  response: exact match and token F1 (SQuAD's normalisation: lower case, no punctuation or
  articles), ROUGE-L (F-measure of the longest common subsequence of words) and the perplexity
  of the reference responses (training's own loss on them).

Every registration (``serving.registry``) asks for scores of the new version on the latest
version of each set of its kind, and of each production version of the same model that has
none yet; a new set asks for scores of each model's latest and production versions. The scores
are computed on a worker (``serving.tasks.score_benchmarks``); a version whose bundle lacks the
set's columns, or of another kind, is "not applicable" with the reason.

NDCG, exact match, token F1 and ROUGE-L are written here: scikit-learn's ``ndcg_score`` wants
groups of equal size (a dense matrix) and the ROUGE package pulls in NLTK and absl for one
longest-common-subsequence; each of these is a few lines of arithmetic, tested against hand
worked cases in ``serving/tests/test_benchmarks.py``.
"""

from __future__ import annotations

import logging
import math
import re
import string
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from serving.models import (
    BenchmarkKind,
    BenchmarkScore,
    BenchmarkScoreState,
    BenchmarkSet,
    Deployment,
    ModelVersion,
)
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError

logger = logging.getLogger(__name__)

# Rows a language set's versions generate for (generation takes tens of ms a row on a CPU even
# for small models); a ranking set scores every row up to the second limit.
MAX_LANGUAGE_ROWS = 200
MAX_RANKING_ROWS = 2_000_000
# A score still "running" this long after it was asked for lost its worker: run it again.
STALE_RUNNING = timedelta(minutes=30)
LANGUAGE_METRICS = ("exact_match", "token_f1", "rouge_l", "perplexity")
RANKING_METRICS = ("auc", "logloss", "ece", "ndcg")
# Which way is better, for the deltas on the version page.
HIGHER_IS_BETTER = {
    "auc": True,
    "ndcg": True,
    "exact_match": True,
    "token_f1": True,
    "rouge_l": True,
    "logloss": False,
    "ece": False,
    "perplexity": False,
}


# --- metrics -------------------------------------------------------------------------------


def ndcg_at_k(label: np.ndarray, score: np.ndarray, group: np.ndarray, k: int) -> dict:
    """Mean NDCG@k over the groups with at least two rows and one positive (gain ``label``,
    discount ``1 / log2(rank + 1)``); ties in score keep the rows' order. ``groups`` is how
    many groups counted."""
    y = np.asarray(label, dtype=np.float64)
    s = np.asarray(score, dtype=np.float64)
    _, codes = np.unique(np.asarray(group).astype(str), return_inverse=True)
    if not len(y):
        return {"ndcg": None, "groups": 0}

    def dcg(order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        g = codes[order]
        starts = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
        counts = np.diff(np.r_[starts, len(g)])
        rank = np.arange(len(g)) - np.repeat(starts, counts)
        gain = np.where(rank < k, y[order] / np.log2(rank + 2.0), 0.0)
        return np.add.reduceat(gain, starts), counts

    got, counts = dcg(np.lexsort((-s, codes)))
    ideal, _ = dcg(np.lexsort((-y, codes)))
    valid = (ideal > 0) & (counts >= 2)
    if not valid.any():
        return {"ndcg": None, "groups": 0}
    return {"ndcg": float(np.mean(got[valid] / ideal[valid])), "groups": int(valid.sum())}


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalise(text: str) -> list[str]:
    """SQuAD's answer normalisation, as words: lower case, punctuation and articles removed."""
    return _ARTICLES.sub(" ", str(text).lower().translate(_PUNCTUATION)).split()


def exact_match(prediction: str, reference: str) -> float:
    return float(normalise(prediction) == normalise(reference))


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalise(prediction), normalise(reference)
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure on lower-cased words (beta 1)."""
    pred, ref = str(prediction).lower().split(), str(reference).lower().split()
    if not pred or not ref:
        return float(pred == ref)
    previous = [0] * (len(ref) + 1)
    for word in pred:
        current = [0]
        for j, other in enumerate(ref):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if not lcs:
        return 0.0
    precision, recall = lcs / len(pred), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


# --- sets ----------------------------------------------------------------------------------


def _source_path(benchmark: BenchmarkSet) -> Path:
    if benchmark.dataset is not None:
        from features.selectors import dataset_file

        return dataset_file(benchmark.dataset)
    from curation.services import record_set_file

    assert benchmark.record_set is not None  # a set has exactly one source
    return record_set_file(benchmark.record_set)


def _columns(path: Path) -> list[str]:
    import pyarrow.dataset as ds

    return list(ds.dataset(str(path), format="parquet").schema.names)


def _read(path: Path, columns: list[str] | None = None, limit: int | None = None) -> Any:
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(path), format="parquet")
    return dataset.head(limit, columns=columns) if limit else dataset.to_table(columns=columns)


def _binary_labels(values: list[Any], column: str) -> np.ndarray:
    """0/1 labels from booleans or numbers 0 and 1; ``ValidationError`` naming the column."""
    out = np.zeros(len(values), dtype=np.float64)
    for i, value in enumerate(values):
        if isinstance(value, bool) or value in (0, 1):
            out[i] = float(value)
        else:
            raise ValidationError(
                {
                    "label_column": f"column {column} must hold 0/1 or true/false labels; "
                    f"row {i} holds {value!r}"
                }
            )
    return out


def _language_columns(columns: list[str]) -> bool:
    return "messages" in columns or {"instruction", "output"} <= set(columns)


@transaction.atomic
def benchmark_set_create(
    *,
    actor: Actor,
    workspace: Any,
    name: str,
    dataset: Any = None,
    record_set: Any = None,
    label_column: str = "",
    group_column: str = "",
    ndcg_k: int = 10,
    max_new_tokens: int = 64,
    description: str = "",
) -> BenchmarkSet:
    """The next version of benchmark set ``name`` over a ready dataset or record set (exactly
    one). Its kind follows the source: a record set of instruction or chat rows is a language
    set, any other source a ranking set whose label column holds 0/1. Every model's latest and
    production versions of that kind are then scored on it."""
    if (dataset is None) == (record_set is None):
        raise ValidationError({"source": "give a dataset or a record set (exactly one)"})
    source = dataset if dataset is not None else record_set
    source_attr = "dataset" if dataset is not None else "record_set"
    if getattr(source, "status", "") != "ready":
        raise ValidationError(
            {source_attr: f"{source} is {getattr(source, 'status', '?')}, not ready"}
        )
    if not 1 <= int(ndcg_k) <= 1000:
        raise ValidationError({"ndcg_k": "between 1 and 1000"})
    if not 1 <= int(max_new_tokens) <= 256:
        raise ValidationError({"max_new_tokens": "between 1 and 256"})
    path = _source_path(BenchmarkSet(dataset=dataset, record_set=record_set))
    columns = _columns(path)
    if record_set is not None and _language_columns(columns):
        kind = BenchmarkKind.LANGUAGE
        label_column = group_column = ""
        rows = int(record_set.row_count)
    else:
        kind = BenchmarkKind.RANKING
        if not label_column:
            labels = list(getattr(dataset, "label_columns", None) or []) if dataset else []
            label_column = labels[0] if labels else "label"
        if label_column not in columns:
            raise ValidationError(
                {"label_column": f"no column {label_column}; the columns are: {', '.join(columns)}"}
            )
        if not group_column and dataset is not None:
            keys = [k for k in dataset.label_group.entity_keys or [] if k in columns]
            group_column = keys[0] if keys else ""
        if group_column and group_column not in columns:
            raise ValidationError(
                {"group_column": f"no column {group_column}; the columns are: {', '.join(columns)}"}
            )
        values = _read(path, [label_column]).column(0).to_pylist()
        y = _binary_labels(values, label_column)
        if not len(y) or y.min() == y.max():
            raise ValidationError(
                {source_attr: f"{source} needs rows of both labels in {label_column} to score AUC"}
            )
        rows = len(y)
    latest = (
        BenchmarkSet.objects.for_workspace(workspace)
        .filter(name=name)
        .aggregate(top=Max("version"))["top"]
    )
    benchmark = BenchmarkSet(
        workspace=workspace,
        name=name,
        version=(latest or 0) + 1,
        kind=kind,
        dataset=dataset,
        record_set=record_set,
        label_column=label_column,
        group_column=group_column,
        ndcg_k=int(ndcg_k),
        max_new_tokens=int(max_new_tokens),
        rows=rows,
        description=str(description or "")[:2000],
        created_by=actor_user(actor),
    )
    benchmark.full_clean(exclude=["workspace", "dataset", "record_set", "created_by"])
    try:
        with transaction.atomic():
            benchmark.save()
    except IntegrityError as exc:
        raise ConflictError(
            f"benchmark set '{name}' v{benchmark.version} was created at the same moment",
            attr="name",
        ) from exc
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.benchmark_set.created",
        refs=[Ref.to(benchmark, role="output"), Ref.to(source, role="input")],
        payload={"name": name, "version": benchmark.version, "kind": kind, "rows": rows},
    )
    newest = (
        ModelVersion.objects.for_workspace(workspace)
        .values("model_id")
        .annotate(top=Max("version"))
        .values_list("model_id", "top")
    )
    wanted = Q()
    for model_id, top in newest:
        wanted |= Q(model_id=model_id, version=top)
    versions: list[ModelVersion] = (
        list(ModelVersion.objects.for_workspace(workspace).filter(wanted)) if wanted else []
    )
    versions += [
        d.version for d in Deployment.objects.for_workspace(workspace).select_related("version")
    ]
    _request(workspace, [benchmark], versions)
    return benchmark


def version_kind(version: ModelVersion) -> str:
    from training.bundle import is_language_model

    template = str((version.spec or {}).get("template") or "")
    return BenchmarkKind.LANGUAGE if is_language_model(template) else BenchmarkKind.RANKING


def latest_sets(workspace: Any) -> list[BenchmarkSet]:
    """The newest version of each benchmark set name of the workspace."""
    newest: dict[str, BenchmarkSet] = {}
    for benchmark in BenchmarkSet.objects.for_workspace(workspace).order_by("name", "-version"):
        newest.setdefault(benchmark.name, benchmark)
    return list(newest.values())


def _request(workspace: Any, sets: list[BenchmarkSet], versions: list[ModelVersion]) -> list[int]:
    """Queued scores for each (set, version) of the same kind that has none; the worker is
    asked for them once the transaction commits."""
    wanted = {
        (b.pk, v.pk): (b, v)
        for b in sets
        for v in versions
        if v is not None and version_kind(v) == b.kind
    }
    if not wanted:
        return []
    have = set(
        BenchmarkScore.objects.for_workspace(workspace)
        .filter(benchmark__in=list(sets), version__in={v.pk for _, v in wanted.values()})
        .values_list("benchmark_id", "version_id")
    )
    created = BenchmarkScore.objects.bulk_create(
        [
            BenchmarkScore(workspace=workspace, benchmark=b, version=v)
            for key, (b, v) in wanted.items()
            if key not in have
        ],
        ignore_conflicts=True,
    )
    ids = list(
        BenchmarkScore.objects.for_workspace(workspace)
        .filter(
            benchmark__in=sets,
            version__in={v.pk for _, v in wanted.values()},
            state=BenchmarkScoreState.QUEUED,
        )
        .values_list("pk", flat=True)
    )
    if created and ids:
        from serving.tasks import score_benchmarks

        transaction.on_commit(lambda: score_benchmarks.delay(ids))
    return ids


def benchmarks_request_for_version(*, workspace: Any, version: ModelVersion) -> list[int]:
    """On registration: the new version, and the production versions of its model that have
    no score yet, on the newest version of every set of its kind."""
    sets = latest_sets(workspace)
    if not sets:
        return []
    productions = [
        d.version
        for d in Deployment.objects.for_workspace(workspace)
        .filter(model_id=version.model_id)
        .select_related("version")
    ]
    return _request(workspace, sets, [version, *productions])


def benchmark_rescore(*, actor: Actor, workspace: Any, score: BenchmarkScore) -> BenchmarkScore:
    """Ask for a failed score again (409 while one is queued or running)."""
    from serving.tasks import score_benchmarks

    with transaction.atomic():
        locked = (
            BenchmarkScore.objects.for_workspace(workspace).select_for_update().get(pk=score.pk)
        )
        if locked.state in (BenchmarkScoreState.QUEUED, BenchmarkScoreState.RUNNING):
            raise ConflictError(f"the score is already {locked.state}", attr="state")
        locked.state = BenchmarkScoreState.QUEUED
        locked.requested_at = timezone.now()
        locked.detail = ""
        locked.save(update_fields=["state", "requested_at", "detail"])
        transaction.on_commit(lambda: score_benchmarks.delay([locked.pk]))
    return locked


# --- scoring (the worker) ------------------------------------------------------------------


def _score_ranking(benchmark: BenchmarkSet, version: ModelVersion) -> tuple[str, dict, str]:
    from serving.registry import load_version
    from training.evaluation import summary

    bundle = load_version(version)
    path = _source_path(benchmark)
    columns = set(_columns(path))
    needed = sorted({f.column for f in bundle.spec.features})
    missing = [c for c in needed if c not in columns]
    if missing:
        return (
            BenchmarkScoreState.NOT_APPLICABLE,
            {},
            f"the set has no column for {len(missing)} of the model's features: "
            + ", ".join(missing[:8]),
        )
    read = [*needed, benchmark.label_column]
    if benchmark.group_column and benchmark.group_column not in read:
        read.append(benchmark.group_column)
    table = _read(path, read, limit=MAX_RANKING_ROWS)
    n = table.num_rows
    data = {c: table.column(c).to_pylist() for c in needed}
    label = _binary_labels(table.column(benchmark.label_column).to_pylist(), "label")
    prob = np.asarray(bundle.predict(data, n), dtype=np.float64).reshape(-1)
    metrics = {k: v for k, v in summary(label, prob).items() if k in ("auc", "logloss", "ece")}
    metrics["rows"] = n
    if benchmark.group_column:
        ranked = ndcg_at_k(
            label,
            prob,
            np.asarray(table.column(benchmark.group_column).to_pylist()),
            benchmark.ndcg_k,
        )
        metrics["ndcg"] = ranked["ndcg"]
        metrics["ndcg_groups"] = ranked["groups"]
        metrics["ndcg_k"] = benchmark.ndcg_k
    return BenchmarkScoreState.DONE, metrics, ""


def _score_language(benchmark: BenchmarkSet, version: ModelVersion) -> tuple[str, dict, str]:
    from serving import lm_inference

    rows = _read(_source_path(benchmark), limit=MAX_LANGUAGE_ROWS).to_pylist()
    prompts = [lm_inference.prompt_of(r) for r in rows]
    references = [lm_inference.reference_of(r) for r in rows]
    made = lm_inference.generate(version, prompts, max_new_tokens=benchmark.max_new_tokens)
    held = lm_inference.perplexity(version, rows)
    metrics: dict[str, Any] = {
        "exact_match": float(
            np.mean([exact_match(p, r) for p, r in zip(made, references, strict=True)])
        ),
        "token_f1": float(np.mean([token_f1(p, r) for p, r in zip(made, references, strict=True)])),
        "rouge_l": float(np.mean([rouge_l(p, r) for p, r in zip(made, references, strict=True)])),
        "perplexity": held.get("perplexity"),
        "rows": len(rows),
        "examples": [
            {"prompt": p[-300:], "reference": r[:300], "output": m[:300]}
            for p, r, m in list(zip(prompts, references, made, strict=True))[:3]
        ],
    }
    return BenchmarkScoreState.DONE, metrics, ""


def benchmark_score_run(score_id: int) -> str:
    """The worker's side: compute one queued score once (a redelivered task finds it done)."""
    now = timezone.now()
    with transaction.atomic():
        score = BenchmarkScore.objects.unscoped().select_for_update().filter(pk=score_id).first()
        if score is None:
            return "missing"
        stale = (
            score.state == BenchmarkScoreState.RUNNING and now - score.requested_at > STALE_RUNNING
        )
        if score.state != BenchmarkScoreState.QUEUED and not stale:
            return str(score.state)
        score.state = BenchmarkScoreState.RUNNING
        score.save(update_fields=["state"])
    score = (
        BenchmarkScore.objects.unscoped()
        .select_related("benchmark", "benchmark__dataset", "benchmark__record_set", "version")
        .get(pk=score_id)
    )
    benchmark, version = score.benchmark, score.version
    state: str
    metrics: dict[str, Any]
    detail: str
    try:
        if version_kind(version) != benchmark.kind:
            state, metrics, detail = (
                BenchmarkScoreState.NOT_APPLICABLE,
                {},
                f"a {version_kind(version)} model on a {benchmark.kind} set",
            )
        elif benchmark.kind == BenchmarkKind.LANGUAGE:
            state, metrics, detail = _score_language(benchmark, version)
        else:
            state, metrics, detail = _score_ranking(benchmark, version)
    except Exception as exc:
        logger.warning("benchmark score %s failed", score_id, exc_info=True)
        state, metrics, detail = BenchmarkScoreState.FAILED, {}, f"{type(exc).__name__}: {exc}"
    metrics = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in metrics.items()
    }
    with transaction.atomic():
        _finish(score, state=state, metrics=metrics, detail=detail)
    return str(state)


def _finish(score: BenchmarkScore, *, state: str, metrics: dict, detail: str) -> None:
    benchmark, version = score.benchmark, score.version
    BenchmarkScore.objects.unscoped().filter(pk=score.pk).update(
        state=state, metrics=metrics, detail=detail[:500], scored_at=timezone.now()
    )
    event_record(
        actor=None,
        workspace=score.workspace,
        verb="serving.benchmark_score.done"
        if state == "done"
        else f"serving.benchmark_score.{state}",
        refs=[Ref.to(version, role="subject"), Ref.to(benchmark, role="input")],
        payload={
            "benchmark": str(benchmark),
            "version": str(version),
            "state": state,
            "metrics": {
                k: v for k, v in metrics.items() if k in (*RANKING_METRICS, *LANGUAGE_METRICS)
            },
        },
    )


# --- reads for the version page --------------------------------------------------------------


def version_benchmarks(version: ModelVersion) -> dict[str, Any]:
    """The version's scores on the newest version of each set, beside each production version
    of its model on the same set: ``{"sets": [...], "productions": [...]}`` where a set's
    ``rows`` are ``(metric, this version, [(production value, delta, better)])``."""
    workspace = version.workspace_id
    sets = [b for b in latest_sets(workspace) if b.kind == version_kind(version)]
    if not sets:
        return {"sets": [], "productions": []}
    productions = list(
        Deployment.objects.for_workspace(workspace)
        .filter(model_id=version.model_id)
        .select_related("version")
        .order_by("name")
    )
    ids = {version.pk, *(d.version_id for d in productions)}
    scores = {
        (s.benchmark_id, s.version_id): s
        for s in BenchmarkScore.objects.for_workspace(workspace).filter(
            benchmark__in=sets, version_id__in=ids
        )
    }
    out = []
    for benchmark in sets:
        mine = scores.get((benchmark.pk, version.pk))
        theirs = [scores.get((benchmark.pk, d.version_id)) for d in productions]
        names = LANGUAGE_METRICS if benchmark.kind == BenchmarkKind.LANGUAGE else RANKING_METRICS
        rows = []
        for metric in names:
            value = (mine.metrics or {}).get(metric) if mine and mine.state == "done" else None
            others = []
            for other in theirs:
                prod = (
                    (other.metrics or {}).get(metric) if other and other.state == "done" else None
                )
                delta = value - prod if value is not None and prod is not None else None
                better = None
                if delta is not None and delta != 0:
                    better = (delta > 0) == HIGHER_IS_BETTER[metric]
                others.append({"value": prod, "delta": delta, "better": better})
            if value is not None or any(o["value"] is not None for o in others):
                rows.append({"metric": metric, "value": value, "production": others})
        out.append({"set": benchmark, "score": mine, "production_scores": theirs, "rows": rows})
    return {"sets": out, "productions": productions}
