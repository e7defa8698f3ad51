"""The shell a newcomer meets: one stylesheet, dashboard cards that count what exists, one quota on
the dashboard and the queue, readable activity and audit pages, the notification inbox."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from experiments.tests.factories import make_deployment, make_model, make_version
from lineage.tests.helpers import record
from training.models import JobState
from training.scheduler import services as scheduler_services
from training.scheduler.tests.factories import make_job
from workspaces.events import Ref
from workspaces.humanize import duration, key_values, verb_label
from workspaces.models import Notification, Role
from workspaces.notifications import notify
from workspaces.testing.factories import UserFactory, make_member

pytestmark = pytest.mark.django_db


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def card(html: str, key: str) -> str:
    match = re.search(
        rf'<section class="card section" data-section="{key}">(.*?)</section>', html, re.S
    )
    assert match, f"no {key} card"
    return match.group(1)


def quota_table(html: str) -> str:
    match = re.search(r'<table class="compact" data-testid="quotas">.*?</table>', html, re.S)
    assert match, "no quota table"
    return match.group(0)


# 1. One stylesheet --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url_name",
    ["training-jobs", "serving-models", "scheduler-queue", "features-list", "workspace-dashboard"],
)
def test_pages_outside_features_link_the_shell_stylesheet_only(workspace, members, url_name):
    page = browser(members[Role.VIEWER]).get(reverse(url_name, kwargs={"ws": workspace.slug}))
    assert page.status_code == 200
    html = page.content.decode()
    assert f'<link rel="stylesheet" href="{static("css/app.css")}">' in html
    assert "features.css" not in html and "training.css" not in html
    assert "<style>" not in html  # no page carries its own copy of shared styles


def test_tab_and_fact_list_styles_live_in_app_css():
    assert finders.find("css/features.css") is None
    assert finders.find("training/training.css") is None
    css = Path(finders.find("css/app.css")).read_text()
    for selector in (".tabs a.active", "dl.facts dt", ".health-broken", ".job-form", ".sched-over"):
        assert selector in css, selector


# 2. Dashboard cards count what exists ------------------------------------------------------------


def test_models_card_counts_versions_and_deployments(workspace, members):
    dep, _treatments = make_deployment(workspace, name="ranker-prod", treatments=2)
    other = make_model(workspace, name="two-tower")
    make_version(workspace, other)
    html = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/").content.decode()
    models = card(html, "models")
    assert "Nothing here yet." not in models
    assert "<strong>2</strong> models</a>" in models
    assert "with 4 versions" in models
    assert "<strong>1</strong> deployment</a>: 1 active, 0 stopped." in models
    assert f'href="/w/{workspace.slug}/deployments/ranker-prod/">ranker-prod</a> serves' in models
    assert f"/w/{workspace.slug}/models/{dep.model.name}/v1/" in models


def test_models_card_of_an_empty_workspace_says_zero(workspace, members):
    models = card(
        browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/").content.decode(), "models"
    )
    assert "<strong>0</strong> models</a>" in models
    assert "live-deployments" not in models


# 3. One quota on the dashboard and the queue ------------------------------------------------------


def test_dashboard_and_queue_show_the_same_quota(workspace, members):
    scheduler_services.quota_set(
        actor=None, workspace=workspace, cpu_milli=8000, memory_mb=16384, gpu_milli=2000
    )
    make_job(workspace, state=JobState.RUNNING, cpu_milli=2500, memory_mb=4096, gpu_count=1)
    make_job(workspace, state=JobState.PENDING, cpu_milli=4000)  # waiting: not counted
    client = browser(members[Role.VIEWER])
    dashboard = quota_table(client.get(f"/w/{workspace.slug}/").content.decode())
    queue = quota_table(client.get(f"/w/{workspace.slug}/queue/").content.decode())
    assert dashboard == queue
    assert '<td data-testid="quota-cpu">2.5 of 8</td>' in queue
    assert '<td data-testid="quota-memory">4 of 16</td>' in queue
    assert '<td data-testid="quota-gpu">1 of 2</td>' in queue


def test_a_workspace_without_a_scheduler_quota_is_unlimited_on_both_pages(workspace, members):
    make_job(workspace, state=JobState.RUNNING, cpu_milli=1500, memory_mb=512)
    client = browser(members[Role.VIEWER])
    dashboard = quota_table(client.get(f"/w/{workspace.slug}/").content.decode())
    queue = quota_table(client.get(f"/w/{workspace.slug}/queue/").content.decode())
    assert dashboard == queue
    assert "No quota: the scheduler admits this workspace's jobs without a limit." in queue
    assert "In use now: 1.5 CPU cores, 0.5 GiB memory, 0 GPUs, 0 GB stored." in queue


# 4. Activity in words; durations -----------------------------------------------------------------


def test_activity_shows_sentences_and_the_platform_instead_of_codes(workspace, members):
    record(workspace, "training.job.created", [Ref("training_job", 7, "ctr-dcn")])
    record(workspace, "widgets.gear_box.polished", actor=members[Role.DEVELOPER])
    html = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/activity/").content.decode()
    verbs = re.findall(r'<td data-testid="event-verb" title="([^"]+)">([^<]+)</td>', html)
    assert ("training.job.created", "Training job submitted") in verbs
    assert ("widgets.gear_box.polished", "Gear box polished") in verbs
    actors = re.findall(r'<td data-testid="event-actor">([^<]+)</td>', html)
    assert "the platform" in actors
    assert members[Role.DEVELOPER].username in actors
    assert ">system<" not in html
    assert ">training.job.created<" not in html
    assert "Training job: ctr-dcn" in html


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (45.4, "45 s"),
        (600, "10 min"),
        (3600, "1 h"),
        (11520, "3 h 12 min"),
        (86400, "1 day"),
        (90000, "1 day 1 h"),
        (8 * 86400 + 3 * 3600, "8 days"),
        (None, "—"),
        ("soon", "—"),
    ],
)
def test_duration_words(seconds, words):
    assert duration(seconds) == words


@pytest.mark.parametrize(
    ("verb", "label"),
    [
        ("training.job.created", "Training job submitted"),
        ("serving.deployment.scaled", "Deployment scaled"),
        ("feature_group.versioned", "Feature group versioned"),
        ("membership.granted", "Member added or role changed"),
        ("system", "System"),
    ],
)
def test_verb_labels(verb, label):
    assert verb_label(verb) == label


def test_key_values_escapes_and_nests():
    html = key_values({"reason": "<b>x</b>", "after": {"cpu_milli": 2000}, "tags": ["a", "b"]})
    assert "<b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert '<dt>after</dt><dd><dl class="kv"><dt>cpu milli</dt><dd>2000</dd></dl></dd>' in html
    assert "<dt>tags</dt><dd>a, b</dd>" in html
    assert key_values({}) == "—"


# 5. Audit pages without dict reprs ---------------------------------------------------------------


@pytest.fixture
def staff_client():
    return browser(UserFactory(is_staff=True, is_superuser=True))


def test_audit_trail_shows_payloads_as_key_value_lists(workspace, staff_client):
    record(
        workspace,
        "scheduler.quota.set",
        [Ref("workspace_quota", 1, "all GPU types")],
        resources={"gpu_hours": 1.5},
        payload={"gpu_type": "", "before": None, "after": {"cpu_milli": 8000, "gpu_milli": None}},
    )
    page = staff_client.get(reverse("admin:lineage_audit_trail"), {"workspace": workspace.slug})
    assert page.status_code == 200
    html = page.content.decode()
    assert "{&#x27;" not in html and "{'" not in html
    assert "<dt>gpu hours</dt><dd>1.5</dd>" in html
    assert '<dt>after</dt><dd><dl class="kv"><dt>cpu milli</dt><dd>8000</dd>' in html
    assert "Scheduler quota set<br><code>scheduler.quota.set</code>" in html
    assert "<td>the platform</td>" in html


def test_audit_changelist_shows_reason_and_resources_without_reprs(workspace, staff_client):
    from lineage.projection import catch_up

    record(
        workspace,
        "scheduler.job.over_quota",
        [Ref("training_job", 41, "big-job")],
        payload={"exceeded": ["gpu_milli 2000 > 0 (all GPU types)"], "priority_class": "x"},
        resources={"gpu_hours": 12.0},
    )
    catch_up()
    page = staff_client.get(reverse("admin:lineage_audititem_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "big-job" in html
    assert "exceeded gpu_milli 2000 &gt; 0 (all GPU types)" in html
    assert "[&#x27;" not in html and "{&#x27;" not in html and "{'" not in html
    assert "<dt>gpu hours</dt><dd>12.0</dd>" in html


# 6. The inbox and the bell -----------------------------------------------------------------------


def _notify(workspace, user, title, *, link=""):
    return notify(
        workspace=workspace, recipients=[user], verb="test.thing", title=title, body="", link=link
    )[0]


@pytest.fixture
def inbox_user(workspace, other_workspace):
    user = make_member(workspace, Role.DEVELOPER)
    make_member(other_workspace, Role.VIEWER, username=f"{user.username}-x")  # someone else
    return user


def test_bell_counts_only_my_unread_notifications(workspace, other_workspace, inbox_user):
    stranger = make_member(workspace, Role.VIEWER)
    _notify(workspace, inbox_user, "one")
    _notify(other_workspace, inbox_user, "two")
    read = _notify(workspace, inbox_user, "three")
    Notification.objects.unscoped().filter(pk=read.pk).update(read_at=timezone.now())
    _notify(workspace, stranger, "not mine")
    html = browser(inbox_user).get(f"/w/{workspace.slug}/").content.decode()
    assert '<span class="count" data-testid="unread-count">2</span>' in html
    assert 'aria-label="Notifications, 2 unread"' in html
    quiet = (
        browser(make_member(workspace, Role.VIEWER)).get(f"/w/{workspace.slug}/").content.decode()
    )
    assert 'data-testid="bell"' in quiet and "unread-count" not in quiet


def test_inbox_lists_newest_first_with_safe_links(workspace, inbox_user):
    _notify(workspace, inbox_user, "older", link=f"/w/{workspace.slug}/experiments/ab1/")
    _notify(workspace, inbox_user, "newer", link="javascript:alert(1)")
    _notify(workspace, inbox_user, "newest", link="//evil.example/x")
    page = browser(inbox_user).get(reverse("inbox"))
    assert page.status_code == 200
    html = page.content.decode()
    assert html.index(">newest<") < html.index(">newer<") < html.index(">older<")
    assert f'<a href="/w/{workspace.slug}/experiments/ab1/">older</a>' in html
    assert "javascript:" not in html and "evil.example" not in html
    assert html.count('data-testid="mark-read"') == 3
    assert 'data-testid="mark-all-read"' in html


def test_empty_inbox_says_what_will_show_up(workspace, inbox_user):
    html = browser(inbox_user).get(reverse("inbox")).content.decode()
    assert 'data-testid="inbox-empty"' in html
    assert "feature group you own, produce or consume" in html
    assert "mark-all-read" not in html


def test_mark_read_and_mark_all_read(workspace, other_workspace, inbox_user):
    first = _notify(workspace, inbox_user, "first")
    second = _notify(other_workspace, inbox_user, "second")
    stranger = make_member(workspace, Role.VIEWER)
    theirs = _notify(workspace, stranger, "theirs")
    client = browser(inbox_user)

    assert client.get(reverse("inbox-read", args=[first.pk])).status_code == 405
    response = client.post(reverse("inbox-read", args=[first.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("inbox")
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.read_at is not None and second.read_at is None

    assert client.post(reverse("inbox-read", args=[theirs.pk])).status_code == 404
    client.post(reverse("inbox-read-all"))
    second.refresh_from_db()
    theirs.refresh_from_db()
    assert second.read_at is not None
    assert theirs.read_at is None
    assert "1 notification marked read." in client.get(reverse("inbox")).content.decode()


def test_inbox_posts_need_the_csrf_token(workspace, inbox_user):
    note = _notify(workspace, inbox_user, "guarded")
    client = Client(enforce_csrf_checks=True)
    client.force_login(inbox_user)
    assert client.post(reverse("inbox-read", args=[note.pk])).status_code == 403
    assert client.post(reverse("inbox-read-all")).status_code == 403
    note.refresh_from_db()
    assert note.read_at is None
    page = client.get(reverse("inbox")).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(reverse("inbox-read", args=[note.pk]), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    note.refresh_from_db()
    assert note.read_at is not None


def test_inbox_needs_a_login():
    response = Client().get(reverse("inbox"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_cluster_link_is_for_staff_only(workspace, members):
    staff = make_member(workspace, Role.VIEWER, is_staff=True)
    staff_html = browser(staff).get(f"/w/{workspace.slug}/").content.decode()
    assert f'href="{reverse("scheduler-cluster")}" data-testid="cluster-link"' in staff_html
    html = browser(members[Role.ADMIN]).get(f"/w/{workspace.slug}/").content.decode()
    assert "cluster-link" not in html and reverse("scheduler-cluster") not in html
    cluster = browser(staff).get(reverse("scheduler-cluster"))
    assert cluster.status_code == 200
    assert static("css/app.css") in cluster.content.decode()
    assert "<style>" not in cluster.content.decode()
