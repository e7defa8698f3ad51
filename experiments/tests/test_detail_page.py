"""The experiment page's times and charts through Django's test client: ramp times read as
"1 Dec 2026, 14:05 UTC" with "in 3 h" / "3 h ago" (never a raw ISO string), the traffic ramp is a
chart with axes and units, the effect and arm charts show their empty state before the first
snapshot, and the decision banner stays."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from experiments import services
from experiments.models import Experiment
from experiments.templatetags.experiment_time import relative, span_text, utc_when
from experiments.tests.factories import make_deployment
from workspaces.models import Role

pytestmark = pytest.mark.django_db
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")
STARTED = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


def test_time_filters_read_like_a_person_writes_them():
    now = datetime(2026, 12, 1, 11, 5, tzinfo=UTC)
    assert utc_when(datetime(2026, 12, 1, 14, 5, 59, tzinfo=UTC)) == "1 Dec 2026, 14:05 UTC"
    assert utc_when("2026-12-01T15:05:00+01:00") == "1 Dec 2026, 14:05 UTC"  # stored ISO
    assert utc_when("") == "" and utc_when(None) == "" and utc_when("soon") == ""
    assert relative(now + timedelta(hours=3), now) == "in 3 h"
    assert relative((now - timedelta(minutes=12)).isoformat(), now) == "12 min ago"
    assert relative(now + timedelta(minutes=90), now) == "in 1.5 h"
    assert relative(now, now) == "now"
    assert span_text(40) == "40 s" and span_text(3 * 86400) == "3 d"


@pytest.fixture
def started(workspace, members):
    """A running experiment (approved within policy) whose first ramp step is at STARTED."""
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_create(
        actor=dev,
        workspace=workspace,
        key="thumbs",
        hypothesis="Bigger thumbnails lift CTR.",
        deployment=dep.name,
        treatment_versions=[treatment.pk],
        ramp_plan=[10, 20],
        guardrails=[{"metric": "ctr", "max_drop": 0.1}],
        layer=services.layer_create(actor=dev, workspace=workspace, name="ui", salt="detail"),
    )
    exp = services.experiment_submit(actor=dev, experiment=exp)
    assert exp.state == "running", exp.review
    history = [{**exp.ramp_history[0], "at": STARTED.isoformat()}]
    Experiment.objects.for_workspace(workspace).filter(pk=exp.pk).update(ramp_history=history)
    return exp


def _chart_data(html: str, name: str) -> dict:
    script = re.search(
        rf'<script id="chart-data-{name}" type="application/json">(.*?)</script>', html, re.S
    )
    assert script, f"no data for chart {name}"
    return json.loads(script.group(1))


def _figure(html: str, testid: str) -> str:
    match = re.search(rf'<figure [^>]*data-testid="{testid}".*?</figure>', html, re.S)
    assert match, f"no chart {testid}"
    return match.group(0)


def test_ramp_times_are_human_and_the_charts_have_axes(workspace, members, started):
    page = Client()
    page.force_login(members[Role.VIEWER])
    html = page.get(f"/w/{workspace.slug}/experiments/thumbs/").content.decode()
    step = html.split('data-testid="ramp-step"')[1].split("</li>")[0]
    assert "1 Dec 2026, 09:30 UTC" in step and re.search(
        r"\((\d[\d.]* (s|min|h|d) ago|now)\)", step
    )
    following = html.split('data-testid="next-ramp"')[1].split("</li>")[0]
    assert re.search(
        r"\d{1,2} \w{3} \d{4}, \d\d:\d\d UTC</time> \(in \d[\d.]* (s|min|h|d)\)", following
    )
    # the ISO strings stay in machine-readable attributes only
    visible = re.sub(r'datetime="[^"]*"', "", html)
    visible = re.sub(r"<script[^>]*>.*?</script>", "", visible, flags=re.S)
    assert not ISO.search(visible)
    # the ramp chart: time axis and percent units; its data starts at the first step
    ramp = _figure(html, "chart-ramp")
    assert 'data-x-label="Time (UTC)"' in ramp and 'data-y-label="Traffic per arm"' in ramp
    assert 'data-units="%"' in ramp and 'data-x-time="true"' in ramp and "<figcaption>" in ramp
    data = _chart_data(html, "ramp")
    assert data["x"][0] == STARTED.timestamp()
    assert data["series"][0]["values"][0] == 10.0
    assert data["series"][1]["label"] == "Next step (planned)"
    assert data["series"][1]["values"][-1] == 20.0
    # no snapshot yet: the effect and arm charts say what will show there
    for testid in ("effect-chart", "arm-chart"):
        figure = _figure(html, testid)
        assert 'data-x-label="Time (UTC)"' in figure and "No data yet:" in figure
    assert 'data-units="%"' in _figure(html, "effect-chart")
    # the decision banner stays at the top
    assert 'data-testid="verdict"' in html and html.index('data-testid="verdict"') < html.index(
        'data-testid="ramp"'
    )
    assert "{'" not in html and "{&#x27;" not in html
