"""The playground (``serving.playground``): a ranking version's request scored by a sandbox
replica (a real model-server process, not the gateway) to the same scores the bundle gives, a
language version's prompt continued as ``lm_inference`` continues it; the API's and the
page's answers to bad rows, the wrong kind of input, other roles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serving import lm_inference, playground, registry
from serving.models import ModelVersion
from serving.tests.factories import make_scene
from serving.tests.helpers import passing_version
from workspaces.models import Event, Role


def _expected(version: ModelVersion, rows: list[dict]) -> np.ndarray:
    bundle = registry.load_version(version)
    columns = {f.ref: [row.get(f.ref) for row in rows] for f in bundle.spec.features}
    return bundle.predict(columns, len(rows))


@pytest.mark.django_db
def test_a_ranking_version_is_tried_by_a_sandbox_replica(workspace, members, client_for, settings):
    actor = members[Role.DEVELOPER]
    scene = make_scene(workspace, actor)
    version = passing_version(scene, actor)
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/{version.pk}/try/"

    # The form's rows come from the training dataset: its newest rows, keyed by reference.
    rows = playground.example_rows(version)
    assert len(rows) == playground.EXAMPLE_ROWS
    assert set(rows[0]) == set(version.features)
    rows.append({version.features[0]: None})  # a candidate with every feature missing but one

    settings.SERVING_SANDBOX = "process"
    response = client_for(actor).post(url, {"rows": rows}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["kind"] == "ranking" and body["version"] == version.version
    assert body["replica"] == "sandbox model-server process"
    assert np.allclose(body["scores"], _expected(version, rows), atol=1e-6)
    assert body["model_ms"] > 0 and body["total_ms"] >= body["model_ms"]
    assert Event.objects.filter(workspace=workspace, verb="serving.model_version.tried").exists()

    settings.SERVING_SANDBOX = "inprocess"
    changed = [dict(rows[0]), dict(rows[0])]
    numeric = next(f for f in version.spec["features"] if f["dtype"] in ("int", "float"))
    changed[1][numeric["ref"]] = (changed[0][numeric["ref"]] or 0) + 10 * (numeric["std"] or 1)
    again = client_for(actor).post(url, {"rows": changed}, format="json").json()
    assert again["scores"][0] == pytest.approx(body["scores"][0], abs=1e-6)
    assert again["scores"][1] != pytest.approx(again["scores"][0], abs=1e-6)

    # Bad input names the row, the key and what it takes; nothing is scored.
    cases = [
        ({"rows": [{"nope:x": 1}]}, "rows", "allowed keys"),
        ({"rows": [{numeric["ref"]: "high"}]}, "rows", "takes a number"),
        ({"rows": [{}] * (playground.MAX_ROWS + 1)}, "rows", f"at most {playground.MAX_ROWS}"),
        ({"rows": {"a": 1}}, "rows", "list of rows"),
        ({"rows": ["x"]}, "rows", "row 1 is not an object"),
        ({"prompt": "hello"}, "prompt", "ranking model"),
    ]
    for payload, attr, says in cases:
        refused = client_for(actor).post(url, payload, format="json")
        assert refused.status_code == 400, (payload, refused.content)
        assert refused.json()["attr"] == attr
        assert says in refused.json()["detail"], refused.json()
    viewer = client_for(members[Role.VIEWER]).post(url, {"rows": rows}, format="json")
    assert viewer.status_code == 403

    # The page: the request form starts from the dataset's rows; scoring shows a table.
    page = client_for(actor)
    page.force_login(actor)
    try_url = f"/w/{workspace.slug}/models/{version.model.name}/v{version.version}/try/"
    html = page.get(try_url).content.decode()
    assert 'data-testid="try-form"' in html and "sandbox replica" in html
    assert all(ref in html for ref in version.features)
    shown = page.post(try_url, {"rows": json.dumps(rows)})
    assert shown.status_code == 200
    text = shown.content.decode()
    assert text.count('data-testid="try-score"') == len(rows)
    assert f"{body['scores'][0]:.4f}" in text
    bad = page.post(try_url, {"rows": "[{"})
    assert bad.status_code == 400
    assert 'data-error-for="rows"' in bad.content.decode()
    assert "not JSON" in bad.content.decode()
    detail_url = f"/w/{workspace.slug}/models/{version.model.name}/v{version.version}/"
    detail = page.get(detail_url)
    assert try_url in detail.content.decode()
    # A viewer, whom the playground refuses, is not sent there: the page says who can try it.
    reader = client_for(members[Role.VIEWER])
    reader.force_login(members[Role.VIEWER])
    assert reader.get(try_url).status_code == 403
    seen = reader.get(detail_url).content.decode()
    assert try_url not in seen
    assert "takes the developer role" in seen


@pytest.mark.django_db
def test_a_language_version_continues_a_prompt(workspace, members, client_for, settings, tmp_path):
    from serving.tests.test_review import make_lm_versions

    actor = members[Role.DEVELOPER]
    (version,) = make_lm_versions(workspace, settings, tmp_path, name="talk", count=1)
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/{version.pk}/try/"
    prompt = "### Instruction:\nname a colour\n\n### Response:\n"
    response = client_for(actor).post(url, {"prompt": prompt, "max_new_tokens": 6}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["kind"] == "language"
    assert body["completion"] == lm_inference.generate(version, [prompt], max_new_tokens=6)[0]

    for payload, attr in (
        ({"rows": [{}]}, "rows"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": prompt, "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": prompt, "max_new_tokens": 10_000}, "max_new_tokens"),
        ({"prompt": "x" * 5000}, "prompt"),
    ):
        refused = client_for(actor).post(url, payload, format="json")
        assert refused.status_code == 400, (payload, refused.content)
        assert refused.json()["attr"] == attr

    page = client_for(actor)
    page.force_login(actor)
    try_url = f"/w/{workspace.slug}/models/talk/v{version.version}/try/"
    assert 'name="prompt"' in page.get(try_url).content.decode()
    shown = page.post(try_url, {"prompt": prompt, "max_new_tokens": "6"})
    assert shown.status_code == 200
    assert 'data-testid="try-completion"' in shown.content.decode()
    bad = page.post(try_url, {"prompt": prompt, "max_new_tokens": "999"})
    assert bad.status_code == 400
    assert "At most 256 tokens." in bad.content.decode()
