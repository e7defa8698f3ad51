"""Release gates (S2): a version takes no traffic until both pass.

- ``consistency``: for a sample of real entities from the version's training dataset, the
  serving path (online-store values fetched by entity keys through the features lookup service,
  the version's serving transforms, the ``FeatureEncoder``) and the training path (the dataset's
  own rows through the same encoder) must give the same model inputs and scores to 1e-6.
- ``performance``: p50/p99 latency and throughput of one model-server process scoring the
  workspace's request shape (``candidates`` per request), against the workspace's limits.

Results are stored on the version (``gates``, ``gate_status``) and written to the event log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from serving import artifacts
from serving.models import GateStatus, ModelVersion
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace

TOLERANCE = 1e-6
DEFAULT_LIMITS = {"candidates": 100, "p50_ms": 20.0, "p99_ms": 50.0, "min_rps": 50.0}
GATES = ("consistency", "performance")


def workspace_limits(workspace: Workspace) -> dict[str, float]:
    limits = dict(DEFAULT_LIMITS)
    limits.update(getattr(settings, "SERVING_LIMITS", {}) or {})
    template = workspace.template if isinstance(workspace.template, dict) else {}
    custom = template.get("serving_limits")
    if isinstance(custom, dict):
        limits.update({k: v for k, v in custom.items() if k in DEFAULT_LIMITS})
    return limits


def language_model(version: ModelVersion) -> bool:
    """Whether ``version`` is a language model (``lm_lora``, ``lm_full``): the ranking gates and
    the ranking gateway do not apply to it."""
    from training.bundle import is_language_model

    return is_language_model(str((version.spec or {}).get("template") or ""))


LANGUAGE_MODEL_DETAIL = (
    "a language model (LoRA adapter): the ranking gateway serves ranking models only, and the "
    "consistency and performance gates compare ranking features"
)


def require_deployable(version: ModelVersion) -> None:
    """409 naming the gate unless every gate passed (naming the version for a language model,
    which the ranking gateway does not serve)."""
    if language_model(version):
        raise ConflictError(f"{version} is {LANGUAGE_MODEL_DETAIL}", attr="version_id")
    gates = version.gates or {}
    for gate in gates_of(version):
        result = gates.get(gate) or {}
        status = result.get("status", GateStatus.PENDING)
        if status != GateStatus.PASSED:
            detail = f": {result['detail']}" if result.get("detail") else ""
            raise ConflictError(
                f"{version} has not passed the {gate} gate ({status}){detail}", attr=gate
            )


def _sample_rows(version: ModelVersion, sample: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    from features.selectors import dataset_file

    table = pq.read_table(dataset_file(version.dataset))
    rows = table.to_pylist()
    if not rows:
        return []
    # The online store holds each entity's latest values: compare against each entity's latest
    # row in the dataset.
    rows.sort(key=lambda r: str(r.get("event_time") or ""))
    return rows[-sample:] if len(rows) > sample else rows


def mapping_check(version: ModelVersion, mapping: dict[str, str]) -> dict[str, Any] | None:
    """An imported model's input mapping against its declared dataset: a verdict when the
    mapping decides the gate (plain inputs only: passed, nothing to compare; a feature outside
    the dataset or no dataset: failed), else None (compare the two paths as for any bundle)."""
    refs = [ref for ref in mapping.values() if ":" in ref]
    if not refs:
        return {
            "status": GateStatus.PASSED,
            "input_mapping": mapping,
            "detail": "plain inputs from the request: no feature to compare",
        }
    if version.dataset_id is None:
        return {
            "status": GateStatus.FAILED,
            "input_mapping": mapping,
            "detail": "the input mapping names features but no training dataset to compare against",
        }
    declared = set(version.dataset.feature_refs or []) if version.dataset else set()
    outside = [ref for ref in refs if ref not in declared]
    if outside:
        return {
            "status": GateStatus.FAILED,
            "input_mapping": mapping,
            "detail": f"the input mapping names features outside dataset {version.dataset}: "
            + ", ".join(outside),
        }
    return None


def consistency_check(version: ModelVersion, *, sample: int = 50) -> dict[str, Any]:
    from serving.inference import build_plan, serving_columns
    from serving.registry import load_version

    mapping = ((version.spec or {}).get("extra") or {}).get("input_mapping")
    if mapping is not None:
        refused = mapping_check(version, mapping)
        if refused is not None:
            return refused
    if version.dataset_id is None:
        return {"status": GateStatus.FAILED, "detail": "no training dataset to compare against"}
    bundle = load_version(version)
    plan = build_plan(version.workspace_id, bundle.spec)
    rows = _sample_rows(version, sample)
    if not rows:
        return {"status": GateStatus.FAILED, "detail": "the training dataset has no rows"}
    # Keep one row per entity combination (latest wins).
    by_key: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(str(row.get(k)) for keys in plan.keys.values() for k in keys)
        by_key[key] = row
    rows = list(by_key.values())
    n = len(rows)
    training = {f.column: [row.get(f.column) for row in rows] for f in bundle.spec.features}
    entities: dict[str, list] = {}
    for entity, keys in plan.keys.items():
        missing = [k for k in keys if k not in rows[0]]
        if missing:
            return {
                "status": GateStatus.FAILED,
                "detail": f"dataset has no key column {missing[0]}",
            }
        entities[entity] = [{k: row[k] for k in keys} for row in rows]
    context = [{c: row.get(c) for _, c, _ in plan.context} for row in rows]
    serving = serving_columns(
        workspace=version.workspace, plan=plan, entities=entities, context=context, n=n
    )
    t_dense, t_cat = bundle.encoder.encode(training, n)
    s_dense, s_cat = bundle.encoder.encode(serving, n)
    t_scores = bundle.predict(training, n)
    s_scores = bundle.predict(serving, n)
    input_diff = float(np.max(np.abs(t_dense - s_dense))) if t_dense.size else 0.0
    cat_mismatch = int(np.sum(t_cat != s_cat)) if t_cat.size else 0
    score_diff = float(np.max(np.abs(t_scores - s_scores))) if n else 0.0
    ok = input_diff <= TOLERANCE and cat_mismatch == 0 and score_diff <= TOLERANCE
    worst: list[str] = []
    if not ok and t_dense.size:
        per_col = np.max(np.abs(t_dense - s_dense), axis=0)
        dense_names = []
        for f in bundle.spec.dense_features:
            dense_names.extend([f.ref] * (f.dim if f.dtype == "embedding" else 1))
        worst = sorted({dense_names[i] for i in np.nonzero(per_col > TOLERANCE)[0]})
    return {
        "status": GateStatus.PASSED if ok else GateStatus.FAILED,
        "entities": n,
        "max_input_diff": input_diff,
        "categorical_mismatches": cat_mismatch,
        "max_score_diff": score_diff,
        "tolerance": TOLERANCE,
        "differing_features": worst,
        "detail": ""
        if ok
        else f"serving and training paths differ (max score diff {score_diff:.3g}"
        + (f"; features {', '.join(worst)}" if worst else "")
        + ")",
    }


@contextlib.contextmanager
def _one_measurement_at_a_time() -> Iterator[None]:
    """Performance gates on one machine measure one at a time: six parallel re-runs of the
    same version otherwise share the cores and time each other, and a live version failed its
    latency gate five times in six. A lock file under VAR_DIR serialises web and worker
    processes alike (the kernel drops it if a holder dies)."""
    folder = Path(settings.VAR_DIR) / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "serving-performance-gate.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _measure(
    version: ModelVersion, path: Path, *, mode: str, candidates: int, seconds: float
) -> dict[str, Any]:
    if mode == "inprocess":
        from serving.model_server import sandbox
        from serving.registry import load_version

        return sandbox(load_version(version), candidates=candidates, seconds=seconds)
    return model_server_run(
        version,
        path,
        ["sandbox", "--candidates", str(candidates), "--seconds", str(seconds)],
    )


def model_server_run(
    version: ModelVersion, path: Path, arguments: list[str], *, stdin: str = ""
) -> dict[str, Any]:
    """One run of ``serving.model_server`` on ``version``'s bundle at ``path``, its last line
    of output as JSON (``{"error": ...}`` when it fails). The server loads a user artifact: as a
    uid of its own, from a private copy, with no platform credential in its environment
    (``training.sandbox``)."""
    from training import sandbox as user_code

    command, *rest = arguments
    scratch, staged = user_code.prepare_server(path, owner_id=version.pk)
    try:
        proc = subprocess.run(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, "-m", "serving.model_server", command, "--path", str(staged), *rest],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            **user_code.server_popen_args(scratch),
        )
    finally:
        scratch.remove()
    if proc.returncode != 0:
        return {"error": f"model server failed: {proc.stderr.strip()[-300:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def performance_check(version: ModelVersion, *, seconds: float | None = None) -> dict[str, Any]:
    """Sandbox: one model-server process scoring the workspace's request shape."""
    if seconds is None:
        seconds = float(getattr(settings, "SERVING_SANDBOX_SECONDS", 1.0))
    limits = workspace_limits(version.workspace)
    candidates = int(limits["candidates"])
    path = artifacts.resolve_artifact(version.artifact_path, attr="artifact_path")
    artifacts.check_bundle_dir(path, attr="artifact_path")
    mode = getattr(settings, "SERVING_SANDBOX", "process")
    source = _quantization_source(version)
    with _one_measurement_at_a_time():
        measured = _measure(version, path, mode=mode, candidates=candidates, seconds=seconds)
        beside = None
        if source is not None and "error" not in measured:
            # A quantised variant is measured beside the version it came from, in the same
            # sandbox and the same lock: the speed-up is one reading, not two days' apart.
            source_path = artifacts.resolve_artifact(source.artifact_path, attr="artifact_path")
            beside = _measure(
                source, source_path, mode=mode, candidates=candidates, seconds=seconds
            )
    if "error" in measured:
        return {"status": GateStatus.FAILED, "detail": measured["error"], "limits": limits}
    if source is not None and beside is not None and "error" not in beside:
        measured["source"] = {
            "version": source.version,
            **{k: beside[k] for k in ("p50_ms", "p99_ms", "rps", "requests")},
        }
        measured["speedup_p99"] = beside["p99_ms"] / measured["p99_ms"]
        measured["throughput_ratio"] = measured["rps"] / beside["rps"]
    failures = []
    if measured["p50_ms"] > limits["p50_ms"]:
        failures.append(f"p50 {measured['p50_ms']:.2f} ms > {limits['p50_ms']} ms")
    if measured["p99_ms"] > limits["p99_ms"]:
        failures.append(f"p99 {measured['p99_ms']:.2f} ms > {limits['p99_ms']} ms")
    if measured["rps"] < limits["min_rps"]:
        failures.append(f"throughput {measured['rps']:.0f}/s < {limits['min_rps']}/s")
    return {
        **measured,
        "mode": mode,
        "limits": limits,
        "status": GateStatus.FAILED if failures else GateStatus.PASSED,
        "detail": "; ".join(failures),
    }


