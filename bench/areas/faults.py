"""Faults: real processes killed, frozen and cut off under load; nothing lost, nothing doubled.

Everything on loopback against the throwaway database: a private ``redis-server`` (broker,
cache, online store, prediction log; ``--appendonly yes`` in the run's temp folder),
``gunicorn config.wsgi`` (2 gthread workers) and Celery workers / node agents as separate
processes, each in its own process group (``bench/faults_stack.py``). For each fault a load loop
runs (pushes with an ``Idempotency-Key`` per batch, or predicts with a client ``request_id``,
or training jobs with status polls), the fault is injected, the service recovers, and then the
stores are counted against what the clients were told:

- ``worker_kill_training``: SIGKILL the worker that is the node agent while jobs train (its
  process group with it, as `make run`'s supervisor does), restart it.
- ``worker_kill_push``: SIGKILL the platform worker (lineage projection, materialisation) under a
  push loop while it rebuilds the group's online rows, restart it.
- ``redis_kill``: SIGKILL Redis under a push loop, restart it on its AOF, materialise.
- ``pg_terminate``: ``pg_terminate_backend`` on every connection of the database, six times,
  under a push loop (PostgreSQL only; on SQLite the variant ``sqlite_lock`` holds the write lock
  for 3 s instead).
- ``agent_sigstop``: SIGSTOP a node agent past its heartbeat timeout (30 s; the node is declared
  lost, the job requeued and started on another node), then SIGCONT it.
- ``gunicorn_master_kill``: SIGKILL the gunicorn master under a predict loop, restart it.
- ``schemathesis``: the Schemathesis CLI over the whole OpenAPI schema at /api/schema/ with an
  admin's token, against the running server.

Per fault ``<f>``: ``acknowledged_<f>`` (2xx answers, jobs accepted), ``stored_<f>`` (rows or
jobs found afterwards), ``duplicates_<f>``, ``lost_<f>`` (acknowledged, not stored),
``server_errors_<f>`` (5xx answers) and ``recovery_s_<f>`` (seconds from the service coming back
to the first success). For schemathesis: requests answered, answers that passed every check,
duplicates 0, requests with no answer, 5xx answers, recovery 0 (nothing is killed).
Goal: lost 0, duplicates 0, server errors 0, recovery <= 10 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.faults_stack import (
    FaultError,
    LoadLoop,
    Stack,
    database_env_of,
    http_call,
    json_body,
    pointed_at,
    stack_env,
    wait_until,
)

FAULTS = (
    "worker_kill_training",
    "worker_kill_push",
    "redis_kill",
    "pg_terminate",
    "agent_sigstop",
    "gunicorn_master_kill",
    "schemathesis",
)
KINDS = ("acknowledged", "stored", "duplicates", "lost", "server_errors", "recovery_s")
RECOVERY_GOAL_S = 10.0
ROWS_PER_BATCH = 20
SLOW_TRAINING = {
    "solver": "adam",  # epochs and checkpoints to kill between (logreg's default is one solve)
    "epochs": 4,
    "batch_size": 32,
    "threads": 1,
    "log_every_steps": 2,
    "step_sleep_s": 0.05,
    "checkpoint_every_steps": 5,
}


@dataclass
class Outcome:
    """What one fault run counted."""

    acknowledged: int
    stored: int
    duplicates: int
    lost: int
    server_errors: int
    recovery_s: float
    notes: dict[str, Any] | None = None

    def measures(self, fault: str) -> dict[str, float]:
        return {
            f"acknowledged_{fault}": self.acknowledged,
            f"stored_{fault}": self.stored,
            f"duplicates_{fault}": self.duplicates,
            f"lost_{fault}": self.lost,
            f"server_errors_{fault}": self.server_errors,
            f"recovery_s_{fault}": round(self.recovery_s, 3),
        }

    def goals_met(self) -> bool:
        return (
            self.lost == 0
            and self.duplicates == 0
            and self.server_errors == 0
            and 0 <= self.recovery_s <= RECOVERY_GOAL_S
        )


@dataclass
class Scene:
    """The workspace the faults run in, its admin and the admin's API token."""

    workspace: Any
    user: Any
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.token}", "Accept": "application/json"}


