"""The acceptance test of blind side-by-side human review, in a real browser (Debian's chromium):
a maintainer starts a review of two language-model versions from a version's page (20 prompts,
2 reviewers); a real Celery worker generates both versions' responses while the review's page
shows the progress; each reviewer judges all 20 items from the keyboard, and no page they see
holds the versions' numbers, ids or names; the results page shows B's win rate, its Wilson
interval (drawn) and the reviewers' agreement, each equal to the test's own computation."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal

import pytest
from playwright.sync_api import expect
from sklearn.metrics import cohen_kappa_score

from serving import review as reviews
from serving.models import ModelVersion, PairwiseReview, RegisteredModel, ReviewStatus
from serving.tests.test_review import make_lm_versions, upload_prompts, wilson
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace
from workspaces.testing.workers import embedded_worker

pytestmark = [
    pytest.mark.browser,
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
]

# What each reviewer thinks, by item position: ann prefers A on every fourth item, bob calls
# every third a tie; B otherwise.
VERDICTS = {
    "ann": lambda p: "a" if p % 4 == 0 else "b",
    "bob": lambda p: "tie" if p % 3 == 0 else "b",
}
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')


def floatformat(value: float, places: int) -> str:
    """Django's ``floatformat`` (half up on the decimal text), the page's rounding."""
    return str(Decimal(repr(value)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def assert_blind(html: str, versions: list[ModelVersion]) -> None:
    """Nothing in the page names either version: its name, the model's, its number or its id
    (as a whole number anywhere in the text, attributes, URLs and form values)."""
    text = CSRF.sub("", html)
    assert versions[0].model.name not in text
    for version in versions:
        assert version.name not in text
        for token in {str(version.pk), str(version.version)}:
            found = re.search(rf"(?<![0-9A-Za-z]){token}(?![0-9A-Za-z])", text)
            assert found is None, text[max(0, found.start() - 200) : found.end() + 200]


def test_two_reviewers_judge_twenty_items_blind_and_the_results_show_the_win_rate(
    page, settings, tmp_path
):
    workspace = make_workspace(slug="blind", name="Blind bench", scene="chat")
    make_member(workspace, Role.MAINTAINER, username="mia")
    for name in VERDICTS:
        make_member(workspace, Role.VIEWER, username=name)
    # Placeholder versions first, so the reviewed ones have numbers and ids that no counter,
    # position or progress figure on the page could also show.
    model = RegisteredModel.objects.create(workspace=workspace, name="chatlm")
    ModelVersion.objects.bulk_create(
        [
            ModelVersion(
                workspace=workspace,
                model=model,
                version=n,
                artifact_path=f"placeholder/{n}",
                spec={"template": "placeholder"},
            )
            for n in range(1, 57)
        ]
    )
    version_a, version_b = make_lm_versions(workspace, settings, tmp_path)
    assert (version_a.version, version_b.version) == (57, 58)
    assert min(version_a.pk, version_b.pk) > 56
    upload_prompts(workspace, None, rows=40)
    ws = workspace.slug

    log_in(page, "mia")
    page.goto(f"/w/{ws}/reviews/")
    expect(page.get_by_test_id("empty")).to_contain_text("No human reviews yet")
    page.goto(f"/w/{ws}/models/chatlm/v58/")
    page.get_by_test_id("review-link").click()
    # B is the version whose page it was, A the one before it
    expect(page.locator("#id_version_b")).to_have_value(str(version_b.pk))
    expect(page.locator("#id_version_a")).to_have_value(str(version_a.pk))
    expect(page.locator("#id_items")).to_have_value("20")
    page.fill("#id_reviewers", "ann")
    page.fill("#id_max_new_tokens", "8")
    page.get_by_test_id("create-review").click()
    expect(page.locator('.field-error[data-field="reviewers"]')).to_contain_text(
        "at least 2 different members"
    )
    page.fill("#id_reviewers", "ann, bob")
    with embedded_worker(["celery"]):
        page.get_by_test_id("create-review").click()
        expect(page.locator(".messages")).to_contain_text("started: generating 20 responses")
        # the page follows the worker (htmx) and reloads itself once the review is open
        expect(page.get_by_test_id("review-status")).to_have_text("open", timeout=120_000)
    review = PairwiseReview.objects.for_workspace(workspace).get()
    assert review.status == ReviewStatus.OPEN and review.generated == 40
    expect(page.get_by_test_id("review-progress")).to_contain_text("0 of 40 judgements given")
    expect(page.get_by_test_id("results-empty")).to_contain_text("No judgements yet")
    items = {item.position: item for item in reviews.items_of(review)}
    assert len(items) == 20
    page.context.clear_cookies()

    for name, verdict_of in VERDICTS.items():
        log_in(page, name)
        page.goto(f"/w/{ws}/reviews/{review.pk}/")
        expect(page.get_by_test_id("results-hidden")).to_be_visible()  # no peeking while judging
        page.get_by_test_id("start-judging").click()
        for number in range(1, 21):
            expect(page.locator("form[data-judge-form][data-ready=true]")).to_have_count(1)
            expect(page.get_by_test_id("judge-progress")).to_have_text(f"Item {number} of 20")
            assert_blind(page.content(), [version_a, version_b])
            position = int(page.locator("input[name=position]").get_attribute("value"))
            item = items[position]
            first, second = reviews.shown_responses(item)
            assert page.get_by_test_id("response-1").text_content().strip() == first.strip()
            assert page.get_by_test_id("response-2").text_content().strip() == second.strip()
            verdict = verdict_of(position)
            key = "1" if (verdict == "a") == item.a_on_left else "2"
            key = "t" if verdict == "tie" else key
            page.keyboard.press(key)
            expect(page.locator(".messages")).to_contain_text(
                f"Saved your judgement of item {position + 1}."
            )
        done = page.get_by_test_id("judge-done")
        expect(done).to_contain_text(
            "This review is done" if name == "bob" else "You have judged all 20 items"
        )
        assert_blind(page.content(), [version_a, version_b])
        page.context.clear_cookies()

    review.refresh_from_db()
    assert review.status == ReviewStatus.DONE
    ann = [VERDICTS["ann"](p) for p in range(20)]
    bob = [VERDICTS["bob"](p) for p in range(20)]
    both = ann + bob
    wins, ties = both.count("b"), both.count("tie")
    rate = (wins + ties / 2) / 40
    low, high = wilson(wins + ties / 2, 40)
    kappa = cohen_kappa_score(ann, bob, labels=["a", "b", "tie"])
    agreement = 100 * sum(x == y for x, y in zip(ann, bob, strict=True)) / 20

    log_in(page, "ann")  # once done, every member sees the results
    page.goto(f"/w/{ws}/reviews/{review.pk}/")
    expect(page.get_by_test_id("review-status")).to_have_text("done")
    expect(page.get_by_test_id("win-rate")).to_have_text(floatformat(rate, 3))
    expect(page.get_by_test_id("interval")).to_have_text(
        f"{floatformat(low, 3)} \u2013 {floatformat(high, 3)}"  # an en dash
    )
    expect(page.get_by_test_id("kappa")).to_have_text(floatformat(kappa, 3))
    expect(page.get_by_test_id("percent-agreement")).to_have_text(f"{floatformat(agreement, 1)}%")
    expect(page.get_by_test_id("b-wins")).to_have_text(str(wins))
    expect(page.get_by_test_id("a-wins")).to_have_text(str(both.count("a")))
    expect(page.get_by_test_id("ties")).to_have_text(str(ties))
    chart = page.get_by_test_id("interval-chart")
    expect(chart.locator("rect")).to_have_count(1)
    expect(chart.locator("svg")).to_have_attribute(
        "aria-label", re.compile(rf"interval {floatformat(low, 3)} to {floatformat(high, 3)}")
    )
    expect(page.get_by_test_id("per-reviewer").locator("tbody tr")).to_have_count(2)
    expect(page.get_by_test_id("per-reviewer").locator('tr[data-reviewer="bob"]')).to_contain_text(
        "20"
    )
    # the results page is where the versions are named
    expect(page.get_by_role("heading", level=1)).to_contain_text("chatlm v58 (B) against v57 (A)")
