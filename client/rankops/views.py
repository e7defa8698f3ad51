"""What the CLI prints for people: the fields it shows of each answer, the cells of its tables,
and the renderings of the answers that are not flat objects (an experiment's analysis, a
lineage graph).

Plain Python (no httpx, no click), so the platform's tests check these field names against the
server's OpenAPI schema (``tests/test_schema_coverage.py``) and these renderings against the
server's real answers (``tests/test_cli_views.py``): a field renamed on the server fails there,
instead of printing an empty column."""

from __future__ import annotations

import json
from typing import Any

# The fields a human-readable answer shows, by the operation whose answer it is.
FIELDS: dict[str, tuple[str, ...]] = {
    "v1_workspaces_list": ("slug", "name", "scene", "prediction_type", "role"),
    "v1_workspaces_feature_groups_list": (
        "name",
        "entity",
        "current_version",
        "status",
        "health_status",
        "online",
    ),
    "v1_workspaces_datasets_list": ("id", "name", "version", "status", "row_count", "label_source"),
    "v1_workspaces_datasets_retrieve": ("id", "name", "status", "row_count"),
    "v1_workspaces_training_templates_list": ("name", "description"),
    "v1_workspaces_training_jobs_list": ("id", "name", "template", "state", "progress", "node"),
    "v1_workspaces_training_jobs_retrieve": ("id", "name", "state", "metrics"),
    "v1_workspaces_tuning_jobs_create": ("id", "name", "state", "n_trials"),
    "v1_workspaces_models_list": ("name", "latest_version", "aliases", "description"),
    "v1_workspaces_model_versions_create": ("id", "model", "version", "gate_status"),
    "v1_workspaces_deployments_create": ("id", "name", "model", "version", "state", "status"),
    "v1_workspaces_experiments_create": ("key", "state", "traffic_percent"),
    "v1_workspaces_experiments_retrieve": ("key", "state", "traffic_percent", "primary_metric"),
    "v1_workspaces_experiments_conclude_create": ("key", "state", "decision"),
    "v1_workspaces_notebooks_list": ("id", "state", "backend", "url", "stop_reason"),
    "v1_workspaces_loops_retrieve": ("id", "state", "failed_stage", "error"),
}


def pick(body: dict[str, Any], operation: str) -> dict[str, Any]:
    """The fields of ``body`` that the CLI shows for ``operation``'s answer."""
    return {k: body.get(k) for k in FIELDS[operation] if k in body}


