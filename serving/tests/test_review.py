"""Blind side-by-side human review (``serving.review``): its statistics on hand-built judgements
with known answers, the review's life on two tiny language-model versions (generation on the
task, the side assignment, judgements mapped back to versions), the API's answers to bad input,
other workspaces and non-reviewers, and the release policy on ``deployment_release``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from django.core.exceptions import PermissionDenied, ValidationError
from sklearn.metrics import cohen_kappa_score

from config.celery import app as celery_app
from curation.services import record_set_upload
from serving import review as reviews
from serving.models import (
    Deployment,
    ModelVersion,
    PairwiseItem,
    PairwiseJudgement,
    PairwiseReview,
    RegisteredModel,
    ReviewStatus,
)
from training.bundle import SPEC_FILE, BundleSpec
from training.tests.test_lm_lora import instruction_rows, save_tiny_model
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member

Z95 = 1.959963984540054


# ---------------------------------------------------------------------------------------------
# Helpers the browser test shares


def save_adapter(base: Path, folder: Path, seed: int) -> Path:
    """A LoRA adapter on ``base`` with random (not zero) weights from ``seed``, saved as
    ``training.lm`` saves one, with its tokenizer and bundle spec: no training needed, and two
    seeds answer differently."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True)
    config = LoraConfig(
        r=4,
        lora_alpha=16,
        target_modules=["c_attn"],
        fan_in_fan_out=True,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    adapted = get_peft_model(model, config)
    adapted.peft_config["default"].base_model_name_or_path = str(base)
    folder.mkdir(parents=True, exist_ok=True)
    adapted.save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(base), local_files_only=True).save_pretrained(str(folder))
    spec = BundleSpec(
        template="lm_lora", features=[], hparams={}, label="", extra={"base_model_path": str(base)}
    )
    (folder / SPEC_FILE).write_text(json.dumps(spec.to_json()))
    return folder


def make_lm_versions(workspace, settings, tmp_path, *, name: str = "chatlm", count: int = 2):
    """``count`` registered language-model versions of model ``name`` (distinct adapters of one
    tiny local GPT-2), artifacts and the base model folder under ``tmp_path``."""
    from serving.registry import model_version_register

    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.TRAINING_BASE_MODEL_ROOTS = [tmp_path / "base_models"]
    base = tmp_path / "base_models" / "tiny-gpt2"
    if not base.is_dir():
        save_tiny_model(base, instruction_rows())
    versions = []
    for seed in range(count):
        folder = save_adapter(
            base, Path(settings.ARTIFACT_ROOT) / "jobs" / f"{name}-{seed}" / "model", seed
        )
        versions.append(
            model_version_register(actor=None, workspace=workspace, name=name, bundle_path=folder)
        )
    return versions


def upload_prompts(workspace, actor, *, name: str = "prompts", rows: int = 30):
    body = "".join(json.dumps(r) + "\n" for r in instruction_rows(rows, seed=3)).encode()
    return record_set_upload(actor=actor, workspace=workspace, name=name, content=body, fmt="jsonl")


def wilson(score: float, n: int) -> tuple[float, float]:
    """The Wilson score interval, written out (the test's own oracle)."""
    p = score / n
    denominator = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denominator
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denominator
    return centre - half, centre + half


@pytest.fixture
def eager_celery():
    before = (celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates)
    celery_app.conf.task_always_eager = celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = before


# ---------------------------------------------------------------------------------------------
# Statistics with known answers


