"""A job's hyperparameters as it ran them: the params it was given over the defaults its
built-in template declares (the job page and the version comparison show both)."""

from __future__ import annotations

from typing import Any


def job_hyperparameters(job) -> list[dict[str, Any]]:
    """``[{"name", "value", "source"}]`` sorted by name; ``source`` is ``"set"`` for a param the
    job was given and ``"default"`` for one its template fills in."""
    from training.forms import template_params

    given = dict(job.params or {})
    defaults = template_params().get(job.template or "", {}) if job.template else {}
    rows = [{"name": name, "value": given[name], "source": "set"} for name in given] + [
        {"name": name, "value": value, "source": "default"}
        for name, value in defaults.items()
        if name not in given
    ]
    return sorted(rows, key=lambda row: row["name"])


def param_text(value: Any) -> str:
    """A param value as a person reads it: lists comma-separated, empty strings marked."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ", ".join(param_text(v) for v in value) or "(empty list)"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {param_text(v)}" for k, v in sorted(value.items())) or "(empty)"
    if value == "":
        return "(empty)"
    return str(value)
