"""Query budgets: no list or detail endpoint of the API queries more as its rows grow.

Every GET route of the permission matrix (each app's ``tests/matrix.py``) is called with a few
objects seeded (``SMALL``) and again with more (``LARGE``): the second call may not run more
queries than the first (an N+1 shows as one query more per row), and neither may run more than
the route's budget. A list route is seeded through ``SEEDS`` or, where the route has an object
twin (``{list}/{key}/`` with a ``setup``), by that twin's setup; an object route by its own
``setup``. A GET route that is neither seeded nor in ``UNSEEDED`` fails the test, so a new route
gets a budget when it gets its matrix row.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from workspaces.events import Ref, event_record
from workspaces.models import Notification, Role
from workspaces.services import membership_grant, quota_request_create, service_account_create
from workspaces.testing.factories import make_member, make_workspace
from workspaces.testing.permission_matrix import Endpoint, MatrixContext, load_endpoints
from workspaces.tests.matrix import PUBLIC_HOOK

# What a route asks of the database is the ORM's doing, counted the same on either database: it
# runs in the server pass, on the production database (conftest.py).
pytestmark = pytest.mark.server_pass

SMALL, LARGE = 2, 6
# Queries one GET may run whatever its rows: authentication (token, user, memberships and the
# token's workspaces), the workspace, permissions, the page's count and rows, their prefetches.
DEFAULT_BUDGET = 20
BUDGETS: dict[str, int] = {}
WS = "/api/v1/workspaces/{ws}"
_n = itertools.count(1)

Seed = Callable[[MatrixContext], dict[str, Any] | None]


def _workspace_of_the_actor(ctx: MatrixContext) -> None:
    """Another workspace the caller belongs to (its quota summary is listed with it)."""
    other = make_workspace()
    membership_grant(actor=None, workspace=other, user=ctx.actor, role=Role.VIEWER)


def _member(ctx: MatrixContext) -> None:
    make_member(ctx.workspace, Role.VIEWER)


def _event(ctx: MatrixContext) -> None:
    n = next(_n)
    with transaction.atomic():
        event_record(
            actor=ctx.actor,
            workspace=ctx.workspace,
            verb="dataset.created",
            refs=[Ref("dataset", f"b{n}", f"dataset {n}")],
        )


def _service_account(ctx: MatrixContext) -> None:
    service_account_create(actor=None, workspace=ctx.workspace, username=f"budget-sa-{next(_n)}")


def _notification(ctx: MatrixContext) -> None:
    Notification.objects.create(
        workspace=ctx.workspace, recipient=ctx.actor, verb="budget.test", title="Budget"
    )


def _batch(ctx: MatrixContext) -> dict[str, Any]:
    """One more ingested batch of one feature group."""
    import json

    from features.ingestion import batch_ingest
    from features.tests.factories import make_group, user_row

    group = ctx.extra.get("group")
    if group is None:
        group = ctx.extra["group"] = make_group(ctx.workspace)
    n = next(_n)
    body = json.dumps({"rows": [user_row(n)]}).encode()
    batch_ingest(actor=ctx.actor, group=group, body=body, format="json")
    return {"name": group.name}


def _health_check(ctx: MatrixContext) -> dict[str, Any]:
    """One more health check in one feature group's history."""
    from features.models import HealthCheck, HealthStatus
    from features.tests.factories import make_group

    group = ctx.extra.get("group")
    if group is None:
        group = ctx.extra["group"] = make_group(ctx.workspace)
    HealthCheck.objects.create(workspace=ctx.workspace, group=group, status=HealthStatus.HEALTHY)
    return {"name": group.name}


def _job_metric(ctx: MatrixContext) -> dict[str, Any]:
    """One more metric row of one training job."""
    from training.models import JobMetric
    from training.scheduler.tests.factories import make_job

    job = ctx.extra.get("job")
    if job is None:
        job = ctx.extra["job"] = make_job(ctx.workspace)
    JobMetric.objects.create(workspace=ctx.workspace, job=job, step=next(_n), name="loss", value=1)
    return {"pk": job.pk}


def _registered_model(ctx: MatrixContext) -> None:
    from experiments.tests.factories import make_model, make_version

    make_version(ctx.workspace, make_model(ctx.workspace))


def _deployment_change(ctx: MatrixContext) -> dict[str, Any]:
    """One more release in one deployment's history (with its actor and both versions)."""
    from experiments.tests.factories import make_deployment, make_version
    from serving.models import DeploymentChange

    dep = ctx.extra.get("deployment")
    if dep is None:
        dep, _ = make_deployment(ctx.workspace)
        ctx.extra["deployment"] = dep
    version = make_version(ctx.workspace, dep.model)
    DeploymentChange.objects.create(
        workspace=ctx.workspace,
        deployment=dep,
        kind=DeploymentChange.Kind.RELEASE,
        from_version=dep.version,
        to_version=version,
        actor=ctx.actor,
        reason="budget",
    )
    return {"name": dep.name}