def _quantization_source(version: ModelVersion) -> ModelVersion | None:
    """The version a quantised variant came from (None for any other version)."""
    from serving.quantization import is_quantized, quantization_of

    if not is_quantized(version):
        return None
    return (
        ModelVersion.objects.for_workspace(version.workspace_id)
        .filter(pk=quantization_of(version).get("source_version_id"))
        .first()
    )


def gates_of(version: ModelVersion) -> tuple[str, ...]:
    """The gates ``version`` must pass: ``GATES``, and ``quantization`` for a quantised
    variant (``serving.quantization``)."""
    from serving.quantization import is_quantized

    return (*GATES, "quantization") if is_quantized(version) else GATES


def version_gates_run(*, actor: Actor, workspace: Workspace, version: ModelVersion) -> ModelVersion:
    """Run the gates, store the results on the version and record an event."""
    from serving.quantization import quantization_check

    results: dict[str, Any] = {}
    not_applicable = language_model(version)
    checks: dict[str, Callable[[ModelVersion], dict[str, Any]]] = {
        "consistency": consistency_check,
        "performance": performance_check,
        "quantization": quantization_check,
    }
    for gate in gates_of(version):
        check = checks[gate]
        if not_applicable and gate in GATES:
            results[gate] = {
                "status": GateStatus.FAILED,
                "detail": f"not applicable: {LANGUAGE_MODEL_DETAIL}",
            }
            continue
        if (
            not not_applicable
            and results
            and any(r["status"] != GateStatus.PASSED for r in results.values())
        ):
            # Gates run in order; a version that already failed is not worth a sandbox run.
            results[gate] = {
                "status": GateStatus.FAILED,
                "detail": "skipped: an earlier gate failed",
            }
            continue
        try:
            result = check(version)
        except Exception as exc:  # noqa: BLE001 (a crashing gate is a failed gate, with why)
            result = {"status": GateStatus.FAILED, "detail": f"{type(exc).__name__}: {exc}"[:500]}
        result["checked_at"] = timezone.now().isoformat()
        results[gate] = result
    passed = all(r["status"] == GateStatus.PASSED for r in results.values())
    with transaction.atomic():
        ModelVersion.objects.for_workspace(workspace).filter(pk=version.pk).update(
            gates=results, gate_status=GateStatus.PASSED if passed else GateStatus.FAILED
        )
        version.gates = results
        version.gate_status = GateStatus.PASSED if passed else GateStatus.FAILED
        event_record(
            actor=actor,
            workspace=workspace,
            verb="serving.model_version.gates_passed"
            if passed
            else "serving.model_version.gates_failed",
            refs=[Ref.to(version)],
            payload={
                gate: {k: v for k, v in r.items() if k != "limits"} for gate, r in results.items()
            },
        )
    return version