def test_win_rate_interval_counts_and_agreement_on_hand_built_judgements():
    ann = ["b", "b", "b", "a", "a", "tie", "b", "b", "a", "b"]
    bob = ["b", "b", "a", "a", "tie", "tie", "b", "a", "a", "b"]
    judgements = [(i, "ann", v) for i, v in enumerate(ann)] + [
        (i, "bob", v) for i, v in enumerate(bob)
    ]
    sides = {(i, r): "1" if i % 2 == 0 else "2" for i, r, v in judgements if v != "tie"}
    sides.update({(i, r): "tie" for i, r, v in judgements if v == "tie"})
    figures = reviews.pairwise_statistics(judgements, sides=sides)

    # B won 6 + 4, lost 3 + 4, tied 1 + 2 of 20: (10 + 3/2) / 20
    assert (figures["b_wins"], figures["a_wins"], figures["ties"]) == (10, 7, 3)
    assert figures["judgements"] == 20
    assert figures["win_rate"] == pytest.approx(0.575)
    low, high = wilson(11.5, 20)
    assert figures["ci_low"] == pytest.approx(low, abs=1e-12)
    assert figures["ci_high"] == pytest.approx(high, abs=1e-12)
    assert 0.36 < low < 0.37 and 0.76 < high < 0.77  # the numbers themselves, for a reader

    # 7 of 10 items agree; chance agreement from the marginals (6,3,1) and (4,4,2): 0.38
    assert figures["agreement"]["percent_agreement"] == pytest.approx(70.0)
    kappa = (0.7 - 0.38) / (1 - 0.38)
    assert figures["agreement"]["cohen_kappa"] == pytest.approx(kappa)
    assert kappa == pytest.approx(cohen_kappa_score(ann, bob))
    (pair,) = figures["agreement"]["pairs"]
    assert pair["reviewers"] == ["ann", "bob"] and pair["items"] == 10

    people = {p["reviewer"]: p for p in figures["reviewers"]}
    assert people["ann"] == {
        "reviewer": "ann",
        "judged": 10,
        "b_better": 6,
        "a_better": 3,
        "ties": 1,
        "first_shown_share": pytest.approx(5 / 9),  # the non-ties at even positions
    }
    assert (people["bob"]["b_better"], people["bob"]["a_better"], people["bob"]["ties"]) == (
        4,
        4,
        2,
    )


def test_agreement_is_on_the_items_both_judged_and_undefined_kappa_is_none():
    judgements = [
        (0, "ann", "b"),
        (1, "ann", "b"),
        (2, "ann", "b"),
        (0, "bob", "b"),
        (1, "bob", "b"),
        (3, "bob", "a"),  # ann did not judge item 3: not compared
        (0, "cy", "a"),
        (1, "cy", "tie"),
    ]
    figures = reviews.pairwise_statistics(judgements)
    pairs = {tuple(p["reviewers"]): p for p in figures["agreement"]["pairs"]}
    # ann and bob agree on both shared items, but one verdict only: kappa is undefined
    assert pairs[("ann", "bob")]["items"] == 2
    assert pairs[("ann", "bob")]["percent_agreement"] == 100.0
    assert pairs[("ann", "bob")]["cohen_kappa"] is None
    assert pairs[("ann", "cy")]["percent_agreement"] == 0.0
    assert pairs[("ann", "cy")]["cohen_kappa"] == pytest.approx(
        cohen_kappa_score(["b", "b"], ["a", "tie"], labels=["a", "b", "tie"])
    )
    # pooled: 2 + 0 + 0 agreeing of 2 + 2 + 2 compared
    assert figures["agreement"]["percent_agreement"] == pytest.approx(100 * 2 / 6)
    assert figures["agreement"]["items_compared"] == 6
    empty = reviews.pairwise_statistics([])
    assert empty["win_rate"] is None and empty["ci_low"] is None
    assert empty["agreement"]["cohen_kappa"] is None


def test_all_ties_is_a_win_rate_of_one_half():
    figures = reviews.pairwise_statistics([(i, "ann", "tie") for i in range(8)])
    assert figures["win_rate"] == 0.5
    assert figures["ci_low"] == pytest.approx(wilson(4, 8)[0])


# ---------------------------------------------------------------------------------------------
# The review's life on two language-model versions


@pytest.fixture
def lm(workspace, settings, tmp_path):
    """A maintainer, two reviewers, a viewer who does not review, two LM versions and prompts."""
    people = {
        "mia": make_member(workspace, Role.MAINTAINER, username="mia"),
        "ann": make_member(workspace, Role.VIEWER, username="ann"),
        "bob": make_member(workspace, Role.DEVELOPER, username="bob"),
        "vic": make_member(workspace, Role.VIEWER, username="vic"),
    }
    a, b = make_lm_versions(workspace, settings, tmp_path)
    prompts = upload_prompts(workspace, people["mia"])
    return {"a": a, "b": b, "prompts": prompts, **people}


def _create(workspace, lm, **overrides):
    fields = {
        "actor": lm["mia"],
        "workspace": workspace,
        "version_a": lm["a"],
        "version_b": lm["b"],
        "record_set": lm["prompts"],
        "reviewers": ["ann", "bob"],
        "items": 6,
        "seed": 7,
        "max_new_tokens": 6,
        "background": False,
        **overrides,
    }
    return reviews.review_create(**fields)