def make_scene(slug: str = "faults") -> Scene:
    """A workspace with an admin and a token, through the services."""
    from workspaces.models import Role
    from workspaces.testing.factories import make_member, make_workspace, token_for

    workspace = make_workspace(slug=slug)
    user = make_member(workspace, Role.ADMIN)
    return Scene(workspace=workspace, user=user, token=token_for(user))


# --------------------------------------------------------------------------------------------
# Pushes


def push_group(scene: Scene, name: str):
    """An online and offline group keyed by ``user_id``."""
    from features.registry import feature_group_register

    return feature_group_register(
        actor=scene.user,
        workspace=scene.workspace,
        name=name,
        entity="user",
        entity_keys=["user_id"],
        features=[{"name": "score", "dtype": "float"}, {"name": "n", "dtype": "int"}],
    )


class Pusher:
    """Batches ``i`` = ``ROWS_PER_BATCH`` rows of entities no other batch has, sent with the
    Idempotency-Key ``<run>-<i>`` (retried with the same key and body until acknowledged)."""

    def __init__(self, stack: Stack, scene: Scene, group, *, rows: int = ROWS_PER_BATCH):
        from django.utils import timezone

        self.stack, self.scene, self.group, self.rows = stack, scene, group, rows
        self.run = uuid.uuid4().hex[:8]
        self.stamp = (timezone.now() - timedelta(hours=1)).isoformat()
        ws = scene.workspace.slug
        self.path = f"/api/v1/workspaces/{ws}/feature-groups/{group.name}/batches/"

    def key(self, i: int) -> str:
        return f"{self.run}-{i}"

    def entities(self, i: int) -> list[str]:
        return [f"{self.run}-{i}-{j}" for j in range(self.rows)]

    def body(self, i: int) -> bytes:
        return json_body(
            {
                "rows": [
                    {"user_id": e, "event_time": self.stamp, "score": i + j / 100, "n": j}
                    for j, e in enumerate(self.entities(i))
                ]
            }
        )

    def send(self, i: int) -> tuple[int, bytes]:
        headers = {
            **self.scene.headers,
            "Content-Type": "application/json",
            "Idempotency-Key": self.key(i),
        }
        return http_call(self.stack.web_port, "POST", self.path, body=self.body(i), headers=headers)

    def loop(self, **options) -> LoadLoop:
        return LoadLoop(send=self.send, **options)


def online_written(answer) -> bool:
    try:
        return bool(json.loads(answer.body).get("online_written"))
    except ValueError:
        return False