def _snapshot(ctx: MatrixContext) -> dict[str, Any]:
    """One more analysis snapshot of one running experiment."""
    from experiments import services
    from experiments.tests.factories import make_deployment

    exp = ctx.extra.get("experiment")
    if exp is None:
        dep, (treatment,) = make_deployment(ctx.workspace)
        exp = services.experiment_create(
            actor=None,
            workspace=ctx.workspace,
            key=f"budget{next(_n)}",
            hypothesis="budget",
            deployment=dep.name,
            treatment_versions=[treatment.pk],
            guardrails=[{"metric": "ctr", "max_drop": 0.1}],
            ramp_plan=[5, 10],
        )
        exp = ctx.extra["experiment"] = services.experiment_submit(actor=None, experiment=exp)
    services.snapshot_take(experiment=exp)
    return {"key": exp.key}


def _queued_job(ctx: MatrixContext) -> None:
    from training.scheduler.tests.factories import make_job

    make_job(ctx.workspace)


def _quota(ctx: MatrixContext) -> None:
    from workspaces.services import quota_set

    quota_set(actor=None, workspace=ctx.workspace, gpu_type=f"T{next(_n)}", gpu_milli=1000)


def _quota_request(ctx: MatrixContext) -> None:
    quota_request_create(
        actor=ctx.actor, workspace=ctx.workspace, gpu_milli=1000 * next(_n), reason="budget"
    )


def _consumed(ctx: MatrixContext, group: str, model: str) -> None:
    """Feature group ``group`` consumed by model version ``model``, projected into the graph."""
    from lineage.projection import project

    with transaction.atomic():
        event_record(
            actor=None,
            workspace=ctx.workspace,
            verb="feature_consumer.registered",
            refs=[
                Ref("feature_group", group, f"group {group}", role="input"),
                Ref("model_version", model, f"model {model}", role="output"),
            ],
            resources={"cpu_hours": 1},
        )
    project(gap_wait=0)


def _consumer(ctx: MatrixContext) -> dict[str, Any]:
    """One more model version consuming one feature group."""
    _consumed(ctx, "budget", f"b{next(_n)}")
    return {"node": "feature_group:budget"}


def _marquez(ctx: MatrixContext) -> dict[str, Any]:
    """One more feature group consumed by the model version Marquez's read is asked about
    (each group's exported name is looked up: one query for all, not one per group)."""
    from lineage.openlineage import namespace_of

    _consumed(ctx, f"g{next(_n)}", "budget")
    return {"nodeId": f"dataset:{namespace_of(ctx.workspace)}:models/model budget", "depth": 3}


def _webhook_delivery(ctx: MatrixContext) -> dict[str, Any]:
    """One more delivery attempt logged for the same webhook (created on the first call)."""
    from django.utils import timezone

    from workspaces.models import WebhookDelivery, WebhookEndpoint
    from workspaces.notifications import webhook_create

    webhook = ctx.extra.get("webhook")
    if webhook is None:
        webhook, _secret = webhook_create(actor=None, workspace=ctx.workspace, url=PUBLIC_HOOK)
        ctx.extra["webhook"] = webhook
    assert isinstance(webhook, WebhookEndpoint)
    n = next(_n)
    WebhookDelivery.objects.create(
        workspace=ctx.workspace,
        webhook=webhook,
        event_id=n,
        attempt=1,
        payload={"id": n},
        next_attempt_at=timezone.now(),
    )
    return {"pk": webhook.pk}


_records = itertools.count(1)


def _growing_record_set(ctx: MatrixContext) -> dict[str, Any]:
    """A record set one row longer than the last one made (its rows are what the route lists)."""
    from curation.services import record_set_upload

    rows = b"".join(b'{"text": "row %d"}\n' % i for i in range(next(_records)))
    record_set = record_set_upload(
        actor=None, workspace=ctx.workspace, name=f"rows_{next(_n)}", content=rows, fmt="jsonl"
    )
    return {"pk": record_set.pk}


def _growing_task(ctx: MatrixContext) -> dict[str, Any]:
    """An annotation task one item longer than the last, each item labelled by two members."""
    from curation import services

    record_set = _growing_record_set(ctx)
    source = services.RecordSet.objects.for_workspace(ctx.workspace).get(pk=record_set["pk"])
    schema = {"fields": [{"name": "label", "kind": "choice", "options": ["a", "b"]}]}
    task = services.annotation_task_create(
        actor=None,
        workspace=ctx.workspace,
        name=f"budget_task_{next(_n)}",
        source=source,
        text_field="text",
        schema=schema,
    )
    people = [make_member(ctx.workspace, Role.DEVELOPER) for _ in range(2)]
    for item in task.items.all():
        for n, person in enumerate(people):
            services.annotation_submit(
                actor=person, task=task, item=item, values={"label": "ab"[n % 2]}, role="developer"
            )
    return {"name": task.name}


def _nothing(ctx: MatrixContext) -> None:
    """Routes whose rows do not live in the database (the built-in templates)."""


