"""F10 on the feature pages: a feature group's page shows each feature's permutation importance
in the latest succeeded training jobs that used it (panel plugged in by training)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from features.tests.factories import make_group
from training.feature_panels import JOBS_PER_FEATURE
from training.models import JobState, TrainingJob

pytestmark = pytest.mark.django_db


def make_job(workspace, name: str, importance: dict, *, state=JobState.SUCCEEDED, auc=0.71):
    return TrainingJob.objects.create(
        workspace=workspace,
        name=name,
        template="logreg",
        state=state,
        finished_at=timezone.now(),
        metrics={
            "holdout": {"auc": auc, "logloss": 0.4, "rows": 1000},
            "roc": [[0.0, 0.0], [1.0, 1.0]],
            "importance": importance,
        },
    )


def group_page(workspace, user, name: str = "users") -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("features-group", kwargs={"ws": workspace.slug, "name": name}))
    assert response.status_code == 200
    return response.content.decode()


def panel(html: str) -> str:
    match = re.search(
        r'<section class="card wide" data-testid="feature-importance">.*?</section>', html, re.S
    )
    assert match, "no importance panel on the page"
    return match.group(0)


def rows(html: str) -> list[dict]:
    found = []
    for attrs, body in re.findall(r"<tr (data-feature=[^>]*)>(.*?)</tr>", panel(html), re.S):
        cells = [
            re.sub(r"<[^>]+>", "", c).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
        ]
        found.append({"attrs": attrs, "cells": cells, "body": body})
    return found


def test_job_importance_shows_on_the_group_page_of_a_feature_it_used(workspace, members):
    make_group(workspace, name="users")
    job = make_job(
        workspace,
        "ranker-a",
        {"users:age": 0.05, "users:ctr_7d": 0.125, "ads:price": 0.2, "users:is_new": -0.001},
        auc=0.7312,
    )
    make_job(workspace, "broken-run", {"users:age": 0.9}, state=JobState.FAILED)
    html = group_page(workspace, members["viewer"])
    body = panel(html)
    link = reverse("training-job", kwargs={"ws": workspace.slug, "pk": job.pk})
    assert f'<a href="{link}">ranker-a</a>' in body
    assert "broken-run" not in body  # only succeeded jobs
    by_feature = {}
    for row in rows(html):
        by_feature.setdefault(
            re.search(r'data-feature="([^"]+)"', row["attrs"]).group(1), []
        ).append(row)
    age = by_feature["age"][0]["cells"]
    # feature, job, template, AUC, importance, rank among the job's 4 features
    assert age[:6] == ["age", "ranker-a", "logreg", "0.7312", "0.0500", "3 / 4"]
    assert by_feature["ctr_7d"][0]["cells"][4:6] == ["0.1250", "2 / 4"]
    assert by_feature["is_new"][0]["cells"][4:6] == ["-0.0010", "4 / 4"]
    # a feature of the group no job used says so instead of showing someone else's numbers
    assert "not used by a finished job yet" in by_feature["city"][0]["body"]
    # the panel sits on the group page next to the schema
    assert html.index('data-testid="schema"') < html.index('data-testid="feature-importance"')


def test_latest_jobs_first_and_at_most_a_few_per_feature(workspace, members):
    make_group(workspace, name="users")
    for index in range(JOBS_PER_FEATURE + 2):
        make_job(workspace, f"run-{index}", {"users:age": 0.01 * (index + 1)})
    age_rows = [
        r
        for r in rows(group_page(workspace, members["viewer"]))
        if 'data-feature="age"' in r["attrs"]
    ]
    names = [r["cells"][1] if r["cells"][0] == "age" else r["cells"][0] for r in age_rows]
    assert names == [f"run-{i}" for i in range(JOBS_PER_FEATURE + 1, 1, -1)]


def test_another_workspaces_job_never_shows(workspace, other_workspace, members):
    make_group(workspace, name="users")
    make_group(other_workspace, name="users")  # same group name over there
    make_job(other_workspace, "their-ranker", {"users:age": 0.3})
    html = group_page(workspace, members["viewer"])
    assert "their-ranker" not in html
    assert 'data-testid="feature-importance"' not in html  # nothing of ours: no panel at all
    make_job(workspace, "our-ranker", {"users:age": 0.02})
    html = group_page(workspace, members["viewer"])
    assert "our-ranker" in panel(html)
    assert "their-ranker" not in html


def test_jobs_using_other_groups_do_not_show(workspace, members):
    make_group(workspace, name="users")
    make_group(workspace, name="users_v2")
    make_job(workspace, "v2-only", {"users_v2:age": 0.3})
    assert 'data-testid="feature-importance"' not in group_page(workspace, members["viewer"])


def test_page_queries_do_not_grow_with_jobs_or_features(workspace, members):
    make_group(workspace, name="users")
    make_job(workspace, "first", {"users:age": 0.1})
    client = Client()
    client.force_login(members["viewer"])
    url = reverse("features-group", kwargs={"ws": workspace.slug, "name": "users"})
    client.get(url)  # warm the session and the access cache

    def counted() -> tuple[int, str]:
        executed: list[str] = []

        def count(execute, sql, params, many, context):
            executed.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            response = client.get(url)
        return len(executed), response.content.decode()

    few, _ = counted()
    for index in range(25):
        make_job(
            workspace,
            f"more-{index}",
            {"users:age": 0.1, "users:ctr_7d": 0.2, "users:city": 0.01, "users:is_new": 0.0},
        )
    client.get(url)
    many, html = counted()
    assert "more-24" in html
    assert many <= few
    training_queries = []

    def spy(execute, sql, params, many_, context):
        if "training_trainingjob" in sql:
            training_queries.append(sql)
        return execute(sql, params, many_, context)

    with connection.execute_wrapper(spy):
        client.get(url)
    assert len(training_queries) == 1
