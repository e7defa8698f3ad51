"""The foundation: API latency through gunicorn, token authentication and event-log writes.

Seeds two workspaces, members with every role and 5,000 events through the services, then
starts ``gunicorn config.wsgi`` (2 gthread workers, 4 threads each) on 127.0.0.1 against the
throwaway database and times requests one after another over one keep-alive connection.

Measures:

- ``workspace_get_p50_ms`` / ``workspace_get_p99_ms``: GET /api/v1/workspaces/{ws}/ with a token.
- ``activity_list_p50_ms`` / ``activity_list_p99_ms``: GET /api/v1/workspaces/{ws}/activity/
  ?limit=50 on a workspace holding 4,000 of the events.
- ``healthz_p50_ms``: GET /healthz, the baseline (no authentication, no database).
- ``token_auth_overhead_ms``: p50 of the authenticated workspace GET minus p50 of /healthz.
- ``event_write_per_s``: events recorded per second through ``workspaces.events.event_record``,
  one transaction per event (as a service writes them), measured in this process while seeding.
"""

from __future__ import annotations

import time

from django.contrib.auth import get_user_model
from django.db import transaction

from bench.harness import Context, LocalHttp, gunicorn_server, percentile
from workspaces import services
from workspaces.events import Ref, event_record
from workspaces.models import PredictionType, Role, Workspace

EVENTS = 5_000
# Every fifth event goes to the second workspace, the rest to the one whose activity is read.
OTHER_WORKSPACE_EVERY = 5
WARMUP = 50
REQUESTS = 500
VERBS = ("model.trained", "feature.registered", "deployment.promoted", "experiment.started")


def _seed_workspaces() -> tuple[Workspace, Workspace, str]:
    """Two workspaces, one member per role (plus one in both) and an API token for that one."""
    users = get_user_model().objects
    main = services.workspace_create(
        actor=None,
        slug="bench-feed",
        name="Bench feed ranking",
        scene="bench-feed",
        prediction_type=PredictionType.FINE_RANK,
    )
    other = services.workspace_create(
        actor=None,
        slug="bench-search",
        name="Bench search ranking",
        scene="bench-search",
        prediction_type=PredictionType.PCTR,
    )
    for role in Role.values:
        for workspace in (main, other):
            user = users.create_user(f"bench-{workspace.slug}-{role}")  # no usable password
            services.membership_grant(actor=None, workspace=workspace, user=user, role=role)
    caller = users.create_user("bench-caller")
    services.membership_grant(actor=None, workspace=main, user=caller, role=Role.DEVELOPER)
    services.membership_grant(actor=None, workspace=other, user=caller, role=Role.VIEWER)
    _token, key = services.api_token_create(actor=None, user=caller, name="bench")
    return main, other, key


def _write_events(main: Workspace, other: Workspace) -> float:
    """Record EVENTS events, one transaction each; return the events written per second."""
    actor = get_user_model().objects.get(username="bench-caller")
    main_ref, other_ref = Ref.to(main), Ref.to(other)
    started = time.perf_counter()
    for i in range(EVENTS):
        in_other = i % OTHER_WORKSPACE_EVERY == OTHER_WORKSPACE_EVERY - 1
        workspace, workspace_ref = (other, other_ref) if in_other else (main, main_ref)
        with transaction.atomic():
            event_record(
                actor=actor,
                workspace=workspace,
                verb=VERBS[i % len(VERBS)],
                refs=[
                    workspace_ref,
                    Ref(kind="model", object_id=i, label=f"model-{i}", role="output"),
                ],
                resources={"cpu_hours": 0.25, "gpu_hours": 0.0},
                payload={"run": i, "metrics": {"auc": 0.71, "logloss": 0.43}, "note": "bench"},
            )
    return EVENTS / (time.perf_counter() - started)


def run(ctx: Context) -> dict[str, float]:
    ctx.parameters.update(
        events=EVENTS,
        warmup_requests=WARMUP,
        requests_per_measure=REQUESTS,
        gunicorn={"workers": 2, "worker_class": "gthread", "threads": 4},
    )
    main, other, key = _seed_workspaces()
    ctx.log(f"recording {EVENTS:,} events through event_record ...")
    event_write_per_s = _write_events(main, other)

    ctx.log("starting gunicorn ...")
    with gunicorn_server(ctx, workers=2, threads=4) as port:
        ctx.log(f"gunicorn on 127.0.0.1:{port}; {WARMUP} warm-up + {REQUESTS} requests each")
        anonymous = LocalHttp(port)
        client = LocalHttp(port, headers={"Authorization": f"Token {key}"})
        try:
            healthz = anonymous.timed_gets("/healthz", count=REQUESTS, warmup=WARMUP)
            workspace_get = client.timed_gets(
                f"/api/v1/workspaces/{main.slug}/", count=REQUESTS, warmup=WARMUP
            )
            activity = client.timed_gets(
                f"/api/v1/workspaces/{main.slug}/activity/?limit=50",
                count=REQUESTS,
                warmup=WARMUP,
            )
        finally:
            anonymous.close()
            client.close()

    healthz_p50 = percentile(healthz, 50)
    workspace_p50 = percentile(workspace_get, 50)
    return {
        "workspace_get_p50_ms": workspace_p50,
        "workspace_get_p99_ms": percentile(workspace_get, 99),
        "activity_list_p50_ms": percentile(activity, 50),
        "activity_list_p99_ms": percentile(activity, 99),
        "healthz_p50_ms": healthz_p50,
        "token_auth_overhead_ms": workspace_p50 - healthz_p50,
        "event_write_per_s": event_write_per_s,
    }
