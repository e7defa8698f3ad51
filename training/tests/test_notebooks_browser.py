"""Notebooks in a real browser: "Open notebook" on the workspace page, the notebook page shows the
server starting and then links JupyterLab; in JupyterLab a notebook's cells list the workspace's
feature groups through the preconfigured client, and the same client gets a 404 from another
workspace the member also belongs to."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import expect

from features import registry
from features.models import EntityKind
from training import notebooks, sandbox
from training.models import NotebookServer
from workspaces import services
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def group(workspace, name):
    registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name=name,
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[{"name": "recent", "dtype": "float"}],
    )


def test_open_notebook_runs_a_cell_that_lists_the_workspace_s_groups(chromium, live_server):
    workspace = make_workspace(slug="nb-browser")
    rival = make_workspace(slug="nb-browser-rival")
    user = make_member(workspace, Role.DEVELOPER)
    services.membership_grant(actor=None, workspace=rival, user=user, role=Role.ADMIN)
    group(workspace, "clicks_seen")
    group(rival, "rival_secret")

    context = chromium.new_context(base_url=live_server.url)
    context.set_default_timeout(60_000)
    page = context.new_page()
    log_in(page, user.username)
    page.goto(f"/w/{workspace.slug}/")
    page.get_by_test_id("open-notebook").first.click()
    page.wait_for_url(re.compile(rf"/w/{workspace.slug}/notebook/$"))
    link = page.get_by_test_id("open-jupyterlab")
    expect(link).to_be_visible(timeout=120_000)  # the page polls until Jupyter answers
    server = NotebookServer.objects.for_workspace(workspace).get(user=user)
    try:
        # A notebook of the member's, in the server's folder (owned by its uid).
        cells = [
            nbformat.v4.new_code_cell(
                "import rankops\n"
                "client = rankops.Client()\n"
                "print('groups:', sorted(g['name'] for g in client.feature_groups()))\n"
                "try:\n"
                f"    client.feature_groups(ws={rival.slug!r})\n"
                "except rankops.ApiError as exc:\n"
                "    print('rival:', exc.status)\n"
            )
        ]
        book = nbformat.v4.new_notebook(
            cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}
        )
        path = Path(server.folder) / "check.ipynb"
        path.write_text(json.dumps(book))
        scratch = sandbox.prepare_notebook(workspace.pk, user.pk)
        scratch.own(path)

        href = link.get_attribute("href")
        assert href and "/lab?token=" in href
        lab = context.new_page()
        console: list[str] = []
        lab.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
        lab.on("websocket", lambda ws: console.append(f"websocket {ws.url[:80]}"))
        lab.goto(href.replace("/lab?", "/lab/tree/check.ipynb?"))
        expect(lab.locator(".jp-Notebook")).to_be_visible(timeout=60_000)
        # The kernel (started as the server's uid) is connected and idle: the status bar says so.
        expect(lab.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle"))).to_be_visible(
            timeout=60_000
        )
        lab.locator(".jp-Cell .jp-InputArea-editor").first.click()
        lab.keyboard.press("Shift+Enter")
        output = lab.locator(".jp-OutputArea-output")
        try:
            expect(output.first).to_contain_text("groups: ['clicks_seen']", timeout=60_000)
        except AssertionError:
            lab.screenshot(path="/tmp/notebook-lab.png")
            raise AssertionError("\n".join(console[-40:])) from None
        expect(output.first).to_contain_text("rival: 404")
        assert "rival_secret" not in output.first.inner_text()

        # Stopping from the notebook page ends the server and revokes its token.
        page.get_by_test_id("stop-notebook").click()
        expect(page.get_by_test_id("notebook-none")).to_be_visible()
        expect(page.get_by_test_id("notebook-past")).to_contain_text("stopped by")
    finally:
        server.refresh_from_db()
        if server.is_live:
            notebooks.notebook_stop(actor=user, server=server)
        context.close()
