"""The sandbox user code runs in: a training child (template or entry point) holds no platform
credential, sees none of the platform's state, and writes only its own folder.

What the node agent does for every attempt of a job (``prepare``, then ``child_popen_args``):

* **Environment from an allow-list.** The child's environment is built, never copied: ``PATH``,
  locale, ``TZ``, the device and thread variables, and the names in
  ``TRAINING_CHILD_ENV_ALLOW``. ``DATABASE_URL``, ``REDIS_URL``, ``SECRET_KEY``, broker and MLflow
  URLs are never passed, whatever the worker's environment holds.
* **A private scratch folder.** ``<TRAINING_SANDBOX_ROOT>/<random>/`` (mode 0700, owned by the
  child's uid) holds copies of the job's inputs (its dataset, its entry-point script, its base
  model, the last checkpoint) and is where the child writes checkpoints and the model. The agent
  copies checkpoints and the final model out into the job's folder under ``ARTIFACT_ROOT``,
  refusing links, files the child does not own and anything over ``TRAINING_SANDBOX_MAX_BYTES``.
  The child gets no API token: it reports through its stdout to the agent, which holds the real
  credentials and writes the job's rows and MLflow run.
* **Its own uid.** When the agent runs as root, each job runs as uid
  ``TRAINING_SANDBOX_UID_BASE + job_id % TRAINING_SANDBOX_UID_SPAN`` (no passwd entry needed),
  with no supplementary groups, umask 077 and a process limit (the runner sets it on itself).
  The platform's state folders (``VAR_DIR``, ``ARTIFACT_ROOT``, the MLflow store, a SQLite
  database) are closed to other users (``harden_state_dirs``), so that uid can open neither the
  database file nor another workspace's artifacts. Under Kubernetes the agent container is root
  with only the capabilities this needs, and a NetworkPolicy lets its pod reach nothing but the
  database, Redis and DNS (platform/k8s/gpu-node-agent.yaml).

``isolation`` says which of these held for an attempt (``uid`` or ``env``: an agent that is not
root cannot change uid); the agent writes it into the job's log.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)

# Names a child may inherit from the worker (values copied as they are); everything else is
# dropped. None of these carries a credential.
BASE_ENV_ALLOW = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "LD_LIBRARY_PATH",
)
SCRATCH_INPUTS = "inputs"
ISOLATION_UID = "uid"
ISOLATION_ENV = "env"


def _setting(name: str, default):
    return getattr(settings, name, default)


def sandbox_root() -> Path:
    return Path(_setting("TRAINING_SANDBOX_ROOT", Path(settings.VAR_DIR) / "sandbox" / "jobs"))


def job_uid(job_id: int) -> int:
    base = int(_setting("TRAINING_SANDBOX_UID_BASE", 200_000))
    span = int(_setting("TRAINING_SANDBOX_UID_SPAN", 100_000))
    return base + int(job_id) % span


def _closed_mode(mode: int, is_dir: bool) -> int:
    return (stat.S_IMODE(mode) & 0o700) | (0o700 if is_dir else 0o600)


def harden_state_dirs() -> list[str]:
    """Close the platform's state to other users: ``VAR_DIR`` may be traversed (the sandbox
    root lives in it) but not listed, and every entry in it but the sandbox root is owner-only;
    ``ARTIFACT_ROOT``, the MLflow store and a SQLite database elsewhere are owner-only too.
    Returns the paths whose mode changed. Only paths this process owns are touched."""
    changed: list[str] = []
    var_dir = Path(settings.VAR_DIR)
    root = sandbox_root()

    def close(path: Path, mode: int | None = None) -> None:
        try:
            info = path.lstat()
        except OSError:
            return
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
            return
        is_dir = stat.S_ISDIR(info.st_mode)
        wanted = mode if mode is not None else _closed_mode(info.st_mode, is_dir)
        if stat.S_IMODE(info.st_mode) != wanted:
            os.chmod(path, wanted)
            changed.append(str(path))

    if var_dir.is_dir():
        close(var_dir, 0o711)
        for entry in var_dir.iterdir():
            if root.resolve().is_relative_to(entry.resolve()):
                continue  # the sandbox root's own folder stays traversable
            close(entry)
    others = [Path(settings.ARTIFACT_ROOT)]
    mlflow_root = str(_setting("MLFLOW_ARTIFACT_ROOT", ""))
    if mlflow_root and "://" not in mlflow_root:
        others.append(Path(mlflow_root))
    tracking = str(_setting("MLFLOW_TRACKING_URI", ""))
    if tracking.startswith("sqlite:///"):
        others.append(Path(tracking[len("sqlite:///") :]).parent)
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        for name in (database["NAME"], (database.get("TEST") or {}).get("NAME")):
            if name and str(name) != ":memory:" and "mode=memory" not in str(name):
                others.append(Path(name))
    for path in others:
        if root.resolve().is_relative_to(path.resolve()):
            continue  # never close the sandbox root's own parents
        close(path)
    return changed


@cache
def uid_switch_possible() -> tuple[bool, str]:
    """Whether children can run under their own uid here, and why not when they cannot.

    The agent must be root, and the interpreter must be reachable by an unprivileged user (a
    Python under a home folder of mode 0700 is not; ``chmod o+x`` on that folder fixes it).
    Probed once per process by starting the interpreter as a sandbox uid."""
    if not _setting("TRAINING_SANDBOX_UID", True):
        return False, "TRAINING_SANDBOX_UID is off"
    if os.geteuid() != 0:
        return False, "the node agent is not root, so children keep its uid"
    uid = job_uid(0)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import numpy, training.runner"],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _code_path()},
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"the interpreter cannot start as uid {uid}: {exc}"
    if probe.returncode != 0:
        tail = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return False, f"the interpreter cannot run as uid {uid}: {tail[0][:300]}"
    return True, ""


def _code_path() -> str:
    return str(Path(settings.BASE_DIR))


@dataclass
class Scratch:
    """One attempt's private folder and who the child runs as."""

    path: Path
    uid: int | None
    isolation: str
    why_not_uid: str = ""

    @property
    def inputs(self) -> Path:
        return self.path / SCRATCH_INPUTS

    def own(self, path: Path) -> None:
        """Give a staged file or folder to the child's uid (read-write for it alone)."""
        if self.uid is None:
            return
        for current in [path, *(path.rglob("*") if path.is_dir() else [])]:
            os.lchown(current, self.uid, self.uid)

    def stage_file(self, source: Path, name: str) -> Path:
        target = self.inputs / name
        shutil.copyfile(source, target)
        self.own(target)
        return target

    def stage_tree(self, source: Path, name: str) -> Path:
        target = self.inputs / name
        shutil.copytree(source, target, symlinks=False)
        self.own(target)
        return target

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _new_scratch(prefix: str, uid: int, *, exact: bool = False) -> Scratch:
    root = sandbox_root()
    root.mkdir(parents=True, exist_ok=True)
    info = root.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        raise PermissionError(f"the sandbox root {root} must be a folder this agent owns")
    var_dir = Path(settings.VAR_DIR).resolve()
    for folder in [root, *root.parents]:
        if folder.resolve() == var_dir or not folder.resolve().is_relative_to(var_dir):
            break
        os.chmod(folder, 0o711)  # noqa: S103 - the children traverse it; nobody lists it
    harden_state_dirs()
    possible, why = uid_switch_possible()
    path = root / (prefix if exact else f"{prefix}-{secrets.token_hex(12)}")
    path.mkdir(mode=0o700)
    (path / SCRATCH_INPUTS).mkdir(mode=0o700)
    (path / "tmp").mkdir(mode=0o700)
    scratch = Scratch(
        path=path,
        uid=uid if possible else None,
        isolation=ISOLATION_UID if possible else ISOLATION_ENV,
        why_not_uid=why,
    )
    scratch.own(path)
    return scratch


