"""Notebooks wired to a workspace (X1): "Open notebook" starts a JupyterLab server for one member
in one workspace, with the ``rankops`` client set up in its kernels.

What a server is given, and nothing else:

* **Its own uid and folder.** ``training.sandbox.prepare_notebook``: a lasting folder per member
  and workspace under the sandbox root (saved notebooks outlive a server), owned by a uid of its
  own; the platform's state folders are closed to it, as to a training child.
* **An environment built, never copied**, as a training child's (``sandbox.child_environment``):
  no database, cache or broker URL and no secret key, plus ``RANKOPS_URL``, ``RANKOPS_WORKSPACE``
  and ``RANKOPS_TOKEN``: an API token of the member's, narrowed to this workspace and expiring
  after ``NOTEBOOK_TOKEN_TTL_S``; it is revoked when the server stops. ``PYTHONPATH`` names the
  client's source (``client/``), so ``import rankops`` works in a kernel with no install.
* **An idle limit.** Jupyter stops its kernels and then itself after ``NOTEBOOK_IDLE_TIMEOUT_S``
  without activity (its own ``cull_idle_timeout`` and ``shutdown_no_activity_timeout``); the
  platform notices when it next looks (``notebook_refresh``) and revokes the token.
* **No network of its own**: the news feed, the update check and the PyPI extension manager are
  off (nothing is fetched at run time).

Where it runs (``NOTEBOOK_BACKEND``):

* ``process``: a process on the web server that took the request, listening on ``NOTEBOOK_BIND``
  at a free port; the browser is sent to it with Jupyter's own token in the URL (shown to its
  member only), on ``NOTEBOOK_PUBLIC_HOST`` or the host the page was asked on.
* ``kubernetes``: a pod of its own (``platform/k8s/notebooks/notebook-server.yaml.tmpl``, applied
  with the official client through ``workspaces.kube``) in ``NOTEBOOK_K8S_NAMESPACE`` of the
  cluster ``NOTEBOOK_KUBECONFIG`` names: its tokens and Jupyter's settings in a Secret of its
  own, the member's folder a claim that outlives the pod, no service-account token, never
  restarted; reached through its Ingress at ``NOTEBOOK_PUBLIC_URL`` + ``/notebooks/<id>/``.
  The pod's phase is the server's state: Running and ready is running, Succeeded (Jupyter
  stopped itself when idle) is stopped, Failed is failed. Stopping deletes the Secret, Pod,
  Service and Ingress, never the claim.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.utils import timezone

from training import notebook_pods as pods
from training import sandbox
from training.models import NOTEBOOK_LIVE, NotebookBackend, NotebookServer, NotebookState
from workspaces.events import Ref, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace
from workspaces.services import api_token_create, api_token_revoke

logger = logging.getLogger(__name__)

EXAMPLES = Path(__file__).with_name("notebook_examples")
LOG_NAME = "jupyter.log"
# The Popen objects this process started, waited on by a thread each so none is left a zombie.
_children: dict[int, subprocess.Popen] = {}


def _setting(name: str, default):
    return getattr(settings, name, default)


def _free_port(bind: str) -> int:
    with socket.socket() as probe:
        probe.bind((bind, 0))
        return int(probe.getsockname()[1])


def idle_timeout_s() -> int:
    return int(_setting("NOTEBOOK_IDLE_TIMEOUT_S", 3600))


def notebooks_of(workspace: Workspace, user) -> list[NotebookServer]:
    """The member's notebook servers in the workspace, newest first, each refreshed."""
    rows = list(NotebookServer.objects.for_workspace(workspace).filter(user=user)[:20])
    for row in rows:
        notebook_refresh(row)
    return rows


def live_notebook(workspace: Workspace, user) -> NotebookServer | None:
    """The member's starting or running server in the workspace (refreshed), if any."""
    row = (
        NotebookServer.objects.for_workspace(workspace)
        .filter(user=user, state__in=NOTEBOOK_LIVE)
        .first()
    )
    if row is not None:
        notebook_refresh(row)
    return row if row is not None and row.is_live else None


