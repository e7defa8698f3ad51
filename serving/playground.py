"""The playground (X4's quick trial): a version tried by hand before it takes any traffic.

- A ranking model takes a request of raw feature values, one row per candidate, keyed by
  feature reference (``users:age``) as its version page lists them, and answers each row's
  click probability. The rows are scored by a sandbox replica of the version: a
  ``serving.model_server score`` process started for the request, as a uid of its own, from a
  private copy of the bundle, with no platform credential in its environment (the release
  gates' sandbox, ``serving.gates.model_server_run``), never by the gateway's production
  replicas. The form starts from the newest rows of the version's training dataset.
- A language model takes a prompt and continues it greedily (``serving.lm_inference``: the
  platform-written adapter or model folder, read with ``local_files_only``; no user code).

Each trial is an event (``serving.model_version.tried``) with its size, not its content.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from serving import artifacts
from serving.models import ModelVersion
from workspaces.events import Actor, Ref, event_record
from workspaces.models import Workspace

MAX_ROWS = 100
MAX_PROMPT_CHARS = 4000
EXAMPLE_ROWS = 3


def is_language(version: ModelVersion) -> bool:
    from serving.gates import language_model

    return language_model(version)


def _features(version: ModelVersion) -> list[dict[str, Any]]:
    return [f for f in (version.spec or {}).get("features") or [] if isinstance(f, dict)]


def example_rows(version: ModelVersion, count: int = EXAMPLE_ROWS) -> list[dict[str, Any]]:
    """Rows to start the request form from: the newest ``count`` rows of the version's
    training dataset (its feature columns, by reference), else made-up values of each type."""
    features = _features(version)
    rows: list[dict[str, Any]] = []
    if version.dataset is not None:
        try:
            import pyarrow.parquet as pq

            from features.selectors import dataset_file

            table = pq.read_table(dataset_file(version.dataset))
            names = [f["column"] for f in features if f.get("column") in table.column_names]
            if "event_time" in table.column_names:
                import pyarrow.compute as pc

                table = table.take(pc.sort_indices(table, [("event_time", "descending")]))
            for raw in table.select(names).slice(0, count).to_pylist():
                rows.append(
                    {f["ref"]: raw.get(f["column"]) for f in features if f["column"] in raw}
                )
        except (OSError, ValueError, KeyError):
            rows = []
    if rows:
        return rows
    from serving.model_server import synthetic_columns
    from training.bundle import BundleSpec

    spec = BundleSpec.from_json(version.spec)
    columns = synthetic_columns(spec, count, seed=0)
    return [{f.ref: columns[f.column][i] for f in spec.features} for i in range(count)]


def _value_problem(feature: dict[str, Any], value: Any) -> str:
    """Why ``value`` cannot be the feature's raw value ("" when it can)."""
    dtype = str(feature.get("dtype") or "float")
    if value is None:
        return ""
    scalar = isinstance(value, str | int | float | bool)
    if dtype in ("float", "int", "bool"):
        ok = isinstance(value, int | float | bool)
        return "" if ok else f"takes a number or true/false ({dtype}) or null"
    if dtype in ("categorical", "string"):
        return "" if scalar else "takes a text or a number (categorical) or null"
    if dtype == "categorical_list":
        ok = isinstance(value, list) and all(isinstance(v, str | int | float) for v in value)
        return "" if ok else "takes a list of texts or numbers (categorical_list) or null"
    if dtype == "embedding":
        dim = int(feature.get("dim") or 1)
        ok = (
            isinstance(value, list)
            and len(value) == dim
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        )
        return "" if ok else f"takes a list of {dim} numbers (embedding) or null"
    return ""


