"""The node agent: what a Celery worker on a node queue (``node.<name>``) does.

* ``node_heartbeat(name, queue)`` registers/updates the ``Node`` row with the inventory found
  here (CPUs, memory, GPUs through ``torch.cuda`` or ``nvidia-smi``). A worker that consumes a
  ``node.*`` queue starts a heartbeat thread on ``worker_ready`` (see ``start_heartbeats``).
* ``execute_job(job_id)`` (the body of ``training.tasks.run_job``) runs a placed job as a child
  process (``python -m training.runner``) with ``CUDA_VISIBLE_DEVICES`` from the job's assigned
  GPUs, reads the child's JSON-lines events, streams progress and metric rows to the database
  and to MLflow, polls ``stop_requested`` every ``STOP_POLL_S`` and SIGTERMs the child (which
  checkpoints and exits), samples the child's CPU and memory, and finally moves the job to
  succeeded / preempted / cancelled, or back to pending (another attempt, resumed from the
  checkpoint) / failed when the child died.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import queue as queue_module
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone

from training import runner, sandbox
from training.distributed import gang_of, local_workers, remote_ranks
from training.models import TRAINJOB_LABEL, JobState, Node, NodeState, TrainingJob
from training.services import StaleAttempt
from workspaces.events import Ref, event_record

logger = logging.getLogger(__name__)

# Set when the worker begins a shutdown: every running child is asked to checkpoint and stop,
# and its job is released as preempted (the scheduler requeues it, it resumes elsewhere).
SHUTTING_DOWN = threading.Event()

HEARTBEAT_S = 5.0
RETRY_TRIES = 40
STOP_POLL_S = 0.5
PROGRESS_FLUSH_S = 1.0
NODE_QUEUE_PREFIX = "node."
PID_FILE = "child.pid"
LOG_FILE = "log.txt"
SPEC_FILE = "spec.json"
LOCK_FILE = "agent-node{node}.lock"
CHECKPOINT_FILE = "checkpoint.pt"
MODEL_DIR = "model"
RANKS_LOCK_FILE = "agent-ranks-node{node}.lock"
RANKS_LOG_FILE = "log-ranks-node{node}.txt"
RANK_PID_FILE = "rank{rank}.pid"
RANK_COMMAND = (sys.executable, "-m", "training.runner", "--rank")


# --- inventory and heartbeat ---------------------------------------------------------------------


def _memory_mb() -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def find_gpus() -> list[dict[str, Any]]:
    """GPUs visible here: torch.cuda first, nvidia-smi as the fallback."""
    gpus: list[dict[str, Any]] = []
    try:
        import torch

        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                gpus.append(
                    {
                        "index": index,
                        "type": props.name,
                        "memory_mb": int(props.total_memory // (1024 * 1024)),
                    }
                )
            return gpus
    except Exception:
        logger.warning("torch.cuda inventory failed", exc_info=True)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(  # noqa: S603 - fixed arguments
                [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            for line in out.strip().splitlines():
                index, name, memory = (part.strip() for part in line.split(","))
                gpus.append({"index": int(index), "type": name, "memory_mb": int(float(memory))})
        except (subprocess.SubprocessError, ValueError, OSError):
            logger.warning("nvidia-smi inventory failed", exc_info=True)
    return gpus


TRAINJOB_ENV = "RANKOPS_TRAINJOB"  # set in a TrainJob's pods (platform/k8s/training)


def node_inventory() -> dict[str, Any]:
    inventory: dict[str, Any] = {
        "hostname": socket.gethostname()[:255],
        "cpu_milli": _cpu_count() * 1000,
        "memory_mb": _memory_mb(),
        "gpus": find_gpus(),
    }
    trainjob = os.environ.get(TRAINJOB_ENV, "")
    if trainjob:  # a pod of a TrainJob: the node takes that TrainJob's job only
        inventory["labels"] = {TRAINJOB_LABEL: trainjob}
    return inventory


def pod_stopping() -> int:
    """A TrainJob's pod got SIGTERM (Kueue suspended or deleted its TrainJob): cordon the nodes
    this process registered so that nothing is placed on them again (the pod is going);
    returns how many. Nothing for an agent outside a TrainJob."""
    if not os.environ.get(TRAINJOB_ENV) or not HEARTBEATS.names:
        return 0
    return Node.objects.filter(name__in=HEARTBEATS.names, state=NodeState.READY).update(
        state=NodeState.CORDONED, state_reason="its TrainJob pod is stopping"
    )


def node_heartbeat(node_name: str, queue: str, *, inventory: dict | None = None) -> Node:
    """Register or refresh this node's row; a lost node that beats again is ready again."""
    inventory = inventory if inventory is not None else node_inventory()
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        if node is None:
            node = Node.objects.create(name=node_name, queue=queue, last_heartbeat=now, **inventory)
            event_record(
                actor=None,
                workspace=None,
                verb="training.node.registered",
                refs=[Ref.to(node)],
                payload={"queue": queue, **inventory},
            )
            return node
        node.queue = queue
        node.last_heartbeat = now
        for key, value in inventory.items():
            setattr(node, key, value)
        if node.state == NodeState.LOST:
            node.state = NodeState.READY
            node.state_reason = "heartbeat resumed"
        node.save()
    return node