def notebook_open(*, actor, workspace: Workspace, platform_url: str) -> tuple[NotebookServer, bool]:
    """The member's live server in the workspace, or a new one started; ``(server, started)``.

    ``platform_url`` is where the kernels' client reaches the API (``NOTEBOOK_PLATFORM_URL``
    wins when set)."""
    existing = live_notebook(workspace, actor)
    if existing is not None:
        return existing, False
    idle = int(_setting("NOTEBOOK_IDLE_TIMEOUT_S", 3600))
    ttl = int(_setting("NOTEBOOK_TOKEN_TTL_S", 12 * 3600))
    try:
        with transaction.atomic():
            token, key = api_token_create(
                actor=actor,
                user=actor,
                name=f"notebook in {workspace.slug}"[:100],
                workspaces=[workspace],
                expires_at=timezone.now() + timedelta(seconds=max(ttl, idle + 60)),
            )
            server = NotebookServer.objects.create(
                workspace=workspace,
                user=actor,
                backend=backend(),
                secret=secrets.token_hex(24),
                api_token=token,
                idle_timeout_s=idle,
            )
    except IntegrityError as exc:  # another request started one just now
        again = live_notebook(workspace, actor)
        if again is None:
            raise ConflictError("a notebook server is starting for you; open it again") from exc
        return again, False
    url = str(_setting("NOTEBOOK_PLATFORM_URL", "") or platform_url).rstrip("/")
    try:
        if server.backend == NotebookBackend.KUBERNETES:
            pods.start(server, key=key, platform_url=url, config=jupyter_settings(server))
            _record_started(server)
        else:
            _start(server, key=key, platform_url=url)
    except pods.errors(subprocess.SubprocessError) as exc:
        _finish(server, NotebookState.FAILED, f"the server could not start: {exc}"[:500])
        return server, True
    return server, True


def backend() -> str:
    """Where new servers run: ``NOTEBOOK_BACKEND`` (``process`` or ``kubernetes``)."""
    name = str(_setting("NOTEBOOK_BACKEND", NotebookBackend.PROCESS))
    if name not in NotebookBackend.values:
        raise ImproperlyConfigured(
            f"NOTEBOOK_BACKEND is {name!r}; allowed: {', '.join(NotebookBackend.values)}"
        )
    return name


def _stage_examples(scratch: sandbox.Scratch) -> None:
    """Copy the example notebooks into the folder once; the member's edits are kept after."""
    target = scratch.path / "examples"
    if target.exists() or not EXAMPLES.is_dir():
        return
    shutil.copytree(EXAMPLES, target, symlinks=False)
    scratch.own(target)


