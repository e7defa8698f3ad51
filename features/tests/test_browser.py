"""The feature registry's write pages in a real browser (Debian's chromium): a developer logs in,
registers a group through the form (the schema editor's "add feature" button, a field error, the
fix), uploads a CSV from the group's page and sees the rows stored. The test makes no API call; it
also checks that the pages themselves called none."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from features.models import Batch, FeatureGroup
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CSV = (
    b"user_id,event_time,age,score,emb\n"
    b'u1,2026-11-01T00:00:00+00:00,31,0.5,"[0.1,0.2]"\n'
    b'u2,2026-11-01T01:00:00+00:00,42,0.25,"[0.3,0.4]"\n'
    b'u3,2026-11-01T02:00:00+00:00,53,0.75,"[0.5,0.6]"\n'
)


def test_register_a_group_and_upload_a_csv_through_the_pages(page, workspace):
    user = make_member(workspace, Role.DEVELOPER, username="builder")
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))

    log_in(page, user.username)

    page.goto(f"/w/{workspace.slug}/features/")
    page.get_by_role("link", name="New feature group").first.click()
    expect(page.get_by_role("heading", name="New feature group")).to_be_visible()
    page.fill("#id_name", "user_profile")
    page.select_option("#id_entity", "user")
    page.fill("#id_entity_keys", "user_id")
    page.fill("#id_freshness_sla_hours", "12")
    rows = page.locator("tr.schema-row")
    rows.nth(0).locator("input[name=feature_name]").fill("age")
    rows.nth(0).locator("select[name=feature_dtype]").select_option("int")
    page.get_by_role("button", name="+ Add feature").click()
    rows.nth(1).locator("input[name=feature_name]").fill("score")
    rows.nth(1).locator("select[name=feature_dtype]").select_option("float")
    page.get_by_role("button", name="+ Add feature").click()
    rows.nth(2).locator("input[name=feature_name]").fill("emb")
    rows.nth(2).locator("select[name=feature_dtype]").select_option("embedding")
    page.get_by_role("button", name="Register feature group").click()

    # The embedding has no dimension: the error sits on its row and nothing was created.
    error = page.locator("tr.schema-row").nth(2).get_by_test_id("row-error")
    expect(error).to_have_text("dimension: an embedding needs 1-4096")
    assert not FeatureGroup.objects.for_workspace(workspace).exists()
    page.locator("tr.schema-row").nth(2).locator("input[name=feature_dimension]").fill("2")
    page.get_by_role("button", name="Register feature group").click()

    expect(page.get_by_role("heading", name="user_profile v1")).to_be_visible()
    expect(page.locator(".messages")).to_contain_text("Feature group 'user_profile' registered")
    expect(page.locator('[data-testid="schema"] tr[data-feature]')).to_have_count(3)

    upload = page.get_by_test_id("upload")
    upload.get_by_label("File").set_input_files(
        {"name": "users.csv", "mimeType": "text/csv", "buffer": CSV}
    )
    upload.get_by_role("button", name="Upload").click()
    expect(upload.get_by_test_id("rows-stored")).to_have_text("3")
    expect(upload.get_by_test_id("upload-stored")).to_contain_text("in version v1")
    # The progress bar followed the XMLHttpRequest upload events to the end, then went away.
    expect(upload.locator("progress")).to_have_js_property("value", 100)
    expect(upload.locator("progress")).to_be_hidden()

    page.reload()
    expect(page.locator('[data-testid="batches"] tr[data-batch]')).to_have_count(1)
    expect(page.locator('[data-testid="batches"] tr[data-batch] td').nth(1)).to_have_text("3")

    group = FeatureGroup.objects.for_workspace(workspace).get(name="user_profile")
    assert (group.freshness_sla_seconds, group.owner) == (12 * 3600, user)
    assert Batch.objects.for_workspace(workspace).get(group=group).rows == 3
    assert not [url for url in requested if "/api/" in url]


def test_preview_then_build_a_dataset_and_watch_its_progress(page, workspace, monkeypatch):
    """The dataset form's Preview shows the row count and coverage without creating anything;
    Build queues the build and the dataset page's progress bar (htmx) follows it until the page
    reloads itself showing the result. The "worker" here is the test: it runs the queued build."""
    from features import ingestion, registry, samples, tasks
    from features.models import Dataset, EntityKind

    user = make_member(workspace, Role.DEVELOPER, username="sampler")
    clicks = registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="clicks",
        entity=EntityKind.LABEL,
        entity_keys=["user_id"],
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )
    users = registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="users",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[
            {"name": "age", "dtype": "int"},
            {"name": "score", "dtype": "float"},
            {"name": "emb", "dtype": "embedding", "dimension": 2},
        ],
        online=False,
    )
    labels = (
        b"user_id,event_time,clicked\n"
        b"u1,2026-11-01T03:00:00+00:00,1\nu2,2026-11-01T04:00:00+00:00,0\n"
        b"u9,2026-11-01T05:00:00+00:00,1\n"
    )
    for group, body in ((clicks, labels), (users, CSV)):
        ingestion.batch_ingest(actor=user, group=group, body=body, format="csv")
    queued: list[int] = []  # the broker: the test runs what the page queued
    monkeypatch.setattr(
        tasks.dataset_build_task, "apply_async", lambda args, **kw: queued.append(args[0])
    )

    log_in(page, user.username)
    page.goto(f"/w/{workspace.slug}/features/datasets/new/")
    page.fill("#id_name", "ctr_sample")
    page.select_option("#id_label_source", "clicks")
    page.fill("#id_label_columns", "clicked")
    page.fill("[data-feature-search]", "users:")
    page.get_by_label("users:age").check()

    # The numbers first; then a preview of bad input names the field; nothing is created.
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_test_id("preview-rows")).to_have_text("3")
    expect(page.get_by_test_id("preview-coverage")).to_have_text("66.7%")  # u9 has no row
    page.fill("#id_label_columns", "bought")
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_test_id("preview")).to_contain_text("'clicks' has no column 'bought'")
    page.fill("#id_label_columns", "clicked")
    assert not Dataset.objects.for_workspace(workspace).exists()

    page.get_by_role("button", name="Build dataset").click()
    expect(page.get_by_role("heading", name="ctr_sample v1")).to_be_visible()
    expect(page.get_by_test_id("progress-text")).to_contain_text("Queued")
    dataset = Dataset.objects.for_workspace(workspace).get(name="ctr_sample")
    assert queued == [dataset.pk]

    samples.dataset_build(queued.pop())  # the worker takes it
    # The next poll (every 2 s) sees the build over and reloads the page.
    expect(page.get_by_test_id("status")).to_have_text("ready", timeout=15_000)
    expect(page.get_by_test_id("building")).to_have_count(0)
    expect(page.locator('[data-testid="coverage"] tr[data-ref="users:age"]')).to_contain_text(
        "66.7%"
    )


def test_import_a_feast_registry_through_the_page(page, workspace, tmp_path):
    """From the empty feature list to imported groups: the link, a refusal naming the Feast
    entity and the kinds, the preview that writes nothing, the import."""
    import json

    from features.tests.test_feast import dump, view

    user = make_member(workspace, Role.DEVELOPER, username="feaster")
    log_in(page, user.username)
    page.goto(f"/w/{workspace.slug}/features/")
    page.get_by_test_id("import-feast").click()
    expect(page.get_by_role("heading", name="Import from Feast")).to_be_visible()
    registry = json.dumps(dump(view(entities=["merchant"]), view(name="user_stats_2"))).encode()
    form = page.get_by_test_id("feast-form")
    form.get_by_label("Registry dump file").set_input_files(
        {"name": "registry.json", "mimeType": "application/json", "buffer": registry}
    )
    form.get_by_role("button", name="Preview").click()
    expect(page.get_by_test_id("field-error")).to_contain_text(
        "say which kind the Feast entity 'merchant' is: one of user, item"
    )
    form.get_by_label("Registry dump file").set_input_files(
        {"name": "registry.json", "mimeType": "application/json", "buffer": registry}
    )
    page.get_by_label("Entity kinds").fill("merchant=item")
    page.get_by_role("button", name="Preview").click()
    result = page.get_by_test_id("feast-result")
    expect(result.get_by_test_id("outcome")).to_have_text(["would be created"] * 2)
    assert not FeatureGroup.objects.for_workspace(workspace).exists()
    form.get_by_label("Registry dump file").set_input_files(
        {"name": "registry.json", "mimeType": "application/json", "buffer": registry}
    )
    page.get_by_role("button", name="Import", exact=True).click()
    expect(result.get_by_test_id("outcome")).to_have_text(["created"] * 2)
    page.screenshot(path=str(tmp_path / "feast-import.png"), full_page=True)
    result.get_by_role("link", name="user_stats_2").click()
    expect(page.get_by_role("heading", name="user_stats_2 v1")).to_be_visible()
    assert set(FeatureGroup.objects.for_workspace(workspace).values_list("name", flat=True)) == {
        "user_stats",
        "user_stats_2",
    }