def count_pushes(pusher: Pusher, loop: LoadLoop) -> dict[str, Any]:
    """Acknowledged batches against the batch rows, the offline files and the online store."""
    import pyarrow.parquet as pq

    from features import offline_store
    from features.lookup import online_lookup
    from features.models import Batch

    group = pusher.group
    acked = {pusher.key(i) for i in loop.acknowledged}
    rows = list(
        Batch.objects.for_workspace(pusher.scene.workspace)
        .filter(group=group)
        .values_list("pk", "idempotency_key", "rows", "online_written")
    )
    keys = Counter(key for _pk, key, _rows, _online in rows)
    duplicate_batches = sum(n - 1 for n in keys.values() if n > 1)
    lost_batches = len(acked - set(keys))
    batch_ids = {pk for pk, *_ in rows}

    # The offline record: each committed batch's file(s); every entity once.
    folder = offline_store.group_dir(
        workspace_id=group.workspace_id, group_id=group.pk, version=group.current_version
    )
    seen: Counter[str] = Counter()
    orphans = 0
    for path in sorted(Path(folder).rglob("batch-*.parquet")) if Path(folder).exists() else []:
        batch_id = offline_store.batch_id_of(path)
        if batch_id not in batch_ids:
            orphans += 1
            continue
        seen.update(pq.read_table(path, columns=["user_id"]).column("user_id").to_pylist())
    expected = [e for i in loop.acknowledged for e in pusher.entities(i)]
    duplicate_rows = sum(n - 1 for n in seen.values() if n > 1)
    lost_rows = sum(1 for e in expected if e not in seen)

    # The online store: every acknowledged entity served.
    lost_online = 0
    for start in range(0, len(expected), 500):
        chunk = expected[start : start + 500]
        found = online_lookup(
            workspace=pusher.scene.workspace, entities=chunk, features=[f"{group.name}:score"]
        )
        lost_online += sum(1 for row in found["rows"] if row[0] is None)

    return {
        "acknowledged": len(acked),
        "stored": len(rows),
        "duplicates": duplicate_batches + duplicate_rows,
        "lost": lost_batches + lost_rows + lost_online,
        "server_errors": loop.server_errors(),
        "detail": {
            "batches_lost": lost_batches,
            "offline_rows_lost": lost_rows,
            "online_rows_lost": lost_online,
            "batches_doubled": duplicate_batches,
            "offline_rows_doubled": duplicate_rows,
            "orphan_files": orphans,
            "not_online_written": sum(1 for *_x, online in rows if not online),
            "statuses": dict(Counter(a.status for a in loop.answers)),
            "no_answer": loop.no_answers(),
            "slowest_s": loop.slowest(),
        },
    }


def wait_online_written(pusher: Pusher, *, timeout: float = 90) -> None:
    from features.models import Batch

    wait_until(
        lambda: (
            not Batch.objects.for_workspace(pusher.scene.workspace)
            .filter(group=pusher.group, online_written=False)
            .exists()
        ),
        timeout=timeout,
        what="every batch written online",
        every=0.5,
    )


def send_materialize(group_ids: list[int]) -> None:
    """Enqueue the materialisation task (the Celery app points at the stack's broker)."""
    from config.celery import app

    app.send_task("features.tasks.materialize_online", args=[group_ids], queue="celery")


def lineage_caught_up() -> bool:
    from lineage.models import Cursor
    from lineage.projection import CURSOR
    from workspaces.models import Event

    last = Event.objects.unscoped().order_by("-pk").values_list("pk", flat=True).first() or 0
    cursor = Cursor.objects.filter(name=CURSOR).values_list("last_event_id", flat=True).first()
    return cursor is not None and cursor >= last


def outcome_of(counted: dict[str, Any], recovery_s: float | None) -> Outcome:
    return Outcome(
        acknowledged=counted["acknowledged"],
        stored=counted["stored"],
        duplicates=counted["duplicates"],
        lost=counted["lost"],
        server_errors=counted["server_errors"],
        # No success after the fault at all: -1 (a finite number the results file can hold).
        recovery_s=recovery_s if recovery_s is not None else -1.0,
        notes=counted.get("detail"),
    )


def platform_worker(stack: Stack, name: str = "platform"):
    """The worker that runs everything but training (beat included), as `make run` has one."""
    return stack.start_worker(name, queues=["celery"], beat=True, concurrency=2)


def fault_worker_kill_push(
    stack: Stack, scene: Scene, *, before: int = 15, during_s: float = 2.0, after: int = 10
) -> Outcome:
    """SIGKILL the platform worker under a push loop while it rebuilds the group's online rows;
    restart it; every batch stored once, offline, online and in the lineage graph."""
    group = push_group(scene, f"push_{uuid.uuid4().hex[:6]}")
    worker = platform_worker(stack, "push")
    pusher = Pusher(stack, scene, group)
    loop = pusher.loop().start()
    t0 = time.monotonic()
    try:
        loop.wait_acknowledged(before)
        send_materialize([group.pk])
        time.sleep(0.3)  # the rebuild under way (not a synchronisation: any moment will do)
        killed_at = time.monotonic()
        worker.kill()
        killed = len(loop.acknowledged)
        time.sleep(during_s)  # pushes go on while no worker runs
        worker.restart()
        back = worker.started_at
        loop.wait_acknowledged(killed + after)
    finally:
        loop.stop()
    wait_until(lineage_caught_up, timeout=120, what="the lineage projection", every=0.2)
    recovery = time.monotonic() - back
    send_materialize([group.pk])
    wait_online_written(pusher)
    counted = count_pushes(pusher, loop)
    counted["detail"]["timeline"] = {
        "killed_s": round(killed_at - t0, 2),
        "restarted_s": round(back - t0, 2),
        "slow_answers": [
            (round(a.at - a.took - t0, 2), round(a.took, 2), a.status)
            for a in loop.answers
            if a.took > 1
        ],
    }
    worker.stop()
    return outcome_of(counted, recovery)


