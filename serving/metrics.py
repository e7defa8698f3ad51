"""Prometheus metrics of the gateway (per deployment): requests by version and outcome (QPS,
version mix, errors) and a latency histogram. Exported at ``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "rankops_serving_requests_total",
    "Predict requests answered by the gateway.",
    ["workspace", "deployment", "version", "outcome"],
)
LATENCY = Histogram(
    "rankops_serving_latency_seconds",
    "Gateway predict latency (features + scoring + logging).",
    ["workspace", "deployment"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
)
CANDIDATES = Counter(
    "rankops_serving_candidates_total",
    "Candidates scored by the gateway.",
    ["workspace", "deployment"],
)
