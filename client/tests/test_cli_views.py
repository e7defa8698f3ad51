"""What the CLI prints for people, from the server's real answers: an experiment's status with
its analysis, and a lineage graph. Their answers are free-form objects in the schema, so these
renderings are checked against what the API returns (``rankops.views``, loaded from the
repository: the platform's virtualenv has no httpx)."""

from __future__ import annotations

import re

import pytest

from experiments.tests.factories import (
    click_events,
    experiment_request,
    make_deployment,
    served_in_experiment,
)
from lineage.tests.helpers import build_scene
from workspaces.models import Role

pytestmark = pytest.mark.django_db
WS = "/api/v1/workspaces/{}"


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


def test_experiment_status_shows_each_effect_with_its_interval(
    workspace, members, client_for, client_module
):
    views = client_module("views")
    dev = client_for(members[Role.DEVELOPER])
    base = WS.format(workspace.slug)
    dep, (treatment,) = make_deployment(workspace)
    created = dev.post(
        f"{base}/experiments/", experiment_request("cli-ab", dep, [treatment]), format="json"
    )
    assert created.status_code == 201, created.json()
    assert dev.post(f"{base}/experiments/cli-ab/submit/").json()["state"] == "running"
    empty = views.experiment_status(
        dev.get(f"{base}/experiments/cli-ab/").json(),
        dev.get(f"{base}/experiments/cli-ab/analysis/").json(),
    )
    print(empty)
    # No units yet: each effect says why it has no estimate, and shows no made-up numbers.
    assert re.search(r"^treatment\s+ctr \(primary\)\s+not enough units$", empty, re.M)
    assert "%" not in empty.split("intervals)")[1]

    # The treatment clicks half as often as control: a significant drop past the guardrail.
    served = served_in_experiment(workspace, dep, units=1500)
    events = click_events(
        served,
        click_rate={"control": 0.2, "treatment": 0.1},
        seed=5,
        conversions=0,
        revenue=0.25,
    )
    fed = dev.post(
        f"{base}/feedback/", {"events": events}, format="json", HTTP_IDEMPOTENCY_KEY="cli-1"
    )
    assert fed.status_code == 200, fed.json()
    experiment = dev.get(f"{base}/experiments/cli-ab/").json()
    analysis = dev.get(f"{base}/experiments/cli-ab/analysis/").json()
    text = views.experiment_status(experiment, analysis)
    print(text)  # shown when an assertion below fails

    assert re.search(r"^state\s+running$", text, re.M)
    units = {name: arm["units"] for name, arm in analysis["arms"].items()}
    for name, count in units.items():
        assert re.search(rf"^{name}\s+{count}\s", text, re.M), name
    # Each treatment metric: its relative lift and interval in percent, as the analysis says.
    ctr = analysis["effects"]["treatment"]["ctr"]["relative"]
    lift = f"{100 * ctr['estimate']:+.2f}%"
    low, high = (f"{100 * ctr[k]:+.2f}%" for k in ("ci_low", "ci_high"))
    row = next(line for line in text.splitlines() if line.startswith("treatment  ctr (primary)"))
    assert lift in row and f"[{low}, {high}]" in row and "True" in row
    assert ctr["estimate"] < 0 and ctr["significant"] is True
    assert "95% intervals" in text
    assert "Sample ratio: ok" in text
    # The guardrail failed: the drop is named with its limit.
    assert analysis["guardrails"], analysis["guardrails"]
    assert "Guardrails: FAILED" in text
    assert re.search(r"^treatment\s+ctr\s+-\d+\.\d\d%\s+-10\.00%$", text, re.M)


def test_a_lineage_graph_prints_its_nodes_and_edges(workspace, members, client_for, client_module):
    views = client_module("views")
    scene = build_scene(workspace, members[Role.DEVELOPER])
    viewer = client_for(members[Role.VIEWER])
    model = f"model_version:{scene['model']}"
    graph = viewer.get(
        f"{WS.format(workspace.slug)}/lineage/", {"node": model, "direction": "both", "depth": 3}
    ).json()
    text = views.lineage(graph)
    print(text)

    lines = text.splitlines()
    for node in graph["nodes"]:
        assert any(line.startswith(node["key"] + " ") for line in lines), node["key"]
    assert len(graph["edges"]) > 3
    for edge in graph["edges"]:
        assert f"{edge['src']} -> {edge['dst']}  {edge['type']}" in lines
    deployment = f"deployment:{scene['deployment']}"
    assert f"{model} -> {deployment}  deployed_as" in lines
    assert f"training_job:{scene['job']} -> {model}  produces" in lines
    assert "None" not in text


def test_table_cells_are_read_by_people(client_module):
    views = client_module("views")
    row = {"name": "m", "rate": 0.04965857031722707, "aliases": {"production": 1}, "on": True}
    text = views.table([row], list(row))
    assert text.splitlines()[1].split() == ["m", "0.0496586", "production=1", "True"]
    assert views.table([]) == "(none)"
    # Cells are clipped to 40 characters, but the last column runs on.
    long = {"name": "x" * 60, "allowed": "a whole number from 1 to 1000 (the work is split)"}
    _, line = views.table([long], list(long)).splitlines()
    assert line.startswith("x" * 39 + "…") and line.endswith("(the work is split)")
