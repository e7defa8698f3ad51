"""The REST API end to end: create, submit, feedback (idempotent), analysis, stop, layers."""

from __future__ import annotations

import pytest

from experiments.tests.factories import (
    click_events,
    experiment_request,
    make_deployment,
    served_in_experiment,
)
from serving.routing import routing_table
from workspaces.models import Role

pytestmark = pytest.mark.django_db
WS = "/api/v1/workspaces/{}"


def test_experiment_lifecycle_over_the_api(workspace, members, client_for):
    dev = client_for(members[Role.DEVELOPER])
    maintainer = client_for(members[Role.MAINTAINER])
    base = WS.format(workspace.slug)
    dep, (treatment,) = make_deployment(workspace)
    created = dev.post(
        f"{base}/experiments/", experiment_request("api-ab", dep, [treatment]), format="json"
    )
    assert created.status_code == 201, created.json()
    assert created.json()["state"] == "draft"
    submitted = dev.post(f"{base}/experiments/api-ab/submit/")
    assert submitted.status_code == 200 and submitted.json()["state"] == "running"
    assert len(submitted.json()["allocations"]) == 2

    served = served_in_experiment(workspace, dep, units=1500)
    events = click_events(
        served,
        click_rate={"control": 0.1, "treatment": 0.1},
        seed=3,
        conversions=0,
        revenue=0.25,
    )
    headers = {"HTTP_IDEMPOTENCY_KEY": "batch-42"}
    first = dev.post(f"{base}/feedback/", {"events": events}, format="json", **headers)
    assert first.status_code == 200, first.json()
    assert first.json()["accepted"] == len(events)
    replay = dev.post(f"{base}/feedback/", {"events": events}, format="json", **headers)
    assert replay.json() == {
        "received": len(events),
        "accepted": 0,
        "duplicates": len(events),
        "unmatched": 0,
    }

    analysis = dev.get(f"{base}/experiments/api-ab/analysis/").json()
    arms = analysis["arms"]
    assert arms["control"]["units"] + arms["treatment"]["units"] == len({u for _, u, _ in served})
    ctr = analysis["effects"]["treatment"]["ctr"]
    assert {"relative", "absolute", "sequential"} <= set(ctr)
    assert ctr["sequential"]["ci_low"] < ctr["relative"]["ci_low"]
    assert analysis["srm"]["mismatch"] is False
    assert analysis["arms"]["control"]["rpm"] == pytest.approx(1000 * 0.25 / 10, rel=1e-9)

    assert dev.post(f"{base}/experiments/api-ab/ramp/").status_code == 403
    ramped = maintainer.post(f"{base}/experiments/api-ab/ramp/")
    assert ramped.json()["traffic_percent"] == 20
    assert maintainer.post(f"{base}/experiments/api-ab/ramp/").status_code == 409

    stopped = dev.post(f"{base}/experiments/api-ab/stop/", {"reason": "enough"}, format="json")
    assert stopped.json()["state"] == "stopped"
    assert routing_table(workspace, dep.name)["layers"] == []
    concluded = maintainer.post(
        f"{base}/experiments/api-ab/conclude/", {"action": "discard"}, format="json"
    )
    assert concluded.json()["decision"]["action"] == "discard"

    layer = dev.get(f"{base}/experiment-layers/default/").json()
    assert layer["buckets"] == 10000 and layer["experiments"] == []
    listing = dev.get(f"{base}/experiments/?state=concluded").json()
    assert [e["key"] for e in listing["results"]] == ["api-ab"]


def test_bad_feedback_is_a_400(workspace, members, client_for):
    dev = client_for(members[Role.DEVELOPER])
    url = f"{WS.format(workspace.slug)}/feedback/"
    for body in (
        {"events": []},
        {"events": "nope"},
        {"events": [{"request_id": "r", "event_id": "e", "impressions": -1}]},
        {"events": [{"request_id": "r", "event_id": "e", "revenue": "NaN"}]},
        {"events": [{"request_id": "r"}]},  # no event id and no Idempotency-Key
        [1, 2],
    ):
        response = dev.post(url, body, format="json")
        assert response.status_code == 400, body
