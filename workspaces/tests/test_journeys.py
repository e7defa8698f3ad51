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
from workspaces.models import Role
from workspaces.testing.factories import TEST_PASSWORD, make_member, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def record_api_calls(page: Page) -> list[str]:
    calls: list[str] = []
    page.on("request", lambda r: calls.append(r.url) if "/api/" in r.url else None)
    return calls


def log_in(page: Page, username: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(TEST_PASSWORD)
    page.get_by_role("button", name="Log in").click()


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
    page.get_by_label("feed").check()
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
