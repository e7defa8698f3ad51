"""The experiments demo step (order 40): an A/B test on the demo deployment, with simulated
traffic and feedback so the experiment page has results, a ramp and charts to show.

It needs serving's demo deployment (``feed-pctr`` / ``feed-ranker``). The challenger is another
gated version of the same model when there is one; otherwise the production job's bundle is
registered again and gated (an honest challenger for a demo: same model, new version). Traffic is
simulated the way the gateway would log it: each simulated user is routed through the published
routing table (``serving.routing.route``) and the request goes into serving's prediction log
(``serving.predlog.predlog_write``); feedback then goes through the same service as
``POST /feedback/``. Click-through is simulated per user (a Beta-distributed CTR around 5%) with a
planted +8% relative lift for the treatment, stated in the hypothesis. A rerun adds nothing.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import numpy as np
from django.utils import timezone

DEMO_WORKSPACE = "feed-pctr"
DEMO_DEPLOYMENT = "feed-ranker"
DEMO_KEY = "ranker-challenger"
WAVES = 6
USERS_PER_WAVE = 2500
BASE_CTR = 0.05
PLANTED_LIFT = 0.08


def _challenger(workspace, dep, stdout):
    from experiments.routing_bridge import version_gated
    from serving.gates import version_gates_run
    from serving.models import GateStatus, ModelVersion
    from serving.registry import model_version_register

    for version in (
        ModelVersion.objects.for_workspace(workspace)
        .filter(model=dep.model)
        .exclude(pk=dep.version_id)
        .order_by("-version")
    ):
        if version_gated(version):
            return version
    production = dep.version
    if production.job_id is None:
        return None
    version = model_version_register(
        actor=None,
        workspace=workspace,
        name=dep.model.name,
        job=production.job,
        description="Demo challenger (the production job's bundle, registered again).",
    )
    version = version_gates_run(actor=None, workspace=workspace, version=version)
    stdout.write(
        f"experiments demo: registered challenger {version} (gates {version.gate_status})\n"
    )
    return version if version.gate_status == GateStatus.PASSED else None


def _wave(workspace, dep, wave: int, rng, at, users: int) -> int:
    """One wave of simulated users: routed, logged as the gateway logs, then their feedback."""
    from experiments import services
    from serving.predlog import predlog_flush, predlog_write
    from serving.routing import route, routing_table

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


def run_demo(*, base_url: str, stdout, users_per_wave: int = USERS_PER_WAVE) -> None:
    from experiments import services
    from experiments.models import Experiment
    from serving.models import Deployment
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
    if Experiment.objects.for_workspace(workspace).filter(key=DEMO_KEY).exists():
        stdout.write(f"experiments demo: experiment {DEMO_KEY} exists; nothing to do\n")
        return
    challenger = _challenger(workspace, dep, stdout)
    if challenger is None:
        stdout.write("experiments demo: no gated challenger version; skipped\n")
        return
    started = time.monotonic()
    exp = services.experiment_create(
        actor=None,
        workspace=workspace,
        key=DEMO_KEY,
        hypothesis=(
            f"{challenger} ranks better than production and lifts CTR. (Demo: simulated traffic "
            f"and feedback with a planted +{PLANTED_LIFT:.0%} relative CTR lift.)"
        ),
        deployment=dep.name,
        treatment_versions=[challenger.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.1}, {"metric": "rpm", "max_drop": 0.2}],
        ramp_plan=[5, 10, 20],
        ramp_interval_s=3600,
        min_units=100,
    )
    now = timezone.now()
    start = now - timedelta(hours=WAVES)
    exp = services.experiment_submit(actor=None, experiment=exp, now=start)
    rng = np.random.default_rng(20261130)
    total = 0
    for wave in range(WAVES):
        at = start + timedelta(hours=wave + 1)
        total += _wave(workspace, dep, wave, rng, at, users_per_wave)
        exp.refresh_from_db()
        outcome = services.experiment_check(experiment=exp, now=at)
        if outcome == "stopped":
            break
    exp.refresh_from_db()
    stdout.write(
        f"experiments demo: {exp.key} is {exp.state} at {exp.traffic_percent}% per arm after "
        f"{total} simulated users in the experiment ({time.monotonic() - started:.1f} s); see "
        f"{base_url}/w/{DEMO_WORKSPACE}/experiments/{exp.key}/\n"
    )
