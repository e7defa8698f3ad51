"""The example notebooks a notebook server starts with (training/notebook_examples/) run
headless with nbclient, as a user would run them, against a live server whose jobs run on a real
Celery worker: the kernel has only the environment a notebook server gives it (RANKOPS_URL,
RANKOPS_TOKEN narrowed to the workspace, RANKOPS_WORKSPACE, the client's source on the path)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from django.conf import settings
from nbclient import NotebookClient

from experiments.models import Experiment
from training.models import JobState, TrainingJob
from training.notebooks import EXAMPLES
from training.tests.workers import node_worker
from workspaces.models import Role
from workspaces.testing.factories import make_member, make_workspace, token_for

# A client of the API over HTTP: the server side of every call is tested on both backends.
pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_backend,
]


def text_of(book) -> str:
    parts = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_the_example_notebooks_run_end_to_end_against_a_live_server(
    live_server, monkeypatch, tmp_path
):
    workspace = make_workspace(slug="nb-examples")
    rival = make_workspace(slug="nb-examples-rival")
    member = make_member(workspace, Role.ADMIN)
    monkeypatch.setenv("RANKOPS_URL", live_server.url)
    monkeypatch.setenv("RANKOPS_TOKEN", token_for(member, workspaces=[workspace]))
    monkeypatch.setenv("RANKOPS_WORKSPACE", workspace.slug)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(Path(settings.BASE_DIR) / "client"))
    books = sorted(EXAMPLES.glob("*.ipynb"))
    assert [book.name for book in books] == [
        "00-start-here.ipynb",
        "01-feature-to-experiment.ipynb",
    ]
    seen = {}
    with node_worker(platform=True):
        for path in books:
            book = nbformat.read(path, as_version=4)
            NotebookClient(
                book, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
            ).execute()
            seen[path.name] = text_of(book)

    start = seen["00-start-here.ipynb"]
    assert f"workspace: {workspace.slug}" in start
    assert "another workspace: 404 not_found" in start, start
    story = seen["01-feature-to-experiment.ipynb"]
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert job.state == JobState.SUCCEEDED and f"{job.state} " in story, story[-2000:]
    experiment = Experiment.objects.for_workspace(workspace).get()
    assert f"experiment {experiment.key} {experiment.state}" in story
    assert not Experiment.objects.for_workspace(rival).exists()
