"""The flow: request -> review -> ramp -> read -> stop/conclude, with routing and events."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from experiments import services
from experiments.models import Experiment, ExperimentState, FeedbackEvent, Layer, Snapshot
from experiments.tests.factories import log_predictions, make_deployment
from serving.routing import route, routing_table
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Notification, Role

pytestmark = pytest.mark.django_db


def _create(workspace, owner, dep, versions, **extra):
    params = dict(  # noqa: C408 - keyword arguments for the service
        actor=owner,
        workspace=workspace,
        key=extra.pop("key", "ab1"),
        hypothesis="The new ranker lifts CTR by 3%.",
        deployment=dep.name,
        treatment_versions=[v.pk for v in versions],
        guardrails=[{"metric": "ctr", "max_drop": 0.05}],
        ramp_plan=[5, 10, 20],
        min_units=50,
    )
    if "layer" not in extra:  # a fixed salt: the simulated outcomes below are reproducible
        params["layer"] = Layer.objects.for_workspace(workspace).filter(
            name="fixed"
        ).first() or services.layer_create(
            actor=owner, workspace=workspace, name="fixed", salt="flow-tests"
        )
    params.update(extra)
    return services.experiment_create(**params)


def _verbs(workspace):
    return list(Event.objects.for_workspace(workspace).values_list("verb", flat=True))


def test_within_policy_starts_automatically_and_publishes_routes(workspace, members):
    owner = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = _create(workspace, owner, dep, [treatment])
    assert exp.state == ExperimentState.DRAFT
    assert exp.arms[0] == {"name": "control", "version_id": dep.version_id}
    exp = services.experiment_submit(actor=owner, experiment=exp)
    assert exp.state == ExperimentState.RUNNING and exp.review["automatic"]
    table = routing_table(workspace, dep.name)
    allocs = table["layers"][0]["allocations"]
    assert [(a["arm"], a["end"] - a["start"]) for a in allocs] == [
        ("control", 500),
        ("treatment", 500),
    ]
    arms = {route(table, f"u{i}")[2] for i in range(2000)}
    assert arms == {"control", "treatment", None}
    verbs = _verbs(workspace)
    for verb in (
        "experiments.experiment.created",
        "experiments.experiment.reviewed",
        "experiments.experiment.started",
        "serving.routing.experiment_set",
    ):
        assert verb in verbs


def test_outside_policy_waits_for_a_maintainer(workspace, members):
    dev, maintainer = members[Role.DEVELOPER], members[Role.MAINTAINER]
    dep, (treatment,) = make_deployment(workspace)
    exp = _create(workspace, dev, dep, [treatment], ramp_plan=[5, 50], guardrails=[])
    exp = services.experiment_submit(actor=dev, experiment=exp)
    assert exp.state == ExperimentState.PENDING_REVIEW
    assert len(exp.review["problems"]) == 2
    assert routing_table(workspace, dep.name)["layers"] == []
    exp = services.experiment_approve(actor=maintainer, experiment=exp, note="fine")
    assert exp.state == ExperimentState.RUNNING and exp.review["reviewer"] == maintainer.username
    assert "experiments.experiment.approved" in _verbs(workspace)


def test_a_flagged_submission_needs_another_maintainer(workspace, members):
    submitter, other = members[Role.MAINTAINER], members[Role.ADMIN]
    dep, (treatment,) = make_deployment(workspace)
    exp = _create(workspace, submitter, dep, [treatment], ramp_plan=[5, 50], guardrails=[])
    exp = services.experiment_submit(actor=submitter, experiment=exp)
    assert exp.state == ExperimentState.PENDING_REVIEW and exp.review["problems"]
    with pytest.raises(PermissionDenied, match="another maintainer"):
        services.experiment_approve(actor=submitter, experiment=exp)
    exp.refresh_from_db()
    assert exp.state == ExperimentState.PENDING_REVIEW and "approved" not in exp.review
    assert routing_table(workspace, dep.name)["layers"] == []
    exp = services.experiment_approve(actor=other, experiment=exp, note="second pair of eyes")
    assert exp.state == ExperimentState.RUNNING and exp.review["reviewer"] == other.username


def test_a_draft_changes_until_it_is_submitted(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (first, second) = make_deployment(workspace, treatments=2)
    exp = _create(workspace, dev, dep, [first])
    exp = services.experiment_update(
        actor=dev, experiment=exp, treatment_versions=[second.pk], ramp_plan=[2, 4]
    )
    exp.refresh_from_db()
    assert exp.arms[1]["version_id"] == second.pk and exp.ramp_plan == [2.0, 4.0]
    assert "experiments.experiment.updated" in _verbs(workspace)
    services.experiment_submit(actor=dev, experiment=exp)
    with pytest.raises(ConflictError, match="only a draft"):
        services.experiment_update(actor=dev, experiment=exp, ramp_plan=[1, 2])


def test_ungated_treatment_cannot_take_traffic(workspace, members):
    dev, maintainer = members[Role.DEVELOPER], members[Role.MAINTAINER]
    dep, (treatment,) = make_deployment(workspace, gated=False)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment])
    )
    assert exp.state == ExperimentState.PENDING_REVIEW
    assert "release gates" in exp.review["problems"][0]
    with pytest.raises(ConflictError):
        services.experiment_approve(actor=maintainer, experiment=exp)


def test_bad_requests_are_refused(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    with pytest.raises(ValidationError):
        _create(workspace, dev, dep, [dep.version])  # control as treatment
    with pytest.raises(ValidationError):
        _create(workspace, dev, dep, [treatment], ramp_plan=[20, 10])
    with pytest.raises(ValidationError):
        _create(workspace, dev, dep, [treatment], ramp_plan=[60])
    with pytest.raises(ValidationError):
        _create(workspace, dev, dep, [treatment], guardrails=[{"metric": "nope"}])


def test_experiments_in_one_layer_get_disjoint_blocks(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, treatments = make_deployment(workspace, treatments=3)
    e1 = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatments[0]], key="e1")
    )
    e2 = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatments[1]], key="e2")
    )
    assert (e1.block_start, e1.block_size) == (0, 4000)
    assert e2.block_start == 4000
    e3 = _create(workspace, dev, dep, [treatments[2]], key="e3")
    with pytest.raises(ConflictError):
        services.experiment_submit(actor=dev, experiment=e3)
    assert Experiment.objects.for_workspace(workspace).get(key="e3").state == "draft"
    e4 = _create(workspace, dev, dep, [treatments[2]], key="e4", layer="other")
    e4 = services.experiment_submit(actor=dev, experiment=e4)
    assert e4.block_start == 0 and e4.layer.salt != e1.layer.salt


def _traffic(workspace, dep, exp, *, units, ctr, rng, imps=10):
    """Gateway-logged requests of ``units`` and their feedback with per-arm CTRs."""
    table = routing_table(workspace, dep.name)
    served = log_predictions(workspace, dep, lambda u: route(table, u), units)
    events = []
    for rid, _unit, arm in served:
        if arm is None:
            continue
        clicks = int(rng.binomial(imps, ctr[arm]))
        events.append(
            {
                "request_id": rid,
                "event_id": f"fb-{rid}",
                "impressions": imps,
                "clicks": clicks,
                "conversions": int(clicks > 2),
                "revenue": clicks * 0.5,
            }
        )
    for i in range(0, len(events), 2000):
        services.feedback_record(actor=None, workspace=workspace, events=events[i : i + 2000])
    return served


def test_feedback_is_joined_and_idempotent(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment], ramp_plan=[20])
    )
    table = routing_table(workspace, dep.name)
    served = log_predictions(
        workspace, dep, lambda u: route(table, u), [f"u{i}" for i in range(60)]
    )
    served = [s for s in served if s[2]][:4]
    assert len(served) == 4
    events = [{"request_id": rid, "impressions": 3, "clicks": 1} for rid, _, _ in served]
    events.append({"request_id": "never-served", "impressions": 1})
    first = services.feedback_record(
        actor=dev, workspace=workspace, events=events, idempotency_key="batch-1"
    )
    assert first == {"received": 5, "accepted": 5, "duplicates": 0, "unmatched": 1}
    again = services.feedback_record(
        actor=dev, workspace=workspace, events=events, idempotency_key="batch-1"
    )
    assert again["accepted"] == 0 and again["duplicates"] == 5
    rows = FeedbackEvent.objects.for_workspace(workspace).exclude(request_id="never-served")
    assert {(r.unit_id, r.arm) for r in rows} == {(u, a) for _, u, a in served}
    assert all(r.experiment_id == exp.pk for r in rows)
    with pytest.raises(ValidationError):
        services.feedback_record(actor=dev, workspace=workspace, events=[{"request_id": "x"}])


def test_ramp_advances_on_schedule_while_guardrails_hold(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment], ramp_plan=[10, 20])
    )
    rng = np.random.default_rng(1)
    _traffic(
        workspace,
        dep,
        exp,
        units=[f"u{i}" for i in range(3000)],
        ctr={"control": 0.1, "treatment": 0.1},
        rng=rng,
    )
    assert services.experiment_check(experiment=exp) == "held"  # not due yet
    later = timezone.now() + timedelta(days=2)
    exp.refresh_from_db()
    assert services.experiment_check(experiment=exp, now=later) == "ramped"
    exp.refresh_from_db()
    assert exp.traffic_percent == 20 and len(exp.ramp_history) == 2
    assert exp.snapshots.count() == 2


def test_planted_guardrail_breach_stops_and_routes_everyone_to_control(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment], ramp_plan=[20])
    )
    rng = np.random.default_rng(2)
    units = [f"u{i}" for i in range(4000)]
    _traffic(workspace, dep, exp, units=units, ctr={"control": 0.2, "treatment": 0.1}, rng=rng)
    # How fast the stop reaches the routing table is a benchmark (bench: guardrail_rollback_s),
    # not a unit-test assertion: here, that one check stops it and routes everyone to control.
    assert services.experiment_check(experiment=exp) == "stopped"
    table = routing_table(workspace, dep.name)
    assert {route(table, u)[0] for u in units} == {dep.version_id}
    exp.refresh_from_db()
    assert exp.state == ExperimentState.STOPPED and "guardrail ctr" in exp.stop_reason
    note = Notification.objects.for_workspace(workspace).get(recipient=dev)
    assert note.verb == "experiment.stopped"
    assert {"experiments.experiment.stopped", "serving.routing.experiment_cleared"} <= set(
        _verbs(workspace)
    )


def test_sample_ratio_mismatch_stops_the_experiment(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment], ramp_plan=[20])
    )
    table = routing_table(workspace, dep.name)

    def lossy(unit):  # a broken logger drops half of the treatment's requests
        version, key, arm = route(table, unit)
        if arm == "treatment" and int(unit[1:]) % 2:
            return dep.version_id, None, None
        return version, key, arm

    log_predictions(workspace, dep, lossy, [f"u{i}" for i in range(6000)])
    assert services.experiment_check(experiment=exp) == "stopped"
    exp.refresh_from_db()
    assert "sample ratio mismatch" in exp.stop_reason


def test_discard_keeps_the_decision_and_its_evidence(workspace, members):
    dev, maintainer = members[Role.DEVELOPER], members[Role.MAINTAINER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment])
    )
    snap = services.snapshot_take(experiment=exp)
    exp = services.experiment_conclude(
        actor=maintainer, experiment=exp, action="discard", note="no lift"
    )
    assert exp.state == ExperimentState.CONCLUDED
    assert exp.decision["action"] == "discard"
    # The evidence is a final snapshot taken at the decision, not the earlier one.
    final = Snapshot.objects.for_workspace(workspace).filter(experiment=exp).first()
    assert final.pk != snap.pk
    assert exp.decision["evidence"]["snapshot_id"] == final.pk
    assert routing_table(workspace, dep.name)["layers"] == []
    with pytest.raises(ConflictError):
        services.experiment_conclude(actor=maintainer, experiment=exp, action="discard")


def test_the_evidence_is_the_analysis_at_decision_time_not_the_last_snapshot(workspace, members):
    dev, maintainer = members[Role.DEVELOPER], members[Role.MAINTAINER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment], ramp_plan=[20])
    )
    table = routing_table(workspace, dep.name)
    served = log_predictions(
        workspace, dep, lambda u: route(table, u), [f"u{i}" for i in range(400)]
    )
    stale = services.snapshot_take(experiment=exp)  # before any feedback: CTR 0.0 / 0.0
    assert {a["ctr"] for a in stale.result["arms"].values()} == {0.0}
    # Feedback that arrives after the last scheduled snapshot.
    clicks = {"control": 6, "treatment": 7}
    events = [
        {"request_id": rid, "event_id": f"late-{rid}", "impressions": 10, "clicks": clicks[arm]}
        for rid, _unit, arm in served
        if arm
    ]
    services.feedback_record(actor=None, workspace=workspace, events=events)

    exp = services.experiment_conclude(actor=maintainer, experiment=exp, action="discard")

    evidence = exp.decision["evidence"]
    arms = evidence["summary"]["arms"]
    assert arms["control"]["ctr"] == pytest.approx(0.6)
    assert arms["treatment"]["ctr"] == pytest.approx(0.7)
    assert arms["control"]["units"] + arms["treatment"]["units"] == len(events)
    assert evidence["snapshot_id"] != stale.pk
    final = Snapshot.objects.for_workspace(workspace).get(pk=evidence["snapshot_id"])
    assert final.result["arms"]["treatment"]["ctr"] == pytest.approx(0.7)
    event = Event.objects.for_workspace(workspace).get(verb="experiments.experiment.concluded")
    assert event.payload["evidence"] == evidence


def test_an_experiment_discarded_in_review_keeps_an_empty_read_out_as_evidence(workspace, members):
    dev, maintainer = members[Role.DEVELOPER], members[Role.MAINTAINER]
    dep, (treatment,) = make_deployment(workspace)
    exp = _create(workspace, dev, dep, [treatment], ramp_plan=[5, 50], guardrails=[])
    exp = services.experiment_submit(actor=dev, experiment=exp)
    assert exp.state == ExperimentState.PENDING_REVIEW

    exp = services.experiment_conclude(actor=maintainer, experiment=exp, action="discard")

    assert exp.state == ExperimentState.CONCLUDED
    arms = exp.decision["evidence"]["summary"]["arms"]
    assert {name: arm["units"] for name, arm in arms.items()} == {"control": 0, "treatment": 0}


def test_cuped_uses_pre_period_clicks_and_narrows_the_interval(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    rng = np.random.default_rng(8)
    units = [f"u{i}" for i in range(3000)]
    propensity = dict(zip(units, rng.gamma(1.5, 0.08, size=len(units)), strict=True))
    # two weeks of production traffic before the experiment: the pre-period
    pre = log_predictions(workspace, dep, lambda u: (dep.version_id, None, None), units)
    services.feedback_record(
        actor=None,
        workspace=workspace,
        events=[
            {
                "request_id": rid,
                "event_id": f"pre-{rid}",
                "impressions": 20,
                "clicks": int(rng.binomial(20, min(0.9, propensity[u]))),
            }
            for rid, u, _ in pre
        ],
    )
    FeedbackEvent.objects.for_workspace(workspace).update(
        created_at=timezone.now() - timedelta(days=3)
    )
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment], ramp_plan=[20])
    )
    table = routing_table(workspace, dep.name)
    served = log_predictions(workspace, dep, lambda u: route(table, u), units)
    services.feedback_record(
        actor=None,
        workspace=workspace,
        events=[
            {
                "request_id": rid,
                "event_id": f"post-{rid}",
                "impressions": 20,
                "clicks": int(
                    rng.binomial(
                        20, min(0.9, propensity[u] * (1.05 if arm == "treatment" else 1.0))
                    )
                ),
            }
            for rid, u, arm in served
            if arm
        ],
    )
    result = services.experiment_analyze(exp, cuped=True)
    cuped = result["effects"]["treatment"]["clicks_per_unit_cuped"]
    assert cuped["theta"] > 0.5
    width = lambda e: e["ci_high"] - e["ci_low"]  # noqa: E731
    assert width(cuped["relative"]) < 0.8 * width(cuped["unadjusted"])
    assert "clicks_per_unit_cuped" not in services.experiment_analyze(exp)["effects"]["treatment"]
