"""Steps the browser tests share."""

from __future__ import annotations

from workspaces.testing.factories import TEST_PASSWORD


def log_in(page, username: str, password: str = TEST_PASSWORD) -> None:
    """Sign in through the login form and wait until it has let the user through."""
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
