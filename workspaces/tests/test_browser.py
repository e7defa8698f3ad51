"""The workspace shell in a real browser: Debian's chromium, driven by playwright, on live_server.

Needs ``/usr/bin/chromium`` (``apt-get install chromium``); playwright's own browser downloads are
not used.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from workspaces import services
from workspaces.models import Membership, Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import UserFactory, make_member, make_workspace

pytestmark = pytest.mark.browser

SCREENSHOT = Path("/tmp/dashboard.png")
SECTIONS = ("features", "jobs", "models", "experiments", "lineage", "quota", "activity")


@pytest.fixture
def scene(allow_orm_beside_playwright, transactional_db):
    """A user who is admin of ``alpha``, viewer of ``beta`` and not in ``gamma``."""
    alpha = make_workspace(slug="alpha", name="Alpha feed", description="Feed pCTR models.")
    beta = make_workspace(slug="beta", name="Beta search")
    gamma = make_workspace(slug="gamma", name="Gamma secret")
    user = make_member(alpha, Role.ADMIN, username="ada")
    services.membership_grant(actor=None, workspace=beta, user=user, role=Role.VIEWER)
    make_member(gamma, Role.ADMIN, username="gamma-admin")
    return {"alpha": alpha, "beta": beta, "gamma": gamma, "user": user}


def test_login_lands_on_the_dashboard_with_its_sections(page, scene, live_server):
    log_in(page, "ada")
    expect(page).to_have_url(f"{live_server.url}/w/alpha/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Alpha feed")
    for section in SECTIONS:
        expect(page.locator(f'[data-section="{section}"]')).to_be_visible()
    expect(page.get_by_test_id("role")).to_have_text("admin")
    expect(page.get_by_test_id("current-user")).to_have_text("ada")
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000


def test_switcher_goes_to_the_other_workspace_with_its_role(page, scene, live_server):
    log_in(page, "ada")
    expect(page).to_have_url(f"{live_server.url}/w/alpha/")
    switcher = page.locator("#ws-switch")
    expect(switcher.locator("option")).to_have_count(2)
    expect(switcher).not_to_contain_text("Gamma")
    switcher.select_option("/w/beta/")
    expect(page).to_have_url(f"{live_server.url}/w/beta/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Beta search")
    expect(page.get_by_test_id("role")).to_have_text("viewer")


def test_admin_adds_a_member_through_the_members_form(page, scene, live_server):
    newcomer = UserFactory(username="grace")
    log_in(page, "ada")
    page.get_by_role("link", name="Members").click()
    expect(page).to_have_url(f"{live_server.url}/w/alpha/members/")
    rows = page.locator("[data-testid=members] tbody tr")
    expect(rows).to_have_count(1)
    page.fill("#id_username", "grace")
    page.select_option("#id_role", "developer")
    page.get_by_role("button", name="Add").click()
    expect(page.locator(".messages .success")).to_have_text("grace is now developer.")
    expect(rows).to_have_count(2)
    expect(page.locator('tr[data-username="grace"]')).to_contain_text("ada")
    membership = Membership.objects.for_workspace(scene["alpha"]).get(user=newcomer)
    assert membership.role == "developer"


def test_a_workspace_the_user_is_not_in_shows_the_404_page(page, scene):
    log_in(page, "ada")
    response = page.goto("/w/gamma/members/")
    assert response is not None
    assert response.status == 404
    expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
    expect(page.locator("body")).not_to_contain_text("gamma-admin")
    expect(page.locator("body")).not_to_contain_text("Gamma secret")


def test_log_out_button_ends_on_the_login_page(page, scene, live_server):
    log_in(page, "ada")
    expect(page).to_have_url(f"{live_server.url}/w/alpha/")
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(f"{live_server.url}/accounts/login/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Log in to RankOps")
    # The session is gone: the dashboard sends us back to the login form.
    page.goto("/w/alpha/")
    expect(page).to_have_url(f"{live_server.url}/accounts/login/?next=/w/alpha/")


def test_features_list_and_a_group_page_with_its_health_chart(page, scene, live_server):
    import json
    from datetime import timedelta

    from django.utils import timezone

    from features import ingestion, registry
    from features.models import HealthCheck, HealthStatus

    alpha, user = scene["alpha"], scene["user"]
    group = registry.feature_group_register(
        actor=user,
        workspace=alpha,
        name="user_profile",
        entity="user",
        entity_keys=["user_id"],
        features=[
            {"name": "age", "dtype": "int", "description": "<b>not bold</b>"},
            {"name": "emb", "dtype": "embedding", "dimension": 3},
        ],
        producer=user,
        description="Users <script>window.pwned = 1</script>",
    )
    rows = [
        {"user_id": f"u{i}", "event_time": timezone.now().isoformat(), "age": 30, "emb": [1, 2, i]}
        for i in range(5)
    ]
    ingestion.batch_ingest(
        actor=user, group=group, body=json.dumps({"rows": rows}).encode(), format="json"
    )
    now = timezone.now()
    for hours in range(48, -1, -6):
        HealthCheck.objects.create(
            workspace=alpha,
            group=group,
            checked_at=now - timedelta(hours=hours),
            status=HealthStatus.HEALTHY,
            freshness_lag_seconds=600.0 + hours * 60,
            coverage=0.9 + hours / 1000,
        )

    log_in(page, "ada")
    page.locator("aside.sidenav").get_by_role("link", name="Features").click()
    expect(page).to_have_url(f"{live_server.url}/w/alpha/features/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Features")
    row = page.locator('tr[data-group="user_profile"]')
    expect(row).to_contain_text("unknown")
    expect(row).to_contain_text("ada")
    page.screenshot(path="/tmp/features-list.png", full_page=True)

    row.get_by_role("link", name="user_profile").click()
    expect(page).to_have_url(f"{live_server.url}/w/alpha/features/groups/user_profile/")
    expect(page.get_by_test_id("description")).to_have_text(
        "Users <script>window.pwned = 1</script>"
    )
    assert page.evaluate("window.pwned") is None
    expect(page.locator('[data-chart="health"]')).to_have_attribute("data-drawn", "true")
    expect(page.locator('[data-chart="health"] canvas')).to_have_count(1)
    expect(page.locator('tr[data-feature="emb"]')).to_contain_text("embedding")
    expect(page.get_by_test_id("batches").locator("tbody tr")).to_have_count(1)
    expect(page.get_by_test_id("curl-json")).to_contain_text(
        f"{live_server.url}/api/v1/workspaces/alpha/feature-groups/user_profile/batches/"
    )
    page.screenshot(path="/tmp/features-group.png", full_page=True)