@pytest.mark.django_db(transaction=True)
def test_a_review_generates_on_the_task_and_maps_each_side_back_to_its_version(
    workspace, lm, eager_celery
):
    from django.db import transaction

    with transaction.atomic():  # the task is queued on commit; eager, it runs at once
        review = _create(workspace, lm, items=20, background=True)
        assert review.status == ReviewStatus.GENERATING
    review.refresh_from_db()
    assert review.status == ReviewStatus.OPEN, review.error
    assert review.generated == 40
    items = list(reviews.items_of(review))
    assert [i.position for i in items] == list(range(20))
    # the sample is the seed's: the same rows again, and the prompts are training's rendering
    rows = reviews.sample_rows(lm["prompts"], 20, 7)
    assert [i.row for i in items] == rows
    assert all(i.prompt.startswith("### Instruction:\n") for i in items)
    assert all(i.prompt.endswith("### Response:\n") for i in items)
    # both versions answered, differently (different adapters)
    assert any(i.output_a != i.output_b for i in items)
    # half of the items show A first
    assert sum(i.a_on_left for i in items) == 10
    events = set(Event.objects.for_workspace(workspace).values_list("verb", flat=True))
    assert {"serving.review.created", "serving.review.opened"} <= events

    left_a = next(i for i in items if i.a_on_left)
    left_b = next(i for i in items if not i.a_on_left)
    assert reviews.shown_responses(left_a) == (left_a.output_a, left_a.output_b)
    assert reviews.shown_responses(left_b) == (left_b.output_b, left_b.output_a)
    assert (
        reviews.review_judge(actor=lm["ann"], review=review, item=left_a, side="1").verdict == "a"
    )
    assert (
        reviews.review_judge(actor=lm["ann"], review=review, item=left_b, side="1").verdict == "b"
    )
    assert (
        reviews.review_judge(actor=lm["bob"], review=review, item=left_b, side="2").verdict == "a"
    )
    assert reviews.review_judge(
        actor=lm["bob"], review=review, item=left_a, side="tie"
    ).verdict == ("tie")
    with pytest.raises(ConflictError, match=f"you judged item {left_a.position + 1}") as conflict:
        reviews.review_judge(actor=lm["ann"], review=review, item=left_a, side="2")
    assert conflict.value.attr == "position"
    with pytest.raises(PermissionDenied):
        reviews.review_judge(actor=lm["vic"], review=review, item=left_a, side="1")
    with pytest.raises(ValidationError) as bad:
        reviews.review_judge(actor=lm["ann"], review=review, item=items[5], side="left")
    assert "allowed: 1, 2, tie" in bad.value.message_dict["choice"][0]
    # the activity log does not say which side was which version
    judged = Event.objects.for_workspace(workspace).filter(verb="serving.review.judged")
    assert all(set(e.payload) == {"item", "status"} for e in judged)

    # every judgement in: done
    for user in (lm["ann"], lm["bob"]):
        while (item := reviews.next_item(review, user)) is not None:
            reviews.review_judge(actor=user, review=review, item=item, side="2")
    review.refresh_from_db()
    assert review.status == ReviewStatus.DONE and review.finished_at is not None
    with pytest.raises(ConflictError, match="is done, not open"):
        reviews.review_judge(actor=lm["ann"], review=review, item=items[0], side="1")
    assert PairwiseJudgement.objects.for_workspace(workspace).count() == 40


@pytest.mark.django_db
def test_a_generation_failure_fails_the_review_with_its_error(workspace, lm, monkeypatch):
    from serving import lm_inference

    def broken(*args, **kwargs):
        raise lm_inference.LanguageModelError("the base model cannot be read")

    monkeypatch.setattr(lm_inference, "generate", broken)
    review = _create(workspace, lm)
    assert review.status == ReviewStatus.FAILED
    assert "the base model cannot be read" in review.error
    assert not PairwiseItem.objects.for_workspace(workspace).exists()
    assert reviews.review_generate(review.pk).status == ReviewStatus.FAILED  # repeat: no change


