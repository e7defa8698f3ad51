"""Benchmark sets (X4): a new ranking version is scored on the workspace's sets by a real worker
without anyone asking, and its version page shows the scores beside production's; the metrics
against hand-worked cases; the API's refusals."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from features.samples import dataset_file
from serving import benchmarks, registry
from serving.models import BenchmarkScore, BenchmarkSet
from serving.tests.factories import make_bundle, make_job, make_spec
from serving.tests.helpers import deployed
from training.tests.workers import wait_for
from workspaces.models import Event, Role
from workspaces.testing.workers import embedded_worker


def test_ndcg_by_hand():
    label = np.array([1, 0, 0, 0, 1, 0, 0])
    score = np.array([0.1, 0.9, 0.5, 0.2, 0.8, 0.3, 0.4])
    group = np.array(["a", "a", "a", "b", "b", "c", "c"])
    # a: the positive is third (1 / log2 4 = 0.5); b: first (1); c has no positive.
    assert benchmarks.ndcg_at_k(label, score, group, 10) == {"ndcg": 0.75, "groups": 2}
    # At k = 2 group a's positive falls outside the cut.
    assert benchmarks.ndcg_at_k(label, score, group, 2) == {"ndcg": 0.5, "groups": 2}
    assert benchmarks.ndcg_at_k(label[:0], score[:0], group[:0], 5)["ndcg"] is None


def test_text_metrics_by_hand():
    assert benchmarks.exact_match("The Sky is blue.", "sky is blue") == 1.0
    assert benchmarks.exact_match("sky is red", "sky is blue") == 0.0
    assert benchmarks.token_f1("the sky is red", "the sky is blue") == pytest.approx(2 / 3)
    assert benchmarks.token_f1("", "") == 1.0
    assert benchmarks.token_f1("blue", "") == 0.0
    # LCS of "a b c d" and "a c d e" is "a c d": precision = recall = 3/4.
    assert benchmarks.rouge_l("a b c d", "a c d e") == pytest.approx(0.75)
    assert benchmarks.rouge_l("x y", "a b") == 0.0


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_a_new_version_is_scored_without_asking_and_shown_beside_production(
    workspace, members, client_for
):
    actor = members[Role.MAINTAINER]
    scene, made, _dep = deployed(workspace, actor)  # ranker v1 (production of "main") and v2
    client = client_for(actor)
    base = f"/api/v1/workspaces/{workspace.slug}"
    response = client.post(
        f"{base}/benchmarks/",
        {"name": "clicks-holdout", "dataset_id": scene.dataset.pk},
        format="json",
    )
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["kind"] == "ranking"
    assert created["label_column"] == "clicked"
    assert created["group_column"] == "user_id"
    assert created["rows"] == scene.dataset.row_count > 0
    # A new set asks for the models' latest (v2) and production (v1) versions.
    queued = set(
        BenchmarkScore.objects.for_workspace(workspace).values_list("version__version", flat=True)
    )
    assert queued == {1, 2}

    # A new version, registered the ordinary way: nobody asks for its scores.
    job = make_job(scene, make_bundle(make_spec(scene), seed=7))
    new = registry.model_version_register(actor=actor, workspace=workspace, name="ranker", job=job)
    assert new.version == 3
    score = BenchmarkScore.objects.for_workspace(workspace).get(version=new)
    assert score.state == "queued"

    with embedded_worker(["celery"]):
        wait_for(
            lambda: (
                not BenchmarkScore.objects.for_workspace(workspace)
                .filter(state__in=["queued", "running"])
                .exists()
            ),
            timeout=120,
            what="the benchmark scores",
        )
    states = list(BenchmarkScore.objects.for_workspace(workspace).values_list("state", "detail"))
    assert all(state == "done" for state, _ in states), states

    listed = client.get(f"{base}/benchmark-scores/", {"version": new.pk}).json()
    assert len(listed["results"]) == 1
    metrics = listed["results"][0]["metrics"]
    # The same numbers computed here from the bundle and the set's rows.
    bundle = registry.load_version(new)
    table = pq.read_table(dataset_file(scene.dataset))
    columns = {f.column: table.column(f.column).to_pylist() for f in bundle.spec.features}
    prob = bundle.predict(columns, table.num_rows)
    label = np.asarray(table.column("clicked").to_pylist(), dtype=float)
    assert metrics["rows"] == table.num_rows
    assert metrics["auc"] == pytest.approx(roc_auc_score(label, prob), abs=1e-9)
    assert metrics["logloss"] == pytest.approx(
        log_loss(label, np.clip(prob, 1e-7, 1 - 1e-7)), abs=1e-4
    )
    assert 0 < metrics["ndcg"] <= 1
    assert metrics["ndcg_groups"] > 0
    production = BenchmarkScore.objects.for_workspace(workspace).get(version=made[0])
    assert production.state == "done"
    assert (
        Event.objects.filter(workspace=workspace, verb="serving.benchmark_score.done").count() == 3
    )

    # The version page: this version's scores beside production's on the same rows.
    client.force_login(actor)
    page = client.get(f"/w/{workspace.slug}/models/ranker/v3/").content.decode()
    assert 'data-testid="benchmark-clicks-holdout"' in page
    assert "Production main (v1)" in page
    assert f"{metrics['auc']:.4f}" in page
    assert f"{production.metrics['auc']:.4f}" in page
    view = benchmarks.version_benchmarks(new)
    auc_row = next(r for r in view["sets"][0]["rows"] if r["metric"] == "auc")
    assert auc_row["production"][0]["delta"] == pytest.approx(
        metrics["auc"] - production.metrics["auc"]
    )
    # The set's page ranks the three scored versions.
    board = client.get(f"/w/{workspace.slug}/benchmarks/clicks-holdout/").content.decode()
    assert board.count('data-version="ranker-v') == 3


@pytest.mark.django_db
def test_bad_inputs_are_refused_naming_the_field(workspace, other_workspace, members, client_for):
    actor = members[Role.MAINTAINER]
    scene, _, _ = deployed(workspace, actor, versions=1)
    client = client_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/benchmarks/"

    def post(body):
        return client.post(url, body, format="json")

    missing = post({"name": "b"})
    assert missing.status_code == 400 and missing.json()["attr"] == "dataset_id"
    label = post({"name": "b", "dataset_id": scene.dataset.pk, "label_column": "nope"})
    assert label.status_code == 400 and label.json()["attr"] == "label_column"
    assert "clicked" in label.json()["detail"]  # the message lists the columns there are
    group = post({"name": "b", "dataset_id": scene.dataset.pk, "group_column": "nope"})
    assert group.status_code == 400 and group.json()["attr"] == "group_column"
    k = post({"name": "b", "dataset_id": scene.dataset.pk, "ndcg_k": 0})
    assert k.status_code == 400 and k.json()["attr"] == "ndcg_k"
    name = post({"name": "Bad Name", "dataset_id": scene.dataset.pk})
    assert name.status_code == 400 and name.json()["attr"] == "name"
    # Another workspace's dataset is not found, as if it did not exist.
    from serving.tests.factories import make_scene

    theirs = make_scene(other_workspace, None)
    foreign = post({"name": "b", "dataset_id": theirs.dataset.pk})
    assert foreign.status_code == 404 and foreign.json()["attr"] == "dataset_id"
    assert not BenchmarkSet.objects.for_workspace(workspace).exists()  # nothing half-written

    ok = post({"name": "b", "dataset_id": scene.dataset.pk})
    assert ok.status_code == 201
    again = post({"name": "b", "dataset_id": scene.dataset.pk})
    assert again.json()["version"] == 2
    # Other workspaces' sets and scores are 404 by URL; a viewer may read but not create.
    other_client = client_for(members[Role.VIEWER])
    assert other_client.get(f"{url}{ok.json()['id']}/").status_code == 200
    assert (
        other_client.post(
            url, {"name": "c", "dataset_id": scene.dataset.pk}, format="json"
        ).status_code
        == 403
    )
    assert client.get(f"/api/v1/workspaces/{other_workspace.slug}/benchmarks/").status_code == 404
    scores = f"/api/v1/workspaces/{workspace.slug}/benchmark-scores/"
    assert client.get(scores, {"version": "x"}).status_code == 400
    score = BenchmarkScore.objects.for_workspace(workspace).first()
    assert client.post(f"{scores}{score.pk}/rescore/").status_code == 409  # still queued


@pytest.mark.django_db
def test_the_pages_show_the_empty_state_and_the_form_errors(workspace, members, client):
    actor = members[Role.DEVELOPER]
    client.force_login(actor)
    page = client.get(f"/w/{workspace.slug}/benchmarks/").content.decode()
    assert 'data-testid="benchmarks-empty"' in page
    assert "No ready dataset or record set yet" in page
    bad = client.post(
        f"/w/{workspace.slug}/benchmarks/new/",
        {"name": "b", "source": "dataset:999999", "ndcg_k": 10, "max_new_tokens": 64},
    )
    assert bad.status_code == 400
    assert "Not one of the choices" in bad.content.decode()


@pytest.mark.django_db
def test_a_language_version_is_scored_on_a_language_set(workspace, members, settings, tmp_path):
    """Exact match, token F1, ROUGE-L and perplexity of a registered LoRA version, checked
    against generation and a loss computed here with transformers' own code."""
    import math

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.tests.test_review import make_lm_versions, upload_prompts
    from training.lm import IGNORE_INDEX, segments

    actor = members[Role.DEVELOPER]
    _first, second = make_lm_versions(workspace, settings, tmp_path, name="chat")
    prompts = upload_prompts(workspace, actor, name="qa", rows=12)
    made = benchmarks.benchmark_set_create(
        actor=actor, workspace=workspace, name="qa", record_set=prompts, max_new_tokens=8
    )
    assert made.kind == "language" and made.rows == 12
    # The model's newest version is asked for, not the older one.
    score = BenchmarkScore.objects.for_workspace(workspace).get()
    assert score.version == second
    assert benchmarks.benchmark_score_run(score.pk) == "done"  # what the worker runs
    assert benchmarks.benchmark_score_run(score.pk) == "done"  # a redelivery does nothing again
    score.refresh_from_db()
    metrics = score.metrics

    base = AutoModelForCausalLM.from_pretrained(second.spec["extra"]["base_model_path"])
    folder = registry.artifacts.resolve_artifact(second.artifact_path)
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    rows = pq.read_table(benchmarks._source_path(made)).to_pylist()
    outputs, total, tokens = [], 0.0, 0
    import torch

    for row in rows:
        pieces = segments(row)
        prompt = "".join(text for text, counted in pieces if not counted)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=8,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        outputs.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
        answer = tokenizer(row["output"], add_special_tokens=False)["input_ids"]
        full = ids[0].tolist() + answer + [tokenizer.eos_token_id]
        labels = [IGNORE_INDEX] * ids.shape[1] + answer + [tokenizer.eos_token_id]
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([full]), labels=torch.tensor([labels])).loss
        total += float(loss) * (len(answer) + 1)
        tokens += len(answer) + 1
    references = [row["output"] for row in rows]
    assert metrics["rows"] == 12
    assert metrics["rouge_l"] == pytest.approx(
        np.mean([benchmarks.rouge_l(o, r) for o, r in zip(outputs, references, strict=True)])
    )
    assert metrics["token_f1"] == pytest.approx(
        np.mean([benchmarks.token_f1(o, r) for o, r in zip(outputs, references, strict=True)])
    )
    assert metrics["perplexity"] == pytest.approx(math.exp(total / tokens), rel=1e-4)
    assert [e["output"] for e in metrics["examples"]] == [o[:300] for o in outputs[:3]]

    # A ranking model is not scored on a language set; a new language version is, unasked.
    from pathlib import Path

    from serving.tests.test_review import save_adapter

    folder = save_adapter(
        Path(second.spec["extra"]["base_model_path"]),
        Path(settings.ARTIFACT_ROOT) / "jobs" / "chat-third" / "model",
        seed=9,
    )
    third = registry.model_version_register(
        actor=None, workspace=workspace, name="chat", bundle_path=folder
    )
    assert BenchmarkScore.objects.for_workspace(workspace).get(version=third).state == "queued"
