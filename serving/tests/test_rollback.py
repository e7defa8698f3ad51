"""Acceptance: a rollback under load moves the traffic back to the previous version, and no
request fails.

How fast it moves is a benchmark figure (``bench``'s serving area: ``rollback_s``), not a unit-test
assertion. Here the order of events decides: every request is numbered when it is sent and when
it returns, on one counter shared by the clients and the test; once a request sent after the
rollback has returned v1, every request sent later is answered by v1 too.
"""

import itertools
import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from serving.deployments import deployment_release, deployment_rollback
from serving.models import DeploymentChange, PredictionLog
from serving.predlog import predlog_flush
from serving.tests.helpers import deployed, predict_body
from workspaces.models import Role
from workspaces.testing.factories import token_for
from workspaces.testing.waiting import wait_until

AFTER = 20  # requests sent after the switch, all of which must be on v1


@pytest.mark.django_db(transaction=True)
def test_rollback_under_load_switches_to_the_previous_version_without_failures(workspace, members):
    actor = members[Role.MAINTAINER]
    scene, (v1, v2), dep = deployed(workspace, actor)
    deployment_release(actor=actor, workspace=workspace, deployment=dep, version=v2, reason="new")
    key = token_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    order = itertools.count()  # next() on it is atomic: one order for every thread
    results: list[tuple[int, int, int, int | None]] = []  # (sent, returned, status, version)
    stop = threading.Event()
    errors: list = []

    def load() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        try:
            while not stop.is_set():
                sent = next(order)
                response = client.post(
                    url,
                    predict_body(scene, request_id=f"load-{sent}", user=f"u{sent % 12}"),
                    format="json",
                )
                version = response.json().get("version") if response.status_code == 200 else None
                if response.status_code != 200:
                    errors.append(response.content[:300])
                results.append((sent, next(order), response.status_code, version))
        finally:
            connection.close()

    def switched_at(rolled: int) -> int | None:
        """When the first request sent after the rollback returned v1."""
        on_v1 = [ret for sent, ret, _, v in list(results) if sent > rolled and v == v1.version]
        return min(on_v1, default=None)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(results) >= 10, timeout=60, what="load on v2")
        rolling = next(order)
        deployment_rollback(actor=actor, workspace=workspace, deployment=dep, reason="dirty model")
        rolled = next(order)
        switch = wait_until(lambda: switched_at(rolled), timeout=60, what="a request on v1")
        wait_until(
            lambda: sum(1 for sent, *_ in list(results) if sent > switch) >= AFTER,
            timeout=60,
            what=f"{AFTER} requests after the switch",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(10)

    assert all(status == 200 for _, _, status, _ in results), (errors[:3], len(results))
    before = [v for _, returned, _, v in results if returned < rolling]
    after = [v for sent, _, _, v in results if sent > switch]
    assert len(before) >= 10 and set(before) == {v2.version}
    assert len(after) >= AFTER and set(after) == {v1.version}, after

    change = DeploymentChange.objects.for_workspace(workspace).filter(kind="rollback").get()
    assert change.actor == actor and change.reason == "dirty model"
    assert (change.from_version, change.to_version) == (v2, v1)
    # Every acknowledged predict is in the prediction log.
    predlog_flush()
    logged = PredictionLog.objects.for_workspace(workspace).count()
    assert logged == len(results)