class _Heartbeats:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.names: list[str] = []  # the nodes this process beats for

    def start(self, queues: list[str]) -> list[str]:
        started = []
        for queue in queues:
            if not queue.startswith(NODE_QUEUE_PREFIX):
                continue
            name = queue[len(NODE_QUEUE_PREFIX) :]
            thread = threading.Thread(
                target=self._loop, args=(name, queue), name=f"heartbeat-{name}", daemon=True
            )
            thread.start()
            self.threads.append(thread)
            started.append(name)
        self.names.extend(started)
        return started

    def _loop(self, name: str, queue: str) -> None:
        inventory = node_inventory()
        while not self.stop.is_set():
            try:
                close_old_connections()
                with_retry(node_heartbeat, name, queue, inventory=inventory)
                resume_orphans(name)
            except Exception:
                logger.warning("node heartbeat failed", exc_info=True)
            self.stop.wait(HEARTBEAT_S)
        connection.close()

    def shutdown(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=HEARTBEAT_S + 1)
        self.threads = []
        self.names = []
        self.stop = threading.Event()


HEARTBEATS = _Heartbeats()


# Jobs this process handed to a fresh delivery, and when (one hand-over per minute at most).
_RESUMED: dict[int, float] = {}
RESUME_AGAIN_AFTER_S = 60.0


def resume_orphans(node_name: str) -> list[int]:
    """Running jobs on this node that no agent supervises any more (their agent was killed or
    crashed, its lock is free) get a fresh ``run_job`` on the node's queue, which resumes them
    from their checkpoint. Runs with every heartbeat, so a restarted worker picks its jobs up
    within seconds instead of waiting for the broker to redeliver the unacknowledged message."""
    from training.services import job_work_dir
    from training.tasks import run_job

    resumed = []
    now = time.monotonic()
    running = (
        TrainingJob.objects.unscoped()
        .filter(state=JobState.RUNNING, node__name=node_name)
        .select_related("node")
    )
    for job in running:
        if now - _RESUMED.get(job.pk, -RESUME_AGAIN_AFTER_S) < RESUME_AGAIN_AFTER_S:
            continue
        work = job_work_dir(job)
        if not work.is_dir():
            continue
        lock = _supervision_lock(work, job.node_id)
        if lock is None:
            continue  # an agent supervises it
        lock.close()
        logger.warning("job %s runs on %s with no agent; resuming it", job.pk, node_name)
        run_job.apply_async(args=[job.pk], queue=job.node.queue)
        _RESUMED[job.pk] = now
        resumed.append(job.pk)
    return resumed


def start_heartbeats(consumer) -> list[str]:
    """``worker_ready`` hook: beat for every ``node.<name>`` queue this worker consumes."""
    try:
        queues = list(consumer.app.amqp.queues.consume_from.keys())
    except AttributeError:
        queues = [q.name for q in consumer.task_consumer.queues]
    return HEARTBEATS.start(queues)


# --- running a job ------------------------------------------------------------------------------


def with_retry(fn, *args, **kwargs):
    """Run a database write, retrying while SQLite says a table is locked.

    PostgreSQL never needs it. The embedded SQLite store (``make run``) waits through its busy
    timeout, but the in-memory shared-cache database of the test runs fails at once when the
    agent, the heartbeat and a web request write together; a short retry rides that out.
    """
    from django.db import OperationalError

    for attempt in range(RETRY_TRIES):
        try:
            return fn(*args, **kwargs)
        except OperationalError as exc:
            if "locked" not in str(exc) or attempt == RETRY_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    return None


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(settings.ARTIFACT_ROOT))
    except ValueError:
        return str(path)


def artifact_path(relative: str) -> Path:
    return Path(settings.ARTIFACT_ROOT) / relative


def feature_dicts(job: TrainingJob) -> list[dict[str, Any]]:
    """The job's dataset features as the training templates read them (ref, column, dtype,
    entity, dim); reads only ``job.dataset`` and ``job.workspace_id``."""
    from features.models import Feature
    from features.selectors import FeatureRef, output_column

    dataset = job.dataset
    result = []
    for index, text in enumerate(dataset.feature_refs):
        ref = FeatureRef.parse(text, index=index)
        feature = (
            Feature.objects.for_workspace(job.workspace_id)
            .filter(group__name=ref.group, name=ref.feature)
            .select_related("group")
            .first()
        )
        dtype = feature.dtype if feature else "float"
        entity = feature.group.entity if feature else ""
        result.append(
            {
                "ref": str(ref),
                "column": output_column(ref),
                "dtype": dtype,
                "entity": entity,
                "dim": (feature.dimension or 1) if feature and dtype == "embedding" else 1,
            }
        )
    return result


def build_job_spec(job: TrainingJob):
    from features.selectors import dataset_file
    from training.data import JobSpec
    from training.models import EntryPoint
    from training.services import entry_point_target, job_work_dir

    if job.record_set_id:
        return _record_set_job_spec(job)
    dataset = job.dataset
    label_columns = list(dataset.label_columns or [])
    label = str(job.params.get("label") or (label_columns[0] if label_columns else "clicked"))
    base_model = ""
    if job.base_job_id and job.base_job and job.base_job.model_path:
        base_model = str(artifact_path(job.base_job.model_path))
    entry = ""
    if job.entry_point:
        entry_point = EntryPoint.objects.for_workspace(job.workspace_id).get(name=job.entry_point)
        entry = entry_point_target(entry_point)
    return JobSpec(
        job_id=job.pk,
        template=job.template or "entry_point",
        dataset_path=str(dataset_file(dataset)),
        features=feature_dicts(job),
        work_dir=str(job_work_dir(job)),
        label=label,
        entity_keys={"label": list(dataset.label_group.entity_keys)},
        params=dict(job.params),
        base_model_path=base_model,
        entry_point=entry,
        slice_column=str(job.params.get("slice_column") or ""),
        **_ranks_fields(job),
    )


