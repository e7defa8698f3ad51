"""Acceptance: rollback under load takes effect within 1 s and no request fails."""

import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from serving.deployments import deployment_release, deployment_rollback
from serving.models import DeploymentChange, PredictionLog
from serving.predlog import predlog_flush
from serving.tests.helpers import deployed, predict_body
from workspaces.models import Role
from workspaces.testing.factories import token_for


@pytest.mark.django_db(transaction=True)
def test_rollback_under_load_is_effective_within_a_second_without_failures(workspace, members):
    actor = members[Role.MAINTAINER]
    scene, (v1, v2), dep = deployed(workspace, actor)
    deployment_release(actor=actor, workspace=workspace, deployment=dep, version=v2, reason="new")
    key = token_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    results: list[tuple[float, float, int, int | None]] = []
    stop = threading.Event()
    counter = iter(range(10**9))
    lock = threading.Lock()
    errors: list = []

    def load() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        try:
            while not stop.is_set():
                with lock:
                    n = next(counter)
                sent = time.monotonic()
                response = client.post(
                    url,
                    predict_body(scene, request_id=f"load-{n}", user=f"u{n % 12}"),
                    format="json",
                )
                version = response.json().get("version") if response.status_code == 200 else None
                if response.status_code != 200:
                    errors.append(response.content[:300])
                results.append((sent, time.monotonic(), response.status_code, version))
        finally:
            connection.close()

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.6)
        started_at = time.monotonic()
        deployment_rollback(actor=actor, workspace=workspace, deployment=dep, reason="dirty model")
        rolled_at = time.monotonic()
        time.sleep(1.6)
    finally:
        stop.set()
        for t in threads:
            t.join(10)

    assert results, "the load generator sent nothing"
    assert all(status == 200 for _, _, status, _ in results), (errors[:3], len(results))
    before = [v for sent, _, _, v in results if sent < started_at]
    after = [v for sent, _, _, v in results if sent >= rolled_at + 1.0]
    print([(round(s - started_at, 3), v) for s, _, _, v in results][:50])
    assert before and set(before) == {v2.version}
    assert after and set(after) == {v1.version}
    # Requests sent after the rollback returned: all on v1 within a second.
    late_v2 = [sent for sent, _, _, v in results if sent >= rolled_at and v == v2.version]
    assert not late_v2 or max(late_v2) - rolled_at < 1.0

    change = DeploymentChange.objects.for_workspace(workspace).filter(kind="rollback").get()
    assert change.actor == actor and change.reason == "dirty model"
    assert (change.from_version, change.to_version) == (v2, v1)
    # Every acknowledged predict is in the prediction log.
    predlog_flush()
    logged = PredictionLog.objects.for_workspace(workspace).count()
    assert logged == len(results)