# List routes (and object routes whose rows are not the object's) and how to add one row.
SEEDS: dict[str, Seed] = {
    "/api/v1/workspaces/": _workspace_of_the_actor,
    WS + "/": _member,  # the workspace itself: its member and quota summary
    WS + "/activity/": _event,
    WS + "/webhooks/{pk}/deliveries/": _webhook_delivery,
    WS + "/service-accounts/": _service_account,
    "/api/v1/notifications/": _notification,
    WS + "/feature-groups/{name}/batches/": _batch,
    WS + "/feature-groups/{name}/health/": _health_check,
    WS + "/training-jobs/{pk}/metrics/": _job_metric,
    WS + "/models/": _registered_model,
    WS + "/deployments/{name}/history/": _deployment_change,
    WS + "/experiments/{key}/snapshots/": _snapshot,
    WS + "/training-templates/": _nothing,
    WS + "/record-sets/{pk}/rows/": _growing_record_set,
    WS + "/annotation-tasks/{name}/items/": _growing_task,
    WS + "/annotation-tasks/{name}/agreement/": _growing_task,
    WS + "/annotation-tasks/{name}/next/": _growing_task,
    WS + "/scheduler/queue/": _queued_job,
    WS + "/scheduler/recommendation/": _queued_job,
    WS + "/scheduler/quotas/": _quota,
    WS + "/scheduler/quota-requests/": _quota_request,
    WS + "/lineage/": _consumer,
    WS + "/lineage/impact/": _consumer,
    WS + "/lineage/consumers/": _consumer,
    WS + "/lineage/features/": _consumer,
    WS + "/lineage/models/": _consumer,
    WS + "/lineage/unused-features/": _consumer,
    WS + "/lineage/cost/": _consumer,
    "/api/v1/lineage": _marquez,
}
UNSEEDED: dict[str, str] = {}

ENDPOINTS = load_endpoints()
GETS = [e for e in ENDPOINTS if e.method == "GET"]


def _twin(endpoint: Endpoint) -> Endpoint | None:
    """The object route under a list route (``{list}{key}/``) whose setup makes one row."""
    for other in ENDPOINTS:
        rest = other.path.removeprefix(endpoint.path)
        if (
            other.path != rest
            and other.setup is not None
            and rest.count("/") == 1
            and rest.startswith("{")
            and rest.endswith("}/")
        ):
            return other
    return None


def _seeder(endpoint: Endpoint) -> Seed | None:
    if endpoint.path in SEEDS:
        return SEEDS[endpoint.path]
    if endpoint.setup is not None:
        return endpoint.setup
    twin = _twin(endpoint)
    return None if twin is None else twin.setup


def test_every_get_route_has_a_budget():
    missing = [e.id for e in GETS if _seeder(e) is None and e.path not in UNSEEDED]
    assert missing == [], "GET routes without a query-budget seed"
    assert not set(SEEDS) - {e.path for e in GETS}, "seeds for routes that do not exist"


def _rows(body: Any) -> int | None:
    """How many rows a response lists, where it is a list or a page of one."""
    if isinstance(body, list):
        return len(body)
    if isinstance(body, dict) and isinstance(body.get("results"), list):
        return body.get("count", len(body["results"]))
    return None


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", GETS, ids=lambda e: e.id)
def test_queries_do_not_grow_with_rows(endpoint, workspace, client_for):
    actor = make_member(workspace, Role.ADMIN)
    ctx = MatrixContext(actor=actor, workspace=workspace)
    seed = _seeder(endpoint)
    client = client_for(actor)
    kwargs: dict[str, Any] = {}

    def grow_to(n: int, have: int) -> None:
        for _ in range(n - have):
            kwargs.update(seed(ctx) or {})

    def measure() -> tuple[int, Any]:
        params = dict(kwargs)
        path_kwargs = {k: params.pop(k) for k in list(params) if "{" + k + "}" in endpoint.path}
        url = endpoint.path.format(ws=workspace.slug, **path_kwargs)
        query = endpoint.body(ctx) if endpoint.body and not params else params
        # The first call after seeding refills the per-process caches that the seeds' writes
        # invalidated (the access cache, content types); the second one is counted.
        assert client.get(url, query).status_code == 200
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url, query)
        assert response.status_code == 200, response.content[:500]
        # A file download (a dataset's Parquet) has no rows to count, only its queries.
        is_json = "json" in response.get("Content-Type", "")
        return len(captured), response.json() if is_json else None

    grow_to(SMALL, 0)
    small, small_body = measure()
    grow_to(LARGE, SMALL)
    large, large_body = measure()
    budget = BUDGETS.get(endpoint.path, DEFAULT_BUDGET)
    print(f"{endpoint.id}: {small} queries with {SMALL} rows, {large} with {LARGE}")
    assert large <= small, f"{large} queries with {LARGE} rows, {small} with {SMALL}: N+1"
    assert large <= budget, f"{large} queries, over the budget of {budget}"
    listed_small, listed_large = _rows(small_body), _rows(large_body)
    if listed_small is not None and seed is not _nothing:
        # The seeds show in the list: the count above covered the rows it claims to.
        assert listed_large > listed_small, (listed_small, listed_large)
