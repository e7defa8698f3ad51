"""The playground and the int8 button in a real browser (Debian's chromium via playwright): a
developer makes the int8 variant of a ranking version from its page, lands on the variant's
page, which names its source, and tries the variant's request form, whose scores table fills
in from a sandbox replica."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from serving.models import ModelVersion, VersionSource
from serving.tests.factories import make_scene
from serving.tests.helpers import passing_version
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace

pytestmark = pytest.mark.browser
SCREENSHOT = Path("/tmp/playground-page.png")
VARIANT_SCREENSHOT = Path("/tmp/int8-variant-page.png")


@pytest.mark.usefixtures("transactional_db")
def test_a_developer_quantises_a_version_and_tries_the_variant(page):
    workspace = make_workspace(slug="try-ui")
    dev = make_member(workspace, Role.DEVELOPER, username="dana")
    scene = make_scene(workspace, dev)
    source = passing_version(scene, dev)
    name = source.model.name

    log_in(page, "dana")
    page.goto(f"/w/{workspace.slug}/models/{name}/v{source.version}/")
    page.get_by_role("button", name=f"Make an int8 variant of v{source.version}").click()
    expect(page.get_by_test_id("quantization-source")).to_contain_text(f"v{source.version}")
    expect(page.get_by_test_id("quantization-source")).to_contain_text("onnx_dynamic_int8")
    variant = ModelVersion.objects.for_workspace(workspace).get(version=source.version + 1)
    assert variant.source == VersionSource.QUANTIZED
    assert page.url.endswith(f"/models/{name}/v{variant.version}/")
    page.screenshot(path=str(VARIANT_SCREENSHOT), full_page=True)

    page.get_by_test_id("try-link").get_by_role("link").click()
    rows = page.locator("textarea[name=rows]")
    start = json.loads(rows.input_value())
    assert len(start) == 3 and set(start[0]) == set(variant.features)
    start[0][variant.features[0]] = None
    rows.fill(json.dumps(start))
    page.get_by_role("button", name="Score the rows").click()
    scores = page.get_by_test_id("try-score")
    expect(scores).to_have_count(3)
    for text in scores.all_inner_texts():
        assert 0 <= float(text) <= 1
    expect(page.get_by_test_id("try-result")).to_contain_text("missing")
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    rows.fill('[{"nope:x": 1}]')
    page.get_by_role("button", name="Score the rows").click()
    expect(page.locator('[data-error-for="rows"]')).to_contain_text("allowed keys")
