"""Prometheus metrics of the gateway (per deployment): requests by version and outcome (QPS,
version mix, errors) and a latency histogram. Exported at ``/metrics``.

Two properties a scraper relies on:

- **One count for the whole server.** Under gunicorn every worker is a process with counters of
  its own; with ``PROMETHEUS_MULTIPROC_DIR`` set (``platform/gunicorn.conf.py`` sets one up) each
  process writes its values to files there and ``exposition()`` sums them, whichever worker
  answers the scrape.
- **Bounded label sets.** The deployment label comes from the request body, so a name that is
  not a deployment of the workspace is counted under ``UNKNOWN_DEPLOYMENT`` instead of adding a
  series per name a client (or an attacker) makes up.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

UNKNOWN_DEPLOYMENT = "_unknown"
# A name found not to be a deployment is not looked up again for this long (a deployment
# created meanwhile is counted under its name once it answers a request or the entry expires).
NEGATIVE_TTL_S = 30.0
NEGATIVE_CAPACITY = 4096


class DeploymentNames:
    """Which ``(workspace slug, deployment name)`` pairs are real deployments, per process: a
    name that answered a request successfully is known; another is looked up once in the
    database (the misses are remembered for a while, in a bounded table)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: set[tuple[str, str]] = set()
        self._missing: dict[tuple[str, str], float] = {}

    def remember(self, workspace: str, deployment: str) -> None:
        with self._lock:
            self._known.add((workspace, deployment))
            self._missing.pop((workspace, deployment), None)

    def is_known(self, workspace: str, deployment: str) -> bool:
        key = (workspace, deployment)
        now = time.monotonic()
        with self._lock:
            if key in self._known:
                return True
            missed_at = self._missing.get(key)
            if missed_at is not None and now - missed_at < NEGATIVE_TTL_S:
                return False
        found = _deployment_exists(workspace, deployment)
        with self._lock:
            if found:
                self._known.add(key)
                self._missing.pop(key, None)
            else:
                if len(self._missing) >= NEGATIVE_CAPACITY:
                    self._missing.clear()
                self._missing[key] = now
        return found

    def clear(self) -> None:
        with self._lock:
            self._known.clear()
            self._missing.clear()


def _deployment_exists(workspace: str, deployment: str) -> bool:
    from serving.models import Deployment

    try:
        return Deployment.objects.filter(workspace__slug=workspace, name=deployment).exists()
    except Exception:  # noqa: BLE001 - counting an error must never raise another (DB down)
        return False


DEPLOYMENT_NAMES = DeploymentNames()


class DeploymentMetric:
    """A metric whose first two labels are ``workspace`` and ``deployment``; ``labels()`` maps a
    deployment name that is not real to ``UNKNOWN_DEPLOYMENT``. An ``outcome`` of ``ok`` (a
    request the deployment answered) vouches for the name."""

    def __init__(self, kind: Any, name: str, documentation: str, labelnames: list[str], **kw):
        self.labelnames = labelnames
        self.metric = kind(name, documentation, labelnames, **kw)

    def labels(self, *values: str, **named: str) -> Any:
        given = dict(zip(self.labelnames, values, strict=False))
        given.update(named)
        workspace, deployment = str(given["workspace"]), str(given["deployment"])
        if given.get("outcome") == "ok":
            DEPLOYMENT_NAMES.remember(workspace, deployment)
        elif not DEPLOYMENT_NAMES.is_known(workspace, deployment):
            given["deployment"] = UNKNOWN_DEPLOYMENT
        return self.metric.labels(**given)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.metric, name)


REQUESTS = DeploymentMetric(
    Counter,
    "rankops_serving_requests_total",
    "Predict requests answered by the gateway.",
    ["workspace", "deployment", "version", "outcome"],
)
LATENCY = DeploymentMetric(
    Histogram,
    "rankops_serving_latency_seconds",
    "Gateway predict latency (features + scoring + logging).",
    ["workspace", "deployment"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
)
CANDIDATES = DeploymentMetric(
    Counter,
    "rankops_serving_candidates_total",
    "Candidates scored by the gateway.",
    ["workspace", "deployment"],
)

FALLBACKS = DeploymentMetric(
    Counter,
    "rankops_replica_fallbacks_total",
    "Requests a deployment's replicas could not score, scored by the gateway itself.",
    ["workspace", "deployment"],
)


def exposition() -> tuple[bytes, str]:
    """The text exposition and its content type: the sum over every process of the server in
    multiprocess mode, this process's registry otherwise."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
