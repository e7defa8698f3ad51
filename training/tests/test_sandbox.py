"""User code runs without the platform's credentials or state (issue 14, critical).

The worker test registers a malicious entry point that looks for everything a tenant could use to
reach another tenant (secrets in its environment, the database file, another workspace's
artifacts, the API, the platform's own folders) and runs it through a real Celery worker and a
real training child. The child reports what it found in the job's log; the test checks that report
and, independently, that nothing it tried to write exists.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from features.samples import dataset_file
from training import agent, sandbox
from training.models import JobState, TrainingJob
from training.services import entry_point_register, job_create, job_work_dir
from training.tasks import run_job
from training.tests.factories import FAST, make_demo_dataset, place
from training.tests.workers import node_worker, wait_for

CANARY = f"canary-{uuid.uuid4().hex}"
# Read from the environment only when settings load (the worker keeps running on its own).
SECRETS = ("SECRET_KEY", "DATABASE_URL", "AWS_SECRET_ACCESS_KEY", "RANKOPS_API_TOKEN")

PROBE = r"""
import json, os, sys, urllib.request, urllib.error

TARGETS = json.loads({targets!r})
found = {{"uid": os.getuid(), "env": dict(os.environ), "reads": {{}}, "writes": {{}}}}
for name, path in TARGETS["read"].items():
    try:
        with open(path, "rb") as handle:
            found["reads"][name] = "read %d bytes" % len(handle.read(64))
    except OSError as exc:
        found["reads"][name] = type(exc).__name__
for name, path in TARGETS["write"].items():
    try:
        with open(path, "wb") as handle:
            handle.write(b"pwned")
        found["writes"][name] = "written"
    except OSError as exc:
        found["writes"][name] = type(exc).__name__
try:
    found["listing"] = os.listdir(TARGETS["list"])
except OSError as exc:
    found["listing"] = type(exc).__name__
try:
    answer = urllib.request.urlopen(TARGETS["api"], timeout=10)
    found["api"] = answer.status
except urllib.error.HTTPError as exc:
    found["api"] = exc.code
except OSError as exc:
    found["api"] = type(exc).__name__
print("PROBE " + json.dumps(found), file=sys.stderr, flush=True)