def prepare(job_id: int) -> Scratch:
    """A fresh scratch folder for one attempt of ``job_id`` (the sandbox root made if needed)."""
    return _new_scratch(f"job-{int(job_id)}", job_uid(job_id))


def server_uid(owner_id: int) -> int:
    """Model servers run as uids of their own, above every job's."""
    base = int(_setting("TRAINING_SANDBOX_UID_BASE", 200_000))
    span = int(_setting("TRAINING_SANDBOX_UID_SPAN", 100_000))
    return base + span + int(owner_id) % span


def prepare_server(bundle: Path, *, owner_id: int) -> tuple[Scratch, Path]:
    """A private folder holding a copy of ``bundle`` for a model-server process (a release
    gate's sandbox run, a local deployment's replica): the server loads user artifacts under
    the same rules as a training child. Returns the folder and the staged bundle's path."""
    scratch = _new_scratch(f"server-{int(owner_id)}", server_uid(owner_id))
    try:
        return scratch, scratch.stage_tree(bundle, "bundle")
    except BaseException:
        scratch.remove()
        raise


def notebook_uid(workspace_id: int, user_id: int) -> int:
    """Notebook servers run as uids of their own, above every model server's: one per user and
    workspace, so a user's notebooks in one workspace cannot read those in another."""
    base = int(_setting("TRAINING_SANDBOX_UID_BASE", 200_000))
    span = int(_setting("TRAINING_SANDBOX_UID_SPAN", 100_000))
    return base + 2 * span + (int(user_id) * 7919 + int(workspace_id)) % span


