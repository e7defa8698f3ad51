"""Data building in a real browser (Debian's chromium): from the empty page, upload a JSON Lines
file, run the pipeline the form suggests after a refused edit, watch the stages progress and read
each rule's count and examples. The "worker" is the test: it runs the queued build."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from curation.models import RecordSet
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

RECORDS = [
    {"question": "How do I reset my password today?", "answer": "Mail help@example.com please."},
    {"question": "HOW do I reset my password today", "answer": "Mail help@example.com please."},
    {"question": "hi", "answer": "hello"},
    {"question": "Which model ranks the feed this week?", "answer": "The DCN, version 7."},
]


def test_upload_records_and_build_a_clean_version_through_the_pages(
    page, workspace, tmp_path, monkeypatch
):
    from curation import services, tasks

    user = make_member(workspace, Role.DEVELOPER, username="curator")
    queued: list[int] = []  # the broker: the test runs what the page queued
    monkeypatch.setattr(
        tasks.pipeline_build_task, "apply_async", lambda args, **kw: queued.append(args[0])
    )
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    log_in(page, user.username)

    page.goto(f"/w/{workspace.slug}/")
    page.get_by_role("link", name="Data building").click()
    expect(page.get_by_test_id("empty")).to_contain_text("Upload a JSON Lines, Parquet or CSV")
    source = tmp_path / "support.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    page.fill("#id_name", "support")
    page.set_input_files("#id_file", str(source))
    page.get_by_test_id("upload-submit").click()
    expect(page.get_by_role("heading", name="support v1")).to_be_visible()
    expect(page.get_by_test_id("rows")).to_have_text("4")
    expect(page.get_by_test_id("preview")).to_contain_text("Which model ranks the feed")

    # The suggested pipeline fits the columns; a typo in it is refused naming the field.
    stages = json.loads(page.input_value("#id_stages"))
    assert [s["kind"] for s in stages] == ["filter", "scrub", "dedup", "format"]
    stages[0]["rules"][0]["rule"] = "min_wordz"
    page.fill("#id_stages", json.dumps(stages))
    page.get_by_test_id("run-pipeline").click()
    expect(page.locator('.field-error[data-field="stages"]')).to_contain_text(
        "stages[0].rules[0].rule: unknown rule 'min_wordz'; allowed: min_length"
    )
    assert RecordSet.objects.for_workspace(workspace).count() == 1

    stages[0]["rules"][0]["rule"] = "min_words"
    page.fill("#id_name", "support_sft")
    page.fill("#id_stages", json.dumps(stages))
    page.get_by_test_id("run-pipeline").click()
    expect(page.get_by_role("heading", name="support_sft v1")).to_be_visible()
    expect(page.get_by_test_id("progress-text")).to_contain_text("0 of 4 stages done")
    built = RecordSet.objects.for_workspace(workspace).get(name="support_sft")
    assert queued == [built.pk]

    services.pipeline_build(queued.pop())  # the worker takes it
    # The next poll (every 2 s) sees the build over and reloads the page.
    expect(page.get_by_test_id("status")).to_have_text("ready", timeout=15_000)
    expect(page.get_by_test_id("rows")).to_have_text("2")
    stage_rows = page.locator('[data-testid="stages"] tbody tr')
    expect(stage_rows).to_have_count(4)
    expect(stage_rows.locator('[data-testid="rows-out"]')).to_have_text(["3", "3", "2", "2"])
    exact = page.locator('details[data-rule="exact duplicate"]')
    expect(exact.locator("summary")).to_contain_text("1 removed")
    exact.locator("summary").click()
    expect(exact).to_contain_text("duplicate_of: How do I reset my password today?")
    scrub = page.locator('details[data-rule="email in answer"]')
    expect(scrub.locator("summary")).to_contain_text("2 changed")
    expect(page.get_by_test_id("preview")).to_contain_text("Mail <EMAIL> please.")
    page.get_by_test_id("parent").click()
    expect(page.get_by_role("heading", name="support v1")).to_be_visible()
    assert not [url for url in requested if "/api/" in url]
