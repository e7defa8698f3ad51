"""The annotation workbench in a real browser (Debian's chromium): a developer creates a task
over 20 generated records; two annotators label all of it from the keyboard alone; a reviewer
adjudicates the disagreements; the agreement on the task page is scikit-learn's Cohen's kappa
of the same labels; the export is a record set with the final labels."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect
from sklearn.metrics import cohen_kappa_score

from curation import services
from curation.models import AnnotationItem, AnnotationTask, RecordSet
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCHEMA = {
    "fields": [
        {
            "name": "sentiment",
            "kind": "choice",
            "options": ["positive", "negative"],
            "required": True,
        },
        {"name": "quality", "kind": "rating", "min": 1, "max": 3},
    ]
}


def sentiment_of(annotator: str, position: int) -> str:
    """What each annotator answers: they disagree on every fourth item."""
    if annotator == "bob" and position % 4 == 0:
        return "negative" if position % 8 else "positive"
    return "positive" if position % 2 == 0 else "negative"


def test_two_annotators_label_twenty_items_by_keyboard_and_a_reviewer_adjudicates(page, workspace):
    developer = make_member(workspace, Role.DEVELOPER, username="lead")
    for name in ("ann", "bob"):
        make_member(workspace, Role.VIEWER, username=name)
    make_member(workspace, Role.MAINTAINER, username="rita")
    rows = b"".join(
        json.dumps({"text": f"Item {i}: the delivery took {i} days", "n": i}).encode() + b"\n"
        for i in range(20)
    )
    services.record_set_upload(
        actor=developer, workspace=workspace, name="reviews", content=rows, fmt="jsonl"
    )

    log_in(page, "lead")
    page.goto(f"/w/{workspace.slug}/data/")
    page.get_by_test_id("tasks-link").click()
    expect(page.get_by_test_id("empty")).to_contain_text("No annotation tasks yet")
    page.fill("#id_name", "delivery")
    page.fill("#id_text_field", "text")
    page.fill("#id_schema", json.dumps(SCHEMA))
    page.fill("#id_annotators", "ann, bob")
    page.fill("#id_reviewers", "rita")
    page.get_by_test_id("create-task").click()
    expect(page.get_by_role("heading", name="delivery")).to_be_visible()
    expect(page.get_by_test_id("labels-given")).to_have_text("0 of 40")
    page.context.clear_cookies()

    for annotator in ("ann", "bob"):
        log_in(page, annotator)
        page.goto(f"/w/{workspace.slug}/data/tasks/delivery/")
        page.get_by_test_id("start-labelling").click()
        ready = page.locator("form[data-label-form][data-ready=true]")
        expect(ready).to_have_count(1)
        # Enter alone: the required field is refused on the form, nothing is saved
        page.keyboard.press("Enter")
        expect(page.locator('.field-error[data-field="sentiment"]')).to_have_text("is required")
        for _ in range(20):
            expect(ready).to_have_count(1)
            item = page.get_by_test_id("item")
            position = int(item.get_attribute("data-position"))
            key = "1" if sentiment_of(annotator, position) == "positive" else "2"
            page.keyboard.press(key)  # sentiment: 1 positive, 2 negative
            page.keyboard.press("5")  # quality: 3, 4, 5 are ratings 1, 2, 3
            page.keyboard.press("Enter")
            expect(page.locator(".messages")).to_contain_text(f"Item {position + 1} labelled")
        expect(page.get_by_test_id("done")).to_contain_text("Nothing left for you to label")
        page.context.clear_cookies()

    task = AnnotationTask.objects.for_workspace(workspace).get(name="delivery")
    items = AnnotationItem.objects.for_workspace(workspace).filter(task=task)
    assert all(item.label_count == 2 for item in items)
    disputed = sorted(items.filter(status="disputed").values_list("position", flat=True))
    assert disputed == [p for p in range(20) if sentiment_of("ann", p) != sentiment_of("bob", p)]

    log_in(page, "rita")
    page.goto(f"/w/{workspace.slug}/data/tasks/delivery/")
    expect(page.get_by_test_id("disputed")).to_have_text(str(len(disputed)))
    page.get_by_test_id("start-review").click()
    for _ in disputed:
        expect(page.locator("form[data-label-form][data-ready=true]")).to_have_count(1)
        expect(page.get_by_test_id("labels").locator("tbody tr")).to_have_count(2)
        page.keyboard.press("2")  # the reviewer rules "negative"
        page.keyboard.press("Enter")
        expect(page.locator(".messages")).to_contain_text("adjudicated")
    expect(page.get_by_test_id("done")).to_contain_text("No disputed item")
    page.goto(f"/w/{workspace.slug}/data/tasks/delivery/")
    expect(page.get_by_test_id("resolved")).to_have_text(str(len(disputed)))

    ann = [sentiment_of("ann", p) for p in range(20)]
    bob = [sentiment_of("bob", p) for p in range(20)]
    expected = cohen_kappa_score(ann, bob, labels=["positive", "negative"])
    expect(page.get_by_test_id("cohen-sentiment")).to_have_text(f"{expected:.3f}")
    page.context.clear_cookies()

    log_in(page, "lead")
    page.goto(f"/w/{workspace.slug}/data/tasks/delivery/")
    page.get_by_test_id("export-submit").click()
    expect(page.get_by_role("heading", name="delivery_labels v1")).to_be_visible()
    expect(page.get_by_test_id("rows")).to_have_text("20")
    exported = RecordSet.objects.for_workspace(workspace).get(name="delivery_labels")
    assert [c["name"] for c in exported.columns] == ["text", "n", "sentiment", "quality"]
    assert exported.parent.name == "reviews"
