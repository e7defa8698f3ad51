"""How the pages word raw figures: durations, event verbs and actors, payloads, resource units.

One place turns them into words, so that every page says "3 h 12 min" and "Job created" the same
way. Templates use these through ``{% load shell %}`` (``workspaces/templatetags/shell.py``):
``{{ seconds|duration }}``, ``{{ event.verb|verb_label }}``, ``{{ event|actor_label }}``,
``{{ payload|key_values }}``, ``{{ milli|from_milli }}`` and ``{{ mib|mib_as_gib }}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.html import format_html, format_html_join

# Sentences for the verbs an engineer meets most; every other verb gets the generic label.
VERB_LABELS = {
    "workspace.created": "Workspace created",
    "workspace.changed": "Workspace settings changed",
    "workspace.policy.changed": "Workspace limits changed",
    "membership.granted": "Member added or role changed",
    "membership.revoked": "Member removed",
    "quota.changed": "Quota changed",
    "quota_request.created": "Quota change requested",
    "quota_request.approved": "Quota request approved",
    "quota_request.rejected": "Quota request rejected",
    "token.created": "API token created",
    "token.revoked": "API token revoked",
    "service_account.created": "Service account created",
    "webhook.created": "Webhook added",
    "webhook.deleted": "Webhook removed",
    "feature_group.registered": "Feature group registered",
    "feature_batch.ingested": "Feature batch ingested",
    "feature_group.materialized": "Feature group materialised online",
    "dataset.created": "Dataset requested",
    "dataset.built": "Dataset built",
    "dataset.failed": "Dataset build failed",
    "training.job.created": "Training job submitted",
    "training.job.succeeded": "Training job succeeded",
    "training.job.failed": "Training job failed",
    "training.job.stop_requested": "Training job stop requested",
    "training.pipeline_run.started": "Pipeline run started",
    "scheduler.quota.set": "Scheduler quota set",
    "scheduler.job.over_quota": "Job admitted over quota",
    "serving.model_version.registered": "Model version registered",
    "serving.model_version.gates_passed": "Model version passed its release gates",
    "serving.deployment.created": "Deployment created",
    "serving.deployment.released": "Deployment released a new version",
    "serving.deployment.rolled_back": "Deployment rolled back",
    "experiments.experiment.created": "Experiment created",
    "experiments.experiment.started": "Experiment started",
    "experiments.experiment.ramped": "Experiment ramped",
    "experiments.experiment.stopped": "Experiment stopped",
    "experiments.experiment.concluded": "Experiment concluded",
    "lineage.audit.flagged": "Flagged for the resource audit",
}

# What ``event_record`` writes as the actor's name when no user acted (tasks, the scheduler).
PLATFORM_ACTOR = "system"


def verb_label(verb: str) -> str:
    """A readable label for an event verb: a known sentence, else ``app.object.verb`` as
    "Object verb" (``training.job.created`` -> "Job created", ``membership.granted`` ->
    "Membership granted")."""
    verb = str(verb or "")
    if verb in VERB_LABELS:
        return VERB_LABELS[verb]
    parts = [p for p in verb.split(".") if p]
    if not parts:
        return verb
    if len(parts) >= 3:
        parts = parts[1:]  # the app's name adds nothing the object does not say
    words = " ".join(p.replace("_", " ") for p in parts)
    return words[:1].upper() + words[1:]


def actor_label(event: Any) -> str:
    """Who did it: the username, or "the platform" for what no user did."""
    name = getattr(event, "actor_name", "") or ""
    if getattr(event, "actor_id", None) is None and name in ("", PLATFORM_ACTOR):
        return "the platform"
    return name


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def duration(value: Any) -> str:
    """Seconds (or a timedelta) in words: "45 s", "12 min", "3 h 12 min", "8 days", "2 days 4 h".

    Two units at most, the larger rounded down; a blank or unreadable value is "—".
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return "—"
    if math.isnan(seconds) or math.isinf(seconds):
        return "—"
    sign = "-" if seconds < 0 else ""
    total = round(abs(seconds))
    if total < 60:
        return f"{sign}{total} s"
    minutes, _ = divmod(total, 60)
    if minutes < 60:
        return f"{sign}{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours} h" + (f" {minutes} min" if minutes else "")
    days, hours = divmod(hours, 24)
    if days >= 7 or not hours:
        return f"{sign}{_plural(days, 'day')}"
    return f"{sign}{_plural(days, 'day')} {hours} h"


def _scalar(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return str(round(value, 6))
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False)


def key_values(value: Any) -> str:
    """A payload as a definition list (nested mappings nest; lists join with commas), escaped.

    An empty mapping is "—"; anything that is not a mapping is shown as one escaped value.
    """
    if not isinstance(value, Mapping):
        return format_html("{}", _scalar(value)) if value not in (None, "") else "—"
    if not value:
        return "—"
    return format_html(
        '<dl class="kv">{}</dl>',
        format_html_join(
            "",
            "<dt>{}</dt><dd>{}</dd>",
            ((str(key).replace("_", " "), _cell(item)) for key, item in value.items()),
        ),
    )


def _cell(item: Any) -> str:
    if isinstance(item, Mapping):
        return key_values(item)
    if isinstance(item, list | tuple):
        if all(not isinstance(x, Mapping | list | tuple) for x in item):
            return format_html("{}", ", ".join(_scalar(x) for x in item) or "—")
        return format_html("<pre>{}</pre>", json.dumps(item, cls=DjangoJSONEncoder, indent=2))
    return format_html("{}", _scalar(item))


def _trimmed(number: float) -> str:
    return f"{number:.2f}".rstrip("0").rstrip(".")


def from_milli(value: Any) -> str:
    """Milli-units (mCPU, mGPU) as whole units: 1500 -> "1.5", 250 -> "0.25"."""
    try:
        return _trimmed(float(value) / 1000)
    except (TypeError, ValueError):
        return "—"


def trimmed(value: Any) -> str:
    """A number with at most two decimals and no trailing zeros: 1.5 -> "1.5", 0.0 -> "0"."""
    try:
        return _trimmed(float(value))
    except (TypeError, ValueError):
        return "—"


def mib_as_gib(value: Any) -> str:
    """MiB as GiB: 6144 -> "6", 512 -> "0.5"."""
    try:
        return _trimmed(float(value) / 1024)
    except (TypeError, ValueError):
        return "—"