def clean_rows(version: ModelVersion, value: Any, *, attr: str = "rows") -> list[dict[str, Any]]:
    """The request's rows checked against the version's features: a list of 1 to ``MAX_ROWS``
    objects keyed by feature reference (a feature left out is missing, as a null in the
    online store would be); 400 naming the row, the key and what it takes."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValidationError({attr: f"not JSON: {exc}"}) from exc
    if not isinstance(value, list) or not value:
        raise ValidationError({attr: "give a list of rows, one object per candidate"})
    if len(value) > MAX_ROWS:
        raise ValidationError({attr: f"{len(value)} rows: at most {MAX_ROWS} in one trial"})
    features = {f["ref"]: f for f in _features(version)}
    for index, row in enumerate(value, start=1):
        if not isinstance(row, dict):
            raise ValidationError({attr: f"row {index} is not an object of feature values"})
        unknown = sorted(set(row) - set(features))
        if unknown:
            raise ValidationError(
                {
                    attr: f"row {index}: {unknown[0]!r} is not a feature of {version}; "
                    f"allowed keys: {', '.join(sorted(features))}"
                }
            )
        for ref, raw in row.items():
            problem = _value_problem(features[ref], raw)
            if problem:
                raise ValidationError({attr: f"row {index}: {ref} {problem} (got {raw!r})"})
    return value


def try_ranker(
    *, actor: Actor, workspace: Workspace, version: ModelVersion, rows: Any
) -> dict[str, Any]:
    """Each row's click probability from a sandbox replica of ``version``."""
    rows = clean_rows(version, rows)
    refs = [f["ref"] for f in _features(version)]
    columns = {ref: [row.get(ref) for row in rows] for ref in refs}
    path = artifacts.resolve_artifact(version.artifact_path, attr="artifact_path")
    artifacts.check_bundle_dir(path, attr="artifact_path")
    began = time.perf_counter()
    if getattr(settings, "SERVING_SANDBOX", "process") == "inprocess":
        from serving.model_server import score
        from serving.registry import load_version

        answer = score(load_version(version), columns, len(rows))
        replica = "in-process sandbox"
    else:
        from serving.gates import model_server_run

        request = json.dumps({"columns": columns, "n": len(rows)})
        answer = model_server_run(version, path, ["score"], stdin=request)
        replica = "sandbox model-server process"
    if "error" in answer:
        problem = answer["error"]
        raise ValidationError({"rows": f"the sandbox replica could not score them: {problem}"})
    result = {
        "kind": "ranking",
        "version": version.version,
        "replica": replica,
        "scores": answer["scores"],
        "rows": rows,
        "model_ms": answer["ms"],
        "total_ms": (time.perf_counter() - began) * 1000,
    }
    _record(actor, workspace, version, {"rows": len(rows), "replica": replica})
    return result


def try_language(
    *,
    actor: Actor,
    workspace: Workspace,
    version: ModelVersion,
    prompt: Any,
    max_new_tokens: Any = 64,
) -> dict[str, Any]:
    """A greedy continuation of ``prompt`` by the language-model ``version``."""
    from serving import lm_inference

    if not isinstance(prompt, str) or not prompt.strip():
        raise ValidationError({"prompt": "give a prompt for the model to continue"})
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValidationError(
            {"prompt": f"{len(prompt)} characters: at most {MAX_PROMPT_CHARS} in one trial"}
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValidationError({"max_new_tokens": "give a whole number of tokens"})
    if not 1 <= max_new_tokens <= lm_inference.MAX_NEW_TOKENS:
        raise ValidationError(
            {"max_new_tokens": f"between 1 and {lm_inference.MAX_NEW_TOKENS} tokens"}
        )
    began = time.perf_counter()
    try:
        (completion,) = lm_inference.generate(version, [prompt], max_new_tokens=max_new_tokens)
    except lm_inference.LanguageModelError as exc:
        raise ValidationError({"prompt": str(exc)}) from exc
    result = {
        "kind": "language",
        "version": version.version,
        "replica": "in-process (platform-written model files, no user code)",
        "prompt": prompt,
        "completion": completion,
        "max_new_tokens": max_new_tokens,
        "total_ms": (time.perf_counter() - began) * 1000,
    }
    _record(actor, workspace, version, {"prompt_chars": len(prompt), "tokens": max_new_tokens})
    return result


@transaction.atomic
def _record(actor: Actor, workspace: Workspace, version: ModelVersion, payload: dict) -> None:
    event_record(
        actor=actor,
        workspace=workspace,
        verb="serving.model_version.tried",
        refs=[Ref.to(version)],
        payload={"version": version.version, **payload},
    )