def _ranks_fields(job: TrainingJob) -> dict[str, Any]:
    """The spec's ``workers`` (and, for a gang over several nodes, ``local_ranks`` and the
    rendezvous address: rank 0's node's, which is this agent's on rank 0's node)."""
    local = local_workers(job)
    spread = len(gang_of(job))
    if spread <= local:
        return {"workers": local}
    return {"workers": spread, "local_ranks": local, "rendezvous_host": settings.NODE_ADDRESS}


def _record_set_job_spec(job: TrainingJob):
    """A job on a record set: for a language model (``lm_lora``, ``lm_full``) its file as the
    data, no features and no label (the base model folder is in its params, staged by
    ``_stage``); for a ranking template, a ranking sample (``curation.stages``' format
    ``to: ranking``): its columns as the features, ``label`` the label."""
    from curation.services import ranking_features, record_set_file
    from training.bundle import is_language_model
    from training.data import JobSpec
    from training.services import job_work_dir

    features: list[dict[str, Any]] = []
    label = ""
    if not is_language_model(job.template):
        features = [
            {"ref": f"record_set:{name}", "column": name, "dtype": dtype, "entity": "context"}
            for name, dtype in ranking_features(job.record_set)
        ]
        label = "label"
    return JobSpec(
        job_id=job.pk,
        template=job.template,
        dataset_path=str(record_set_file(job.record_set)),
        features=features,
        work_dir=str(job_work_dir(job)),
        label=label,
        params=dict(job.params),
        workers=1,
    )


class Tracker:
    """MLflow logging for one job: an experiment per workspace, one run per job (resumed on
    every attempt). Tracking trouble is logged, never fatal to the training."""

    def __init__(self, job: TrainingJob) -> None:
        self.run_id = job.mlflow_run_id
        self.client = None
        try:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=settings.MLFLOW_TRACKING_URI)
            name = f"rankops/{job.workspace.slug}"
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                location = (Path(settings.MLFLOW_ARTIFACT_ROOT) / job.workspace.slug).as_uri()
                try:
                    experiment_id = self.client.create_experiment(name, artifact_location=location)
                except Exception:  # another agent created it just now (re-raised otherwise)
                    experiment = self.client.get_experiment_by_name(name)
                    if experiment is None:
                        raise
                    experiment_id = experiment.experiment_id
            else:
                experiment_id = experiment.experiment_id
            if self.run_id:
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                run = self.client.create_run(
                    experiment_id,
                    run_name=f"{job.name}-{job.pk}",
                    tags={
                        "rankops.job_id": str(job.pk),
                        "rankops.workspace": job.workspace.slug,
                        "rankops.template": job.template or job.entry_point,
                    },
                )
                self.run_id = run.info.run_id
        except Exception:
            logger.warning("MLflow tracking unavailable for job %s", job.pk, exc_info=True)
            self.client = None

    def params(self, params: dict[str, Any]) -> None:
        if self.client is None:
            return
        from mlflow.entities import Param

        try:
            existing = self.client.get_run(self.run_id).data.params
            items = [Param(k, str(v)[:500]) for k, v in sorted(params.items()) if k not in existing]
            for start in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[start : start + 100])
        except Exception:
            logger.warning("MLflow params failed", exc_info=True)

    def metrics(self, rows: list[tuple[int, str, float]]) -> None:
        if self.client is None or not rows:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        items = [Metric(name, float(value), stamp, int(step)) for step, name, value in rows]
        try:
            for start in range(0, len(items), 500):
                self.client.log_batch(self.run_id, metrics=items[start : start + 500])
        except Exception:
            logger.warning("MLflow metrics failed", exc_info=True)

    def artifacts(self, directory: Path, path: str) -> None:
        if self.client is None:
            return
        try:
            self.client.log_artifacts(self.run_id, str(directory), artifact_path=path)
        except Exception:
            logger.warning("MLflow artifacts failed", exc_info=True)

    def finish(self, status: str) -> None:
        if self.client is None:
            return
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception:
            logger.warning("MLflow terminate failed", exc_info=True)