def fault_redis_kill(
    stack: Stack, scene: Scene, *, before: int = 15, down_s: float = 3.0, after: int = 10
) -> Outcome:
    """SIGKILL Redis under a push loop, restart it on its AOF, materialise; every acknowledged
    batch stored once and served online."""
    if stack.redis is None:
        raise FaultError("no Redis in this stack")
    group = push_group(scene, f"redis_{uuid.uuid4().hex[:6]}")
    worker = platform_worker(stack, "redis")
    pusher = Pusher(stack, scene, group)
    loop = pusher.loop().start()
    try:
        loop.wait_acknowledged(before)
        stack.redis.kill()
        killed = len(loop.acknowledged)
        time.sleep(down_s)
        stack.redis.start()
        back = stack.redis.child.started_at
        loop.wait_acknowledged(killed + after)
        wait_until(
            lambda: loop.first_success_after(back, online_written) is not None,
            timeout=60,
            what="a push written online again",
        )
    finally:
        loop.stop()
    send_materialize([group.pk])
    wait_online_written(pusher)
    counted = count_pushes(pusher, loop)
    worker.stop()
    return outcome_of(counted, loop.first_success_after(back, online_written))


def terminate_connections(database: str) -> int:
    """``pg_terminate_backend`` on every other connection to ``database``; how many."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()) AS t",
            [database],
        )
        return int(cursor.fetchone()[0])


def fault_pg_terminate(
    stack: Stack, scene: Scene, *, before: int = 10, rounds: int = 6, after: int = 10
) -> Outcome:
    """Terminate every connection of the database six times, 0.5 s apart, under a push loop."""
    from django.db import connection

    group = push_group(scene, f"pg_{uuid.uuid4().hex[:6]}")
    worker = platform_worker(stack, "pg")
    pusher = Pusher(stack, scene, group)
    loop = pusher.loop().start()
    terminated = 0
    try:
        loop.wait_acknowledged(before)
        for _ in range(rounds):
            terminated += terminate_connections(connection.settings_dict["NAME"])
            time.sleep(0.5)
        back = time.monotonic()
        loop.wait_acknowledged(len(loop.acknowledged) + after)
    finally:
        loop.stop()
    wait_online_written(pusher)
    counted = count_pushes(pusher, loop)
    counted["detail"]["connections_terminated"] = terminated
    worker.stop()
    return outcome_of(counted, loop.first_success_after(back))


def fault_sqlite_lock(
    stack: Stack, scene: Scene, *, before: int = 10, hold_s: float = 3.0, after: int = 10
) -> Outcome:
    """SQLite's variant of losing the database: another process holds the write lock for
    ``hold_s`` under a push loop; pushes wait (busy timeout) and none fails or doubles."""
    import sqlite3

    from django.db import connection

    group = push_group(scene, f"lock_{uuid.uuid4().hex[:6]}")
    worker = platform_worker(stack, "lock")
    pusher = Pusher(stack, scene, group)
    loop = pusher.loop().start()
    try:
        loop.wait_acknowledged(before)
        holder = sqlite3.connect(str(connection.settings_dict["NAME"]), timeout=30)
        try:
            holder.execute("BEGIN IMMEDIATE")
            time.sleep(hold_s)
        finally:
            holder.rollback()
            holder.close()
        back = time.monotonic()
        loop.wait_acknowledged(len(loop.acknowledged) + after)
    finally:
        loop.stop()
    wait_online_written(pusher)
    counted = count_pushes(pusher, loop)
    worker.stop()
    return outcome_of(counted, loop.first_success_after(back))


# --------------------------------------------------------------------------------------------
# Training


def training_dataset(scene: Scene):
    from training.tests.factories import make_demo_dataset

    return make_demo_dataset(scene.workspace, scale=0.05)


def ends_of(scene: Scene, job_id: int) -> list[str]:
    """The job's end events (succeeded or failed), in order."""
    from workspaces.models import Event

    return list(
        Event.objects.for_workspace(scene.workspace)
        .filter(
            verb__in=["training.job.succeeded", "training.job.failed"],
            refs__kind="training_job",
            refs__object_id=str(job_id),
        )
        .order_by("pk")
        .values_list("verb", flat=True)
    )


