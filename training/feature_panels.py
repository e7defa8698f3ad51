"""F10 on the feature pages: each feature's permutation importance in the jobs that used it.

Training stores permutation importance per feature in ``TrainingJob.metrics["importance"]``
(``{"group:feature": AUC drop}``, see ``training.evaluation``). The feature group page belongs to
features, which may not import training, so this panel is plugged in through
``features.panels.register_group_panel`` from ``TrainingConfig.ready``.

Cost: one query for the group's features and one for the jobs (only the JSON keys needed are
selected, not the whole metrics blob with its ROC/calibration curves), whatever the number of
features or jobs.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.db.models.fields.json import KT, KeyTransform
from django.http import HttpRequest
from django.template.loader import render_to_string

from features.models import FeatureGroup
from training.models import JobState, TrainingJob
from workspaces.models import Workspace

JOBS_PER_FEATURE = 5
# The newest jobs looked at; enough for JOBS_PER_FEATURE per feature in any realistic group.
MAX_JOBS_SCANNED = 200


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def importance_by_feature(
    *, workspace: Workspace, group: FeatureGroup, per_feature: int = JOBS_PER_FEATURE
) -> list[dict[str, Any]]:
    """One row per feature of ``group``: its importance in the latest succeeded jobs using it.

    Each job entry carries the job, its template, held-out AUC, the feature's importance (AUC
    lost when shuffled) and its rank among that job's features (1 = most important).
    """
    names = list(group.feature_set.order_by("name").values_list("name", flat=True))
    if not names:
        return []
    refs = {f"{group.name}:{name}": name for name in names}
    jobs = (
        TrainingJob.objects.for_workspace(workspace)
        .filter(state=JobState.SUCCEEDED, metrics__importance__has_any_keys=list(refs))
        .annotate(
            importance=KeyTransform("importance", "metrics"),
            holdout_auc=KT("metrics__holdout__auc"),
        )
        .order_by(F("finished_at").desc(nulls_last=True), "-id")
        .values("pk", "name", "template", "entry_point", "finished_at", "importance", "holdout_auc")
    )[:MAX_JOBS_SCANNED]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for job in jobs:
        importance = job["importance"] if isinstance(job["importance"], dict) else {}
        values = {ref: v for ref, raw in importance.items() if (v := _number(raw)) is not None}
        ranked = sorted(values, key=lambda ref: -values[ref])
        for ref, name in refs.items():
            if ref not in values or len(rows[name]) >= per_feature:
                continue
            rows[name].append(
                {
                    "job_id": job["pk"],
                    "job_name": job["name"],
                    "template": job["template"] or job["entry_point"],
                    "finished_at": job["finished_at"],
                    "auc": _number(job["holdout_auc"]),
                    "importance": values[ref],
                    "rank": ranked.index(ref) + 1,
                    "of": len(ranked),
                }
            )
    return [{"feature": name, "jobs": rows[name]} for name in names]


def feature_importance_panel(
    request: HttpRequest, workspace: Workspace, group: FeatureGroup
) -> str | None:
    """The group page's "Importance in training" card; nothing when no job used the group."""
    features = importance_by_feature(workspace=workspace, group=group)
    if not any(row["jobs"] for row in features):
        return None
    return render_to_string(
        "training/_feature_importance_panel.html",
        {"workspace": workspace, "group": group, "features": features},
        request=request,
    )
