"""Tests of the benchmark harness with fake areas; the real benchmarks never run here."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from bench import harness

ENVIRONMENT_KEYS = {
    "python",
    "platform",
    "cpu_count",
    "memory_total_bytes",
    "database_vendor",
    "database_version",
    "redis_url_set",
    "redis_version",
    "broker_transport",
    "git_commit",
    "timestamp_utc",
    "command",
}

ALPHA = '''
"""Alpha: a fake area for the harness tests."""

SEEN = []


def run(ctx):
    SEEN.append(ctx)
    ctx.parameters["rounds"] = 3
    return {"lookup_p50_ms": 1.25, "writes_per_s": 12345.0, "items": 7}
'''

BROKEN = '''
"""Broken: returns something that is not a measure."""


def run(ctx):
    return {"lookup_ms": "fast"}
'''

FAILING = '''
"""Failing: raises while measuring."""


def run(ctx):
    raise RuntimeError("boom")
'''


@pytest.fixture
def areas(tmp_path, monkeypatch):
    """A package of fake areas (alpha, broken, failing) under a unique name."""
    name = f"fake_bench_areas_{uuid.uuid4().hex[:8]}"
    package = tmp_path / "pkgs" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Fake areas."""\n')
    (package / "alpha.py").write_text(ALPHA)
    (package / "broken.py").write_text(BROKEN)
    (package / "failing.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


class FakeDatabase:
    """Stands in for throwaway_database: records that it was entered and left."""

    def __init__(self):
        self.entered = 0
        self.left = 0

    @contextlib.contextmanager
    def __call__(self, workdir: Path):
        assert workdir.is_dir()
        self.entered += 1
        try:
            yield {"DATABASE_URL": "postgres://db/test_fake"}
        finally:
            self.left += 1


def run_main(argv, areas_package, tmp_path, *, known=("alpha", "beta"), database=None):
    out, err = io.StringIO(), io.StringIO()
    code = harness.main(
        argv,
        package=areas_package,
        known=known,
        results_dir=tmp_path / "results",
        database=database or FakeDatabase(),
        out=out,
        err=err,
    )
    return code, out.getvalue(), err.getvalue()


def test_an_area_writes_its_result_and_prints_a_table(db, areas, tmp_path):
    database = FakeDatabase()
    code, out, err = run_main(["--only", "alpha"], areas, tmp_path, database=database)

    assert code == 0, err
    document = json.loads((tmp_path / "results" / "alpha.json").read_text())
    assert set(document) == {"measures", "environment"}
    assert document["measures"] == {"lookup_p50_ms": 1.25, "writes_per_s": 12345.0, "items": 7}
    environment = document["environment"]
    assert set(environment) >= ENVIRONMENT_KEYS
    assert environment["command"].endswith("-m bench --only alpha")
    assert environment["parameters"] == {"rounds": 3}
    assert environment["database_vendor"] in {"sqlite", "postgresql"}
    assert isinstance(environment["redis_url_set"], bool)
    assert database.entered == database.left == 1

    lines = out.splitlines()
    assert any(line.split() == ["lookup_p50_ms", "1.25", "ms"] for line in lines)
    assert any(line.split() == ["writes_per_s", "12,345", "/s"] for line in lines)
    assert any(line.split() == ["items", "7"] for line in lines)
    assert "Alpha: a fake area for the harness tests." in out


def test_the_area_gets_a_context_pointing_at_the_throwaway_database(db, areas, tmp_path):
    run_main(["--only", "alpha"], areas, tmp_path)

    ctx = sys.modules[f"{areas}.alpha"].SEEN[-1]
    assert ctx.area == "alpha"
    assert ctx.database_env == {"DATABASE_URL": "postgres://db/test_fake"}
    assert ctx.child_env(EXTRA="1")["DATABASE_URL"] == "postgres://db/test_fake"
    assert ctx.child_env(EXTRA="1")["EXTRA"] == "1"
    assert not ctx.workdir.exists(), "the work folder is removed afterwards"


def test_a_known_area_without_a_module_says_so_and_fails(areas, tmp_path):
    code, _out, err = run_main(["--only", "beta"], areas, tmp_path)

    assert code != 0
    assert "no benchmark for area 'beta' yet" in err
    assert not (tmp_path / "results").exists()


def test_an_unknown_area_is_refused(areas, tmp_path):
    code, _out, err = run_main(["--only", "nope"], areas, tmp_path)

    assert code != 0
    assert "unknown bench area 'nope'" in err
    assert "alpha, beta" in err


def test_the_project_areas_without_modules_say_so():
    for area in harness.KNOWN_AREAS:
        if harness.area_exists(area):
            continue
        err = io.StringIO()
        assert harness.main(["--only", area], err=err, out=io.StringIO()) == 2
        assert f"no benchmark for area '{area}' yet" in err.getvalue()


def test_the_platform_area_exists_and_describes_itself(db):
    assert "platform" in harness.discover_areas()
    module = harness.load_area("platform")
    for measure in (
        "workspace_get_p50_ms",
        "workspace_get_p99_ms",
        "activity_list_p50_ms",
        "activity_list_p99_ms",
        "token_auth_overhead_ms",
        "event_write_per_s",
    ):
        assert measure in module.__doc__


def test_running_everything_runs_existing_areas_and_lists_missing_ones(db, areas, tmp_path):
    code, out, err = run_main([], areas, tmp_path, known=("alpha", "beta", "gamma"))

    # broken and failing exist too (not in `known`): they run after the known ones, and fail.
    assert code == 1
    assert "no benchmark yet for: beta, gamma" in out
    assert (tmp_path / "results" / "alpha.json").exists()
    assert "bench area 'broken' failed" in err
    assert "bench area 'failing' failed: RuntimeError: boom" in err
    assert out.index("== alpha") < out.index("== broken") < out.index("== failing")


def test_a_failing_area_writes_nothing_and_releases_its_database(db, areas, tmp_path):
    database = FakeDatabase()
    code, _out, err = run_main(["--only", "failing"], areas, tmp_path, database=database)

    assert code == 1
    assert "RuntimeError: boom" in err
    assert database.entered == database.left == 1
    assert not (tmp_path / "results" / "failing.json").exists()


def test_measures_must_be_numbers(db, areas, tmp_path):
    code, _out, err = run_main(["--only", "broken"], areas, tmp_path)

    assert code == 1
    assert "measure 'lookup_ms' is 'fast', not a number" in err


@pytest.mark.parametrize(
    "measures",
    [{}, [], {"x_ms": True}, {"x_ms": float("nan")}, {"Bad Name": 1.0}, None],
)
def test_check_measures_refuses(measures):
    with pytest.raises(harness.BenchError):
        harness.check_measures("a", measures)


@pytest.mark.parametrize(
    ("name", "unit"),
    [
        ("workspace_get_p50_ms", "ms"),
        ("event_write_per_s", "/s"),
        ("startup_s", "s"),
        ("model_size_bytes", "B"),
        ("hit_rate_pct", "%"),
        ("rows", ""),
    ],
)
def test_unit_comes_from_the_name(name, unit):
    assert harness.unit_of(name) == unit


def test_render_table_aligns_values():
    table = harness.render_table("x", {"a_ms": 0.5, "long_name_per_s": 1234.5}, "Title")
    lines = table.splitlines()
    assert lines[0] == "x: Title"
    rows = [line for line in lines if line.startswith(("a_ms", "long_name_per_s"))]
    assert rows == [f"{'a_ms':<15}  0.500  ms", "long_name_per_s  1,234  /s"]


def test_percentile_interpolates():
    values = list(range(1, 101))
    assert harness.percentile(values, 50) == pytest.approx(50.5)
    assert harness.percentile(values, 99) == pytest.approx(99.01)
    assert harness.percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError, match="no values"):
        harness.percentile([], 50)