def cell(value: Any) -> str:
    """One value as a table cell: six significant digits for a float (a rate of 0.0496586, not
    0.04965857031722707), ``k=v`` pairs for a flat mapping, commas for a list."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        if all(_scalar(v) for v in value.values()):
            return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
        return json.dumps(value, default=str)
    if isinstance(value, list | tuple):
        if all(_scalar(v) for v in value):
            return ", ".join(cell(v) for v in value)
        return json.dumps(value, default=str)
    return str(value)


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: list[dict[str, Any]], columns: list[str] | tuple[str, ...] | None = None) -> str:
    """Rows as aligned columns under upper-case headers; "(none)" for no rows."""
    if not rows:
        return "(none)"
    cols = list(columns or [k for k in rows[0] if _scalar(rows[0][k])][:8])
    # The last column is not clipped: nothing follows it (a template's allowed values, a
    # model's description), so it may run on.
    last = len(cols) - 1
    cells = [
        [cell(row.get(c)) if i == last else clip(cell(row.get(c)), 40) for i, c in enumerate(cols)]
        for row in rows
    ]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def pairs(body: dict[str, Any]) -> str:
    """A flat object as ``key  value`` lines."""
    width = max((len(str(k)) for k in body), default=0)
    return "\n".join(f"{str(k).ljust(width)}  {clip(cell(v), 100)}" for k, v in body.items())


def _scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _percent(x: Any) -> str:
    return "" if x is None else f"{100 * x:+.2f}%"


def experiment_status(experiment: dict[str, Any], analysis: dict[str, Any]) -> str:
    """An experiment and its analysis as people read it: the state, each arm's counts and rates,
    each treatment's effect on each metric with its confidence interval, p-value and verdict,
    the sample-ratio check and the guardrails that failed."""
    primary = experiment.get("primary_metric") or analysis.get("primary_metric") or ""
    head = pick(experiment, "v1_workspaces_experiments_retrieve")
    head["enough_units"] = analysis.get("enough_units")
    out = [pairs(head), "", "Arms"]
    arms = analysis.get("arms") or {}
    out.append(
        table(
            [{"arm": name, **arm} for name, arm in arms.items()],
            ["arm", *(k for k, v in next(iter(arms.values())).items() if _scalar(v))],
        )
        if arms
        else "(no traffic yet)"
    )
    rows = []
    for arm, metrics in (analysis.get("effects") or {}).items():
        for metric, kinds in metrics.items():
            effect = kinds.get("relative") or {}
            sequential = kinds.get("sequential") or {}
            named = metric + (" (primary)" if metric == primary else "")
            if effect.get("error"):  # no estimate yet (e.g. too few units): say why, no numbers
                rows.append({"arm": arm, "metric": named, "note": effect["error"]})
                continue
            rows.append(
                {
                    "arm": arm,
                    "metric": named,
                    "lift": _percent(effect.get("estimate")),
                    "ci": (
                        f"[{_percent(effect.get('ci_low'))}, {_percent(effect.get('ci_high'))}]"
                        if effect.get("ci_low") is not None
                        else ""
                    ),
                    "p_value": effect.get("p_value"),
                    "significant": effect.get("significant"),
                    "always_valid_ci": (
                        f"[{_percent(sequential.get('ci_low'))}, "
                        f"{_percent(sequential.get('ci_high'))}]"
                        if sequential.get("ci_low") is not None
                        else ""
                    ),
                    "note": effect.get("error") or "",
                }
            )
    alpha = analysis.get("alpha")
    level = f", {100 * (1 - alpha):.0f}% intervals" if alpha is not None else ""
    out += ["", f"Effects against {analysis.get('control') or 'control'} (relative lift{level})"]
    columns = ["arm", "metric", "lift", "ci", "p_value", "significant", "always_valid_ci", "note"]
    out.append(table(rows, columns) if rows else "(none yet)")
    srm = analysis.get("srm") or {}
    if srm:
        verdict = "MISMATCH: the split is not what was configured" if srm.get("mismatch") else "ok"
        out += ["", f"Sample ratio: {verdict} (p = {cell(srm.get('p_value'))})"]
    breaches = analysis.get("guardrails") or []
    out += ["", "Guardrails: " + ("none failed" if not breaches else "FAILED")]
    if breaches:
        out.append(
            table(
                [
                    {
                        "arm": b.get("arm"),
                        "metric": b.get("metric"),
                        "drop": _percent(b.get("estimate")),
                        "max_drop": _percent(-(b.get("max_drop") or 0)),
                    }
                    for b in breaches
                ]
            )
        )
    return "\n".join(out)


LINEAGE_NODE_FIELDS = ("key", "kind", "label", "level", "status", "live", "owner")


def lineage(graph: dict[str, Any]) -> str:
    """A lineage answer: its nodes (level < 0 upstream, > 0 downstream of the root), then its
    edges as ``source -> target  type``, ended ones marked."""
    nodes = graph.get("nodes") or []
    out = [table(nodes, LINEAGE_NODE_FIELDS)]
    edges = graph.get("edges") or []
    if edges:
        out += ["", "Edges"]
        for edge in edges:
            ended = "" if edge.get("active", True) else "  (ended)"
            out.append(f"{edge['src']} -> {edge['dst']}  {edge['type']}{ended}")
    if graph.get("truncated"):
        out += ["", "(truncated: more nodes lie beyond; narrow --depth or --direction)"]
    return "\n".join(out)
