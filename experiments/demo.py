"""The experiments demo step (order 40): the one action on the demo workspace. It presses "Try in
an A/B experiment" on the ``user_profile`` feature group (whose ``impressions_7d`` the demo's
first model does not read): the loop adds its features to the sample stream, builds samples,
trains the workspace's default template, checks the candidate against production on the same
held-out rows, registers and gates it, loads it as the challenger inside ``feed-ranker`` and
starts the experiment. Traffic is then simulated so the experiment page has results, a ramp
and charts to show.

The loop runs on the platform's worker (the `make run` worker advances pipelines and trains on
the local node); this step also advances it itself (safe: a run is advanced by one process at a
time) and places a job the scheduler has not placed after a while, like the training demo. The
experiment is then given six simulated hours of history: each simulated user is routed through
the published routing table (``serving.routing.route``) and the request goes into serving's
prediction log (``serving.predlog.predlog_write``); feedback goes through the same service as
``POST /feedback/``. Click-through is simulated per user (a Beta-distributed CTR around 5%) with
a planted +8% relative lift for the treatment, stated in the hypothesis. A rerun adds nothing.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import numpy as np

DEMO_WORKSPACE = "feed-pctr"
DEMO_DEPLOYMENT = "feed-ranker"
DEMO_GROUP = "user_profile"
WAVES = 6
USERS_PER_WAVE = 2500
BASE_CTR = 0.05
PLANTED_LIFT = 0.08
LOOP_WAIT_S = 900.0
PLACE_AFTER_S = 20.0
# The demo's experiment policy: hourly ramp steps, so six simulated hours reach the last step.
DEMO_LOOP_POLICY = {
    "ramp_plan": [5, 10, 20],
    "ramp_interval_s": 3600,
    "guardrails": [{"metric": "ctr", "max_drop": 0.1}, {"metric": "rpm", "max_drop": 0.2}],
    "primary_metric": "ctr",
    "min_units": 100,
}


def _run_loop(workspace, group: str, stdout, *, place_on: str, place_after_s: float):
    """Start (or find) the demo's loop and wait until it ends; returns the run."""
    from experiments import loop
    from training import pipelines
    from training.demo import PARAMS
    from training.models import JobState, RunState, TrainingJob
    from workspaces.services import workspace_update

    # The demo workspace's policy: hourly ramp steps, and the first model's template and
    # parameters as the default model the loop trains.
    wanted = {"loop": DEMO_LOOP_POLICY, "model": {"template": "fine_ranking", "params": PARAMS}}
    template = workspace.template or {}
    if any(template.get(key) != value for key, value in wanted.items()):
        workspace = workspace_update(
            actor=None, workspace=workspace, template={**template, **wanted}
        )
    run = loop.loops_of(workspace).filter(params__group=group).first()
    if run is None or run.state == RunState.FAILED:
        if run is not None:
            run = loop.loop_retry(actor=None, run=run)
        else:
            run = loop.loop_start(
                actor=None, workspace=workspace, group=group, deployment=DEMO_DEPLOYMENT
            )
        stdout.write(
            f"experiments demo: pressed 'Try in an A/B experiment' on {group}: loop #{run.pk}\n"
        )
    started = time.monotonic()
    while time.monotonic() - started < LOOP_WAIT_S:
        state = pipelines.pipeline_run_advance(run.pk, dispatch=False)
        if state != RunState.RUNNING:
            break
        job_id = (
            run.stage_runs.filter(name="train").values_list("output", flat=True).first() or {}
        ).get("job_id")
        job = TrainingJob.objects.for_workspace(workspace).filter(pk=job_id).first()
        if (
            job is not None
            and job.state in {JobState.PENDING, JobState.ADMITTED}
            and (time.monotonic() - started > PLACE_AFTER_S)
        ):
            from training.demo import place_locally

            place_locally(job, stdout, node_name=place_on)
        time.sleep(1.0)
    run.refresh_from_db()
    stages = ", ".join(
        f"{s.name} {(s.finished_at - s.started_at).total_seconds():.0f} s"
        for s in run.stage_runs.order_by("position")
        if s.started_at and s.finished_at
    )
    stdout.write(f"experiments demo: loop #{run.pk} {run.state} ({stages})\n")
    return run


def _backdate(exp, hours: int):
    """Give the started experiment a history: it started ``hours`` ago (the simulation fills
    those hours with traffic)."""
    start = exp.started_at - timedelta(hours=hours)
    exp.started_at = start
    exp.next_ramp_at = start + timedelta(seconds=exp.ramp_interval_s)
    exp.ramp_history = [{**exp.ramp_history[0], "at": start.isoformat()}]
    exp.save(update_fields=["started_at", "next_ramp_at", "ramp_history"])
    return start


