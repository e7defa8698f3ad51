"""How serving's pages show their data: the chart series of a deployment (for
``static/js/charts.js``), scaling, routing and change details as readable rows instead of raw
dicts, a version's held-out evaluation, and two versions side by side (metrics on the same rows,
overlaid ROC and calibration curves, the parameter diff). Plain data in, plain data out."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from training.curves import calibration_chart, roc_chart
from training.params import job_hyperparameters, param_text

# The held-out metrics a job's evaluation writes (training.evaluation.summary), in page order:
# (key, label, digits, which way is better: +1 higher, -1 lower, 0 neither).
HOLDOUT_ROWS = [
    ("auc", "AUC", 4, +1),
    ("logloss", "Logloss", 4, -1),
    ("predicted_ctr", "Predicted CTR", 4, 0),
    ("observed_ctr", "Observed CTR", 4, 0),
    ("calibration_ratio", "Predicted / observed", 3, 0),
    ("rows", "Held-out rows", 0, 0),
]
COMPARE_COLOURS = ["#2563eb", "#d97706"]


# -- deployment charts ------------------------------------------------------------------------


def deployment_charts(stats: dict[str, Any], now: datetime) -> dict[str, dict[str, Any]]:
    """Chart data for the deployment page from ``serving.observability.deployment_stats``:
    QPS and errors per minute on a time axis, the latency histogram and the version mix as
    bars. A chart has no points (its empty state shows) while the window has no request."""
    end = int(now.timestamp() // 60 * 60)
    answered = bool(stats.get("requests"))

    def per_minute(points: list[dict], key: str, label: str, colour: str, kind: str) -> dict:
        if not answered and not any(p[key] for p in points):
            return {"x": [], "series": []}
        return {
            "x": [end - p["minutes_ago"] * 60 for p in points],
            "series": [
                {
                    "label": label,
                    "values": [p[key] for p in points],
                    "color": colour,
                    "kind": kind,
                }
            ],
        }

    histogram = stats.get("latency_histogram") or []
    mix = stats.get("version_mix") or {}
    versions = sorted(mix, key=lambda v: int(v) if str(v).isdigit() else 0)
    return {
        "qps": per_minute(stats.get("qps") or [], "qps", "QPS", "#2563eb", "line"),
        "errors": per_minute(stats.get("errors") or [], "errors", "Errors", "#dc2626", "bars"),
        "latency": {
            "x": list(range(len(histogram))) if answered else [],
            "x_labels": _bucket_labels(histogram),
            "x_ticks": [
                label.replace(" ms", "").replace(" ", "") for label in _bucket_labels(histogram)
            ],
            "series": [
                {
                    "label": "Requests",
                    "values": [b["count"] for b in histogram],
                    "color": "#059669",
                    "kind": "bars",
                }
            ]
            if answered
            else [],
        },
        "mix": {
            "x": list(range(len(versions))),
            "x_labels": [f"v{v}" for v in versions],
            "series": [
                {
                    "label": "Requests",
                    "values": [mix[v] for v in versions],
                    "color": "#7c3aed",
                    "kind": "bars",
                }
            ]
            if versions
            else [],
        },
    }


def _bucket_labels(histogram: list[dict]) -> list[str]:
    labels, previous = [], None
    for bucket in histogram:
        if isinstance(bucket["le"], int | float):
            labels.append(f"≤ {bucket['le']:g} ms")
            previous = bucket["le"]
        else:
            labels.append(f"> {previous:g} ms" if previous is not None else "any")
    return labels


# -- readable details ------------------------------------------------------------------------


def scaling_text(scaling: dict[str, Any] | None, replicas: int) -> list[str]:
    """A deployment's scaling policy as sentences (one per line)."""
    scaling = scaling or {}
    mode = scaling.get("mode") or "fixed"
    if mode == "fixed":
        return [f"Fixed: {replicas} replica{'s' if replicas != 1 else ''}"]
    if mode == "schedule":
        lines = ["On a schedule (UTC):"]
        for window in scaling.get("windows") or []:
            n = window.get("replicas")
            lines.append(
                f"{window.get('start', '?')}-{window.get('end', '?')}: "
                f"{n} replica{'s' if n != 1 else ''}"
            )
        lines.append(f"Outside the windows: {replicas} replica{'s' if replicas != 1 else ''}")
        return lines
    if mode == "load":
        return [
            f"By load: {scaling.get('target_qps_per_replica', '?')} req/s per replica, "
            f"between {scaling.get('min', '?')} and {scaling.get('max', '?')} replicas"
        ]
    return [f"{mode}: " + "; ".join(detail_rows_text(scaling))]