def job_of(pk: int):
    from training.models import TrainingJob

    return TrainingJob.objects.unscoped().get(pk=pk)


def status_poller(stack: Stack, scene: Scene, job_ids: Iterable[int]) -> LoadLoop:
    """GETs of the jobs' status pages, as a user watching them does (counts 5xx)."""
    ids = list(job_ids)
    ws = scene.workspace.slug

    def send(i: int) -> tuple[int, bytes]:
        path = f"/api/v1/workspaces/{ws}/training-jobs/{ids[i % len(ids)]}/"
        return http_call(stack.web_port, "GET", path, headers=scene.headers)

    return LoadLoop(send=send, pause_s=0.25, give_up_s=0)


def count_jobs(scene: Scene, job_ids: list[int], poller: LoadLoop) -> dict[str, Any]:
    from training.models import JobState

    jobs = [job_of(pk) for pk in job_ids]
    ends = {job.pk: ends_of(scene, job.pk) for job in jobs}
    succeeded = [job for job in jobs if job.state == JobState.SUCCEEDED]
    return {
        "acknowledged": len(job_ids),
        "stored": len(succeeded),
        "duplicates": sum(max(0, len(e) - 1) for e in ends.values()),
        "lost": len(job_ids) - len(succeeded),
        "server_errors": poller.server_errors(),
        "detail": {
            "states": {str(job.pk): job.state for job in jobs},
            "attempts": {str(job.pk): job.attempts for job in jobs},
            "ends": {str(pk): e for pk, e in ends.items()},
            "reasons": {str(job.pk): job.state_reason[:200] for job in jobs},
        },
    }


def cordon(names: Iterable[str]) -> None:
    """Take the nodes of stopped agents out of placement (their heartbeats ended)."""
    from training.models import Node, NodeState

    Node.objects.filter(name__in=list(names)).update(state=NodeState.CORDONED)


def submit_jobs(scene: Scene, dataset, count: int, prefix: str) -> list[int]:
    from training.services import job_create

    return [
        job_create(
            actor=scene.user, workspace=scene.workspace, name=f"{prefix}{k}", dataset=dataset,
            template="logreg", params=SLOW_TRAINING, cpu_milli=1000, memory_mb=256,
        ).pk
        for k in range(count)
    ]  # fmt: skip


