"""From raw records to a fine-tuned language model on real workers: a pipeline (filter, scrub,
dedup, format) built by the platform's Celery worker, then an ``lm_lora`` job on its output
through the scheduler and a node agent; the lineage graph puts the raw records upstream of the
job that made the model and of the model version registered from it."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from curation.models import RecordSet, RecordSetStatus
from lineage.projection import project
from training.models import JobState, TrainingJob
from training.tests.test_lm_lora import FAST_LM, OBJECTS, instruction_rows, save_tiny_model
from training.tests.workers import node_worker, wait_for
from workspaces.models import Role
from workspaces.testing.factories import make_member

API = "/api/v1/workspaces/{ws}"


def raw_rows() -> list[dict[str, str]]:
    """60 distinct questions with an e-mail address in each answer, 20 copies of some of them
    in other case and spacing, and 10 rows too short to keep."""
    things = sorted(OBJECTS)
    rows = [
        {
            "question": f"what color is the {things[i % len(things)]} ? ( {i} )",
            "answer": f"the {things[i % len(things)]} is {OBJECTS[things[i % len(things)]]} . "
            f"ask ann{i}@example.com",
        }
        for i in range(60)
    ]
    copies = [{**rows[i], "question": "  " + rows[i]["question"].upper()} for i in range(0, 40, 2)]
    junk = [{"question": "ok", "answer": "fine"} for _ in range(10)]
    return rows + copies + junk


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_raw_records_are_cleaned_on_a_worker_and_fine_tune_a_model_with_lineage(
    workspace, client_for, settings, tmp_path
):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.TRAINING_BASE_MODEL_ROOTS = [tmp_path / "base_models"]
    base = save_tiny_model(tmp_path / "base_models" / "tiny-gpt2", instruction_rows())
    developer = make_member(workspace, Role.DEVELOPER)
    client = client_for(developer)
    ws = API.format(ws=workspace.slug)
    from django.core.files.uploadedfile import SimpleUploadedFile

    body = "".join(json.dumps(r) + "\n" for r in raw_rows()).encode()
    raw = client.post(
        f"{ws}/record-sets/",
        {"name": "support_raw", "file": SimpleUploadedFile("raw.jsonl", body)},
        format="multipart",
    ).json()
    assert raw["row_count"] == 90
    stages = [
        {"kind": "filter", "field": "question", "rules": [{"rule": "min_words", "value": 3}]},
        {"kind": "scrub", "fields": ["answer"], "patterns": ["email"]},
        {"kind": "dedup", "field": "question", "threshold": 0.8},
        {"kind": "format", "to": "instruction", "instruction": "question", "output": "answer"},
    ]
    with node_worker("cur", platform=True):  # also consumes the default queue (pipelines)
        response = client.post(
            f"{ws}/record-sets/{raw['id']}/pipeline/", {"name": "support_sft", "stages": stages},
            format="json",
        )  # fmt: skip
        assert response.status_code == 202, response.content
        built = wait_for(
            lambda: (
                RecordSet.objects.unscoped()
                .filter(pk=response.json()["id"], status=RecordSetStatus.READY)
                .first()
            ),
            timeout=60,
            what="the pipeline's record set",
        )
        assert built.row_count == 60
        assert [(r["kind"], r["rows_out"]) for r in built.reports] == [
            ("filter", 80),
            ("scrub", 80),
            ("dedup", 60),
            ("format", 60),
        ]
        job = client.post(
            f"{ws}/training-jobs/",
            {
                "name": "support-lora",
                "template": "lm_lora",
                "record_set": built.pk,
                "params": {**FAST_LM, "epochs": 1, "base_model_path": str(base)},
            },
            format="json",
        )
        assert job.status_code == 201, job.content
        done = wait_for(
            lambda: TrainingJob.objects.unscoped().filter(pk=job.json()["id"]).first().is_terminal,
            timeout=180,
            what="the lm_lora job",
            tick=True,
        )
    assert done
    trained = TrainingJob.objects.for_workspace(workspace).get(pk=job.json()["id"])
    assert trained.state == JobState.SUCCEEDED, trained.state_reason
    assert "<EMAIL>" in json.dumps(client.get(f"{ws}/record-sets/{built.pk}/rows/").json())

    project()
    up = client.get(
        f"{ws}/lineage/",
        {"node": f"training_job:{trained.pk}", "direction": "upstream", "depth": 6},
    ).json()
    keys = {n["key"] for n in up["nodes"]}
    assert {f"record_set:{built.pk}", f"record_set:{raw['id']}"} <= keys

    # The adapter is a model version in the registry: its files are the adapter, its config and
    # the tokenizer, and the raw records are upstream of the version in the lineage graph.
    registered = client.post(
        f"{ws}/model-versions/", {"model": "support-lm", "job_id": trained.pk}, format="json"
    )
    assert registered.status_code == 201, registered.content
    version = registered.json()
    files = {f["name"] for f in version["artifacts"]}
    assert {"spec.json", "adapter_model.safetensors", "adapter_config.json"} <= files
    assert "tokenizer_config.json" in files
    project()
    up = client.get(
        f"{ws}/lineage/",
        {"node": f"model_version:{version['id']}", "direction": "upstream", "depth": 8},
    ).json()
    assert f"record_set:{raw['id']}" in {n["key"] for n in up["nodes"]}
    # the ranking gateway does not serve a language model: refused naming the version
    maintainer = client_for(make_member(workspace, Role.MAINTAINER))
    refused = maintainer.post(
        f"{ws}/deployments/", {"name": "support-lm", "version_id": version["id"]}, format="json"
    )
    assert refused.status_code == 409, refused.content
    assert "language model" in refused.content.decode()
    browser = Client()
    browser.force_login(developer)
    page = browser.get(f"/w/{workspace.slug}/models/support-lm/v{version['version']}/")
    assert page.status_code == 200
    assert "adapter_config.json" in page.content.decode()