@pytest.mark.django_db
def test_creating_a_review_refuses_bad_input_naming_the_field(workspace, lm, settings, tmp_path):
    def refused(field, **overrides):
        with pytest.raises(ValidationError) as caught:
            _create(workspace, lm, **overrides)
        assert field in caught.value.message_dict, caught.value.message_dict
        return caught.value.message_dict[field][0]

    assert "at least 2" in refused("reviewers", reviewers=["ann"])
    assert "at least 2" in refused("reviewers", reviewers=["ann", "ann"])
    message = refused("reviewers", reviewers=["ann", "nobody"])
    assert "nobody" in message and "the members are: ann, bob, mia, vic" in message
    assert "from 1 to 30" in refused("items", items=0)
    assert "from 1 to 30" in refused("items", items=31)  # the record set has 30 rows
    assert "whole number" in refused("items", items="5")
    assert "from 0 to" in refused("seed", seed=-1)
    assert "from 1 to 256" in refused("max_new_tokens", max_new_tokens=10_000)
    assert "must differ" in refused("version_b", version_b=lm["a"])
    ranking = RegisteredModel.objects.create(workspace=workspace, name="ctr")
    plain = ModelVersion.objects.create(
        workspace=workspace, model=ranking, version=1, artifact_path="x", spec={"template": "dnn"}
    )
    assert "not a language model (lm_lora)" in refused("version_a", version_a=plain)
    (other,) = make_lm_versions(workspace, settings, tmp_path, name="otherlm", count=1)
    assert "must be a version of chatlm" in refused("version_b", version_b=other)
    table = record_set_upload(
        actor=None, workspace=workspace, name="tabular", content=b'{"x": 1}\n', fmt="jsonl"
    )
    assert "neither instruction rows" in refused("record_set", record_set=table)
    assert not PairwiseReview.objects.for_workspace(workspace).exists()


# ---------------------------------------------------------------------------------------------
# The API


def _url(workspace, tail: str = "") -> str:
    return f"/api/v1/workspaces/{workspace.slug}/reviews/{tail}"


def _attr(response) -> str | None:
    body = response.json()
    return body.get("attr") or (body.get("errors") or [{}])[0].get("attr")


@pytest.mark.django_db
def test_the_api_creates_reads_and_judges_blind_with_the_workspace_rules(
    workspace, other_workspace, lm, client_for, eager_celery, django_capture_on_commit_callbacks
):
    mia, ann, vic = client_for(lm["mia"]), client_for(lm["ann"]), client_for(lm["vic"])
    body = {
        "model": "chatlm",
        "version_a": lm["a"].version,
        "version_b": lm["b"].version,
        "record_set": lm["prompts"].pk,
        "reviewers": ["ann", "bob"],
        "items": 4,
        "max_new_tokens": 4,
    }
    # only maintainers start one
    assert client_for(lm["bob"]).post(_url(workspace), body, format="json").status_code == 403
    for field, value, status in (
        ("items", 0, 400),
        ("items", "many", 400),
        ("reviewers", ["ann"], 400),
        ("reviewers", "ann", 400),
        ("seed", -3, 400),
        ("model", "nope", 404),
        ("version_b", 99, 404),
        ("record_set", 10_000, 404),
    ):
        response = mia.post(_url(workspace), {**body, field: value}, format="json")
        assert response.status_code == status, (field, response.content)
        assert _attr(response) == field, response.json()
    elsewhere = upload_prompts(other_workspace, None)
    response = mia.post(_url(workspace), {**body, "record_set": elsewhere.pk}, format="json")
    assert response.status_code == 404 and _attr(response) == "record_set"

    with django_capture_on_commit_callbacks(execute=True):
        created = mia.post(_url(workspace), body, format="json")
    assert created.status_code == 202, created.content
    pk = created.json()["id"]
    assert created["Location"].endswith(_url(workspace, f"{pk}/"))
    read = mia.get(_url(workspace, f"{pk}/")).json()
    assert read["status"] == "open" and read["reviewers"] == ["ann", "bob"]
    assert read["results"]["judgements"] == 0  # a maintainer sees results before the end
    assert vic.get(_url(workspace, f"{pk}/")).json()["results"] is None  # a viewer does not
    assert vic.get(_url(workspace, f"{pk}/results/")).status_code == 403
    assert len(mia.get(_url(workspace)).json()["results"]) == 1

    # the next item is blind: no version in it
    following = ann.get(_url(workspace, f"{pk}/next/")).json()
    assert set(following["item"]) == {"position", "prompt", "response_1", "response_2"}
    assert vic.get(_url(workspace, f"{pk}/next/")).status_code == 403
    judge = _url(workspace, f"{pk}/judgements/")
    position = following["item"]["position"]
    response = ann.post(judge, {"position": position, "choice": "3"}, format="json")
    assert response.status_code == 400 and _attr(response) == "choice"
    assert "allowed: 1, 2, tie" in json.dumps(response.json())
    response = ann.post(judge, {"position": "x", "choice": "1"}, format="json")
    assert response.status_code == 400 and _attr(response) == "position"
    assert ann.post(judge, {"position": 99, "choice": "1"}, format="json").status_code == 404
    assert vic.post(judge, {"position": position, "choice": "1"}, format="json").status_code == 403
    first = ann.post(judge, {"position": position, "choice": "1"}, format="json")
    assert first.status_code == 201, first.content
    again = ann.post(judge, {"position": position, "choice": "2"}, format="json")
    assert again.status_code == 409
    assert "judged item" in again.json()["detail"] and again.json()["attr"] == "position"

    # other workspaces: 404, in the URL and for outsiders
    outsider = make_member(other_workspace, Role.ADMIN)
    assert client_for(outsider).get(_url(workspace, f"{pk}/")).status_code == 404
    assert client_for(outsider).get(_url(other_workspace, f"{pk}/")).status_code == 404
    assert client_for(None).get(_url(workspace, f"{pk}/")).status_code in (401, 403)

    # close early (maintainers), then everybody sees the results
    assert ann.post(_url(workspace, f"{pk}/close/")).status_code == 403
    closed = mia.post(_url(workspace, f"{pk}/close/"))
    assert closed.status_code == 200 and closed.json()["status"] == "done"
    assert mia.post(_url(workspace, f"{pk}/close/")).status_code == 409
    results = vic.get(_url(workspace, f"{pk}/results/")).json()
    assert results["judgements"] == 1 and results["interval"] == "wilson 95%"