def fault_worker_kill_training(stack: Stack, scene: Scene, dataset, *, jobs: int = 2) -> Outcome:
    """SIGKILL the node agent's worker (and its group) while jobs train; restart it; every job
    succeeds once, resumed from its checkpoint."""
    from training.models import JobState, Node

    node = f"fk{uuid.uuid4().hex[:6]}"
    worker = stack.start_worker(
        "train", queues=["celery", f"node.{node}"], beat=True, concurrency=3
    )
    wait_until(lambda: Node.objects.filter(name=node).exists(), timeout=90, what="the node")
    job_ids = submit_jobs(scene, dataset, jobs, "kill")
    poller = status_poller(stack, scene, job_ids).start()
    try:
        running = wait_until(
            lambda: [
                j for j in map(job_of, job_ids)
                if j.state == JobState.RUNNING and j.checkpoint_step >= 5
            ],
            timeout=240,
            what="a job past its first checkpoint",
        )  # fmt: skip
        attempts = {j.pk: j.attempts for j in running}
        worker.kill()
        worker.restart()
        back = worker.started_at

        def resumed() -> bool:
            return all(
                (j := job_of(pk)).attempts > attempts[pk]
                and j.state in (JobState.RUNNING, JobState.SUCCEEDED)
                for pk in attempts
            )

        wait_until(resumed, timeout=180, what="the killed jobs running again", every=0.2)
        recovery = time.monotonic() - back
        wait_until(
            lambda: all(job_of(pk).is_terminal for pk in job_ids),
            timeout=600,
            what="every job finished",
            every=0.5,
        )
    finally:
        poller.stop()
    counted = count_jobs(scene, job_ids, poller)
    worker.stop()
    cordon([node])
    return outcome_of(counted, recovery)


def fault_agent_sigstop(stack: Stack, scene: Scene, dataset) -> Outcome:
    """SIGSTOP a node agent past its heartbeat timeout; the job moves to another node; SIGCONT
    the frozen agent: the job finishes once, on the new node, nothing written by the old one."""
    from training.models import JobState, Node, NodeState

    first, second = f"sa{uuid.uuid4().hex[:6]}", f"sb{uuid.uuid4().hex[:6]}"
    scheduler = stack.start_worker("sched", queues=["celery"], beat=True, concurrency=2)
    frozen = stack.start_worker("agent-a", queues=[f"node.{first}"], pool="solo")
    wait_until(lambda: Node.objects.filter(name=first).exists(), timeout=90, what="node a")
    (job_id,) = submit_jobs(scene, dataset, 1, "frozen")
    poller = status_poller(stack, scene, [job_id]).start()
    try:
        wait_until(
            lambda: (j := job_of(job_id)).state == JobState.RUNNING and j.checkpoint_step >= 5,
            timeout=240,
            what="the job past its first checkpoint on node a",
        )
        frozen.signal(signal.SIGSTOP)
        # The second node comes up while the first is frozen, so it is warm when the job moves.
        other = stack.start_worker("agent-b", queues=[f"node.{second}"], pool="solo")
        wait_until(
            lambda: Node.objects.filter(name=first, state=NodeState.LOST).exists(),
            timeout=120,
            what="node a declared lost",
            every=0.2,
        )
        lost_at = time.monotonic()
        wait_until(
            lambda: (
                (j := job_of(job_id)).state == JobState.RUNNING
                and j.node_id == Node.objects.get(name=second).pk
            ),
            timeout=120,
            what="the job running on node b",
            every=0.2,
        )
        recovery = time.monotonic() - lost_at
        frozen.signal(signal.SIGCONT)
        wait_until(lambda: job_of(job_id).is_terminal, timeout=600, what="the job", every=0.5)
    finally:
        frozen.signal(signal.SIGCONT)
        poller.stop()
    counted = count_jobs(scene, [job_id], poller)
    job = job_of(job_id)
    moved_ok = job.node_id == Node.objects.get(name=second).pk
    counted["detail"]["finished_on_second_node"] = moved_ok
    if not moved_ok:
        counted["duplicates"] += 1
    for child in (frozen, other, scheduler):
        child.stop()
    cordon([first, second])
    return outcome_of(counted, recovery)


# --------------------------------------------------------------------------------------------
# Predicts