def detail_rows(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A nested dict as (dotted key, readable value) rows; a list of scalars is one row."""
    if isinstance(value, dict):
        rows: list[tuple[str, str]] = []
        for key in sorted(value, key=str):
            name = f"{prefix}{key}".replace("_", " ")
            item = value[key]
            if isinstance(item, dict) and item:
                rows.extend(detail_rows(item, f"{prefix}{key} / "))
            elif isinstance(item, list) and any(isinstance(v, dict) for v in item):
                for i, entry in enumerate(item, 1):
                    rows.extend(detail_rows(entry, f"{prefix}{key} {i} / "))
            else:
                rows.append((name, param_text(item)))
        return rows
    return [(prefix.rstrip(" /") or "value", param_text(value))]


def detail_rows_text(value: Any) -> list[str]:
    return [f"{key}: {text}" for key, text in detail_rows(value)]


def change_detail(change) -> list[str]:
    """What a deployment change did beyond from/to, e.g. a scale change's before and after."""
    detail = change.detail or {}
    if not detail:
        return []
    if "before" in detail and ("replicas" in detail or "scaling" in detail):
        before = detail.get("before") or {}
        lines = []
        if before.get("replicas") != detail.get("replicas"):
            lines.append(f"Replicas {before.get('replicas')} → {detail.get('replicas')}")
        old = scaling_text(before.get("scaling"), before.get("replicas") or 1)
        new = scaling_text(detail.get("scaling"), detail.get("replicas") or 1)
        if old != new:
            lines.append(f"Scaling: {' '.join(old)} → {' '.join(new)}")
        return lines or ["No change in replicas or scaling"]
    return detail_rows_text(detail)


def routing_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The experiment allocations of a routing table, one row per arm and bucket range."""
    buckets = table.get("buckets") or 0
    rows = []
    for layer in table.get("layers") or []:
        for alloc in layer.get("allocations") or []:
            width = alloc["end"] - alloc["start"]
            rows.append(
                {
                    "layer": layer["layer"],
                    "experiment": alloc["experiment_key"],
                    "arm": alloc["arm"],
                    "version_id": alloc["version_id"],
                    "buckets": f"{alloc['start']}-{alloc['end'] - 1}",
                    "share": width / buckets if buckets else None,
                }
            )
    return rows


# -- a version's evaluation ------------------------------------------------------------------


def version_evaluation(version) -> dict[str, Any]:
    """The held-out evaluation of a version: its own metrics as registered, else its training
    job's (``metrics["holdout"]``, ``["production"]``, ``["auc_delta_vs_production"]``, curves)."""
    from serving.models import VersionSource

    metrics = dict(version.metrics or {})
    # A quantised variant shares its source's job but not its model: only its own figures.
    own_only = version.source == VersionSource.QUANTIZED
    if not metrics.get("holdout") and version.job is not None and not own_only:
        metrics = dict(version.job.metrics or {})
    production = metrics.get("production")
    if not isinstance(production, dict):
        production = None
    delta = metrics.get("auc_delta_vs_production")
    return {
        "holdout": metrics.get("holdout") or {},
        "production": production,
        "auc_delta": delta if isinstance(delta, int | float) else None,
        "roc": metrics.get("roc") or [],
        "calibration": metrics.get("calibration") or [],
    }


def holdout_table(holdout: dict, production: dict | None) -> list[dict[str, Any]]:
    """Rows (metric, this model, production) of the held-out summary that are present."""
    rows = []
    for key, label, digits, _ in HOLDOUT_ROWS:
        ours = holdout.get(key)
        theirs = (production or {}).get(key) if production and not production.get("error") else None
        if ours is None and theirs is None:
            continue
        rows.append({"key": key, "label": label, "ours": ours, "theirs": theirs, "digits": digits})
    return rows


# -- two versions side by side ---------------------------------------------------------------


def _dataset_of(version):
    if version.dataset_id:
        return version.dataset
    if version.job is not None and version.job.dataset_id:
        return version.job.dataset
    return None


def dataset_note(a, b) -> dict[str, Any]:
    """Whether the two versions' held-out metrics come from the same dataset version."""
    da, db = _dataset_of(a), _dataset_of(b)
    if da is None or db is None:
        missing = " and ".join(f"v{v.version}" for v, d in ((a, da), (b, db)) if d is None)
        return {
            "same": False,
            "text": f"The dataset of {missing} is not recorded: the metrics may not be comparable.",
        }
    if da.pk == db.pk:
        return {
            "same": True,
            "text": f"Both were evaluated on the held-out split of the same dataset version, "
            f"{da}: the metrics below are directly comparable.",
        }
    return {
        "same": False,
        "text": f"They were evaluated on different dataset versions (v{a.version}: {da}, "
        f"v{b.version}: {db}): differences mix the models with the data.",
    }


def metric_rows(ea: dict, eb: dict) -> list[dict[str, Any]]:
    """Held-out metrics of two evaluations on the same rows, with b - a and the better side."""
    rows = []
    for key, label, digits, better in HOLDOUT_ROWS:
        va, vb = ea["holdout"].get(key), eb["holdout"].get(key)
        if va is None and vb is None:
            continue
        delta = vb - va if isinstance(va, int | float) and isinstance(vb, int | float) else None
        winner = ""
        if delta and better:
            winner = "b" if delta * better > 0 else "a"
        rows.append(
            {"label": label, "a": va, "b": vb, "delta": delta, "digits": digits, "winner": winner}
        )
    if ea["auc_delta"] is not None or eb["auc_delta"] is not None:
        rows.append(
            {
                "label": "AUC - production AUC (when each was trained)",
                "a": ea["auc_delta"],
                "b": eb["auc_delta"],
                "delta": None,
                "digits": 4,
                "winner": "",
            }
        )
    return rows


def param_diff(a, b) -> list[dict[str, Any]]:
    """Both training jobs' hyperparameters (template defaults filled in), changed ones marked."""
    pa = {row["name"]: row for row in job_hyperparameters(a.job)} if a.job else {}
    pb = {row["name"]: row for row in job_hyperparameters(b.job)} if b.job else {}
    rows = []
    for name in sorted(set(pa) | set(pb)):
        ra, rb = pa.get(name), pb.get(name)
        rows.append(
            {
                "name": name,
                "a": param_text(ra["value"]) if ra else "—",
                "b": param_text(rb["value"]) if rb else "—",
                "a_default": bool(ra and ra["source"] == "default"),
                "b_default": bool(rb and rb["source"] == "default"),
                "changed": (ra or {}).get("value") != (rb or {}).get("value"),
            }
        )
    return rows


def comparison(a, b) -> dict[str, Any]:
    """Everything the compare page shows for versions ``a`` and ``b`` of one model."""
    ea, eb = version_evaluation(a), version_evaluation(b)
    la, lb = f"v{a.version}", f"v{b.version}"
    template_of = lambda v: (v.job.template or v.job.entry_point) if v.job else ""  # noqa: E731
    return {
        "dataset": dataset_note(a, b),
        "metrics": metric_rows(ea, eb),
        "roc": roc_chart(
            [
                (f"{la} TPR", ea["roc"], COMPARE_COLOURS[0]),
                (f"{lb} TPR", eb["roc"], COMPARE_COLOURS[1]),
            ]
        ),
        "calibration": calibration_chart(
            [
                (f"{la} observed", ea["calibration"], COMPARE_COLOURS[0]),
                (f"{lb} observed", eb["calibration"], COMPARE_COLOURS[1]),
            ]
        ),
        "params": param_diff(a, b),
        "templates": (template_of(a), template_of(b)),
        "has_jobs": a.job is not None and b.job is not None,
    }


def version_quantization(version) -> dict[str, Any]:
    """The version page's quantised-inference card: for a variant, what it came from and its
    quantisation record; for any other version, its variant if it has one, else the method it
    would take or why it takes none."""
    from serving.quantization import existing_variant, is_quantized, method_for, quantization_of
    from workspaces.exceptions import ConflictError

    if is_quantized(version):
        record = quantization_of(version)
        fp32, int8 = record.get("fp32_bytes") or 0, record.get("int8_bytes") or 0
        return {"record": record, "size_ratio": int8 / fp32 if fp32 and int8 else None}
    try:
        method = method_for(version)
    except ConflictError as exc:
        return {"refusal": str(exc)}
    return {"method": method, "variant": existing_variant(version)}