def prepare_notebook(workspace_id: int, user_id: int) -> Scratch:
    """The lasting folder of a user's notebooks in one workspace (``notebook-w<ws>-u<user>``
    under the sandbox root, made on first use and kept across servers so that saved work stays),
    owned by the notebook's uid and closed to everyone else."""
    uid = notebook_uid(workspace_id, user_id)
    name = f"notebook-w{int(workspace_id)}-u{int(user_id)}"
    path = sandbox_root() / name
    if not path.is_dir():
        scratch = _new_scratch(name, uid, exact=True)
    else:
        harden_state_dirs()
        possible, why = uid_switch_possible()
        scratch = Scratch(
            path=path,
            uid=uid if possible else None,
            isolation=ISOLATION_UID if possible else ISOLATION_ENV,
            why_not_uid=why,
        )
    (path / "tmp").mkdir(mode=0o700, exist_ok=True)
    scratch.own(path / "tmp")
    return scratch


def server_popen_args(scratch: Scratch) -> dict:
    """``subprocess`` keywords for a model server: its own uid, folder and allow-listed
    environment (no database, cache or broker URL, no secret key)."""
    env = child_environment(scratch, gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""), threads=1)
    env.pop("RANKOPS_AGENT_PID", None)
    return {**child_popen_args(scratch), "env": env}


def child_environment(scratch: Scratch, *, gpus: str, threads: int) -> dict[str, str]:
    """The child's whole environment: the allow-list, its devices and its own folders."""
    allowed = set(BASE_ENV_ALLOW) | set(_setting("TRAINING_CHILD_ENV_ALLOW", ()))
    env = {name: os.environ[name] for name in sorted(allowed) if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": gpus,
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": _code_path(),
            "PYTHONNOUSERSITE": "1",
            "HOME": str(scratch.path),
            "TMPDIR": str(scratch.path / "tmp"),
            "XDG_CACHE_HOME": str(scratch.path / "tmp"),
            "TORCHINDUCTOR_CACHE_DIR": str(scratch.path / "tmp" / "inductor"),
            "MPLCONFIGDIR": str(scratch.path / "tmp"),
            "OMP_NUM_THREADS": str(max(1, threads)),
            "RANKOPS_AGENT_PID": str(os.getpid()),
            "RANKOPS_SANDBOX": scratch.isolation,
            # The runner lowers its own process limit to this before it imports user code
            # (the uid is the job's own, so the count is the job's).
            "RANKOPS_MAX_PROCESSES": str(int(_setting("TRAINING_SANDBOX_MAX_PROCESSES", 512))),
        }
    )
    return env


def child_popen_args(scratch: Scratch) -> dict:
    """``subprocess.Popen`` keywords that start the child as its own user in its own folder."""
    args: dict = {"cwd": str(scratch.path), "umask": 0o077}
    if scratch.uid is not None:
        args.update(user=scratch.uid, group=scratch.uid, extra_groups=[])
    return args


class UnsafeOutput(Exception):
    """A file the child left that the agent refuses to take (a link, not its own, too large)."""


def _check_regular(path: Path, scratch: Scratch, budget: list[int]) -> os.stat_result:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise UnsafeOutput(f"{path.name} is not a regular file")
    if scratch.uid is not None and info.st_uid != scratch.uid:
        raise UnsafeOutput(f"{path.name} is not the child's own file")
    if info.st_nlink > 1:
        raise UnsafeOutput(f"{path.name} has other links")
    budget[0] -= info.st_size
    if budget[0] < 0:
        raise UnsafeOutput("the child's output is larger than TRAINING_SANDBOX_MAX_BYTES")
    return info


def _copy_regular(source: Path, target: Path) -> None:
    """Copy without following a link the child may have swapped in after the check."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(source, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeOutput(f"{source.name} is not a regular file")
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        with os.fdopen(os.dup(fd), "rb") as reader, open(tmp, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1024 * 1024)
        os.replace(tmp, target)
    finally:
        os.close(fd)


def collect_file(scratch: Scratch, relative: str, target: Path) -> Path:
    """Copy one regular file the child wrote (``relative`` to its folder) to ``target``."""
    source = scratch.path / relative
    budget = [int(_setting("TRAINING_SANDBOX_MAX_BYTES", 8 * 1024**3))]
    _check_regular(source, scratch, budget)
    target.parent.mkdir(parents=True, exist_ok=True)
    _copy_regular(source, target)
    return target


def collect_tree(scratch: Scratch, relative: str, target: Path) -> Path:
    """Copy a folder the child wrote (regular files and folders only) to ``target``, whole or
    not at all."""
    source = scratch.path / relative
    info = source.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeOutput(f"{relative} is not a folder")
    budget = [int(_setting("TRAINING_SANDBOX_MAX_BYTES", 8 * 1024**3))]
    staging = target.with_name(f".{target.name}.incoming-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for directory, folders, files in os.walk(source, followlinks=False):
            here = Path(directory)
            out = staging / here.relative_to(source)
            for name in folders:
                child = here / name
                if child.is_symlink():
                    raise UnsafeOutput(f"{name} is a link")
                (out / name).mkdir()
            for name in files:
                _check_regular(here / name, scratch, budget)
                _copy_regular(here / name, out / name)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
