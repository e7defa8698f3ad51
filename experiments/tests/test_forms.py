"""The experiment form, a draft's edit, the decision banner and the four-eyes approval through
Django's test client."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from experiments import services
from experiments.models import Experiment, ExperimentState, Layer
from experiments.tests.factories import click_events, make_deployment, served_in_experiment
from workspaces.exceptions import ConflictError
from workspaces.models import Role

pytestmark = pytest.mark.django_db


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _form_data(dep, versions, **extra) -> dict:
    data = {
        "key": "bigger-thumbs",
        "hypothesis": "Bigger thumbnails lift CTR.",
        "deployment": str(dep.pk),
        "treatment_versions": [str(v.pk) for v in versions],
        "layer": "ui",
        "ramp_plan": "5, 10, 20",
        "ramp_interval_hours": "12",
        "unit": "user",
        "primary_metric": "ctr",
        "guardrail_ctr": "5",
        "guardrail_rpm": "10",
        "min_units": "50",
        "sequential_method": "always_valid",
        "spending": "pocock",
    }
    data.update(extra)
    return data


def _messages(html: str) -> list[str]:
    return [
        li.split(">", 1)[1].split("</li>")[0]
        for li in html.split('<ul class="messages">', 1)[-1].split("</ul>")[0].split("<li")[1:]
    ]


def test_the_form_creates_a_draft_with_the_service(workspace, members):
    dev = browser(members[Role.DEVELOPER])
    dep, (treatment,) = make_deployment(workspace)
    url = f"/w/{workspace.slug}/experiments/new/"
    page = dev.get(url).content.decode()
    assert f'<option value="{dep.pk}">{dep.name}' in page
    assert f'value="{treatment.pk}"' in page
    assert 'data-testid="free-buckets">10000<' in page  # a new layer: every bucket is free
    refused = dev.post(url, _form_data(dep, [treatment], key="new"))  # the form's own URL
    assert (
        refused.status_code == 400 and "a word of the experiments URLs" in refused.content.decode()
    )
    response = dev.post(url, _form_data(dep, [treatment]))
    assert response.status_code == 302
    exp = Experiment.objects.for_workspace(workspace).get(key="bigger-thumbs")
    assert response["Location"] == f"/w/{workspace.slug}/experiments/bigger-thumbs/"
    assert exp.state == ExperimentState.DRAFT and exp.owner == members[Role.DEVELOPER]
    assert exp.arms == [
        {"name": "control", "version_id": dep.version_id},
        {"name": "treatment", "version_id": treatment.pk},
    ]
    assert exp.layer.name == "ui" and exp.ramp_plan == [5.0, 10.0, 20.0]
    assert exp.ramp_interval_s == 12 * 3600 and exp.min_units == 50
    assert exp.guardrails == [
        {"metric": "ctr", "max_drop": 0.05},
        {"metric": "rpm", "max_drop": 0.1},
    ]
    assert (exp.sequential_method, exp.spending) == ("always_valid", "pocock")
    detail = dev.get(response["Location"]).content.decode()
    # the flash message shows once (base.html renders it; the page no longer repeats it)
    assert detail.count("Draft bigger-thumbs created") == 1
    assert 'data-testid="edit"' in detail and 'data-verdict="not_started"' in detail


def test_a_ramp_over_the_free_buckets_is_refused_naming_them(workspace, members):
    dev_user = members[Role.DEVELOPER]
    dev = browser(dev_user)
    dep, (first, second) = make_deployment(workspace, treatments=2)
    layer = services.layer_create(actor=dev_user, workspace=workspace, name="ui", salt="forms")
    running = services.experiment_create(
        actor=dev_user,
        workspace=workspace,
        key="holds-4000",
        hypothesis="x",
        deployment=dep.name,
        treatment_versions=[first.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.1}],
        ramp_plan=[20],
        layer=layer,
    )
    running = services.experiment_submit(actor=dev_user, experiment=running)
    assert running.block_size == 4000  # 2 arms x 20%: 6000 buckets stay free
    before = Experiment.objects.for_workspace(workspace).count()
    url = f"/w/{workspace.slug}/experiments/new/"
    assert '<option value="ui">6000 buckets free' in dev.get(url).content.decode()
    response = dev.post(url, _form_data(dep, [second], ramp_plan="10, 40"))
    assert response.status_code == 400
    page = response.content.decode()
    error = page.split('data-testid="error-ramp_plan"')[1].split("</ul>")[0]
    assert "6000 free buckets" in error and "need 8000" in error and "30%" in error
    assert Experiment.objects.for_workspace(workspace).count() == before
    # the live hint (htmx) says the same before submitting
    hint = dev.get(
        f"/w/{workspace.slug}/experiments/layers/room/",
        {"layer": "ui", "treatment_versions": [second.pk], "ramp_plan": "10, 40"},
    ).content.decode()
    assert 'data-testid="free-buckets">6000<' in hint and "does not fit" in hint
    assert dev.post(url, _form_data(dep, [second], ramp_plan="10, 30")).status_code == 302


def test_viewers_get_no_form_and_an_empty_list_says_what_to_do(workspace, members):
    dep, (treatment,) = make_deployment(workspace)
    viewer = browser(members[Role.VIEWER])
    url = f"/w/{workspace.slug}/experiments/new/"
    assert viewer.get(url).status_code == 403
    assert viewer.post(url, _form_data(dep, [treatment])).status_code == 403
    assert not Experiment.objects.for_workspace(workspace).exists()
    assert not Layer.objects.for_workspace(workspace).exists()
    listing = viewer.get(f"/w/{workspace.slug}/experiments/").content.decode()
    assert "New experiment" not in listing and "A developer of this workspace" in listing
    listing = browser(members[Role.DEVELOPER]).get(f"/w/{workspace.slug}/experiments/")
    listing = listing.content.decode()
    assert "New experiment" in listing and f'href="{url}">Create one</a>' in listing


def test_a_draft_is_edited_in_the_same_form_until_submitted(workspace, members, monkeypatch):
    dev_user = members[Role.DEVELOPER]
    dev = browser(dev_user)
    dep, (first, second) = make_deployment(workspace, treatments=2)
    assert dev.post(
        f"/w/{workspace.slug}/experiments/new/", _form_data(dep, [first])
    ).status_code == (302)
    url = f"/w/{workspace.slug}/experiments/bigger-thumbs/edit/"
    page = dev.get(url).content.decode()
    assert 'value="5, 10, 20"' in page and "Bigger thumbnails lift CTR." in page
    assert 'name="key"' in page and "disabled" in page.split('name="key"')[1].split(">")[0]
    response = dev.post(
        url,
        _form_data(dep, [second], key="renamed", ramp_plan="1, 2", hypothesis="Changed."),
        follow=True,
    )
    assert response.redirect_chain == [(f"/w/{workspace.slug}/experiments/bigger-thumbs/", 302)]
    assert _messages(response.content.decode()) == ["Draft bigger-thumbs saved."]
    exp = Experiment.objects.for_workspace(workspace).get(key="bigger-thumbs")  # key is fixed
    assert exp.arms[1]["version_id"] == second.pk and exp.ramp_plan == [1.0, 2.0]
    assert exp.hypothesis == "Changed."
    # a 409 from the service (submitted meanwhile) is a page message, nothing is saved
    monkeypatch.setattr(
        services,
        "experiment_update",
        lambda **kw: (_ for _ in ()).throw(
            ConflictError("experiment is pending_review; only a draft can be edited", attr="state")
        ),
    )
    response = dev.post(url, _form_data(dep, [first]), follow=True)
    assert response.redirect_chain[-1][0] == f"/w/{workspace.slug}/experiments/bigger-thumbs/"
    assert _messages(response.content.decode()) == [
        "Not saved: experiment is pending_review; only a draft can be edited"
    ]
    monkeypatch.undo()
    services.experiment_submit(actor=dev_user, experiment=exp)
    response = dev.get(url, follow=True)
    assert "only a draft can be edited" in response.content.decode()
    assert 'data-testid="edit"' not in response.content.decode()
    assert browser(members[Role.VIEWER]).get(url).status_code == 403


def _running(workspace, members, *, key, ctr, method="always_valid", guardrails=None):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_create(
        actor=dev,
        workspace=workspace,
        key=key,
        hypothesis="x",
        deployment=dep.name,
        treatment_versions=[treatment.pk],
        guardrails=guardrails or [{"metric": "cvr", "max_drop": 0.5}],
        ramp_plan=[20],
        layer=services.layer_create(actor=dev, workspace=workspace, name=key, salt=key),
        min_units=10,
        sequential_method=method,
    )
    exp = services.experiment_submit(actor=dev, experiment=exp)
    served = served_in_experiment(workspace, dep, units=3000)
    events = click_events(served, click_rate=ctr, seed=3, event_ids=True)
    services.feedback_record(actor=None, workspace=workspace, events=events)
    services.snapshot_take(experiment=exp)
    return exp


def _verdict(client, workspace, key) -> str:
    page = client.get(f"/w/{workspace.slug}/experiments/{key}/").content.decode()
    return page.split('data-testid="verdict"')[1].split("</div>\n</div>")[0]


def test_the_banner_gives_one_decision_from_the_experiments_method(workspace, members):
    viewer = browser(members[Role.VIEWER])
    _running(workspace, members, key="wins", ctr={"control": 0.1, "treatment": 0.2})
    banner = _verdict(viewer, workspace, "wins")
    assert 'data-verdict="ship"' in banner and "Ship treatment" in banner
    assert "always-valid" in banner and "lifts CTR" in banner
    _running(
        workspace,
        members,
        key="breaks",
        ctr={"control": 0.2, "treatment": 0.1},
        guardrails=[{"metric": "ctr", "max_drop": 0.05}],
    )
    banner = _verdict(viewer, workspace, "breaks")
    assert 'data-verdict="stop"' in banner and "Stop" in banner
    assert "guardrail ctr breached by treatment" in banner
    # group-sequential at its first look: the same lift has not crossed the boundary yet
    _running(
        workspace,
        members,
        key="early",
        ctr={"control": 0.1, "treatment": 0.105},
        method="group_sequential",
    )
    banner = _verdict(viewer, workspace, "early")
    assert 'data-verdict="keep_running"' in banner and "Keep running" in banner
    assert "group-sequential boundary" in banner


def test_a_concluded_experiment_shows_what_was_decided_and_dates_read_as_dates(workspace, members):
    exp = _running(workspace, members, key="done", ctr={"control": 0.1, "treatment": 0.2})
    iso = exp.ramp_history[0]["at"]
    page = browser(members[Role.VIEWER]).get(f"/w/{workspace.slug}/experiments/done/")
    text = re.sub(r"<[^>]+>", "", page.content.decode())  # what the reader sees
    assert iso not in text and exp.started_at.strftime("%-d %b %Y, %H:%M") in text
    html = page.content.decode()
    assert 'data-testid="next-ramp"' in html
    # (promoting needs a loadable bundle; the factories' versions have none)
    services.experiment_conclude(actor=members[Role.MAINTAINER], experiment=exp, action="discard")
    banner = _verdict(browser(members[Role.VIEWER]), workspace, "done")
    assert 'data-verdict="stop"' in banner
    assert f"discarded by {members[Role.MAINTAINER].username}" in banner


def test_the_submitter_of_a_flagged_request_cannot_approve_it_in_the_browser(workspace, members):
    submitter = members[Role.MAINTAINER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_create(
        actor=submitter,
        workspace=workspace,
        key="risky",
        hypothesis="x",
        deployment=dep.name,
        treatment_versions=[treatment.pk],
        ramp_plan=[50],
    )
    services.experiment_submit(actor=submitter, experiment=exp)
    url = f"/w/{workspace.slug}/experiments/risky/"
    own = browser(submitter)
    page = own.get(url).content.decode()
    assert "Approve and start" not in page and 'data-testid="needs-other-maintainer"' in page
    response = own.post(url + "approve/", follow=True)
    (message,) = _messages(response.content.decode())
    assert "another maintainer must approve it" in message
    exp.refresh_from_db()
    assert exp.state == ExperimentState.PENDING_REVIEW
    other = browser(members[Role.ADMIN])
    assert "Approve and start" in other.get(url).content.decode()
    other.post(url + "approve/", {"note": "checked"})
    exp.refresh_from_db()
    assert exp.state == ExperimentState.RUNNING
    assert exp.review["reviewer"] == members[Role.ADMIN].username
