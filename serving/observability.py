"""Per-deployment serving statistics for the UI and API, from the prediction log (all gateway
processes) and the error counters in the shared cache. Prometheus has the same per process."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.core.cache import cache
from django.db.models import Count
from django.utils import timezone

from serving.models import Deployment, PredictionLog

LATENCY_BUCKETS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
WINDOW_MIN = 15
MAX_ROWS = 50_000


def deployment_stats(dep: Deployment, *, minutes: int = WINDOW_MIN) -> dict:
    from serving.predlog import predlog_flush

    try:
        predlog_flush(max_batches=5)
    except Exception:
        logging.getLogger(__name__).warning("prediction log flush failed", exc_info=True)
    now = timezone.now()
    since = now - timedelta(minutes=minutes)
    logs = PredictionLog.objects.for_workspace(dep.workspace_id).filter(
        deployment=dep, created_at__gte=since
    )
    rows = list(
        logs.order_by("-created_at").values_list(
            "created_at", "latency_ms", "model_version__version"
        )[:MAX_ROWS]
    )
    per_minute: dict[int, int] = {}
    latencies = []
    for created, latency, _ in rows:
        minute = int((now - created).total_seconds() // 60)
        per_minute[minute] = per_minute.get(minute, 0) + 1
        latencies.append(latency)
    qps = [{"minutes_ago": m, "qps": round(per_minute.get(m, 0) / 60, 3)} for m in range(minutes)][
        ::-1
    ]
    histogram = []
    previous = 0.0
    for bound in [*LATENCY_BUCKETS_MS, float("inf")]:
        histogram.append(
            {
                "le": bound if bound != float("inf") else "+Inf",
                "count": sum(1 for v in latencies if previous < v <= bound),
            }
        )
        previous = bound
    mix = {
        str(row["model_version__version"]): row["n"]
        for row in logs.values("model_version__version").annotate(n=Count("id"))
    }
    minute_now = int(time.time() // 60)
    errors = [
        {
            "minutes_ago": k,
            "errors": int(
                cache.get(f"serving:errors:{dep.workspace_id}:{dep.name}:{minute_now - k}") or 0
            ),
        }
        for k in range(minutes)
    ][::-1]
    latencies.sort()

    def pct(p: float) -> float | None:
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))], 3)

    return {
        "deployment": dep.name,
        "window_minutes": minutes,
        "requests": len(rows),
        "qps": qps,
        "latency_ms": {"p50": pct(0.5), "p99": pct(0.99)},
        "latency_histogram": histogram,
        "errors": errors,
        "version_mix": mix,
    }