from training.templates.logreg import build  # noqa: E402,F401  (the job itself trains)
"""


def _probe_report(job) -> dict:
    log = (job_work_dir(job) / agent.LOG_FILE).read_text()
    lines = [line for line in log.splitlines() if line.startswith("PROBE ")]
    assert lines, log[-3000:]
    return json.loads(lines[-1][len("PROBE ") :])


def _database_files() -> dict[str, str]:
    files = {"mlflow_db": settings.MLFLOW_TRACKING_URI.removeprefix("sqlite:///")}
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        files["database"] = str(database["NAME"])
    files["online_store"] = str(settings.ONLINE_STORE_SQLITE_PATH)
    return {name: path for name, path in files.items() if Path(path).exists()}


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.server_pass  # the credentials it hunts for are the servers' (DATABASE_URL, REDIS_URL)
def test_a_malicious_entry_point_finds_nothing_and_can_do_nothing(
    workspace, other_workspace, live_server, monkeypatch
):
    # The worker's own environment holds secrets; none may reach the child.
    for name in SECRETS:
        monkeypatch.setenv(name, f"{CANARY}-{name}")
    theirs = make_demo_dataset(other_workspace, scale=0.02)
    ours = make_demo_dataset(workspace, scale=0.05)
    their_file = dataset_file(theirs)
    base = Path(settings.BASE_DIR)
    their_job_dir = Path(settings.ARTIFACT_ROOT) / "jobs" / f"ws={other_workspace.pk}"
    their_job_dir.mkdir(parents=True, exist_ok=True)
    targets = {
        "read": {"their_dataset": str(their_file), **_database_files()},
        "write": {
            "code": str(base / f"pwned-{CANARY}.py"),
            "their_artifacts": str(their_job_dir / f"pwned-{CANARY}"),
            "var": str(Path(settings.VAR_DIR) / f"pwned-{CANARY}"),
        },
        "list": str(Path(settings.ARTIFACT_ROOT)),
        "api": f"{live_server.url}/api/v1/workspaces/{other_workspace.slug}/feature-groups/",
    }
    script = PROBE.format(targets=json.dumps(targets)).encode()
    entry_point_register(actor=None, workspace=workspace, name="probe", script=script)
    job = job_create(
        actor=None, workspace=workspace, name="probe", dataset=ours, entry_point="probe",
        params=FAST, cpu_milli=1000, memory_mb=512,
    )  # fmt: skip
    _run_on_worker(job)
    job = TrainingJob.objects.unscoped().get(pk=job.pk)
    assert job.state == JobState.SUCCEEDED, job.state_reason
    found = _probe_report(job)

    # No credential of the platform, by name or by value.
    values = " ".join(found["env"].values())
    assert CANARY not in values
    for name in SECRETS:
        assert name not in found["env"]
    assert not any("TOKEN" in name or "PASSWORD" in name for name in found["env"])
    if settings.DATABASES["default"].get("PASSWORD"):
        assert settings.DATABASES["default"]["PASSWORD"] not in values
    # The API without a credential: refused, never another workspace's data.
    assert found["api"] in (401, 403)
    # Writes outside its own folder fail, and nothing was written.
    for name, outcome in found["writes"].items():
        assert outcome == "PermissionError", (name, outcome)
    for path in targets["write"].values():
        assert not Path(path).exists()
    log = (job_work_dir(job) / agent.LOG_FILE).read_text()
    possible, why = sandbox.uid_switch_possible()
    if os.geteuid() == 0:
        # A root agent (CI, a node) always gives the child its own uid; without it the
        # platform's files would be readable, so a root run that cannot switch is a failure.
        assert possible, why
    if possible:
        assert f"sandbox: uid (uid {sandbox.job_uid(job.pk)})" in log
        assert found["uid"] == sandbox.job_uid(job.pk) != os.geteuid()
        for name, outcome in found["reads"].items():
            assert outcome == "PermissionError", (name, outcome)
        assert found["listing"] == "PermissionError"
    else:
        assert "sandbox: env" in log


def _run_on_worker(job):
    with node_worker() as node:
        place(job, node)
        run_job.apply_async(args=[job.pk], queue=node.queue)
        wait_for(lambda: _job(job.pk).is_terminal, timeout=120, what="the probe job")


def _job(pk) -> TrainingJob:
    return TrainingJob.objects.unscoped().get(pk=pk)


def test_the_child_environment_is_an_allow_list(tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db/x")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://u:p@db/mlflow")
    monkeypatch.setenv("LANG", "C.UTF-8")
    scratch = sandbox.Scratch(path=tmp_path, uid=None, isolation=sandbox.ISOLATION_ENV)
    env = sandbox.child_environment(scratch, gpus="1,3", threads=2)
    assert "DATABASE_URL" not in env and "MLFLOW_TRACKING_URI" not in env
    assert env["LANG"] == "C.UTF-8" and env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["HOME"] == str(tmp_path) and env["OMP_NUM_THREADS"] == "2"
    assert set(env) <= set(sandbox.BASE_ENV_ALLOW) | {
        "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH",
        "PYTHONNOUSERSITE", "HOME", "TMPDIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR",
        "MPLCONFIGDIR", "OMP_NUM_THREADS", "RANKOPS_AGENT_PID", "RANKOPS_SANDBOX",
        "RANKOPS_MAX_PROCESSES",
    }  # fmt: skip


def test_collecting_outputs_refuses_links_and_keeps_nothing_half_copied(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("another workspace's weights")
    child = tmp_path / "scratch"
    (child / "model").mkdir(parents=True)
    (child / "model" / "spec.json").write_text("{}")
    scratch = sandbox.Scratch(path=child, uid=None, isolation=sandbox.ISOLATION_ENV)
    target = tmp_path / "job" / "model"
    sandbox.collect_tree(scratch, "model", target)
    assert (target / "spec.json").read_text() == "{}"

    (child / "model" / "weights.pt").symlink_to(secret)
    with pytest.raises(sandbox.UnsafeOutput):
        sandbox.collect_tree(scratch, "model", tmp_path / "job" / "model2")
    assert not (tmp_path / "job" / "model2").exists()
    (child / "checkpoint.pt").symlink_to(secret)
    with pytest.raises(sandbox.UnsafeOutput):
        sandbox.collect_file(scratch, "checkpoint.pt", tmp_path / "job" / "checkpoint.pt")
    assert not (tmp_path / "job" / "checkpoint.pt").exists()
    os.link(secret, child / "hardlinked")
    with pytest.raises(sandbox.UnsafeOutput):
        sandbox.collect_file(scratch, "hardlinked", tmp_path / "job" / "hardlinked")


def test_state_folders_are_closed_to_other_users(settings, tmp_path):
    var = tmp_path / "var"
    (var / "artifacts").mkdir(parents=True)
    (var / "db.sqlite3").write_text("")
    (var / "sandbox" / "jobs").mkdir(parents=True)
    settings.VAR_DIR = var
    settings.ARTIFACT_ROOT = str(var / "artifacts")
    settings.TRAINING_SANDBOX_ROOT = var / "sandbox" / "jobs"
    sandbox.harden_state_dirs()
    assert (var.stat().st_mode & 0o777) == 0o711
    assert (var / "artifacts").stat().st_mode & 0o077 == 0
    assert (var / "db.sqlite3").stat().st_mode & 0o077 == 0
    assert (var / "sandbox").stat().st_mode & 0o001  # the children's way in stays open
