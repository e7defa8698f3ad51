"""Notebooks (training.notebooks): a real JupyterLab process per member and workspace, started
through the API against a live server; what its kernels hold, what its token reaches, and how it
ends. The browser path is test_notebooks_browser.py; the example notebooks run headless in
test_notebook_examples.py."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from training import notebooks
from training.models import NotebookServer, NotebookState
from workspaces.models import ApiToken, Role
from workspaces.testing.factories import make_member, make_workspace
from workspaces.testing.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def get(url: str, token: str, path: str) -> int:
    request = urllib.request.Request(f"{url}{path}", headers={"Authorization": f"Token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def running(client, base: str, pk: int) -> dict:
    return wait_until(
        lambda: (body := client.get(f"{base}{pk}/").json())["state"] != "starting" and body,
        timeout=120,
        what="the notebook server to answer",
        interval=0.2,
    )


def test_open_gives_jupyterlab_a_narrowed_token_and_none_of_the_platform_s_credentials(
    live_server, client_for
):
    workspace = make_workspace(slug="nb-home")
    rival = make_workspace(slug="nb-rival")
    member = make_member(workspace, Role.DEVELOPER)
    # A member of both: the notebook's token is narrowed to the workspace it was opened in.
    from workspaces import services

    services.membership_grant(actor=None, workspace=rival, user=member, role=Role.DEVELOPER)
    api = client_for(member)
    base = f"/api/v1/workspaces/{workspace.slug}/notebooks/"
    assert api.get(base).json()["results"] == []

    opened = api.post(base, format="json", SERVER_NAME="testserver")
    assert opened.status_code == 201, opened.content
    server_id = opened.json()["id"]
    try:
        body = running(api, base, server_id)
        assert body["state"] == "running", body
        assert body["url"].startswith("http://testserver:") and "/lab?token=" in body["url"]
        server = NotebookServer.objects.for_workspace(workspace).get(pk=server_id)
        # Jupyter answers with its own token only.
        status_url = f"http://127.0.0.1:{server.port}/api/status"
        with urllib.request.urlopen(
            urllib.request.Request(status_url, headers={"Authorization": f"token {server.secret}"})
        ) as answer:
            assert answer.status == 200
        assert get(f"http://127.0.0.1:{server.port}", "wrong", "/api/status") == 403

        # The process: its own uid (as root), an environment without the platform's secrets.
        env = environ_of(server.pid)
        for secret in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"):
            assert secret not in env
        assert not any(value == settings.SECRET_KEY for value in env.values())
        assert env["RANKOPS_WORKSPACE"] == workspace.slug
        assert env["RANKOPS_URL"] == "http://testserver"  # the URL the page was asked on
        assert env["PYTHONPATH"].endswith("client")
        if os.geteuid() == 0:
            assert server.isolation == "uid"
            assert Path(f"/proc/{server.pid}").stat().st_uid != 0
        config = json.loads(
            (Path(server.folder) / ".jupyter/jupyter_server_config.json").read_text()
        )
        assert config["ServerApp"]["shutdown_no_activity_timeout"] == server.idle_timeout_s
        assert config["MappingKernelManager"]["cull_idle_timeout"] == server.idle_timeout_s
        assert config["LabApp"]["news_url"] is None
        assert (Path(server.folder) / "examples" / "00-start-here.ipynb").is_file()

        # Its token: this workspace only, expiring; the rival workspace is a 404.
        key = env["RANKOPS_TOKEN"]
        token = ApiToken.objects.get(pk=server.api_token_id)
        assert [w.slug for w in token.workspaces.all()] == [workspace.slug]
        assert token.expires_at is not None
        assert (
            get(live_server.url, key, f"/api/v1/workspaces/{workspace.slug}/feature-groups/") == 200
        )
        assert get(live_server.url, key, f"/api/v1/workspaces/{rival.slug}/feature-groups/") == 404

        # Opening again answers the live server; another member sees none of it.
        again = api.post(base, format="json")
        assert again.status_code == 200 and again.json()["id"] == server_id
        other = client_for(make_member(workspace, Role.ADMIN))
        assert other.get(f"{base}{server_id}/").status_code == 404
        assert other.get(base).json()["results"] == []
        assert (
            client_for(make_member(rival, Role.ADMIN))
            .get(f"/api/v1/workspaces/{rival.slug}/notebooks/{server_id}/")
            .status_code
            == 404
        )
    finally:
        stopped = api.post(f"{base}{server_id}/stop/", format="json")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped", stopped.content
    assert "stopped by" in stopped.json()["stop_reason"]
    assert ApiToken.objects.get(pk=server.api_token_id).revoked_at is not None
    assert get(live_server.url, key, f"/api/v1/workspaces/{workspace.slug}/feature-groups/") == 401
    wait_until(lambda: not notebooks._alive(server.pid), timeout=30, what="the process to end")
    refused = api.post(f"{base}{server_id}/stop/", format="json")
    assert refused.status_code == 409 and "already stopped" in refused.json()["detail"]


def test_a_server_whose_process_ends_is_marked_stopped_and_its_token_revoked(client_for):
    workspace = make_workspace(slug="nb-ends")
    member = make_member(workspace, Role.VIEWER)
    server, started = notebooks.notebook_open(
        actor=member, workspace=workspace, platform_url="http://testserver/"
    )
    assert started and server.state == NotebookState.STARTING
    wait_until(
        lambda: notebooks.notebook_refresh(server).state == NotebookState.RUNNING,
        timeout=120,
        what="the server to answer",
        interval=0.2,
    )
    os.killpg(server.pid, 15)  # as Jupyter does to itself after its idle limit
    wait_until(
        lambda: notebooks.notebook_refresh(server).state != NotebookState.RUNNING,
        timeout=60,
        what="the platform to notice",
        interval=0.2,
    )
    assert server.state == NotebookState.STOPPED and "idle for 3600 s" in server.stop_reason
    assert ApiToken.objects.get(pk=server.api_token_id).revoked_at is not None
    # The next open starts a new server in the same folder (saved work stays).
    again, started = notebooks.notebook_open(
        actor=member, workspace=workspace, platform_url="http://testserver/"
    )
    try:
        assert started and again.pk != server.pk and again.folder == server.folder
    finally:
        notebooks.notebook_stop(actor=member, server=again)


def test_a_server_that_cannot_start_fails_saying_why(settings, client_for):
    settings.NOTEBOOK_PYTHON = "/nonexistent/python"
    workspace = make_workspace(slug="nb-broken")
    member = make_member(workspace, Role.DEVELOPER)
    response = client_for(member).post(f"/api/v1/workspaces/{workspace.slug}/notebooks/")
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "failed" and "could not start" in body["stop_reason"]
    assert not ApiToken.objects.filter(
        user=member, name__startswith="notebook", revoked_at__isnull=True
    ).exists()


def test_outsiders_and_tokens_of_other_workspaces_get_404(client_for):
    workspace = make_workspace(slug="nb-closed")
    rival = make_workspace(slug="nb-outside")
    outsider = make_member(rival, Role.ADMIN)
    url = f"/api/v1/workspaces/{workspace.slug}/notebooks/"
    assert client_for(outsider).post(url).status_code == 404
    assert client_for(outsider).get(url).status_code == 404
    # A member's token narrowed to another workspace reaches nothing here either.
    member = make_member(workspace, Role.VIEWER)
    services_of_rival = client_for(member, workspaces=[rival])
    assert services_of_rival.post(url).status_code == 404
    assert not NotebookServer.objects.for_workspace(workspace).exists()