def test_database_url_for_replaces_only_the_name():
    url = "postgres://user:pw@db.local:5432/rankops?sslmode=disable"
    assert harness._database_url_for(url, "test_rankops") == (
        "postgres://user:pw@db.local:5432/test_rankops?sslmode=disable"
    )


# ------------------------------------------------------------------------------------------
# peer_venv


class FakeRunner:
    """Records commands; "creates" the venv's python when asked to make a venv."""

    def __init__(self, fail_pip: bool = False):
        self.commands: list[list[str]] = []
        self.fail_pip = fail_pip

    def __call__(self, command, check):
        assert check is True
        self.commands.append(list(command))
        if command[1:3] == ["-m", "venv"]:
            python = Path(command[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("#!fake\n")
        elif self.fail_pip:
            raise subprocess.CalledProcessError(1, command)


REQS = ["feast==0.40.1", "pandas==2.2.3"]


def test_peer_venv_creates_the_venv_and_installs_the_pins(tmp_path):
    runner = FakeRunner()

    python = harness.peer_venv("feast", REQS, root=tmp_path, runner=runner)

    venv = tmp_path / "feast"
    assert python == venv / "bin" / "python"
    assert runner.commands == [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *REQS,
        ],
    ]
    stamp = (venv / harness.STAMP_NAME).read_text()
    assert stamp == harness.peer_stamp(REQS)
    assert "feast==0.40.1" in stamp


def test_peer_venv_does_nothing_when_the_stamp_matches(tmp_path):
    harness.peer_venv("feast", REQS, root=tmp_path, runner=FakeRunner())
    runner = FakeRunner()

    harness.peer_venv("feast", list(reversed(REQS)), root=tmp_path, runner=runner)

    assert runner.commands == []


def test_peer_venv_reinstalls_when_the_pins_change(tmp_path):
    harness.peer_venv("feast", REQS, root=tmp_path, runner=FakeRunner())
    runner = FakeRunner()
    changed = ["feast==0.41.0", "pandas==2.2.3"]

    harness.peer_venv("feast", changed, root=tmp_path, runner=runner)

    assert len(runner.commands) == 1
    assert runner.commands[0][1:4] == ["-m", "pip", "install"]
    assert runner.commands[0][-2:] == changed
    assert (tmp_path / "feast" / harness.STAMP_NAME).read_text() == harness.peer_stamp(changed)


def test_a_failed_install_leaves_no_stamp(tmp_path):
    with pytest.raises(subprocess.CalledProcessError):
        harness.peer_venv("feast", REQS, root=tmp_path, runner=FakeRunner(fail_pip=True))
    assert not (tmp_path / "feast" / harness.STAMP_NAME).exists()

    runner = FakeRunner()
    harness.peer_venv("feast", REQS, root=tmp_path, runner=runner)
    assert [command[1:4] for command in runner.commands] == [["-m", "pip", "install"]]


def test_a_second_caller_waits_for_the_build_under_way_and_installs_nothing(tmp_path, monkeypatch):
    """CI starts the Feast venv's build beside the suites; the test that needs it calls
    ``peer_venv`` while pip may still run and must wait for that build, not start a second one
    into the same folder (without the lock it finds no stamp and runs pip itself)."""
    in_pip = threading.Event()
    release = threading.Event()

    class SlowRunner(FakeRunner):
        def __call__(self, command, check):
            super().__call__(command, check)
            if command[1:3] == ["-m", "pip"]:
                in_pip.set()
                assert release.wait(timeout=60)

    builder = SlowRunner()
    first = threading.Thread(
        target=harness.peer_venv, args=("feast", REQS), kwargs={"root": tmp_path, "runner": builder}
    )
    first.start()
    assert in_pip.wait(timeout=60)
    second_runner = FakeRunner()
    answers: list[Path] = []
    second = threading.Thread(
        name="second-caller",
        target=lambda: answers.append(
            harness.peer_venv("feast", REQS, root=tmp_path, runner=second_runner)
        ),
    )
    at_lock = threading.Event()
    real_flock = harness.fcntl.flock

    def flock(fd, operation):
        if threading.current_thread() is second:
            at_lock.set()
        return real_flock(fd, operation)

    monkeypatch.setattr(harness.fcntl, "flock", flock)
    second.start()
    # The second caller has reached the lock while pip still runs for the first.
    assert at_lock.wait(timeout=60)
    release.set()
    first.join(timeout=60)
    second.join(timeout=60)

    assert answers == [tmp_path / "feast" / "bin" / "python"]
    assert second_runner.commands == []
    assert [command[1:3] for command in builder.commands] == [["-m", "venv"], ["-m", "pip"]]
    assert (tmp_path / "feast" / harness.STAMP_NAME).read_text() == harness.peer_stamp(REQS)


def test_the_stamp_is_keyed_on_python_and_requirements():
    assert harness.peer_stamp(REQS, "3.11.7") == harness.peer_stamp(REQS[::-1], "3.11.7")
    assert harness.peer_stamp(REQS, "3.11.7") != harness.peer_stamp(REQS, "3.12.1")
    assert harness.peer_stamp(REQS, "3.11.7") != harness.peer_stamp(REQS[:1], "3.11.7")


@pytest.mark.parametrize(
    ("name", "requirements"),
    [
        ("feast", ["feast"]),
        ("feast", ["feast>=0.40"]),
        ("feast", []),
        ("../escape", REQS),
        ("", REQS),
    ],
)
def test_peer_venv_refuses_unpinned_requirements_and_odd_names(tmp_path, name, requirements):
    runner = FakeRunner()
    with pytest.raises(ValueError):  # noqa: PT011 - the messages differ per case
        harness.peer_venv(name, requirements, root=tmp_path, runner=runner)
    assert runner.commands == []


def test_peer_venvs_live_in_an_ignored_folder():
    assert Path(harness.__file__).parent / ".venvs" == harness.VENVS_DIR
    gitignore = (harness.REPO_ROOT / ".gitignore").read_text()
    assert "/bench/.venvs/" in gitignore


def test_the_readme_describes_running_and_adding_areas():
    readme = (harness.BENCH_DIR / "README.md").read_text()
    assert "make bench ONLY=" in readme
    assert "peer_venv" in readme
    assert "def run(ctx" in readme