# ---------------------------------------------------------------------------------------------
# Release policy


def _judge_all(review, people, verdict_of):
    """Every reviewer judges every item; ``verdict_of(position)`` says a, b or tie."""
    for user in people:
        while (item := reviews.next_item(review, user)) is not None:
            verdict = verdict_of(item.position)
            side = (
                "tie" if verdict == "tie" else ("1" if (verdict == "a") == item.a_on_left else "2")
            )
            reviews.review_judge(actor=user, review=review, item=item, side=side)
    review.refresh_from_db()
    return review


@pytest.mark.django_db
def test_the_review_policy_gates_the_release_of_a_language_model_version(workspace, lm):
    from serving.deployments import deployment_release

    deployment = Deployment.objects.create(
        workspace=workspace, name="chat", model=lm["a"].model, version=lm["a"]
    )

    def release():
        return deployment_release(
            actor=lm["mia"], workspace=workspace, deployment=deployment, version=lm["b"]
        )

    # no policy: the review plays no part (the ranking gateway's own refusal of an LM comes next)
    assert reviews.require_review(lm["b"]) is None
    with pytest.raises(ConflictError) as refused:
        release()
    assert refused.value.attr == "version_id"

    workspace.template = {**workspace.template, "review_policy": {"required": True}}
    workspace.save()
    lm["b"].refresh_from_db()
    with pytest.raises(ConflictError, match="has no human review as version B") as refused:
        release()
    assert refused.value.attr == "review"

    review = _create(workspace, lm)
    with pytest.raises(ConflictError, match=f"review {review.pk} is open \\(0 of 12 judgements\\)"):
        reviews.require_review(lm["b"])
    # B wins 4 of 6 items with both reviewers: 8 of 12, lower bound ~0.39 < 0.5: fails
    _judge_all(review, [lm["ann"], lm["bob"]], lambda p: "b" if p < 4 else "a")
    with pytest.raises(ConflictError, match="failed its human review") as refused:
        release()
    assert refused.value.attr == "review" and refused.value.extra["review"] == review.pk
    assert refused.value.extra["ci_low"] == pytest.approx(wilson(8, 12)[0])

    # a newer review where B wins every item: lower bound ~0.76 >= 0.5 passes
    better = _judge_all(_create(workspace, lm, seed=8), [lm["ann"], lm["bob"]], lambda p: "b")
    figures = reviews.require_review(lm["b"])
    assert figures["win_rate"] == 1.0 and figures["ci_low"] == pytest.approx(wilson(12, 12)[0])
    assert reviews.review_results(better)["passes_policy"] is True
    with pytest.raises(ConflictError) as refused:
        release()  # past the review: the ranking gateway's refusal of a language model
    assert refused.value.attr == "version_id"
    # version A was never B of a review
    with pytest.raises(ConflictError, match="no human review"):
        reviews.require_review(lm["a"])

    # a stricter minimum fails the same review
    workspace.template["review_policy"] = {"required": True, "min_win_rate": 0.8}
    workspace.save()
    lm["b"].workspace.refresh_from_db()
    with pytest.raises(ConflictError, match=r"under the policy's minimum 0\.8"):
        reviews.require_review(lm["b"])

    # a malformed policy fails closed, naming it
    for policy in ({"required": "yes"}, {"required": True, "min_win_rate": 2}, ["x"], {"min": 1}):
        workspace.template["review_policy"] = policy
        workspace.save()
        lm["b"].workspace.refresh_from_db()
        with pytest.raises(ConflictError) as refused:
            release()
        assert refused.value.attr == "review_policy", policy