@dataclass
class Usage:
    """Peaks and totals of the child, sampled from /proc."""

    pid: int
    started: float = field(default_factory=time.monotonic)
    cpu_peak_milli: int = 0
    memory_peak_mb: int = 0
    gpu_memory_peak_mb: int = 0
    cpu_seconds: float = 0.0
    _last: tuple[float, float] | None = None

    def sample(self) -> None:
        try:
            with open(f"/proc/{self.pid}/stat") as handle:
                parts = handle.read().rsplit(")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            cpu = (int(parts[11]) + int(parts[12])) / ticks
            with open(f"/proc/{self.pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        self.memory_peak_mb = max(self.memory_peak_mb, int(line.split()[1]) // 1024)
        except (OSError, IndexError, ValueError):
            return
        now = time.monotonic()
        if self._last is not None and now - self._last[0] >= 0.2:
            rate = (cpu - self._last[1]) / (now - self._last[0])
            self.cpu_peak_milli = max(self.cpu_peak_milli, int(rate * 1000))
            self._last = (now, cpu)
        elif self._last is None:
            self._last = (now, cpu)
        self.cpu_seconds = cpu

    def hours(self) -> float:
        return (time.monotonic() - self.started) / 3600.0


def _gpu_env(job: TrainingJob) -> str:
    indices = [str(g.get("index")) for g in job.assigned_gpus or [] if "index" in g]
    return ",".join(dict.fromkeys(indices))  # slices of one GPU: that GPU once


def _resources(job: TrainingJob, usage: Usage) -> dict[str, float]:
    hours = usage.hours()
    gpus = job.gpu_count + job.gpu_milli / 1000.0 if job.assigned_gpus else 0.0
    return {
        "cpu_hours": round(job.cpu_milli / 1000.0 * hours, 6),
        "gpu_hours": round(gpus * hours, 6),
        "memory_gb_hours": round(job.memory_mb / 1024.0 * hours, 6),
    }


def _usage_dict(job: TrainingJob, usage: Usage) -> dict[str, Any]:
    previous = job.usage or {}
    resources = _resources(job, usage)
    return {
        "cpu_peak_milli": max(usage.cpu_peak_milli, previous.get("cpu_peak_milli", 0)),
        "memory_peak_mb": max(usage.memory_peak_mb, previous.get("memory_peak_mb", 0)),
        "gpu_memory_peak_mb": max(usage.gpu_memory_peak_mb, previous.get("gpu_memory_peak_mb", 0)),
        "cpu_hours": round(previous.get("cpu_hours", 0) + resources["cpu_hours"], 6),
        "gpu_hours": round(previous.get("gpu_hours", 0) + resources["gpu_hours"], 6),
        "memory_gb_hours": round(
            previous.get("memory_gb_hours", 0) + resources["memory_gb_hours"], 6
        ),
        "cpu_time_hours": round(previous.get("cpu_time_hours", 0) + usage.cpu_seconds / 3600, 6),
    }


def _refresh(job: TrainingJob) -> TrainingJob:
    return TrainingJob.objects.unscoped().select_related("workspace", "node").get(pk=job.pk)


def _load_job(job_id: int) -> TrainingJob | None:
    """The job with what running it reads (workspace, dataset and its label group, node, base
    job) in one query; None when it is gone."""
    return (
        TrainingJob.objects.unscoped()
        .select_related("workspace", "dataset", "dataset__label_group", "node", "base_job")
        .filter(pk=job_id)
        .first()
    )


def execute_job(job_id: int) -> str:
    """Run a placed job to its end here; returns the job's final state."""
    from training.services import job_transition, job_work_dir

    job = _load_job(job_id)
    if job is None:
        return "missing"
    if job.state not in {JobState.PLACED, JobState.RUNNING}:
        logger.info("job %s is %s; nothing to run", job.pk, job.state)
        return job.state
    work = job_work_dir(job)
    work.mkdir(parents=True, exist_ok=True)
    if job.state == JobState.PLACED and job.stop_requested:
        to = JobState.PREEMPTED if job.stop_requested == "preempt" else JobState.CANCELLED
        job_transition(
            job=job, to=to, expect=JobState.PLACED, reason="stopped before start", stop_requested=""
        )
        return job.state
    lock = _supervision_lock(work, job.node_id)
    if lock is None:
        logger.info("job %s already runs here; ignoring a duplicate delivery", job.pk)
        return job.state
    try:
        return _execute_locked(job, work)
    finally:
        lock.close()


def _supervision_lock(work: Path, node_id: int | None, name: str = LOCK_FILE):
    """An exclusive lock on the job's folder for one node, held for as long as this node's agent
    supervises the job.

    The kernel drops it when the agent dies (SIGKILL included), so a job that is ``running`` while
    its lock is free has no agent: ``resume_orphans`` hands it to a fresh delivery. None when
    another agent process of the node holds it (a duplicate delivery of ``run_job``). The lock is
    per node so that an agent frozen on a node declared lost (SIGSTOP, a partition) does not keep
    the node the job moved to from running it; fencing (the attempt number) keeps the frozen one
    from writing once it wakes."""
    handle = open(work / name.format(node=node_id or 0), "a+b")  # noqa: SIM115 - held until the job ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _execute_locked(job: TrainingJob, work: Path) -> str:
    from training.services import job_transition

    job.refresh_from_db()
    if job.state not in {JobState.PLACED, JobState.RUNNING}:
        return job.state
    spec = build_job_spec(job)
    spec_path = work / SPEC_FILE
    spec_path.write_text(spec.to_json())
    if job.state == JobState.PLACED:
        with_retry(
            job_transition,
            job=job,
            to=JobState.RUNNING,
            expect=JobState.PLACED,
            reason=f"attempt {job.attempts + 1} on {job.node.name if job.node else 'this node'}",
            attempts=job.attempts + 1,
            payload={"attempt": job.attempts + 1, "resume_step": job.checkpoint_step},
        )
    else:  # the agent that ran it died; this redelivered task resumes it
        TrainingJob.objects.unscoped().filter(pk=job.pk).update(attempts=F("attempts") + 1)
        job.refresh_from_db()
    tracker = Tracker(job)
    if tracker.run_id and tracker.run_id != job.mlflow_run_id:
        TrainingJob.objects.unscoped().filter(pk=job.pk).update(mlflow_run_id=tracker.run_id)
        job.mlflow_run_id = tracker.run_id
    tracker.params(
        {
            "template": job.template or job.entry_point,
            "dataset": str(job.dataset) if job.dataset_id else "",
            **({"record_set": str(job.record_set)} if job.record_set_id else {}),
            "base_job": job.base_job_id or "",
            "features": ",".join(f["ref"] for f in spec.features),
            **{f"param.{k}": v for k, v in job.params.items()},
        }
    )
    return _supervise(job, spec, spec_path, work, tracker)


def _stage(job: TrainingJob, spec, scratch: sandbox.Scratch, work: Path, *, salvage: bool = True):
    """Copy the job's inputs into the child's private folder; the spec the child reads names
    those copies only (the platform's own paths stay unknown and unreadable to it). ``salvage``
    (rank 0's agent): first take the checkpoint a dead agent's child left behind."""
    staged: dict[str, Any] = {"work_dir": str(scratch.path)}
    dataset = Path(spec.dataset_path)
    if dataset.is_dir():
        staged["dataset_path"] = str(scratch.stage_tree(dataset, "dataset"))
    else:
        staged["dataset_path"] = str(scratch.stage_file(dataset, "dataset.parquet"))
    if spec.base_model_path:
        staged["base_model_path"] = str(
            scratch.stage_tree(Path(spec.base_model_path), "base_model")
        )
    lm_base = str(spec.params.get("base_model_path") or "") if job.record_set_id else ""
    if lm_base:
        from training.services import base_model_path_problem

        # Checked again here: the roots are this node's, and the folder is copied as the agent.
        # A folder this node lacks (or may not give) is not staged: the child says so and fails.
        if not base_model_path_problem(lm_base) and Path(lm_base).is_dir():
            staged["params"] = {
                **spec.params,
                "base_model_path": str(scratch.stage_tree(Path(lm_base), "lm_base_model")),
                "base_model_source": lm_base,  # what the adapter's config names as its base
            }
        else:
            staged["params"] = {**spec.params, "base_model_path": ""}
    if spec.entry_point.endswith(".py"):
        staged["entry_point"] = str(scratch.stage_file(Path(spec.entry_point), "entry_point.py"))
    if salvage:
        _salvage_checkpoint(job, work, keep=scratch.path)
    checkpoint = work / CHECKPOINT_FILE
    if checkpoint.exists():
        shutil.copyfile(checkpoint, scratch.path / CHECKPOINT_FILE)
        scratch.own(scratch.path / CHECKPOINT_FILE)
    child_spec = dataclasses.replace(spec, **staged)
    spec_path = scratch.path / SPEC_FILE
    spec_path.write_text(child_spec.to_json())
    scratch.own(spec_path)
    return spec_path


def _salvage_checkpoint(job: TrainingJob, work: Path, *, keep: Path) -> None:
    """Take the newest checkpoint a dead agent's child left in its scratch folder (the child
    checkpoints on its parent's death, after the agent could copy it out), then remove those
    folders."""
    root = sandbox.sandbox_root()
    if not root.is_dir():
        return
    target = work / CHECKPOINT_FILE
    newest = target.stat().st_mtime if target.exists() else 0.0
    for folder in sorted(root.glob(f"job-{job.pk}-*")):
        if folder == keep:
            continue
        leftover = sandbox.Scratch(
            path=folder,
            uid=sandbox.job_uid(job.pk) if sandbox.uid_switch_possible()[0] else None,
            isolation="",
        )
        candidate = folder / CHECKPOINT_FILE
        try:
            if candidate.exists() and candidate.lstat().st_mtime > newest:
                sandbox.collect_file(leftover, CHECKPOINT_FILE, target)
                newest = target.stat().st_mtime
        except (OSError, sandbox.UnsafeOutput):
            logger.warning("job %s: a leftover checkpoint was refused", job.pk, exc_info=True)
        leftover.remove()


def _max_wall_s(job: TrainingJob) -> float:
    """The job's wall-time limit in seconds (0: none): the workspace's policy."""
    from training.services import job_max_wall_s

    return float(job_max_wall_s(job))


def _node_fault(job: TrainingJob, why: str, attempt: int | None = None) -> str:
    """The node itself failed this attempt (not the job): count it towards a cordon and give
    the job back to the scheduler, which places it again (on another node if this one is
    cordoned meanwhile)."""
    from training.services import job_transition

    logger.error("job %s: node fault: %s", job.pk, why)
    Node.objects.filter(pk=job.node_id).update(failure_count=F("failure_count") + 1)
    job = _refresh(job)
    if job.state != JobState.RUNNING:
        return job.state
    to = JobState.PENDING if job.attempts < job.max_attempts else JobState.FAILED
    try:
        with_retry(
            job_transition,
            job=job,
            to=to,
            expect=JobState.RUNNING,
            reason=f"node fault: {why}"[:500],
            attempt=attempt,
            **({"node": None, "assigned_gpus": []} if to == JobState.PENDING else {}),
        )
    except StaleAttempt as exc:
        logger.warning("job %s: %s", job.pk, exc)
        return _refresh(job).state
    return job.state


def _supervise(job: TrainingJob, spec, spec_path: Path, work: Path, tracker: Tracker) -> str:
    try:
        scratch = sandbox.prepare(job.pk)
    except OSError as exc:
        tracker.finish("FAILED")
        return _node_fault(job, f"cannot prepare the sandbox: {exc}", job.attempts)
    try:
        try:
            child_spec_path = _stage(job, spec, scratch, work)
        except OSError as exc:
            tracker.finish("FAILED")
            return _node_fault(job, f"cannot stage the job's inputs: {exc}", job.attempts)
        return _run_child(job, work, tracker, scratch, child_spec_path, spec)
    finally:
        scratch.remove()


def _run_child(
    job: TrainingJob, work: Path, tracker: Tracker, scratch, child_spec_path: Path, spec
) -> str:
    from training.services import job_record_progress

    # The fencing token: every write of this attempt carries it, and is refused once the job
    # has moved on (its node declared lost, the job requeued and started elsewhere).
    attempt = job.attempts
    env = sandbox.child_environment(
        scratch, gpus=_gpu_env(job), threads=max(1, job.cpu_milli // 1000)
    )
    log = open(work / LOG_FILE, "ab")  # noqa: SIM115 - closed below, after the child exits
    log.write(f"--- attempt {job.attempts} at {timezone.now().isoformat()}\n".encode())
    isolation = f"sandbox: {scratch.isolation}"
    if scratch.uid is not None:
        isolation += f" (uid {scratch.uid})"
    elif scratch.why_not_uid:
        isolation += f" ({scratch.why_not_uid})"
    log.write(f"{isolation}; environment from an allow-list; a private folder\n".encode())
    log.flush()
    try:
        child = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, "-m", "training.runner", str(child_spec_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            **sandbox.child_popen_args(scratch),
        )
    except OSError as exc:
        log.close()
        tracker.finish("FAILED")
        return _node_fault(job, f"cannot start the training child: {exc}", attempt)
    (work / PID_FILE).write_text(str(child.pid))
    events: queue_module.Queue = queue_module.Queue()

    def read() -> None:
        for raw in child.stdout:
            try:
                events.put(json.loads(raw))
            except ValueError:
                log.write(raw)
        events.put(None)

    reader = threading.Thread(target=read, name=f"job-{job.pk}-reader", daemon=True)
    reader.start()
    usage = Usage(pid=child.pid)
    state = _Progress(
        collect=lambda: _collect_checkpoint(scratch, work, job.pk, attempt),
        checkpoint_path=_relative(work / CHECKPOINT_FILE),
        rendezvous=lambda event: dispatch_ranks(job, attempt, event, log),
    )
    max_wall_s = _max_wall_s(job)
    started = time.monotonic()
    signalled = ""
    superseded = ""
    last_poll = last_flush = 0.0
    reader_done = False
    while True:
        try:
            event = events.get(timeout=0.1)
        except queue_module.Empty:
            event = False
        if event is None:
            reader_done = True
        elif event:
            state.handle(event, log)
        now = time.monotonic()
        if now - last_poll >= STOP_POLL_S:
            last_poll = now
            usage.sample()
            row = with_retry(
                lambda: (
                    TrainingJob.objects.unscoped()
                    .filter(pk=job.pk)
                    .values_list("stop_requested", "attempts", "state")
                    .first()
                )
            )
            if row is None or row[1] != attempt or row[2] != JobState.RUNNING:
                superseded = (
                    f"attempt {attempt} was superseded: the job is "
                    f"{row[2] if row else 'gone'} at attempt {row[1] if row else '-'}"
                )
                break
            if not signalled:
                wanted = row[0]
                if not wanted and SHUTTING_DOWN.is_set():
                    wanted = "shutdown"
                if not wanted and max_wall_s and now - started > max_wall_s:
                    wanted = "wall_time"
                if not wanted and state.refused:
                    wanted = "unsafe_output"
                if wanted:
                    signalled = wanted
                    with contextlib.suppress(OSError):
                        child.send_signal(signal.SIGTERM)
        if now - last_flush >= PROGRESS_FLUSH_S or (reader_done and child.poll() is not None):
            last_flush = now
            try:
                state.flush(job.pk, tracker, usage, job_record_progress, attempt)
            except StaleAttempt as exc:
                superseded = str(exc)
                break
        if reader_done and child.poll() is not None:
            break
    if superseded:
        return _superseded(job, child, log, tracker, superseded)
    try:
        state.flush(job.pk, tracker, usage, job_record_progress, attempt)
    except StaleAttempt as exc:
        return _superseded(job, child, log, tracker, str(exc))
    code = child.wait()
    if code == 0 and state.done is not None:
        try:
            state.done["model_path"] = str(
                sandbox.collect_tree(scratch, MODEL_DIR, work / MODEL_DIR)
            )
            if (scratch.path / runner.SELECTION_ROWS_FILE).is_file():
                # The validation rows' scores a tuning job compares its trials on.
                sandbox.collect_file(
                    scratch, runner.SELECTION_ROWS_FILE, work / runner.SELECTION_ROWS_FILE
                )
        except (OSError, sandbox.UnsafeOutput) as exc:
            state.done, state.error, code = None, f"the model was refused: {exc}", 1
    if signalled == "wall_time":
        state.error = f"the job ran past its wall-time limit of {max_wall_s:g} s"
    elif signalled == "unsafe_output":
        state.error = state.refused
    log.write(f"--- child exited with {code}\n".encode())
    if state.error:
        log.write(f"{state.error}\n".encode())
    log.close()
    with contextlib.suppress(OSError):
        (work / PID_FILE).unlink()
    try:
        return _finish(_refresh(job), code, state, usage, tracker, spec, signalled, attempt)
    except StaleAttempt as exc:
        logger.warning("job %s: %s; its end is not recorded", job.pk, exc)
        return _refresh(job).state


# --- ranks on the gang's other nodes -------------------------------------------------------------


def dispatch_ranks(job: TrainingJob, attempt: int, event: dict[str, Any], log) -> None:
    """Rank 0 opened its rendezvous (``training.distributed.start``): hand the ranks from
    ``first_remote_rank`` on to the agents of the gang's other nodes, ``tasks.run_ranks`` on
    each node's queue. A node that is gone gets nothing: rank 0 then times out waiting for the
    group, and the attempt fails and is requeued like any lost rank."""
    from training.tasks import run_ranks

    store, world = str(event.get("store", "")), int(event.get("world", 0))
    plan = remote_ranks(job, int(event.get("first_remote_rank", 0)))
    nodes = Node.objects.in_bulk([node for node, _, _ in plan])
    for node_id, ranks, gpus in plan:
        node = nodes.get(node_id)
        if node is None:
            log.write(f"--- ranks {ranks}: their node {node_id} is gone\n".encode())
            continue
        run_ranks.apply_async(
            args=[job.pk, attempt, node.pk, store, world, ranks, gpus], queue=node.queue
        )
        log.write(f"--- ranks {ranks} of {world} handed to {node.name} (store {store})\n".encode())
    log.flush()


def execute_ranks(
    job_id: int, attempt: int, node_id: int, store: str, world: int, ranks: list[int], gpus=()
) -> str:
    """Run ``ranks`` of attempt ``attempt`` of a data-parallel job whose rank 0 runs on another
    node: the job's inputs and checkpoint staged into a sandbox as for rank 0, one
    ``python -m training.runner --rank r`` per rank joined to the store at ``store``; returns
    how they ended. The ranks are stopped at once when the attempt is over (fenced)."""
    from training.services import job_work_dir

    job = _load_job(job_id)
    if job is None:
        return "missing"
    if job.attempts != attempt or job.state != JobState.RUNNING:
        return "superseded"
    work = job_work_dir(job)
    lock = _supervision_lock(work, node_id, RANKS_LOCK_FILE)
    if lock is None:
        return "duplicate"  # this node's agent runs these ranks already
    try:
        return _execute_ranks_locked(job, attempt, node_id, store, world, ranks, gpus, work)
    finally:
        lock.close()


def _job_log(work: Path, line: str) -> None:
    with open(work / LOG_FILE, "ab") as log:
        log.write(f"--- {line}\n".encode())


def _execute_ranks_locked(job, attempt, node_id, store, world, ranks, gpus, work: Path) -> str:
    from training import distributed

    here = Node.objects.filter(pk=node_id).values_list("name", flat=True).first() or node_id
    spec = build_job_spec(job)
    if spec.workers != world:
        _job_log(work, f"ranks {ranks} on {here}: the job has {spec.workers} ranks, not {world}")
        return "failed"
    scratch = sandbox.prepare(job.pk)
    output = open(work / RANKS_LOG_FILE.format(node=node_id), "ab")  # noqa: SIM115 - closed below
    children: list[subprocess.Popen] = []
    try:
        child_spec_path = _stage(job, spec, scratch, work, salvage=False)
        env = sandbox.child_environment(
            scratch, gpus=",".join(str(g) for g in gpus), threads=max(1, job.cpu_milli // 1000)
        )
        env.update({distributed.WORLD_ENV: str(world), distributed.STORE_ENV: store})
        for rank in ranks:
            children.append(
                subprocess.Popen(  # noqa: S603 - our own module, a spec we wrote
                    [*RANK_COMMAND, str(rank), str(child_spec_path)],
                    env={**env, distributed.RANK_ENV: str(rank)},
                    stdout=output,
                    stderr=output,
                    **sandbox.child_popen_args(scratch),
                )
            )
            (work / RANK_PID_FILE.format(rank=rank)).write_text(str(children[-1].pid))
        _job_log(work, f"ranks {ranks} of {world} started on {here} (attempt {attempt})")
        superseded = False
        while any(child.poll() is None for child in children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                next(c for c in children if c.poll() is None).wait(timeout=STOP_POLL_S)
            row = with_retry(
                lambda: (
                    TrainingJob.objects.unscoped()
                    .filter(pk=job.pk)
                    .values_list("attempts", "state")
                    .first()
                )
            )
            if row is None or row[0] != attempt or row[1] != JobState.RUNNING:
                superseded = True
                break
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
        codes = [child.returncode for child in children]
        ended = "stopped: the attempt is over" if superseded else f"exited with {codes}"
        _job_log(work, f"ranks {ranks} on {here} {ended}")
        if superseded:
            return "superseded"
        return "succeeded" if not any(codes) else "failed"
    except OSError as exc:
        _job_log(work, f"ranks {ranks} on {here} could not start: {exc}")
        return "failed"
    finally:
        for rank, child in zip(ranks, children, strict=False):
            if child.poll() is None:
                child.kill()
                child.wait()
            with contextlib.suppress(OSError):
                (work / RANK_PID_FILE.format(rank=rank)).unlink()
        output.close()
        scratch.remove()


def _superseded(job: TrainingJob, child, log, tracker: Tracker, why: str) -> str:
    """This attempt lost the job (fenced): stop its child at once, write nothing more."""
    logger.warning("job %s: %s; stopping this attempt's child", job.pk, why)
    with contextlib.suppress(OSError):
        child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=30)
    log.write(f"--- {why}; this agent stopped its child and wrote nothing more\n".encode())
    log.close()
    tracker.finish("KILLED")
    return _refresh(job).state


def _collect_checkpoint(scratch, work: Path, job_id: int, attempt: int) -> str:
    """Copy the child's newest checkpoint into the job's folder, unless this attempt has been
    superseded (the folder then holds the new attempt's checkpoint); returns the error, if any."""
    from training.services import job_attempt_current

    if not with_retry(job_attempt_current, job_id, attempt):
        return ""  # the supervision loop sees the fence and stops the child
    try:
        sandbox.collect_file(scratch, CHECKPOINT_FILE, work / CHECKPOINT_FILE)
    except (OSError, sandbox.UnsafeOutput) as exc:
        return f"the checkpoint was refused: {exc}"
    return ""


class _Progress:
    """Events from the child, batched for the database and MLflow."""

    def __init__(self, collect=None, checkpoint_path: str = "", rendezvous=None) -> None:
        self.collect = collect
        self.rendezvous = rendezvous
        self.checkpoint_path = checkpoint_path
        self.fields: dict[str, Any] = {}
        self.metrics: list[tuple[int, str, float]] = []
        self.done: dict[str, Any] | None = None
        self.error = ""
        self.refused = ""  # an output of the child the agent would not take
        self.gpu_memory_peak_mb = 0

    def handle(self, event: dict[str, Any], log) -> None:
        kind = event.get("type")
        if kind == "start":
            self.fields["total_steps"] = int(event["total_steps"])
        elif kind == "progress":
            step = int(event["step"])
            self.fields.update(
                step=step,
                total_steps=int(event["total_steps"]),
                epoch=int(event["epoch"]),
                loss=float(event["loss"]),
                samples_per_s=float(event["samples_per_s"]),
                eta_s=float(event["eta_s"]),
            )
            self.metrics.append((step, "loss", float(event["loss"])))
            self.metrics.append((step, "samples_per_s", float(event["samples_per_s"])))
            self.gpu_memory_peak_mb = max(
                self.gpu_memory_peak_mb, int(event.get("gpu_memory_mb") or 0)
            )
        elif kind == "metric" and event.get("value") is not None:
            self.metrics.append((int(event["step"]), str(event["name"]), float(event["value"])))
        elif kind == "checkpoint":
            # The child's own path is never trusted: the agent copies the file it knows.
            problem = self.collect() if self.collect is not None else ""
            if problem:
                self.error = self.refused = problem
                return
            self.fields.update(
                checkpoint_path=self.checkpoint_path, checkpoint_step=int(event["step"])
            )
            self.metrics.append((int(event["step"]), "checkpoint", float(event["step"])))
        elif kind == "rendezvous":
            if self.rendezvous is not None:
                self.rendezvous(event)
        elif kind == "done":
            self.done = event
        elif kind == "error":
            self.error = str(event.get("message", ""))
        elif kind == "log":
            log.write(f"{event.get('message', '')}\n".encode())
            log.flush()

    def flush(
        self, job_id: int, tracker: Tracker, usage: Usage, record, attempt: int | None = None
    ) -> None:
        if not self.fields and not self.metrics:
            return
        fields, metrics = self.fields, self.metrics
        self.fields, self.metrics = {}, []
        usage.gpu_memory_peak_mb = max(usage.gpu_memory_peak_mb, self.gpu_memory_peak_mb)
        if attempt is None:
            with_retry(record, job_id=job_id, metrics=metrics, **fields)
        else:
            with_retry(record, job_id=job_id, metrics=metrics, attempt=attempt, **fields)
        tracker.metrics([m for m in metrics if m[1] != "checkpoint"])


def _production_comparison(job: TrainingJob, spec) -> dict[str, Any] | None:
    from training import evaluation

    if job.record_set_id:
        return None  # a language model's adapter is not a ranking model: nothing to compare
    path = evaluation.production_bundle_path(job.workspace, job.compare_deployment)
    if not path:
        return None
    where = {"bundle": str(path), "deployment": job.compare_deployment}
    try:
        return {**evaluation.evaluate_bundle(path, spec), **where}
    except Exception as exc:
        logger.warning("production comparison failed for job %s", job.pk, exc_info=True)
        return {"error": f"{type(exc).__name__}: {exc}"[:500], **where}


def _finish(
    job: TrainingJob,
    code: int,
    state: _Progress,
    usage: Usage,
    tracker,
    spec,
    signalled: str = "",
    attempt: int | None = None,
) -> str:
    from training.services import job_transition

    usage_now = _usage_dict(job, usage)
    resources = _resources(job, usage)

    def end_attempt(to: str, **fields: Any) -> None:
        # Every end moves the running attempt on, with its resources and usage.
        with_retry(
            job_transition,
            job=job,
            attempt=attempt,
            to=to,
            expect=JobState.RUNNING,
            resources=resources,
            usage=usage_now,
            **fields,
        )

    if code == 0 and state.done is not None:
        metrics = dict(state.done.get("metrics") or {})
        production = _production_comparison(job, spec)
        if production is not None:
            metrics["production"] = production
            ours, theirs = (metrics.get("holdout") or {}).get("auc"), production.get("auc")
            if ours is not None and theirs is not None:
                metrics["auc_delta_vs_production"] = ours - theirs
        model_dir = Path(state.done["model_path"])
        tracker.artifacts(model_dir, "model")
        holdout = metrics.get("holdout") or {}
        tracker.metrics(
            [
                (int(state.done.get("step", 0)), f"final_{k}", float(v))
                for k, v in holdout.items()
                if isinstance(v, int | float) and v is not None
            ]
        )
        tracker.finish("FINISHED")
        end_attempt(
            JobState.SUCCEEDED,
            reason="training finished",
            payload={"holdout": holdout, "mlflow_run_id": tracker.run_id or ""},
            model_path=_relative(model_dir),
            metrics=metrics,
            stop_requested="",
            eta_s=0.0,
        )
        return job.state
    mode = job.stop_requested or ("preempt" if signalled == "shutdown" else "")
    if code == runner.EXIT_STOPPED and mode:
        to = JobState.CANCELLED if mode == "cancel" else JobState.PREEMPTED
        why = "the node agent is shutting down" if signalled == "shutdown" else f"{mode} requested"
        tracker.finish("KILLED")
        end_attempt(
            to,
            reason=f"{why}; checkpointed at step {job.checkpoint_step}",
            payload={"checkpoint_step": job.checkpoint_step},
            stop_requested="",
        )
        return job.state
    # The job failed on its own (its code, its data, its limits): the node is not at fault and
    # keeps serving every workspace (see training.scheduler.failover._failures).
    reason = state.error or f"training child exited with {code}"
    if job.state != JobState.RUNNING:
        return job.state
    final = signalled in {"wall_time", "unsafe_output"}
    if job.attempts < job.max_attempts and not job.stop_requested and not final:
        tracker.finish("FAILED")
        end_attempt(
            JobState.PENDING,
            reason=f"{reason}; requeued (attempt {job.attempts}/{job.max_attempts}), "
            f"resumes from step {job.checkpoint_step}",
            node=None,
            assigned_gpus=[],
        )
        return job.state
    tracker.finish("FAILED")
    to = JobState.CANCELLED if job.stop_requested == "cancel" else JobState.FAILED
    end_attempt(
        to,
        reason=reason,
        stop_requested="",
    )
    return job.state
