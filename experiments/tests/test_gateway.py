"""Acceptance with serving's real gateway under load: a planted guardrail breach moves all
traffic to control, and promoting the winner switches production, both without a failed predict
request.

How fast the traffic moves is a benchmark figure (``bench``'s experiments area:
``guardrail_rollback_s``), not a unit-test assertion. Here the order of events decides: every
request is numbered when it is sent and when it returns, on one counter shared by the clients and
the test; once a request sent after the change has returned the new route, every request sent
later takes it too.
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import numpy as np
import pytest
from django.db import connection
from rest_framework.test import APIClient

from experiments import services
from serving.deployments import deployment_create
from serving.models import PredictionLog
from serving.predlog import list_key, predlog_flush, redis_client
from serving.tests.factories import make_scene
from serving.tests.helpers import passing_version, predict_body
from workspaces.models import Role
from workspaces.testing.factories import token_for
from workspaces.testing.waiting import wait_until

USERS = 120


def _setup(workspace, actor, approver):
    scene = make_scene(workspace, actor, users=USERS)
    v1 = passing_version(scene, actor, seed=0)
    v2 = passing_version(scene, actor, seed=1)
    dep = deployment_create(actor=actor, workspace=workspace, name="main", version=v1)
    exp = services.experiment_create(
        actor=actor,
        workspace=workspace,
        key="gw-ab",
        hypothesis="v2 ranks better",
        deployment=dep.name,
        treatment_versions=[v2.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.05}],
        ramp_plan=[50],
        min_units=20,
    )
    exp = services.experiment_submit(actor=actor, experiment=exp)
    # 50% per arm is flagged, so another maintainer approves it
    exp = services.experiment_approve(actor=approver, experiment=exp, note="load test")
    return scene, v1, v2, dep, exp


# SQLite's in-memory test database locks whole tables across threads: there the load is one
# client and the test's own writes wait between its requests (``load.quiet()``). PostgreSQL
# gets three concurrent clients and no pauses.
SQLITE = connection.vendor == "sqlite"


class Load:
    """Clients sending predicts for the scene's users until stopped."""

    def __init__(self, workspace, scene, key):
        self.gate = threading.Lock()
        self.url = f"/api/v1/workspaces/{workspace.slug}/predict/"
        self.scene, self.key = scene, key
        # (sent, returned, status, arm, version), numbered on ``order``
        self.results: list[tuple[int, int, int, str | None, int | None]] = []
        self.stop = threading.Event()
        self.order = itertools.count()  # next() on it is atomic: one order for every thread
        self.threads = [threading.Thread(target=self._run) for _ in range(1 if SQLITE else 3)]

    def quiet(self):
        return self.gate if SQLITE else contextlib.nullcontext()

    def now(self) -> int:
        """A mark on the requests' order: later requests are sent after it."""
        return next(self.order)

    def wait_for_sent(self, *, after: int = -1, count: int = 5, timeout: float = 60.0):
        """Wait until ``count`` answered requests were sent after the mark ``after``, however
        slowly the machine serves them: the window is counted in requests."""
        wait_until(
            lambda: sum(1 for sent, *_ in list(self.results) if sent > after) >= count,
            timeout=timeout,
            what=f"{count} requests answered",
        )

    def switched(self, *, after: int, route) -> int:
        """The mark at which the first request sent after ``after`` returned ``route`` (an
        (arm, version) pair), waiting for it."""

        def first() -> int | None:
            results = list(self.results)
            hits = [ret for sent, ret, _, *got in results if sent > after and tuple(got) == route]
            return min(hits, default=None)

        return wait_until(first, timeout=60, what=f"a request routed to {route}")

    def _run(self):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {self.key}")
        try:
            while not self.stop.is_set():
                sent = n = next(self.order)
                body = predict_body(self.scene, request_id=f"r-{n}", user=f"u{n % USERS}", n=5)
                with self.quiet():
                    response = client.post(self.url, body, format="json")
                data = response.json() if response.status_code == 200 else {}
                self.results.append(
                    (
                        sent,
                        next(self.order),
                        response.status_code,
                        data.get("arm"),
                        data.get("version"),
                    )
                )
        finally:
            connection.close()

    def __enter__(self):
        _drop_stale_log_records()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(10)
        predlog_flush()  # leave nothing queued for a later test's (flushed) database


def _drop_stale_log_records():
    """Records queued by an earlier test point at rows its database flush removed."""
    client = redis_client()
    if client is not None:
        client.delete(list_key())


def _feedback(workspace, ctr):
    predlog_flush()
    rng = np.random.default_rng(9)
    logs = PredictionLog.objects.for_workspace(workspace).exclude(arm="")
    events = [
        {
            "request_id": log.request_id,
            "event_id": log.request_id,
            "impressions": 10,
            "clicks": int(rng.binomial(10, ctr[log.arm])),
        }
        for log in logs
    ]
    services.feedback_record(actor=None, workspace=workspace, events=events)
    return len(events)


@pytest.mark.django_db(transaction=True)
def test_planted_guardrail_breach_moves_all_traffic_to_control_without_failures(workspace, members):
    actor = members[Role.MAINTAINER]
    scene, v1, _v2, _dep, exp = _setup(workspace, actor, members[Role.ADMIN])
    control = (None, v1.version)
    with Load(workspace, scene, token_for(actor)) as load:
        load.wait_for_sent(count=60)  # traffic in the experiment before the breach
        before_breach = load.now()
        with load.quiet():
            assert _feedback(workspace, {"control": 0.3, "treatment": 0.05}) > 40
            assert services.experiment_check(experiment=exp) == "stopped"
        stopped = load.now()
        switch = load.switched(after=stopped, route=control)
        load.wait_for_sent(after=switch, count=20)
    results = load.results
    assert results and all(status == 200 for _, _, status, _, _ in results)
    before = [arm for _, returned, _, arm, _ in results if returned < before_breach]
    after = [(arm, v) for sent, _, _, arm, v in results if sent > switch]
    assert len(before) >= 60 and None not in before  # 50% per arm: every unit in the experiment
    assert len(after) >= 20 and set(after) == {control}
    exp.refresh_from_db()
    assert exp.state == "stopped" and "guardrail" in exp.stop_reason


@pytest.mark.django_db(transaction=True)
def test_promoting_the_winner_switches_production_without_failures(workspace, members):
    actor = members[Role.MAINTAINER]
    scene, _v1, v2, dep, exp = _setup(workspace, actor, members[Role.ADMIN])
    with Load(workspace, scene, token_for(actor)) as load:
        load.wait_for_sent(count=60)
        with load.quiet():
            _feedback(workspace, {"control": 0.1, "treatment": 0.2})
            services.snapshot_take(experiment=exp)
            exp = services.experiment_conclude(
                actor=actor, experiment=exp, action="promote", note="clear win"
            )
        promoted = load.now()
        switch = load.switched(after=promoted, route=(None, v2.version))
        load.wait_for_sent(after=switch, count=20)
    results = load.results
    assert results and all(status == 200 for _, _, status, _, _ in results)
    after = {(arm, v) for sent, _, _, arm, v in results if sent > switch}
    assert after == {(None, v2.version)}
    dep.refresh_from_db()
    assert dep.version_id == v2.pk and dep.model.aliases.get("production") == v2.version
    assert exp.decision["action"] == "promote" and exp.decision["version_id"] == v2.pk
    assert exp.decision["evidence"]["summary"]["effects"]["treatment"]["relative"]["estimate"] > 0
