"""The client from the outside: ``pip install ./client`` into a fresh virtualenv (no Django in
it), then a user's script and the ``rankops`` command drive a live server whose jobs run on a
real Celery worker (the node agent trains for real).

One test, because the virtualenv (most of the time: unpacking pandas, numpy and pyarrow) and the
worker are shared by every step: the journey script (register, push a DataFrame, build a
dataset, train and wait, register, deploy, launch an experiment, read its analysis), then the
CLI's ``train --wait`` and ``loop`` through the installed entry point, with their exit codes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pandas as pd
import pytest

from experiments.models import Experiment, ExperimentState
from features.models import FeatureGroup
from training.models import JobState, TrainingJob
from training.tests.workers import node_worker
from workspaces.models import Role
from workspaces.testing.factories import make_member, make_workspace, token_for

# An HTTP client of the API: the server side of every call is tested on both backends.
pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_backend,
]

CLIENT = Path(__file__).resolve().parents[1]
# The platform's wheels, offline: the configured registry is a local file index.
WHEELS = Path("/opt/pypi/files")


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with ``pip install ./client`` and nothing else (no pip of its own:
    the platform's pip installs into it, which saves bootstrapping one)."""
    # While working on the client: RANKOPS_CLIENT_TEST_VENV=/some/dir keeps the virtualenv
    # between runs (made fresh the first time; the client itself is reinstalled every run).
    kept = os.environ.get("RANKOPS_CLIENT_TEST_VENV")
    home = Path(kept) if kept else tmp_path_factory.mktemp("client-venv")
    python = home / "bin" / "python"
    reuse = kept is not None and python.exists()
    if not reuse:
        venv.create(home, with_pip=False, system_site_packages=False)
    index = ["--no-index", "--find-links", str(WHEELS)] if WHEELS.is_dir() else []
    # Installed from a copy: setuptools writes build/ and *.egg-info beside the sources.
    source = tmp_path_factory.mktemp("client-src") / "client"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--disable-pip-version-check",
            *index,
            *(["--force-reinstall", "--no-deps"] if reuse else []),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    has_django = subprocess.run([python, "-c", "import django"], capture_output=True)
    assert has_django.returncode != 0, "the client's virtualenv must not have Django"
    return home