def jupyter_settings(server: NotebookServer) -> dict:
    """Jupyter's own settings for the server, as its ``jupyter_server_config.json`` holds
    them: its idle limits, and nothing fetched at run time."""
    return {
        "ServerApp": {
            "shutdown_no_activity_timeout": server.idle_timeout_s,
            "port_retries": 0,
            "open_browser": False,
            "allow_remote_access": True,
            "terminals_enabled": False,
        },
        "MappingKernelManager": {
            "cull_idle_timeout": server.idle_timeout_s,
            "cull_interval": max(1, min(60, server.idle_timeout_s // 2)),
            "cull_connected": True,
        },
        "LabApp": {
            "news_url": None,
            "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
            "extension_manager": "readonly",
        },
    }


def _jupyter_config(scratch: sandbox.Scratch, server: NotebookServer) -> Path:
    folder = scratch.path / ".jupyter"
    folder.mkdir(mode=0o700, exist_ok=True)
    config = jupyter_settings(server)
    (folder / "jupyter_server_config.json").write_text(json.dumps(config, indent=1))
    scratch.own(folder)
    return folder


def _start(server: NotebookServer, *, key: str, platform_url: str) -> None:
    scratch = sandbox.prepare_notebook(server.workspace_id, server.user_id)
    _stage_examples(scratch)
    config = _jupyter_config(scratch, server)
    bind = str(_setting("NOTEBOOK_BIND", "127.0.0.1"))
    port = _free_port(bind)
    env = sandbox.child_environment(scratch, gpus="", threads=2)
    for name in ("RANKOPS_AGENT_PID", "RANKOPS_MAX_PROCESSES", "RANKOPS_SANDBOX"):
        env.pop(name, None)
    runtime = scratch.path / "tmp" / "runtime"
    env.update(
        {
            "PYTHONPATH": str(Path(settings.BASE_DIR) / "client"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_DATA_DIR": str(scratch.path / ".local" / "jupyter"),
            "JUPYTER_RUNTIME_DIR": str(runtime),
            "IPYTHONDIR": str(scratch.path / ".ipython"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "RANKOPS_URL": platform_url,
            "RANKOPS_TOKEN": key,
            "RANKOPS_WORKSPACE": server.workspace.slug,
        }
    )
    log_path = _log_path(server)
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    command = [
        str(_setting("NOTEBOOK_PYTHON", "python3")),
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.ip={bind}",
        f"--ServerApp.port={port}",
        f"--ServerApp.root_dir={scratch.path}",
        f"--IdentityProvider.token={server.secret}",
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 - the command is built here, not from input
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            **sandbox.child_popen_args(scratch),
        )
    _children[process.pid] = process
    threading.Thread(target=_reap, args=(process,), daemon=True).start()
    server.port, server.pid = port, process.pid
    server.folder, server.isolation = str(scratch.path), scratch.isolation
    _record_started(server)


def _record_started(server: NotebookServer) -> None:
    server.started_at = timezone.now()
    with transaction.atomic():
        server.save(update_fields=["port", "pid", "folder", "isolation", "started_at"])
        event_record(
            actor=server.user,
            workspace=server.workspace,
            verb="training.notebook_server.started",
            refs=[Ref.to(server)],
            payload={"idle_timeout_s": server.idle_timeout_s, "isolation": server.isolation},
        )


def _reap(process: subprocess.Popen) -> None:
    process.wait()
    _children.pop(process.pid, None)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/stat")
    try:
        return status.read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _answers(server: NotebookServer) -> bool:
    """Whether the server answers its status endpoint with its own token."""
    host = str(_setting("NOTEBOOK_BIND", "127.0.0.1"))
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host  # noqa: S104 - reached locally
    request = urllib.request.Request(
        f"http://{host}:{server.port}/api/status",
        headers={"Authorization": f"token {server.secret}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:  # noqa: S310
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _log_path(server: NotebookServer) -> Path:
    """The server's output, kept by the platform beside (not in) the member's folder."""
    return sandbox.sandbox_root() / "notebook-logs" / f"server-{server.pk}.log"


def log_tail(server: NotebookServer, lines: int = 15) -> str:
    path = _log_path(server)
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def notebook_refresh(server: NotebookServer) -> NotebookServer:
    """Bring a live server's state up to date: running once it answers; stopped when its
    process has ended (after its idle limit, or killed); failed when it never answered within
    ``NOTEBOOK_START_TIMEOUT_S``."""
    if not server.is_live:
        return server
    if server.backend == NotebookBackend.KUBERNETES:
        return _refresh_pod(server)
    if _alive(server.pid):
        if _answers(server):
            if server.state != NotebookState.RUNNING:
                server.state = NotebookState.RUNNING
                server.save(update_fields=["state"])
            return server
        limit = int(_setting("NOTEBOOK_START_TIMEOUT_S", 120))
        started = server.started_at or server.created_at
        if server.state == NotebookState.STARTING and timezone.now() - started > timedelta(
            seconds=limit
        ):
            _kill(server)
            _finish(server, NotebookState.FAILED, f"it did not answer within {limit} s")
        return server
    if server.state == NotebookState.RUNNING:
        _finish(
            server,
            NotebookState.STOPPED,
            f"it stopped itself (idle for {server.idle_timeout_s} s, or its process ended)",
        )
    else:
        tail = log_tail(server, 3).replace("\n", " | ")
        _finish(server, NotebookState.FAILED, f"its process ended before it answered: {tail}")
    return server


def _refresh_pod(server: NotebookServer) -> NotebookServer:
    """The server's state from its pod's (an unreachable cluster changes nothing)."""
    try:
        seen = pods.observe(server)
    except pods.errors() as exc:
        logger.warning("notebook server %s: the cluster did not answer: %s", server.pk, exc)
        return server
    if seen.phase == pods.READY:
        if server.state != NotebookState.RUNNING:
            server.state = NotebookState.RUNNING
            server.save(update_fields=["state"])
        return server
    if seen.phase == pods.STARTING:
        limit = int(_setting("NOTEBOOK_START_TIMEOUT_S", 120))
        started = server.started_at or server.created_at
        if timezone.now() - started > timedelta(seconds=limit):
            _kill(server)
            _finish(server, NotebookState.FAILED, f"its pod was not ready within {limit} s")
        return server
    # Ended: Succeeded (Jupyter stopped itself when idle), Failed, or gone. Its Secret, Service
    # and Ingress go with it.
    _kill(server)
    if seen.phase == pods.SUCCEEDED and server.state == NotebookState.RUNNING:
        _finish(
            server,
            NotebookState.STOPPED,
            f"it stopped itself (idle for {server.idle_timeout_s} s): {seen.detail}",
        )
    elif server.state == NotebookState.RUNNING and seen.phase == pods.GONE:
        _finish(server, NotebookState.STOPPED, seen.detail)
    else:
        _finish(server, NotebookState.FAILED, seen.detail)
    return server


def _kill(server: NotebookServer) -> None:
    if server.backend == NotebookBackend.KUBERNETES:
        try:
            pods.delete(server)
        except pods.errors() as exc:
            logger.warning("notebook server %s: its pod was not deleted: %s", server.pk, exc)
        return
    if not server.pid or not _alive(server.pid):
        return
    try:
        if os.getpgid(server.pid) == os.getpgid(0):
            return  # not a server of ours (each runs in a session of its own): never our group
        os.killpg(server.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    child = _children.get(server.pid)
    if child is not None:
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def stop_started_here() -> int:
    """Stop every server this process started and has not seen exit; how many were stopped.

    For a process that ends with its servers (the test suite's teardown): a server normally
    outlives the web process that started it and stops on its idle limit."""
    stopped = 0
    for pid, child in list(_children.items()):
        if child.poll() is not None:
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        stopped += 1
    return stopped


def _finish(server: NotebookServer, state: str, reason: str, *, actor=None) -> None:
    with transaction.atomic():
        row = NotebookServer.objects.unscoped().select_for_update().get(pk=server.pk)
        if not row.is_live:
            server.refresh_from_db()
            return
        row.state, row.stop_reason, row.stopped_at = state, reason[:500], timezone.now()
        row.save(update_fields=["state", "stop_reason", "stopped_at"])
        if row.api_token is not None and row.api_token.revoked_at is None:
            api_token_revoke(actor=actor, token=row.api_token)
        event_record(
            actor=actor,
            workspace=row.workspace,
            verb=f"training.notebook_server.{state}",
            refs=[Ref.to(row)],
            payload={"reason": row.stop_reason},
        )
    server.refresh_from_db()


def notebook_stop(*, actor, server: NotebookServer) -> NotebookServer:
    """Stop the member's server now (its kernels with it) and revoke its token."""
    if not server.is_live:
        raise ConflictError(f"notebook server {server.pk} is already {server.state}")
    _kill(server)
    _finish(server, NotebookState.STOPPED, f"stopped by {actor.get_username()}", actor=actor)
    return server


def notebook_url(server: NotebookServer, request_host: str) -> str:
    """Where the member's browser opens JupyterLab (with Jupyter's token): the public host when
    one is configured, else the host the platform's page was asked on."""
    if server.backend == NotebookBackend.KUBERNETES:
        base = str(_setting("NOTEBOOK_PUBLIC_URL", "") or f"http://{request_host}").rstrip("/")
        return f"{base}{pods.base_url(server)}lab?token={server.secret}"
    host = str(_setting("NOTEBOOK_PUBLIC_HOST", "") or request_host.rsplit(":", 1)[0])
    if host.startswith("[") is False and host.count(":") > 1:
        host = f"[{host}]"
    return f"http://{host}:{server.port}/lab?token={server.secret}"
