"""Data-parallel training: ``workers`` ranks of the training child, on one node or several.

A job with ``workers: N`` (N > 1) trains with N processes. The child the agent starts is rank 0:
it opens a c10d ``TCPStore`` on the loopback (the rendezvous, as torchrun's), writes the job's
spec beside its work folder and starts ranks 1..N-1 as ``python -m training.runner --rank r``
(same interpreter, environment and sandbox). Every rank joins the process group (``gloo`` on the
CPU; ``nccl`` on CUDA, one rank per visible GPU: a job given N GPUs trains on all N, and a gang
placed on one node sees every worker's GPUs), loads the data and the
checkpoint, and trains on its share of every batch: the batch ``data.BatchOrder`` fixes for the
step, rows ``rank::N`` of it (the step still fixes the data position, so resume is exact).

Gradients are averaged over the ranks after each backward pass: one ``all_reduce`` of all the
gradients, which live in one flat buffer (``GradientBuffer``, ``synchronise``). That is what
``DistributedDataParallel`` does (its buckets, without the overlap with backward); the wrapper
itself is not used because templates and entry points may train through their own
``training_loss`` method, which bypasses DDP's forward hooks and would leave the gradients
unsynchronised. Its overlap does not pay here either: the wrapper (gradients as bucket views,
25 MB, 20 kB and 5 kB buckets, so one to five collectives overlapped with backward) trained the
training bench's 2-rank job at 554k-686k samples/s against 678k-760k for this one collective,
same machine, same session. On two busy CPU ranks a gloo ``all_reduce`` costs the same ~2.5 ms
for 16 floats as for 12,000 (latency, not bandwidth), so every extra collective costs a step
that much. With equal shards the averaged gradient is the full batch's, so N ranks train the
same model as one process (``tests/test_distributed.py``). While the collective is in flight a
rank reads the next step's rows (``synchronise(during=...)``, ``_reduce``).

Rank 0 alone reports (progress, with the loss summed over every rank's rows; metrics),
validates, decides early stopping, writes checkpoints and the model; its decisions (stop
requested, stopped early) reach the others in the same collective as the gradients. A rank
that dies breaks the next collective: the others fail, rank 0 reports the error and exits
non-zero, and the agent's retry (``max_attempts``) resumes every rank from the last checkpoint.

**Over several nodes** (a gang the scheduler placed on more than one node): the spec's
``local_ranks`` are the ranks on rank 0's node (0 .. local_ranks - 1, started by rank 0 as above)
and ``rendezvous_host`` is that node's address (``settings.NODE_ADDRESS``). Rank 0 opens the
store (it listens on every interface) and, before it waits for the group, emits a
``rendezvous`` event (the store's address, the world, the first remote rank). Its node agent
hands the remaining ranks to the agents of the gang's other nodes
(``training.agent.dispatch_ranks`` -> ``training.tasks.run_ranks`` on each node's queue), which
stage the same inputs and checkpoint and start their ranks against that store
(``training.agent.execute_ranks``). Every rank checks that it resumes from rank 0's step
(``check_same_step``). A remote rank that dies breaks the collectives exactly as a local one
does: rank 0 fails, the job is requeued, and the next attempt's rendezvous starts every rank
again from the checkpoint; a remote agent stops its ranks as soon as the attempt it started them
for is over (the attempt number is the fencing token).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

RANK_ENV = "RANKOPS_DDP_RANK"
WORLD_ENV = "RANKOPS_DDP_WORLD"
STORE_ENV = "RANKOPS_DDP_STORE"  # host:port of rank 0's TCPStore
SPEC_FILE = "ddp_spec.json"
TIMEOUT = timedelta(seconds=120)


@dataclass
class Group:
    """This process's place in the job's ranks (``rank`` 0 of ``world`` 1 when alone)."""

    rank: int = 0
    world: int = 1
    backend: str = ""
    children: list[subprocess.Popen] = field(default_factory=list)
    store: Any = None

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


_current: list[Group] = []  # this process's group, for ``abandon_current``
_joined: list[bool] = []  # this process has been a rank of a group


def joined() -> bool:
    """Whether this process has joined a process group (``runner.main`` then exits without the
    interpreter's teardown)."""
    return bool(_joined)


def gang_of(job) -> list[dict[str, Any]]:
    """The scheduler's gang of ``job`` (one entry per worker: its node, its GPUs); empty when
    the job was placed whole on one node."""
    return list(getattr(getattr(job, "scheduling", None), "gang_nodes", None) or [])


def local_workers(job) -> int:
    """The data-parallel ranks rank 0's node runs: every worker of a gang placed there alone;
    of a gang spread over several nodes, that node's (the others' run on their own nodes:
    ``dispatch_ranks``)."""
    gang = gang_of(job)
    if not gang:
        return max(job.workers or 1, 1)
    return max(sum(1 for w in gang if int(w.get("node", 0)) == job.node_id), 1)


def remote_ranks(job, first: int) -> list[tuple[int, list[int], list[int]]]:
    """The ranks from ``first`` on, by node: ``(node id, ranks, GPU indices)`` for each other
    node of the gang, in the gang's order (one rank per worker placed there)."""
    by_node: dict[int, tuple[list[int], list[int]]] = {}
    rank = first
    for worker in gang_of(job):
        node = int(worker.get("node", 0))
        if node == job.node_id:
            continue
        ranks, gpus = by_node.setdefault(node, ([], []))
        ranks.append(rank)
        gpus.extend(int(g) for g, _ in worker.get("gpus") or [])
        rank += 1
    return [(node, ranks, gpus) for node, (ranks, gpus) in by_node.items()]


def rank_layout(job) -> list[dict[str, Any]]:
    """Where each rank of ``job`` runs, rank by rank: ``{"rank", "node", "gpus"}`` (the node's
    id; the GPU indices of a gang's worker), for the job page."""
    gang = gang_of(job)
    if not gang:
        gpus = [int(g.get("index", 0)) for g in job.assigned_gpus or []]
        return [{"rank": r, "node": job.node_id, "gpus": gpus} for r in range(job.workers or 1)]
    here = [w for w in gang if int(w.get("node", 0)) == job.node_id]
    rows = [
        {"rank": r, "node": job.node_id, "gpus": [int(g) for g, _ in w.get("gpus") or []]}
        for r, w in enumerate(here)
    ]
    rank = len(rows)
    for worker in gang:
        if int(worker.get("node", 0)) != job.node_id:
            gpus = [int(g) for g, _ in worker.get("gpus") or []]
            rows.append({"rank": rank, "node": int(worker["node"]), "gpus": gpus})
            rank += 1
    return rows


def world_of(job, device=None) -> int:
    """How many ranks train ``job``: its ``workers``, and on CUDA at least one per visible GPU
    (a job given N GPUs on its node trains on all N)."""
    workers = max(int(getattr(job, "workers", 1) or 1), 1)
    if 0 < int(getattr(job, "local_ranks", 0) or 0) < workers:
        return workers  # spread over nodes: the gang's workers are the ranks
    if device is not None and device.type == "cuda":
        import torch

        return ranks_for(workers, torch.cuda.device_count())
    return workers


def ranks_for(workers: int, visible_gpus: int) -> int:
    return max(workers, visible_gpus, 1)


def start(job, *, device, emit=None) -> Group:
    """Join (or, as rank 0, open and populate) the job's process group; ``Group()`` alone.
    Rank 0 of a job spread over nodes announces the rendezvous through ``emit`` (an
    ``Emitter``) before it waits for the other nodes' ranks."""
    world = world_of(job, device)
    if world == 1:
        return Group()
    import torch.distributed as dist

    rank = int(os.environ.get(RANK_ENV, "0"))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if rank == 0:
        from torch.distributed import TCPStore

        local = int(getattr(job, "local_ranks", 0) or 0)
        local = local if 0 < local < world else world
        host = str(getattr(job, "rendezvous_host", "") or "127.0.0.1") if local < world else ""
        store = TCPStore(
            host or "127.0.0.1", 0, world, True, timeout=TIMEOUT, wait_for_workers=False
        )
        spec = Path(job.work_dir) / SPEC_FILE
        spec.write_text(replace(job, workers=world).to_json())
        env = {
            **os.environ,
            WORLD_ENV: str(world),
            STORE_ENV: f"127.0.0.1:{store.port}",
            "RANKOPS_AGENT_PID": str(os.getpid()),  # ranks stop when rank 0 dies
        }
        children = [
            subprocess.Popen(  # noqa: S603 - this interpreter, this module, a spec we wrote
                [sys.executable, "-m", "training.runner", "--rank", str(r), str(spec)],
                env={**env, RANK_ENV: str(r)},
                stdout=subprocess.DEVNULL,  # only rank 0 reports
            )
            for r in range(1, local)
        ]
        if local < world:
            if emit is None:
                raise RuntimeError("ranks on other nodes need an agent to start them")
            emit("rendezvous", store=f"{host}:{store.port}", world=world, first_remote_rank=local)
    else:
        from torch.distributed import TCPStore

        host, port = os.environ[STORE_ENV].rsplit(":", 1)
        store = TCPStore(host, int(port), world, False, timeout=TIMEOUT)
        children = []
    group = Group(rank=rank, world=world, backend=backend, children=children, store=store)
    _current.append(group)
    _joined.append(True)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    return group


def check_same_step(group: Group, step: int) -> None:
    """Every rank resumes from the same step (rank 0's checkpoint), or the attempt fails: a rank
    on another node that staged an older checkpoint would train a different model."""
    if not group.active:
        return
    import torch
    import torch.distributed as dist

    low = torch.tensor([float(step)])
    high = torch.tensor([float(step)])
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if low.item() != high.item():
        raise RuntimeError(
            f"the ranks resume from different steps ({int(low.item())} to {int(high.item())}): "
            "a rank staged another checkpoint"
        )


def shard(group: Group, index):
    """This rank's rows of a batch."""
    return index[group.rank :: group.world] if group.active else index


# Rank 0's decisions and the step's loss ride in the gradients' collective: four numbers after
# the gradients in the same buffer.
EXTRA = 4


@dataclass
class GradientBuffer:
    """Every trainable parameter's gradient as a view into one flat tensor, with ``EXTRA`` slots
    after them: backward accumulates into it, the collective reduces it in place and the optimizer
    reads the views, as ``DistributedDataParallel``'s ``gradient_as_bucket_view`` does: no copy of
    the gradients into a new tensor and back each step (two passes over every gradient and two
    allocations, which grow with the embedding tables). On the training bench's demo model (12k
    parameters) the difference is within the noise: scaling efficiency 0.811 (rounds 0.80-0.83)
    against 0.806 (0.72-0.82) with the copies, same machine, 3 rounds each."""

    flat: Any
    size: int  # the gradients' share of ``flat``

    def zero(self) -> None:
        self.flat.zero_()


def gradient_buffer(group: Group, model) -> GradientBuffer | None:
    """The model's gradients laid into one flat buffer (``GradientBuffer``) for a data-parallel
    run; None alone or when the parameters mix dtypes or devices (``synchronise`` then copies)."""
    if not group.active:
        return None
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params or len({(p.dtype, p.device) for p in params}) > 1:
        return None
    size = sum(p.numel() for p in params)
    flat = torch.zeros(size + EXTRA, dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return GradientBuffer(flat=flat, size=size)


@dataclass
class Sync:
    """What one step's collective tells every rank."""

    stop: bool  # rank 0 was asked to stop (checkpoint and exit)
    stopped_early: bool  # rank 0's early stopping ended the run
    loss_sum: float  # the step's loss summed over every rank's rows
    rows: int  # every rank's rows
    during: Any = None  # what ``during`` answered, run while the collective was in flight


def synchronise(
    group: Group,
    model,
    *,
    stop: bool,
    stopped_early: bool,
    loss_sum: float,
    rows: int,
    buffer: GradientBuffer | None = None,
    during: Callable[[], Any] | None = None,
) -> Sync:
    """One ``all_reduce`` per step: every parameter's gradient replaced by its mean over the
    ranks, with rank 0's decisions and the step's loss riding along (four more numbers). Two
    collectives a step (a broadcast for the decisions, then the gradients) halved the 2-rank
    throughput of the demo job, whose steps take about 2 ms. With a ``buffer`` (the runner's
    case) the gradients are reduced where backward left them; without one they are copied into
    a flat tensor and back."""
    import torch

    leader = group.rank == 0
    extra = [float(stop and leader), float(stopped_early and leader), loss_sum, float(rows)]
    if buffer is not None:
        flat, size = buffer.flat, buffer.size
        flat[size:] = torch.tensor(extra, dtype=flat.dtype)
        answer = _reduce(flat, during)
        flat[:size].mul_(1.0 / group.world)
        tail = flat[size:].tolist()
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat(
            [g.reshape(-1) for g in grads]
            + [
                torch.tensor(
                    extra,
                    dtype=grads[0].dtype if grads else torch.float32,
                    device=grads[0].device if grads else None,
                )
            ]
        )
        answer = _reduce(flat, during)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = (flat[offset : offset + n] / group.world).view_as(p).clone()
            offset += n
        tail = flat[offset:].tolist()
    return Sync(
        stop=tail[0] > 0,
        stopped_early=tail[1] > 0,
        loss_sum=tail[2],
        rows=round(tail[3]),
        during=answer,
    )


def _reduce(flat, during: Callable[[], Any] | None) -> Any:
    """``all_reduce`` of ``flat`` in place; ``during()`` (the runner: the next step's rows,
    which no gradient changes) runs while the collective is in flight, and its answer is
    returned. A rank waits for the collective mostly while the other is woken (about 2.3 ms a
    step on two busy vCPUs, against 0.5 ms back to back), so the rows' gather (1.7 ms of the
    2-rank bench job's 24 ms step) fits in that wait. Measured on the training bench's job
    (global batch 16,384, 6 interleaved pairs of runs, twice): 689k samples/s against 587k
    with the gather after the collective, and 634k against 581k for the code before it; the
    same AUC to the last digit."""
    import torch.distributed as dist

    if during is None:
        dist.all_reduce(flat)
        return None
    work = dist.all_reduce(flat, async_op=True)
    try:
        answer = during()
    finally:
        work.wait()
    return answer


def finish(group: Group) -> int:
    """Leave the group; rank 0 waits for the other ranks and answers the first failure's code
    (0 when every rank ended cleanly)."""
    if not group.active:
        return 0
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    codes = [child.wait() for child in group.children]
    group.store = None  # the rendezvous closes once every rank has left
    if group in _current:
        _current.remove(group)
    return next((code for code in codes if code), 0)


def abandon(group: Group) -> None:
    """Rank 0 failed: the other ranks are stopped (they would wait on a collective) and this
    process leaves the group."""
    import torch.distributed as dist

    for child in group.children:
        if child.poll() is None:
            child.kill()
            child.wait()
    if dist.is_initialized():
        dist.destroy_process_group()
    group.store = None


def abandon_current() -> None:
    """``abandon`` this process's group, if it has one (the runner's error path)."""
    while _current:
        abandon(_current.pop())