RUN_KEY = "run"
# A queued or running request older than this is taken as lost (its worker died) and may be
# asked for again.
GATES_RUN_STALE_S = 600


def version_gates_request(
    *, actor: Actor, workspace: Workspace, version: ModelVersion
) -> ModelVersion:
    """Ask for the release gates of ``version`` to run again, on a worker: the sandbox run
    takes many seconds and does not belong inside a request. ``gates["run"]`` says where the
    request stands (queued, running); its results replace the gates when it is done. A second
    request while one is under way is a conflict, not a second measurement."""
    from serving.tasks import run_gates

    now = timezone.now()
    with transaction.atomic():
        locked = (
            ModelVersion.objects.for_workspace(workspace).select_for_update().get(pk=version.pk)
        )
        run = (locked.gates or {}).get(RUN_KEY) or {}
        if run.get("state") in {"queued", "running"}:
            since = datetime.fromisoformat(run["requested_at"])
            if (now - since).total_seconds() < GATES_RUN_STALE_S:
                raise ConflictError(
                    f"the release gates of version {locked.version} are already {run['state']} "
                    f"(asked for at {run['requested_at']})",
                    attr="gates",
                )
        locked.gates = {
            **(locked.gates or {}),
            RUN_KEY: {
                "state": "queued",
                "requested_at": now.isoformat(),
                "requested_by": getattr(actor, "username", "") or "",
            },
        }
        ModelVersion.objects.for_workspace(workspace).filter(pk=locked.pk).update(
            gates=locked.gates
        )
        event_record(
            actor=actor,
            workspace=workspace,
            verb="serving.model_version.gates_requested",
            refs=[Ref.to(locked)],
            payload={"version": locked.version},
        )
        user = actor_user(actor)
        actor_id = user.pk if user is not None else None
        transaction.on_commit(lambda: run_gates.delay(locked.pk, actor_id))
    return locked


def version_gates_run_requested(*, version_id: int, actor_id: int | None) -> str:
    """The worker's side of ``version_gates_request``: run the gates once (a redelivered task
    finds the request done and does nothing)."""
    from django.contrib.auth import get_user_model

    with transaction.atomic():
        version = (
            ModelVersion.objects.unscoped()
            .select_for_update()
            .select_related("workspace")
            .filter(pk=version_id)
            .first()
        )
        if version is None:
            return "missing"
        run = (version.gates or {}).get(RUN_KEY) or {}
        if run.get("state") != "queued":
            return run.get("state") or "done"
        version.gates = {**version.gates, RUN_KEY: {**run, "state": "running"}}
        ModelVersion.objects.unscoped().filter(pk=version.pk).update(gates=version.gates)
    actor = get_user_model().objects.filter(pk=actor_id).first() if actor_id else None
    version = version_gates_run(actor=actor, workspace=version.workspace, version=version)
    return version.gate_status
