"""Two people's journeys through the product in a real browser (Debian's chromium, playwright,
live_server). The browser calls no API; the only HTTP calls the test makes itself are the
producer's, who is a REST client by trade.

1. A feature producer makes an API token on the tokens page, pushes rows with it from a script,
   and sees on the group's page that the rows arrived and the group is healthy again.
2. A platform admin, in the Django admin, creates a workspace, grants a user a role in it, sets
   its quota and approves a flagged over-quota job; the user then sees the workspace and the quota.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from features import health
from features.models import FeatureGroup
from features.tests.factories import make_group, user_row
from lineage.models import AuditItem, AuditStatus
from lineage.tests.helpers import record
from workspaces.events import Ref
from workspaces.models import Membership, Role, Workspace
from workspaces.testing.browser import log_in
from workspaces.testing.factories import TEST_PASSWORD, UserFactory, make_member, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def record_api_calls(page: Page) -> list[str]:
    calls: list[str] = []
    page.on("request", lambda r: calls.append(r.url) if "/api/" in r.url else None)
    return calls


def test_producer_pushes_rows_with_a_token_made_on_the_tokens_page(page, live_server):
    workspace = make_workspace(slug="feed", name="Feed ranking")
    producer = make_member(workspace, Role.DEVELOPER, username="pat")
    group = make_group(
        workspace,
        actor=producer,
        name="user_profile",
        producer=producer,
        freshness_sla_seconds=3600,
    )
    # Registered two hours ago and nothing pushed since: the last health check found it broken.
    FeatureGroup.objects.for_workspace(workspace).filter(pk=group.pk).update(
        created_at=timezone.now() - timedelta(hours=2)
    )
    health.health_check_all()
    browser_api_calls = record_api_calls(page)

    log_in(page, "pat")
    page.get_by_role("link", name="API tokens").click()
    page.get_by_label("Name").fill("nightly-push")
    page.get_by_label("feed", exact=True).check()
    page.get_by_role("button", name="Create token").click()
    key = page.get_by_test_id("new-token").locator("pre.key").inner_text().strip()
    expect(page.get_by_role("row", name="nightly-push")).to_contain_text("feed")

    # The producer's script: one JSON batch to the group's ingestion endpoint, with that token.
    rows = [user_row(i, when=timezone.now().isoformat()) for i in range(3)]
    request = urllib.request.Request(
        f"{live_server.url}/api/v1/workspaces/feed/feature-groups/user_profile/batches/",
        data=json.dumps({"rows": rows}).encode(),
        headers={
            "Authorization": f"Token {key}",
            "Content-Type": "application/json",
            "Idempotency-Key": "nightly-1",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
    health.health_check_all()  # what beat runs every minute

    page.goto("/w/feed/")
    page.locator("aside.sidenav").get_by_role("link", name="Features").click()
    page.get_by_role("link", name="user_profile").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("user_profile")
    expect(page.locator(".badges").get_by_test_id("health")).to_have_text("healthy")
    batch = page.get_by_test_id("batches").locator("tbody tr").first
    expect(batch).to_contain_text("pat")
    expect(batch.locator("td").nth(1)).to_have_text("3")
    history = page.get_by_test_id("health-history").locator("tbody tr")
    expect(history.first).to_contain_text("healthy")
    expect(history.nth(1)).to_contain_text("broken")
    assert browser_api_calls == []


def test_admin_sets_up_a_workspace_and_approves_a_flagged_job(page, chromium, live_server):
    UserFactory(username="root", is_staff=True, is_superuser=True)
    UserFactory(username="dana")
    # Elsewhere, the scheduler let a job run over its workspace's quota and flagged it for audit.
    search = make_workspace(slug="search", name="Search ranking")
    job = Ref("training_job", 41, "big-job")
    record(search, "training.job.running", [job], resources={"gpu_hours": 12.0})
    record(search, "scheduler.job.over_quota", [job], payload={"reason": "gpus 4 > quota 2"})
    browser_api_calls = record_api_calls(page)

    page.goto("/admin/")
    page.get_by_label("Username").fill("root")
    page.get_by_label("Password").fill(TEST_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.locator("tr.model-workspace").get_by_role("link", name="Add").click()
    page.get_by_label("Slug").fill("video")
    page.get_by_label("Name").fill("Video recall")
    page.get_by_label("Scene").fill("video")
    page.get_by_label("Prediction type").select_option("recall")
    page.get_by_role("button", name="Save and continue editing").click()
    expect(page.locator(".messagelist .success")).to_contain_text("was added successfully")

    # On the workspace's page: a role for dana.
    page.get_by_role("button", name="Add another Membership").click()
    row = page.locator("tr.dynamic-memberships").last
    row.locator(".select2-selection").click()
    page.locator(".select2-search__field").fill("dana")
    page.locator(".select2-results__option", has_text="dana").click()
    row.locator('select[name$="-role"]').select_option("admin")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist .success")).to_contain_text("was changed successfully")
    video = Workspace.objects.get(slug="video")
    assert Membership.objects.for_workspace(video).get(user__username="dana").role == "admin"

    # The quota the scheduler enforces (and every page shows): 4 GPUs.
    page.goto("/admin/")
    page.locator("tr.model-workspacequota").get_by_role("link", name="Add").click()
    page.get_by_label("Workspace").select_option(label=str(video))
    page.get_by_label("Gpu milli").fill("4000")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".messagelist .success")).to_contain_text("was added successfully")

    # The flagged job, approved from the audit console.
    page.goto("/admin/")
    page.get_by_role("link", name="Audit items").click()
    flagged = page.get_by_role("row").filter(has_text="big-job")
    flagged.get_by_role("checkbox").check()
    page.locator('select[name="action"]').select_option(label="Approve (recorded as an event)")
    page.get_by_role("button", name="Go").click()
    expect(page.locator(".messagelist")).to_contain_text("Approve: 1 item(s)")
    expect(flagged).to_contain_text("Approved")
    item = AuditItem.objects.for_workspace(search).get()
    assert (item.status, item.decided_by) == (AuditStatus.APPROVED, "root")

    # dana, in her own browser, lands in the new workspace and sees its quota.
    context = chromium.new_context(base_url=live_server.url)
    context.set_default_timeout(15_000)
    dana = context.new_page()
    browser_api_calls += record_api_calls(dana)
    log_in(dana, "dana")
    expect(dana).to_have_url(f"{live_server.url}/w/video/")
    expect(dana.get_by_role("heading", level=1)).to_have_text("Video recall")
    expect(dana.get_by_test_id("role")).to_have_text("admin")
    expect(dana.get_by_test_id("quota-gpu")).to_have_text("0 of 4")
    context.close()
    assert browser_api_calls == []