def _wave(workspace, dep, wave: int, rng, at, users: int) -> int:
    """One wave of simulated users: routed, logged as the gateway logs, then their feedback."""
    from experiments import services
    from serving.selectors import route, routing_table
    from serving.services import predlog_flush, predlog_write

    table = routing_table(workspace, dep)
    served = []
    for i in range(users):
        unit = f"demo-user-{wave}-{i}"
        version_id, experiment, arm = route(table, unit)
        request_id = f"demo-{uuid.uuid4().hex}"
        predlog_write(
            {
                "w": workspace.pk,
                "r": request_id,
                "u": unit,
                "d": dep.pk,
                "dn": dep.name,
                "v": version_id,
                "e": experiment,
                "a": arm,
                "n": 10,
                "l": 0.0,
                "t": at.timestamp(),
            }
        )
        if arm:
            served.append((request_id, arm))
    predlog_flush()
    events = []
    for request_id, arm in served:
        ctr = BASE_CTR * (1 + PLANTED_LIFT if arm != "control" else 1)
        p = rng.beta(ctr * 30, (1 - ctr) * 30)
        impressions = int(1 + rng.poisson(9))
        clicks = int(rng.binomial(impressions, p))
        conversions = int(rng.binomial(clicks, 0.2))
        events.append(
            {
                "request_id": request_id,
                "event_id": f"{request_id}:fb",
                "impressions": impressions,
                "clicks": clicks,
                "conversions": conversions,
                "revenue": round(conversions * float(rng.gamma(2.0, 3.0)), 2),
            }
        )
    for start in range(0, len(events), 2000):
        services.feedback_record(
            actor=None, workspace=workspace, events=events[start : start + 2000]
        )
    return len(served)


def run_demo(
    *,
    base_url: str,
    stdout,
    users_per_wave: int = USERS_PER_WAVE,
    group: str = DEMO_GROUP,
    place_on: str = "local",
    place_after_s: float = PLACE_AFTER_S,
) -> None:
    from experiments.models import Experiment, ExperimentState
    from features.models import FeatureGroup
    from serving.models import Deployment
    from training.models import RunState
    from workspaces.models import Workspace

    workspace = Workspace.objects.filter(slug=DEMO_WORKSPACE).first()
    dep = (
        Deployment.objects.for_workspace(workspace).filter(name=DEMO_DEPLOYMENT).first()
        if workspace
        else None
    )
    if dep is None:
        stdout.write("experiments demo: no demo deployment yet (serving step); skipped\n")
        return
    if not FeatureGroup.objects.for_workspace(workspace).filter(name=group).exists():
        stdout.write(f"experiments demo: no feature group {group} (features step); skipped\n")
        return
    run = _run_loop(workspace, group, stdout, place_on=place_on, place_after_s=place_after_s)
    if run.state != RunState.SUCCEEDED:
        stdout.write(
            f"experiments demo: the loop stopped: {run.error}; see "
            f"{base_url}/w/{DEMO_WORKSPACE}/loops/{run.pk}/\n"
        )
        return
    exp = Experiment.objects.for_workspace(workspace).get(pk=run.context["experiment_id"])
    if exp.snapshots.exists() or exp.state != ExperimentState.RUNNING:
        stdout.write(f"experiments demo: experiment {exp.key} has its traffic; nothing to do\n")
        return
    _simulate(workspace, dep, exp, users_per_wave)
    exp.refresh_from_db()
    stdout.write(
        f"experiments demo: {exp.key} is {exp.state} at {exp.traffic_percent}% per arm; see "
        f"{base_url}/w/{DEMO_WORKSPACE}/experiments/{exp.key}/ and the loop at "
        f"{base_url}/w/{DEMO_WORKSPACE}/loops/{run.pk}/\n"
    )


def _simulate(workspace, dep, exp, users_per_wave: int) -> int:
    """Six simulated hours of routed traffic and feedback, with the hourly checks."""
    from experiments import services

    start = _backdate(exp, WAVES)
    rng = np.random.default_rng(20261130)
    total = 0
    for wave in range(WAVES):
        at = start + timedelta(hours=wave + 1)
        total += _wave(workspace, dep, wave, rng, at, users_per_wave)
        exp.refresh_from_db()
        if services.experiment_check(experiment=exp, now=at) == "stopped":
            break
    return total
