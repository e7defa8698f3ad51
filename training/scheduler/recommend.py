"""Resource recommendation (T6): right-size a job from what similar past jobs actually used.

Similar = succeeded jobs of the same workspace and template whose dataset has a similar row count
(within a factor of ``SIZE_FACTOR``; the nearest ones when none is that close). The recommendation
is the highest observed peak plus ``HEADROOM``, rounded up (CPU to 100 milli, memory to 64 MiB,
GPU to 50 milli-GPU or whole GPUs). ``savings`` says how much requested-but-unused capacity the
recommendation would have saved on those past jobs (core-hours, GiB-hours, GPU-hours).
"""

from __future__ import annotations

import math
from typing import Any

from training.models import JobState, TrainingJob

HEADROOM = 0.25
SIZE_FACTOR = 2.0
MAX_HISTORY = 50


def _round_up(value: float, step: int, minimum: int) -> int:
    return max(int(math.ceil(value / step) * step), minimum)


def _rows(job: TrainingJob) -> int:
    return int(job.dataset.row_count) if job.dataset_id and job.dataset else 0


def _hours(job: TrainingJob) -> float:
    if job.started_at and job.finished_at:
        return max((job.finished_at - job.started_at).total_seconds() / 3600, 0.0)
    return 0.0


def _gpu_memory_mb(job: TrainingJob) -> int:
    node = job.node
    if node is None:
        return 0
    sizes = [int(g.get("memory_mb") or 0) for g in node.gpus or []]
    return max(sizes) if sizes else 0


def history(*, workspace, template: str, dataset=None) -> list[TrainingJob]:
    jobs = list(
        TrainingJob.objects.for_workspace(workspace)
        .filter(state=JobState.SUCCEEDED, template=template)
        .select_related("dataset", "node")
        .order_by("-finished_at")[: MAX_HISTORY * 4]
    )
    jobs = [j for j in jobs if (j.usage or {}).get("cpu_peak_milli") is not None]
    rows = int(getattr(dataset, "row_count", 0) or 0)
    if not rows or not jobs:
        return jobs[:MAX_HISTORY]

    def distance(job: TrainingJob) -> float:
        return abs(math.log((_rows(job) or 1) / rows))

    close = [j for j in jobs if distance(j) <= math.log(SIZE_FACTOR)]
    if close:
        return close[:MAX_HISTORY]
    return sorted(jobs, key=distance)[:5]


def recommend(*, workspace, template: str, dataset=None) -> dict[str, Any]:
    """The recommended request for a new job; ``based_on_jobs`` is 0 when there is no history."""
    jobs = history(workspace=workspace, template=template, dataset=dataset)
    if not jobs:
        return {
            "template": template,
            "dataset_rows": int(getattr(dataset, "row_count", 0) or 0),
            "based_on_jobs": 0,
            "detail": "no succeeded job of this template with recorded usage yet",
        }
    cpu_peak = max(int(j.usage.get("cpu_peak_milli") or 0) for j in jobs)
    mem_peak = max(int(j.usage.get("memory_peak_mb") or 0) for j in jobs)
    gpu_fraction = 0.0
    for job in jobs:
        gpu_mem = int(job.usage.get("gpu_memory_peak_mb") or 0)
        if gpu_mem and (job.gpu_count or job.gpu_milli):
            per_gpu = _gpu_memory_mb(job)
            used = gpu_mem / per_gpu if per_gpu else (job.gpu_count or job.gpu_milli / 1000)
            gpu_fraction = max(gpu_fraction, used)
    cpu = _round_up(cpu_peak * (1 + HEADROOM), 100, 100)
    memory = _round_up(mem_peak * (1 + HEADROOM), 64, 256)
    gpu_count, gpu_milli = 0, 0
    if gpu_fraction:
        need = gpu_fraction * (1 + HEADROOM)
        if need >= 1:
            gpu_count = math.ceil(need)
        else:
            gpu_milli = _round_up(need * 1000, 50, 50)
    rec = {
        "template": template,
        "dataset_rows": int(getattr(dataset, "row_count", 0) or 0),
        "based_on_jobs": len(jobs),
        "headroom": HEADROOM,
        "observed_peak": {
            "cpu_milli": cpu_peak,
            "memory_mb": mem_peak,
            "gpu_share": round(gpu_fraction, 4),
        },
        "cpu_milli": cpu,
        "memory_mb": memory,
        "gpu_count": gpu_count,
        "gpu_milli": gpu_milli,
    }
    rec["savings"] = savings(jobs, rec)
    return rec


def savings(jobs: list[TrainingJob], rec: dict[str, Any]) -> dict[str, float]:
    """Requested-but-unused capacity the recommendation would have saved on ``jobs``."""
    cpu_req = cpu_rec = mem_req = mem_rec = gpu_req = gpu_rec = 0.0
    rec_gpu = rec.get("gpu_count", 0) + rec.get("gpu_milli", 0) / 1000
    for job in jobs:
        hours = _hours(job) * max(job.workers, 1)
        cpu_req += job.cpu_milli / 1000 * hours
        cpu_rec += min(rec["cpu_milli"], job.cpu_milli) / 1000 * hours
        mem_req += job.memory_mb / 1024 * hours
        mem_rec += min(rec["memory_mb"], job.memory_mb) / 1024 * hours
        requested_gpu = job.gpu_count + (0 if job.gpu_count else job.gpu_milli / 1000)
        gpu_req += requested_gpu * hours
        gpu_rec += min(rec_gpu, requested_gpu) * hours
    return {
        "cpu_core_hours_requested": round(cpu_req, 4),
        "cpu_core_hours_saved": round(cpu_req - cpu_rec, 4),
        "memory_gib_hours_requested": round(mem_req, 4),
        "memory_gib_hours_saved": round(mem_req - mem_rec, 4),
        "gpu_hours_requested": round(gpu_req, 4),
        "gpu_hours_saved": round(gpu_req - gpu_rec, 4),
        "cpu_saved_share": round((cpu_req - cpu_rec) / cpu_req, 4) if cpu_req else 0.0,
        "memory_saved_share": round((mem_req - mem_rec) / mem_req, 4) if mem_req else 0.0,
    }


def savings_report(*, workspace) -> dict[str, Any]:
    """Per template: what right-sizing from history would have saved on its past jobs."""
    templates = (
        TrainingJob.objects.for_workspace(workspace)
        .filter(state=JobState.SUCCEEDED)
        .exclude(template="")
        .values_list("template", flat=True)
        .distinct()
    )
    out = {}
    for template in sorted(set(templates)):
        rec = recommend(workspace=workspace, template=template)
        if rec.get("based_on_jobs"):
            out[template] = {"recommendation": rec, "savings": rec["savings"]}
    return out
