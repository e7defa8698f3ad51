"""The feature registry in the browser UI, through Django's test client: the groups list with its
search and filters, a group's page (schema, versions, health chart, batches, consumers, the
producer's curl), datasets, the dashboard card, isolation and escaping."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from features import ingestion, registry
from features.models import (
    BatchFormat,
    Dataset,
    DatasetStatus,
    FeatureGroup,
    HealthCheck,
    HealthStatus,
    Lifecycle,
)
from workspaces.models import Role
from workspaces.testing.factories import make_member

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"

FEATURES = [
    {"name": "age", "dtype": "int", "description": "Age in years."},
    {"name": "ctr_7d", "dtype": "float"},
    {"name": "is_new", "dtype": "bool"},
    {"name": "city", "dtype": "categorical"},
    {"name": "nickname", "dtype": "string"},
    {"name": "emb", "dtype": "embedding", "dimension": 4},
]


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def list_url(workspace, **params) -> str:
    url = reverse("features-list", kwargs={"ws": workspace.slug})
    if params:
        url += "?" + "&".join(f"{key}={value}" for key, value in params.items())
    return url


def group_url(workspace, name: str) -> str:
    return reverse("features-group", kwargs={"ws": workspace.slug, "name": name})


def datasets_url(workspace) -> str:
    return reverse("features-datasets", kwargs={"ws": workspace.slug})


def dataset_url(workspace, name: str, version: int = 1) -> str:
    return reverse(
        "features-dataset", kwargs={"ws": workspace.slug, "name": name, "version": version}
    )


def register(workspace, name: str, *, actor=None, **extra) -> FeatureGroup:
    spec = {"entity": "user", "entity_keys": ["user_id"], "features": FEATURES}
    spec.update(extra)
    return registry.feature_group_register(actor=actor, workspace=workspace, name=name, **spec)


def push_rows(group: FeatureGroup, producer, rows: list[dict]) -> None:
    ingestion.batch_ingest(
        actor=producer,
        group=group,
        body=json.dumps({"rows": rows}).encode(),
        format=BatchFormat.JSON,
    )


def row(index: int, **overrides) -> dict:
    values = {
        "user_id": f"u{index}",
        "event_time": (timezone.now() - timedelta(hours=1)).isoformat(),
        "age": 20 + index,
        "ctr_7d": 0.01 * index,
        "is_new": index % 2 == 0,
        "city": "paris",
        "nickname": f"n{index}",
        "emb": [0.1, 0.2, 0.3, float(index)],
    }
    values.update(overrides)
    return values


def set_health(group: FeatureGroup, status: str) -> None:
    FeatureGroup.objects.unscoped().filter(pk=group.pk).update(health_status=status)


def table_rows(page: str, testid: str) -> list[str]:
    match = re.search(rf'<table data-testid="{testid}">(.*?)</table>', page, re.S)
    assert match, f"no table {testid}"
    return re.findall(r'<tr data-group="([^"]+)"', match.group(1))


def section(page: str, testid: str) -> str:
    match = re.search(
        rf'<section class="card[^"]*" data-testid="{testid}">(.*?)</section>', page, re.S
    )
    assert match, f"no section {testid}"
    return match.group(1)


def pre(page: str, testid: str) -> str:
    match = re.search(rf'<pre class="shell" data-testid="{testid}">(.*?)</pre>', page, re.S)
    assert match, f"no <pre> {testid}"
    return html.unescape(match.group(1))


# The list ----------------------------------------------------------------------------------------


def test_list_shows_each_group_with_its_badges_and_producer(workspace, members):
    producer = members["developer"]
    users = register(workspace, "user_profile", actor=producer, producer=producer)
    register(workspace, "ad_profile", entity="item", entity_keys=["ad_id"], features=FEATURES[:2])
    push_rows(users, producer, [row(1), row(2)])
    set_health(users, HealthStatus.BROKEN)

    response = browser(members["viewer"]).get(list_url(workspace))
    assert response.status_code == 200
    page = response.content.decode()
    assert table_rows(page, "feature-groups") == ["ad_profile", "user_profile"]
    user_row_html = re.search(r'<tr data-group="user_profile">(.*?)</tr>', page, re.S).group(1)
    assert group_url(workspace, "user_profile") in user_row_html
    assert "User" in user_row_html
    assert "v1" in user_row_html
    assert '<span class="lifecycle lifecycle-active">active</span>' in user_row_html
    assert '<span class="health health-broken" data-testid="health">broken</span>' in user_row_html
    assert producer.username in user_row_html
    assert " ago</time>" in user_row_html
    ad_row_html = re.search(r'<tr data-group="ad_profile">(.*?)</tr>', page, re.S).group(1)
    assert "health-unknown" in ad_row_html
    assert "never" in ad_row_html
    # The sidebar links here, and marks the section.
    assert f'<a href="{list_url(workspace)}" class="active">Features</a>' in page


def test_search_matches_name_description_and_tags(workspace, members):
    register(workspace, "user_profile", description="Demographics of users.")
    register(workspace, "ad_profile", tags=["creative"])
    register(workspace, "context_stats")
    client = browser(members["viewer"])

    def names(**params) -> list[str]:
        response = client.get(list_url(workspace, **params))
        assert response.status_code == 200
        return table_rows(response.content.decode(), "feature-groups")

    assert names(q="profile") == ["ad_profile", "user_profile"]
    assert names(q="DEMOGRAPHICS") == ["user_profile"]
    assert names(q="creative") == ["ad_profile"]
    assert names(q="nothing-like-this") == []
    assert "No feature group matches." in client.get(list_url(workspace, q="zzz")).content.decode()


def test_filters_by_status_and_health(workspace, members):
    healthy = register(workspace, "healthy_one")
    broken = register(workspace, "broken_one")
    register(workspace, "draft_one", status=Lifecycle.DRAFT)
    set_health(healthy, HealthStatus.HEALTHY)
    set_health(broken, HealthStatus.BROKEN)
    client = browser(members["viewer"])

    def names(**params) -> list[str]:
        return table_rows(
            client.get(list_url(workspace, **params)).content.decode(), "feature-groups"
        )

    assert names(health="broken") == ["broken_one"]
    assert names(health="healthy") == ["healthy_one"]
    assert names(health="unknown") == ["draft_one"]
    assert names(status="draft") == ["draft_one"]
    assert names(status="active", health="broken") == ["broken_one"]
    assert names(q="one", status="active") == ["broken_one", "healthy_one"]
    # Unknown values are ignored rather than matching nothing or failing.
    assert names(status="bogus", health="<x>") == ["broken_one", "draft_one", "healthy_one"]
    page = client.get(list_url(workspace, health="broken")).content.decode()
    assert '<option value="broken" selected>' in page


def test_list_page_queries_do_not_grow_with_the_groups(workspace, members):
    producer = members["developer"]
    client = browser(members["viewer"])
    for index in range(3):
        register(workspace, f"group_{index:02d}", producer=producer)
    client.get(list_url(workspace))  # warm the session and the access cache
    from django.db import connection

    def counted_get() -> tuple[int, object]:
        executed: list[str] = []

        def count(execute, sql, params, many, context):
            executed.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            response = client.get(list_url(workspace))
        return len(executed), response

    few, _ = counted_get()
    for index in range(3, 30):
        register(workspace, f"group_{index:02d}", producer=producer, tags=["t1", "t2"])
    client.get(list_url(workspace))  # registry writes dropped the access cache: warm it again
    many, response = counted_get()
    assert many <= few
    assert len(table_rows(response.content.decode(), "feature-groups")) == 30
    assert few <= 12


# A group's page ----------------------------------------------------------------------------------


@pytest.fixture
def users_group(workspace, members):
    """A group with two versions, batches, consumers and a week of health checks."""
    producer = members["developer"]
    group = register(
        workspace,
        "user_profile",
        actor=members["maintainer"],
        producer=producer,
        description="Users, by day.",
        tags=["core"],
        freshness_sla_seconds=7200,
    )
    push_rows(group, producer, [row(1), row(2), row(3)])
    registry.feature_group_new_version(
        actor=members["maintainer"],
        group=group,
        features=[*FEATURES, {"name": "score", "dtype": "float", "description": "New."}],
    )
    group.refresh_from_db()
    push_rows(group, producer, [row(4, score=0.5)])
    registry.consumer_register(
        actor=members["developer"],
        group=group,
        kind="model",
        object_id=7,
        label="ctr-dcn v3",
        owner=members["developer"],
    )
    registry.consumer_register(
        actor=None, group=group, kind="dataset", object_id=3, label="old sample"
    )
    registry.consumer_release(actor=None, workspace=workspace, kind="dataset", object_id=3)
    now = timezone.now()
    for day in range(6, -1, -1):
        broken = day == 0
        HealthCheck.objects.create(
            workspace=workspace,
            group=group,
            checked_at=now - timedelta(days=day),
            status=HealthStatus.BROKEN if broken else HealthStatus.HEALTHY,
            freshness_lag_seconds=90_000.0 if broken else 600.0 + day,
            coverage=0.5 if broken else 0.98,
            problems=[{"kind": "freshness", "detail": "no data for 25 h (SLA 2 h)"}]
            if broken
            else [],
        )
    set_health(group, HealthStatus.BROKEN)
    group.refresh_from_db()
    return group


def test_group_page_shows_schema_versions_batches_and_consumers(workspace, members, users_group):
    response = browser(members["viewer"]).get(group_url(workspace, "user_profile"))
    assert response.status_code == 200
    page = response.content.decode()
    assert '<span class="health health-broken" data-testid="health">broken</span>' in page
    assert "Users, by day." in page

    schema = section(page, "schema")
    assert re.findall(r'<tr data-feature="(\w+)">', schema) == [
        "age", "city", "ctr_7d", "emb", "is_new", "nickname", "score",
    ]  # fmt: skip
    emb = re.search(r'<tr data-feature="emb">(.*?)</tr>', schema, re.S).group(1)
    assert "<td>embedding</td>" in emb
    assert "<td>4</td>" in emb
    assert "lifecycle-active" in emb
    assert "Age in years." in schema
    score = re.search(r'<tr data-feature="score">(.*?)</tr>', schema, re.S).group(1)
    assert "<td>v2</td>" in score

    versions = section(page, "versions")
    assert re.findall(r'<li data-version="(\d+)">', versions) == ["2", "1"]
    v1 = versions.split('<li data-version="1">')[1]
    assert "score" not in v1
    assert "emb: embedding[4]" in v1
    assert "score: float" in versions.split('<li data-version="1">')[0]

    batches = section(page, "batches")
    batch_rows = re.findall(r"<tr data-batch=\"\d+\">(.*?)</tr>", batches, re.S)
    assert len(batch_rows) == 2
    assert "<td>1</td>" in batch_rows[0]  # newest first: the one-row batch of v2
    assert "<td>v2</td>" in batch_rows[0]
    assert "<td>3</td>" in batch_rows[1]
    for batch_html in batch_rows:
        assert "<td>json</td>" in batch_html
        assert members["developer"].username in batch_html
        assert "bytes" in batch_html

    consumers = section(page, "consumers")
    assert "Retiring is blocked while live consumers exist: 1 live now." in consumers
    assert "ctr-dcn v3" in consumers
    assert "Model version" in consumers
    assert members["developer"].username in consumers
    assert '<span class="live">live</span>' in consumers
    assert "old sample" in consumers
    assert "released" in consumers


def test_group_page_carries_the_chart_data_and_the_health_history(workspace, members, users_group):
    page = browser(members["viewer"]).get(group_url(workspace, "user_profile")).content.decode()
    match = re.search(
        r'<script id="health-series" type="application/json">(.*?)</script>', page, re.S
    )
    assert match, "the chart has no data"
    series = json.loads(match.group(1))
    assert len(series["t"]) == len(series["freshness_hours"]) == len(series["coverage"]) == 7
    assert series["t"] == sorted(series["t"])
    assert series["freshness_hours"][-1] == 25.0
    assert series["coverage"][0] == 0.98
    assert series["coverage"][-1] == 0.5
    assert series["sla_hours"] == 2
    assert 'data-chart="health"' in page
    for asset in ("js/uplot.iife.min.js", "css/uplot.min.css", "js/feature-charts.js"):
        assert f"/static/{asset}" in page
        assert (Path(settings.BASE_DIR) / "static" / asset).stat().st_size > 500

    history = section(page, "health-history")
    assert history.count("<tr>") == 1 + 7  # header + checks
    assert "freshness: no data for 25 h (SLA 2 h)" in history
    assert ">1 day 1 h<" in history  # 90000 s, humanised
    assert "50%" in history


def test_group_page_without_checks_or_batches_says_so(workspace, members):
    register(workspace, "fresh_group")
    page = browser(members["viewer"]).get(group_url(workspace, "fresh_group")).content.decode()
    assert "No health checks yet." in section(page, "health-chart")
    assert 'id="health-series"' not in page
    assert "No batches yet" in section(page, "batches")
    assert "Nobody uses this group yet." in section(page, "consumers")


def test_push_help_has_the_exact_curl_for_the_current_schema(
    workspace, members, users_group, client_for
):
    page = browser(members["viewer"]).get(group_url(workspace, "user_profile")).content.decode()
    url = (
        f"http://testserver/api/v1/workspaces/{workspace.slug}/feature-groups/user_profile/batches/"
    )
    curl = pre(page, "curl-json")
    assert curl.startswith("curl -X POST ")
    assert '-H "Authorization: Token $TOKEN"' in curl
    assert '-H "Content-Type: application/json"' in curl
    assert '-H "Idempotency-Key: $BATCH_ID"' in curl
    assert curl.rstrip().endswith(url)
    body = json.loads(re.search(r"-d '(.*?)'", curl).group(1))
    [example] = body["rows"]
    assert list(example) == [
        "user_id", "event_time", "age", "ctr_7d", "is_new", "city", "nickname", "emb", "score",
    ]  # fmt: skip
    assert example["user_id"] == "user_1"
    assert isinstance(example["age"], int)
    assert isinstance(example["ctr_7d"], float)
    assert example["is_new"] is True
    assert len(example["emb"]) == 4
    assert "BATCH_ID=$(uuidgen)" in pre(page, "push-env")

    parquet = pre(page, "curl-parquet")
    assert '-H "Content-Type: application/vnd.apache.parquet"' in parquet
    assert "--data-binary @batch.parquet" in parquet
    assert parquet.rstrip().endswith(url)

    # The example is a batch the producer endpoint accepts as it stands.
    response = client_for(members["developer"]).post(
        url.removeprefix("http://testserver"),
        data=json.dumps(body),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="from-the-help-panel",
    )
    assert response.status_code == 201, response.content


def test_push_help_uses_the_groups_keys_and_time_column(workspace, members):
    register(
        workspace,
        "impressions",
        entity="label",
        entity_keys=["user_id", "ad_id"],
        event_time_column="shown_at",
        features=[{"name": "click", "dtype": "bool"}],
    )
    page = browser(members["viewer"]).get(group_url(workspace, "impressions")).content.decode()
    body = json.loads(re.search(r"-d '(.*?)'", pre(page, "curl-json")).group(1))
    assert list(body["rows"][0]) == ["user_id", "ad_id", "shown_at", "click"]
    assert body["rows"][0]["ad_id"] == "ad_1"


# Datasets ----------------------------------------------------------------------------------------


def make_dataset(workspace, label_group, *, name="ctr_sample", **extra) -> Dataset:
    values = {
        "workspace": workspace,
        "name": name,
        "label_group": label_group,
        "label_columns": ["click"],
        "feature_refs": ["user_profile:age", "user_profile:city"],
        "status": DatasetStatus.READY,
        "row_count": 1234,
        "coverage": {"user_profile:age": 0.875, "user_profile:city": 0.25},
    }
    values.update(extra)
    return Dataset.objects.create(**values)


def test_dataset_list_and_page_show_coverage_per_feature(workspace, members):
    labels = register(
        workspace, "impressions", entity="label", features=[{"name": "click", "dtype": "bool"}]
    )
    make_dataset(workspace, labels, created_by=members["developer"])
    client = browser(members["viewer"])

    listing = client.get(datasets_url(workspace)).content.decode()
    assert dataset_url(workspace, "ctr_sample") in listing
    assert "1234" in listing
    assert "impressions" in listing
    assert "dataset-ready" in listing

    response = client.get(dataset_url(workspace, "ctr_sample"))
    assert response.status_code == 200
    page = response.content.decode()
    coverage = section(page, "coverage")
    assert re.findall(r'<tr data-ref="([^"]+)">', coverage) == [
        "user_profile:age",
        "user_profile:city",
    ]
    assert '<span style="width: 87.5%"></span>' in coverage
    assert "87.5%" in coverage
    assert '<span style="width: 25.0%"></span>' in coverage
    assert members["developer"].username in section(page, "about")
    assert group_url(workspace, "impressions") in page


def test_dataset_coverage_tolerates_odd_values(workspace, members):
    labels = register(
        workspace, "impressions", entity="label", features=[{"name": "click", "dtype": "bool"}]
    )
    make_dataset(
        workspace,
        labels,
        feature_refs=["a:x", "a:y", "a:z"],
        coverage={"a:x": 7, "a:y": "n/a"},
        status=DatasetStatus.FAILED,
        error=XSS,
    )
    page = browser(members["viewer"]).get(dataset_url(workspace, "ctr_sample")).content.decode()
    coverage = section(page, "coverage")
    assert '<span style="width: 100.0%"></span>' in coverage
    assert coverage.count("not measured") == 2
    assert XSS not in page
    assert XSS_ESCAPED in page


def test_missing_dataset_version_is_404(workspace, members):
    labels = register(
        workspace, "impressions", entity="label", features=[{"name": "click", "dtype": "bool"}]
    )
    make_dataset(workspace, labels)
    client = browser(members["viewer"])
    assert client.get(dataset_url(workspace, "ctr_sample", 2)).status_code == 404


# Isolation, access and escaping ------------------------------------------------------------------


def test_another_workspaces_groups_and_datasets_answer_404_like_missing_ones(
    workspace, other_workspace, members
):
    theirs = register(other_workspace, "secret_group", description="Their secret.")
    make_dataset(other_workspace, theirs, name="secret_sample")
    register(workspace, "mine")
    client = browser(members["admin"])
    for url in (
        list_url(other_workspace),
        group_url(other_workspace, "secret_group"),
        datasets_url(other_workspace),
        dataset_url(other_workspace, "secret_sample"),
    ):
        assert client.get(url).status_code == 404, url
    # Their names through our workspace's URLs: 404 too, the same page as a missing name.
    theirs_here = client.get(group_url(workspace, "secret_group"))
    missing = client.get(group_url(workspace, "no_such_group"))
    assert theirs_here.status_code == missing.status_code == 404
    assert client.get(dataset_url(workspace, "secret_sample")).status_code == 404
    listing = client.get(list_url(workspace)).content.decode()
    assert "secret_group" not in listing
    assert "secret_sample" not in client.get(datasets_url(workspace)).content.decode()


def test_anonymous_is_sent_to_login(workspace):
    register(workspace, "user_profile")
    for url in (list_url(workspace), group_url(workspace, "user_profile"), datasets_url(workspace)):
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_user_text_is_escaped_everywhere(workspace, members):
    group = register(
        workspace,
        "tricky",
        description=f'{XSS} and <a href="javascript:alert(2)">x</a> &amp;',
        tags=[XSS, "javascript:alert(3)"],
        features=[{"name": "f", "dtype": "float", "description": XSS}],
    )
    registry.consumer_register(actor=None, group=group, kind="model", object_id=1, label=XSS)
    HealthCheck.objects.create(
        workspace=workspace,
        group=group,
        status=HealthStatus.BROKEN,
        freshness_lag_seconds=1.0,
        coverage=1.0,
        problems=[{"kind": "drift", "detail": XSS}, XSS],
    )
    client = browser(members["viewer"])
    for url in (list_url(workspace), group_url(workspace, "tricky"), list_url(workspace, q=XSS)):
        page = client.get(url).content.decode()
        assert "<script>alert" not in page, url
        assert 'href="javascript:' not in page, url
    page = client.get(group_url(workspace, "tricky")).content.decode()
    assert page.count(XSS_ESCAPED) >= 5  # description, tag, feature, consumer, problems
    assert "&amp;amp;" in page
    search = client.get(list_url(workspace, q="%3Cscript%3E")).content.decode()
    assert 'value="&lt;script&gt;"' in search


# The dashboard card ------------------------------------------------------------------------------


def test_dashboard_features_card_counts_groups_and_links_the_broken_ones(workspace, members):
    broken = register(workspace, "context_stats")
    set_health(broken, HealthStatus.BROKEN)
    set_health(register(workspace, "user_profile"), HealthStatus.HEALTHY)
    register(workspace, "ad_profile")
    response = browser(members["viewer"]).get(
        reverse("workspace-dashboard", kwargs={"ws": workspace.slug})
    )
    page = response.content.decode()
    card = re.search(r'data-section="features">(.*?)</section>', page, re.S).group(1)
    assert "<strong>3</strong> feature groups" in card
    assert "1 healthy" in card
    assert "1 broken" in card
    assert "1 unknown" in card
    assert f'href="{group_url(workspace, "context_stats")}">context_stats</a>' in card
    assert "Nothing here yet." not in card


def test_dashboard_card_of_an_empty_workspace(workspace, members):
    page = (
        browser(members["viewer"])
        .get(reverse("workspace-dashboard", kwargs={"ws": workspace.slug}))
        .content.decode()
    )
    card = re.search(r'data-section="features">(.*?)</section>', page, re.S).group(1)
    assert "<strong>0</strong> feature groups" in card


def test_workspaces_does_not_import_features():
    """workspaces is left of features: the dashboard card is plugged in, never imported."""
    root = Path(settings.BASE_DIR) / "workspaces"
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "tests" not in path.parts
        and re.search(r"^\s*(from|import) features\b", path.read_text(), re.M)
    ]
    assert offenders == []


def test_viewer_of_the_workspace_sees_the_pages(workspace):
    viewer = make_member(workspace, Role.VIEWER)
    register(workspace, "user_profile")
    client = browser(viewer)
    for url in (list_url(workspace), group_url(workspace, "user_profile"), datasets_url(workspace)):
        assert client.get(url).status_code == 200, url


def test_a_failing_dashboard_section_leaves_its_card_empty(workspace, members, monkeypatch):
    from workspaces import dashboard

    def broken(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setitem(dashboard._providers, "features", broken)
    response = browser(members["viewer"]).get(
        reverse("workspace-dashboard", kwargs={"ws": workspace.slug})
    )
    assert response.status_code == 200
    card = re.search(r'data-section="features">(.*?)</section>', response.content.decode(), re.S)
    assert "Nothing here yet." in card.group(1)