def fault_gunicorn_master_kill(
    stack: Stack, scene: Scene, *, before: int = 50, after: int = 50
) -> Outcome:
    """SIGKILL the gunicorn master under a predict loop, restart it; every acknowledged predict
    is in the prediction log once."""
    from django.test.utils import override_settings

    from serving.models import PredictionLog
    from serving.tests.helpers import deployed, predict_body

    # The latency gates measure speed on this machine (a loaded one fails them); this fault is
    # about what a killed server loses, so they are relaxed for its one version.
    with override_settings(SERVING_LIMITS={"p50_ms": 5000.0, "p99_ms": 20000.0, "min_rps": 0.1}):
        served, _versions, deployment = deployed(
            scene.workspace, scene.user, versions=1, name="ranker"
        )
    worker = platform_worker(stack, "predict")  # flushes the prediction log (beat)
    run = uuid.uuid4().hex[:8]
    path = f"/api/v1/workspaces/{scene.workspace.slug}/predict/"

    def request_id(i: int) -> str:
        return f"{run}-{i}"

    def send(i: int) -> tuple[int, bytes]:
        body = predict_body(
            served, request_id=request_id(i), user=served.user_ids[i % len(served.user_ids)],
            deployment=deployment.name,
        )  # fmt: skip
        headers = {**scene.headers, "Content-Type": "application/json"}
        return http_call(stack.web_port, "POST", path, body=json_body(body), headers=headers)

    loop = LoadLoop(send=send).start()
    try:
        loop.wait_acknowledged(before)
        web = stack.web
        if web is None:
            raise FaultError("no web server")
        # The orphaned workers finish what they hold and exit (they watch their parent); what
        # is left after 10 s is killed, as a supervisor would, then a new master starts.
        web.kill(orphans_grace_s=10)
        killed = len(loop.acknowledged)
        stack.start_web(wait=False)
        back = stack.web.started_at if stack.web else time.monotonic()
        loop.wait_acknowledged(killed + after, timeout=120)
    finally:
        loop.stop()
    acked = {request_id(i) for i in loop.acknowledged}

    def logged() -> list[str]:
        return list(
            PredictionLog.objects.for_workspace(scene.workspace)
            .filter(request_id__startswith=f"{run}-")
            .values_list("request_id", flat=True)
        )

    # Not flushed in time counts as lost below.
    with contextlib.suppress(FaultError):
        wait_until(lambda: acked <= set(logged()), timeout=60, what="the log flushed", every=0.5)
    rows = logged()
    counts = Counter(rows)
    worker.stop()
    counted = {
        "acknowledged": len(acked),
        "stored": len(rows),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "lost": len(acked - set(counts)),
        "server_errors": loop.server_errors(),
        "detail": {
            "statuses": dict(Counter(a.status for a in loop.answers)),
            "no_answer": loop.no_answers(),
            "slowest_s": loop.slowest(),
        },
    }
    return outcome_of(counted, loop.first_success_after(back))


# --------------------------------------------------------------------------------------------
# Schemathesis over HTTP


