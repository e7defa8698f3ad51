"""The gateway's way to a deployment's model servers.

A deployment on the ``local`` or ``kubernetes`` backend runs its production version in
model-server replicas (``serving.model_server serve``): processes on this node, or the pods behind
the deployment's Service. Once its controller reports it Ready, the routing table names the
replicas' addresses (``remote``), and the gateway scores that version's rows there with an Open
Inference Protocol infer request; the features are still fetched by the gateway (the online
store is the platform's, the replicas hold no credential). Versions an experiment routes to, and
any deployment on the ``embedded`` backend, are scored in the gateway's own process.

A replica that cannot be reached or answers an error leaves the request to the next replica,
then to the gateway's own copy of the same version, so a replica restart never fails a request;
each such fallback is counted per workspace and deployment (``serving.metrics.FALLBACKS``,
``rankops_replica_fallbacks_total``).

One pooled ``httpx.Client`` per gateway process keeps the connections to the replicas alive.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import httpx
import numpy as np
from django.conf import settings

from serving import oip

log = logging.getLogger(__name__)

_client: httpx.Client | None = None
_client_lock = threading.Lock()
_turn = itertools.count()


def _http() -> httpx.Client:
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(timeout=settings.SERVING_REPLICA_TIMEOUT_S)
        return _client


def remote_of(dep: Any, status: Any) -> dict[str, Any] | None:
    """The routing table's ``remote`` entry for ``dep``: its version and the replicas' base
    URLs, when the controller last reported them Ready; None otherwise (scored in process)."""
    from serving.models import Backend, DeploymentPhase

    if dep.backend == Backend.EMBEDDED or status is None:
        return None
    if status.phase != DeploymentPhase.READY or status.observed_generation != dep.generation:
        return None
    urls = list((status.detail or {}).get("endpoints") or [])
    if not urls:
        return None
    return {
        "version_id": dep.version_id,
        "urls": urls,
        "model": (status.detail or {}).get("model", dep.name),
    }


def score(
    remote: dict[str, Any], loaded: Any, columns: dict[str, list], n: int, request_id: str
) -> np.ndarray | None:
    """The replicas' scores for ``n`` rows (round robin, the next replica on a failure); None
    when none answered, for the caller to score in process."""
    inputs = loaded.oip_inputs
    body = oip.encode_inputs(columns, n, inputs, request_id)
    urls = remote["urls"]
    start = next(_turn)
    for i in range(len(urls)):
        url = f"{urls[(start + i) % len(urls)]}/v2/models/{remote['model']}/infer"
        try:
            answer = _http().post(url, json=body)
            if answer.status_code == 200:
                output = answer.json()["outputs"][0]
                scores = np.asarray(output["data"], dtype=np.float64)
                if scores.shape == (n,):
                    return scores
            log.warning("replica %s answered %s", url, answer.status_code)
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            log.warning("replica %s failed: %s", url, exc)
    return None
