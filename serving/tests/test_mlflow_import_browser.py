"""The registry page's MLflow import in a real browser: a stock-format sklearn model (skops)
imports with its input mapping after a field error that names the signature's columns."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
from django.conf import settings
from playwright.sync_api import expect

from serving.models import ModelVersion
from serving.tests.factories import make_scene
from workspaces.models import Role
from workspaces.testing.browser import log_in
from workspaces.testing.factories import make_member, make_workspace

pytestmark = pytest.mark.browser


@pytest.mark.usefixtures("transactional_db")
def test_an_engineer_imports_an_mlflow_model_from_the_registry_page(page):
    import mlflow.sklearn
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    workspace = make_workspace(slug=f"import-ui-{uuid.uuid4().hex[:6]}")
    engineer = make_member(workspace, Role.DEVELOPER, username="ines")
    scene = make_scene(workspace, engineer, labels=20)
    u, i = scene.users.name, scene.items.name
    x = np.random.default_rng(2).random((30, 3)) * [40, 0.2, 30]
    frame = pd.DataFrame(x, columns=["age", "ctr", "price"])
    folder = Path(settings.MLFLOW_ARTIFACT_ROOT) / workspace.slug / uuid.uuid4().hex / "sk"
    mlflow.sklearn.save_model(
        LogisticRegression().fit(frame, (x[:, 2] > 15).astype(int)),
        folder,
        input_example=frame.head(2),
        pip_requirements=[],
    )

    # The registry mirror's MLflow client costs seconds on first use in a process: made here,
    # before the clock of the browser's steps starts.
    from serving import registry

    registry.mlflow_client()
    log_in(page, "ines")
    page.goto(f"/w/{workspace.slug}/models/")
    form = page.get_by_test_id("import-form")
    form.locator("input[name=model]").fill("imported")
    form.locator("input[name=source]").fill(folder.as_uri())
    form.locator("select[name=dataset]").select_option(str(scene.dataset.pk))
    form.locator("textarea[name=inputs]").fill(f"age = {u}:age\nctr = {u}:ctr")
    form.get_by_role("button", name="Import").click()
    expect(page.locator("[data-error-for=inputs]")).to_contain_text("age, ctr, price")
    form = page.get_by_test_id("import-form")
    form.locator("textarea[name=inputs]").fill(f"age = {u}:age\nctr = {u}:ctr\nprice = {i}:price")
    form.get_by_role("button", name="Import").click()
    expect(page).to_have_url(f"/w/{workspace.slug}/models/imported/v1/")
    version = ModelVersion.objects.for_workspace(workspace).get(model__name="imported")
    assert version.spec["extra"]["input_mapping"]["price"] == f"{i}:price"