def fault_schemathesis(
    stack: Stack, scene: Scene, *, max_examples: int = 2, timeout_s: float = 900
) -> Outcome:
    """The Schemathesis CLI over the whole schema with an admin's token; counts answers from
    its HAR report."""
    report = stack.workdir / "schemathesis.har"
    config = stack.workdir / "schemathesis.toml"
    config.write_text(f'[parameters]\nws = "{scene.workspace.slug}"\n')
    argv = [
        *(sys.executable, "-m", "schemathesis.cli", "--no-color"),
        *("--config-file", str(config), "run"),
        f"http://127.0.0.1:{stack.web_port}/api/schema/?format=json",
        *("-H", f"Authorization: Token {scene.token}", "--checks", "not_a_server_error"),
        *("--max-examples", str(max_examples), "--seed", "17", "--generation-deterministic"),
        *("--request-timeout", "30", "--workers", "2", "--continue-on-failure"),
        *("--phases", "examples,fuzzing", "--report", "har"),
        *("--report-har-path", str(report)),
    ]
    done = subprocess.run(
        argv, cwd=stack.workdir, env=stack.child_env(), capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip
    if not report.exists():
        raise FaultError(f"schemathesis wrote no report (rc {done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")  # fmt: skip
    entries = json.loads(report.read_text())["log"]["entries"]
    statuses = [int(e["response"]["status"] or 0) for e in entries]
    answered = [s for s in statuses if s > 0]
    server_errors = sum(1 for s in answered if s >= 500)
    return Outcome(
        acknowledged=len(answered),
        stored=len(answered) - server_errors,
        duplicates=0,
        lost=len(statuses) - len(answered),
        server_errors=server_errors,
        recovery_s=0.0,
        notes={
            "requests": len(statuses),
            "statuses": dict(Counter(statuses)),
            "server_error_urls": sorted(
                {f"{e['request']['method']} {e['request']['url'][:160]}"
                 for e in entries if int(e["response"]["status"] or 0) >= 500}
            )[:20],
            "rc": done.returncode,
            "summary": done.stdout[-1500:],
        },
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# The area


def run(ctx) -> dict[str, float]:
    from django.db import connection

    stack = Stack(
        workdir=ctx.workdir,
        env=stack_env(
            ctx.workdir,
            database=database_env_of(connection, ctx.workdir),
            cache_prefix=f"rankops-faults-{os.getpid()}",
        ),
        log=ctx.log,
    )
    measures: dict[str, float] = {}
    notes: dict[str, Any] = {}
    failed: dict[str, str] = {}
    db_fault = "pg_terminate" if connection.vendor == "postgresql" else "sqlite_lock"

    def database_fault(stack: Stack, scene: Scene) -> Outcome:
        if db_fault == "pg_terminate":
            return fault_pg_terminate(stack, scene)
        return fault_sqlite_lock(stack, scene)

    try:
        stack.start_redis()
        with pointed_at(stack):
            scene = make_scene()
            stack.start_web()
            wanted = os.environ.get("BENCH_FAULTS", "")
            training = not wanted or "agent_sigstop" in wanted or "training" in wanted
            dataset = training_dataset(scene) if training else None
            runs: list[tuple[str, Callable[[], Outcome]]] = [
                ("agent_sigstop", lambda: fault_agent_sigstop(stack, scene, dataset)),
                ("worker_kill_training", lambda: fault_worker_kill_training(stack, scene, dataset)),
                ("worker_kill_push", lambda: fault_worker_kill_push(stack, scene)),
                ("redis_kill", lambda: fault_redis_kill(stack, scene)),
                (db_fault, lambda: database_fault(stack, scene)),
                ("gunicorn_master_kill", lambda: fault_gunicorn_master_kill(stack, scene)),
                ("schemathesis", lambda: fault_schemathesis(stack, scene)),
            ]
            # BENCH_FAULTS=a,b runs only those (a partial run, for working on one fault).
            only = {f for f in os.environ.get("BENCH_FAULTS", "").split(",") if f}
            for fault, action in runs:
                if only and fault not in only:
                    continue
                ctx.log(f"{fault} ...")
                started = time.monotonic()
                try:
                    outcome = action()
                except Exception as exc:  # noqa: BLE001 - one fault that cannot run must not hide the others' numbers
                    ctx.log(f"{fault} could not run: {type(exc).__name__}: {exc}")
                    failed[fault] = f"{type(exc).__name__}: {str(exc)[:2000]}"
                    continue
                measures.update(outcome.measures(fault))
                notes[fault] = {
                    "goals_met": outcome.goals_met(),
                    "seconds": round(time.monotonic() - started, 1),
                    **(outcome.notes or {}),
                }
                ctx.log(
                    f"{fault}: {outcome.measures(fault)} goals "
                    f"{'met' if outcome.goals_met() else 'NOT met'}; {outcome.notes}"
                )
    finally:
        stack.stop()
        keep = os.environ.get("BENCH_FAULTS_LOGS")  # a folder to keep the processes' logs in
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for log in ctx.workdir.glob("*.log"):
                shutil.copy(log, Path(keep) / log.name)
    ctx.parameters["faults"] = notes
    ctx.parameters["faults_that_could_not_run"] = failed
    ctx.parameters["rows_per_batch"] = ROWS_PER_BATCH
    ctx.parameters["training_params"] = SLOW_TRAINING
    ctx.parameters["recovery_goal_s"] = RECOVERY_GOAL_S
    return measures