def run(venv_home: Path, env: dict[str, str], *args: str, timeout: float = 300):
    """Run a program of the virtualenv (its python, or the installed ``rankops``)."""
    program = venv_home / "bin" / args[0]
    return subprocess.run(
        [str(program), *args[1:]], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_installed_client_and_cli_drive_a_live_server(client_venv, live_server, tmp_path):
    workspace = make_workspace(slug="journey")
    engineer = make_member(workspace, Role.ADMIN, username="eng")
    env = {
        "PATH": f"{client_venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "RANKOPS_URL": live_server.url,
        "RANKOPS_TOKEN": token_for(engineer),
        "RANKOPS_WORKSPACE": workspace.slug,
    }
    with node_worker(platform=True):
        script = run(client_venv, env, "python", str(CLIENT / "tests" / "journey_script.py"))
        assert script.returncode == 0, script.stderr[-4000:]
        seen = json.loads(script.stdout.strip().splitlines()[-1])
        print(json.dumps(seen, indent=1)[:6000])  # shown when an assertion below fails

        # (b) live: every operation of /api/schema/ is reachable from the installed client.
        assert seen["unreachable"] == []
        first, again = seen["push"]
        # The retried batch was stored once: the second answer is the first one, replayed.
        assert first["rows"] == 12 and again == {**first, "replayed": True}
        assert seen["lookup"][0] == {"entity": "u3", "users:age": 23}
        assert seen["lookup"][2]["users:age"] is None
        assert seen["duplicate"] == {"class": "Conflict", "code": "conflict", "attr": "name"}
        assert seen["dataset"]["rows"] == 120
        assert {"clicked", "users__age", "users__ctr"} <= set(seen["dataset"]["columns"])
        assert seen["paged"] == ["clicks", "users"]  # two pages of one
        assert seen["job"]["state"] == "succeeded"
        assert seen["job"]["log"][-1].startswith("result ")
        assert any(line.startswith("state running") for line in seen["job"]["log"])
        # The job's log file itself, read through the log endpoint: the agent's own lines.
        assert any(line.startswith("--- attempt 1 at ") for line in seen["job"]["log"])
        assert (
            seen["experiment"]["state"] == "running"
            and "arms" in seen["experiment"]["analysis_keys"]
        )
        exp = Experiment.objects.for_workspace(workspace).get(key="journey-ab")
        assert exp.state == ExperimentState.RUNNING
        assert exp.arms[1]["version_id"] == seen["versions"][1]

        # (c) the CLI through its entry point. A param the template does not have: usage, 2.
        dataset = str(seen["dataset"]["id"])
        bad = run(client_venv, env, "rankops", "train", "cli", "--dataset", dataset, "-p", "nope=1")
        assert bad.returncode == 2 and "has no param 'nope'" in bad.stderr
        trained = run(
            client_venv, env, "rankops", "--json", "train", "cli", "--dataset", dataset,
            "--template", "logreg", "-p", "l2=0.01", "--wait",
        )  # fmt: skip
        assert trained.returncode == 0, trained.stderr[-3000:]
        job = json.loads(trained.stdout)
        assert job["state"] == "succeeded" and job["params"]["l2"] == 0.01
        assert "state succeeded" in trained.stderr  # the streamed log
        assert TrainingJob.objects.for_workspace(workspace).get(pk=job["id"]).state == (
            JobState.SUCCEEDED
        )

        # The deployment is free for the loop's experiment once the journey's one ends.
        stopped = run(
            client_venv, env, "rankops", "call", "v1_workspaces_experiments_stop_create",
            "key=journey-ab", "--body", '{"reason": "done"}',
        )  # fmt: skip
        assert stopped.returncode == 0, stopped.stderr
        concluded = run(
            client_venv, env, "rankops", "experiments", "conclude", "journey-ab",
            "--action", "discard",
        )  # fmt: skip
        assert concluded.returncode == 0 and "concluded" in concluded.stdout, concluded.stderr

        recency = tmp_path / "recency.parquet"
        pd.DataFrame(
            {
                "user_id": [f"u{i}" for i in range(12)],
                "event_time": [pd.Timestamp("2026-01-01T00:00:00Z")] * 12,
                "clicks_1d": [i % 3 for i in range(12)],
            }
        ).to_parquet(recency)
        registered = run(
            client_venv, env, "rankops", "features", "register", "recency", "--entity", "user",
            "--key", "user_id", "--from-file", str(recency),
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        pushed = run(
            client_venv, env, "rankops", "--json", "features", "push", "recency", str(recency)
        )
        assert pushed.returncode == 0 and json.loads(pushed.stdout)["rows"] == 12, pushed.stderr
        looped = run(client_venv, env, "rankops", "--json", "loop", "recency", timeout=600)
        assert looped.returncode == 0, looped.stderr[-3000:]
        loop = json.loads(looped.stdout)
        assert loop["state"] == "succeeded"
        assert "experiment: succeeded" in looped.stderr  # each stage as it ended
    made = {s["name"]: s["object"] for s in loop["stages"]}
    key = made["experiment"]["url"].rstrip("/").rsplit("/", 1)[-1]
    assert Experiment.objects.for_workspace(workspace).get(key=key).state == ExperimentState.RUNNING
    assert FeatureGroup.objects.for_workspace(workspace).filter(name="recency").exists()

    # Exit codes that mean something: not found 5, a conflict 6, a bad token 3.
    status = run(client_venv, env, "rankops", "experiments", "status", "nope")
    assert status.returncode == 5 and "not_found" in status.stderr
    version = str(seen["versions"][0])
    again = run(client_venv, env, "rankops", "deploy", "main", "--version", version)
    assert again.returncode == 6 and "already exists" in again.stderr, again.stderr
    anonymous = run(client_venv, {**env, "RANKOPS_TOKEN": "bad"}, "rankops", "workspaces")
    assert anonymous.returncode == 3
    # login writes the profile file the next command reads (no RANKOPS_* variables then).
    profile_env = {"PATH": env["PATH"], "HOME": env["HOME"]}
    from workspaces.testing.factories import TEST_PASSWORD

    login = run(
        client_venv, profile_env, "rankops", "login", live_server.url, "--username", "eng",
        "--password", TEST_PASSWORD, "-w", workspace.slug,
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    listed = run(client_venv, profile_env, "rankops", "--json", "features", "list")
    assert listed.returncode == 0, listed.stderr
    assert {g["name"] for g in json.loads(listed.stdout)} == {"users", "clicks", "recency"}
    assert os.stat(Path(env["HOME"]) / ".config/rankops/profiles.json").st_mode & 0o077 == 0

    # A notebook server from the command line: opened and waited for (its URL printed), listed,
    # stopped; a second stop is a conflict (exit 6).
    opened = run(client_venv, profile_env, "rankops", "--json", "notebooks", "open", timeout=200)
    assert opened.returncode == 0, opened.stderr[-3000:]
    server = json.loads(opened.stdout)
    assert server["state"] == "running" and "/lab?token=" in server["url"], server
    listed = run(client_venv, profile_env, "rankops", "notebooks", "list")
    assert listed.returncode == 0 and "running" in listed.stdout, listed.stderr
    stopped = run(client_venv, profile_env, "rankops", "notebooks", "stop", str(server["id"]))
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    again = run(client_venv, profile_env, "rankops", "notebooks", "stop", str(server["id"]))
    assert again.returncode == 6 and "already stopped" in again.stderr, again.stderr