@pytest.mark.django_db
def test_a_failed_review_is_named_by_the_policy(workspace, lm, monkeypatch):
    from serving import lm_inference

    monkeypatch.setattr(
        lm_inference, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    review = _create(workspace, lm)
    workspace.template = {**workspace.template, "review_policy": {"required": True}}
    workspace.save()
    lm["b"].workspace.refresh_from_db()
    with pytest.raises(ConflictError, match=f"its review {review.pk} failed: RuntimeError: boom"):
        reviews.require_review(lm["b"])


# ---------------------------------------------------------------------------------------------
# The pages (the browser journey is test_review_browser.py)


@pytest.mark.django_db
def test_the_pages_answer_bad_input_conflicts_and_outsiders_by_the_rules(
    workspace, other_workspace, lm, client
):
    from workspaces.testing.factories import TEST_PASSWORD

    def as_user(user):
        client.logout()
        assert client.login(username=user.username, password=TEST_PASSWORD)

    base = f"/w/{workspace.slug}/reviews/"
    as_user(lm["mia"])
    page = client.get(f"{base}new/?version={lm['b'].pk}")
    assert page.status_code == 200
    assert page.context["form"].initial == {"version_b": lm["b"].pk, "version_a": lm["a"].pk}
    form = {
        "version_a": lm["a"].pk,
        "version_b": 99_999,
        "record_set": lm["prompts"].pk,
        "items": 500,
        "seed": 0,
        "reviewers": "ann",
        "max_new_tokens": 8,
    }
    refused = client.post(f"{base}new/", form)
    assert refused.status_code == 400
    errors = refused.context["form"].errors
    assert "allowed: chatlm v2, chatlm v1" in errors["version_b"][0]
    assert "200" in errors["items"][0]
    refused = client.post(f"{base}new/", {**form, "version_b": lm["b"].pk, "items": 5})
    assert refused.status_code == 400
    assert "at least 2" in refused.context["form"].errors["reviewers"][0]
    assert not PairwiseReview.objects.for_workspace(workspace).exists()

    review = _create(workspace, lm, items=3)
    judge = f"{base}{review.pk}/judge/"
    as_user(lm["vic"])
    assert client.get(judge).status_code == 403  # a member who does not review it
    assert client.get(f"{base}{review.pk}/").context["results"] is None
    assert client.get(f"{base}new/").status_code == 403  # viewers do not start reviews
    as_user(lm["ann"])
    shown = client.get(judge)
    assert shown.status_code == 200 and shown.context["number"] == 1
    item = shown.context["item"]
    assert client.post(judge, {"position": item.position, "choice": "left"}).status_code == 400
    assert client.post(judge, {"position": "x", "choice": "1"}).status_code == 400
    assert client.post(judge, {"position": item.position, "choice": "1"}).status_code == 302
    again = client.post(judge, {"position": item.position, "choice": "2"})
    assert again.status_code == 409
    assert f"you judged item {item.position + 1}" in again.content.decode()
    assert again.context["number"] == 2  # and the next item is shown
    # another workspace's review, and an outsider: 404
    outsider = make_member(other_workspace, Role.ADMIN)
    assert client.get(f"/w/{other_workspace.slug}/reviews/{review.pk}/").status_code == 404
    as_user(outsider)
    assert client.get(f"{base}{review.pk}/").status_code == 404
    assert client.get(judge).status_code == 404
    assert client.get(f"/w/{other_workspace.slug}/reviews/").context["rows"] == []
