"""The annotation workbench: schemas and their checks, assignment that never shows an annotator an
item twice, disagreement to a reviewer, agreement against the libraries' own computation, export
as a record set with lineage, through the API and the pages."""

from __future__ import annotations

import io
import json

import krippendorff
import numpy as np
import pyarrow.parquet as pq
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

from curation import annotation
from curation.annotation import SchemaError, validate_schema, validate_values
from lineage.projection import project
from workspaces.models import Role
from workspaces.testing.factories import make_member

SCHEMA = {
    "fields": [
        {"name": "sentiment", "kind": "choice", "options": ["pos", "neu", "neg"], "required": True},
        {"name": "topics", "kind": "multi_choice", "options": ["price", "delivery"]},
        {"name": "quality", "kind": "rating", "min": 1, "max": 5},
        {"name": "note", "kind": "text", "max_length": 50},
        {"name": "entities", "kind": "spans", "labels": ["brand", "place"]},
    ]
}


@pytest.mark.parametrize(
    ("schema", "path", "words"),
    [
        ({"fields": []}, "schema.fields", "1 to 20"),
        ({"fields": [{"name": "x", "kind": "slider"}]}, "schema.fields[0].kind", "allowed: choice"),
        (
            {"fields": [{"name": "x", "kind": "choice", "options": ["a"]}]},
            "schema.fields[0].options",
            "2 to 30",
        ),
        ({"fields": [{"name": "X y", "kind": "text"}]}, "schema.fields[0].name", "lowercase"),
        (
            {"fields": [{"name": "x", "kind": "rating", "min": 1, "max": 30}]},
            "schema.fields[0].max",
            "1 to 10",
        ),
        (
            {"fields": [{"name": "x", "kind": "text", "options": ["a", "b"]}]},
            "schema.fields[0].options",
            "allowed: help",
        ),
        (
            {"fields": [{"name": "x", "kind": "text"}, {"name": "x", "kind": "text"}]},
            "schema.fields[1].name",
            "twice",
        ),
        (
            {"fields": [{"name": "x", "kind": "text", "required": "yes"}]},
            "schema.fields[0].required",
            "true or false",
        ),
    ],
)
def test_a_bad_schema_is_refused_naming_the_field(schema, path, words):
    with pytest.raises(SchemaError) as caught:
        validate_schema(schema)
    assert caught.value.path == path and words in caught.value.message


def test_submissions_are_checked_against_the_schema_required_fields_included():
    schema = validate_schema(SCHEMA)
    good = validate_values(
        schema,
        {
            "sentiment": "pos",
            "topics": ["delivery", "price", "price"],
            "quality": "4",
            "entities": [
                {"start": 5, "end": 9, "label": "place"},
                {"start": 0, "end": 4, "label": "brand"},
            ],
        },
        text_length=20,
    )
    assert good == {
        "sentiment": "pos",
        "topics": ["price", "delivery"],
        "quality": 4,
        "entities": [
            {"start": 0, "end": 4, "label": "brand"},
            {"start": 5, "end": 9, "label": "place"},
        ],
    }
    for values, path, words in [
        ({"topics": ["price"]}, "values.sentiment", "required"),
        ({"sentiment": ""}, "values.sentiment", "required"),
        ({"sentiment": "meh"}, "values.sentiment", "allowed: pos, neu, neg"),
        ({"sentiment": "pos", "quality": 9}, "values.quality", "1 to 5"),
        ({"sentiment": "pos", "note": "x" * 51}, "values.note", "at most 50"),
        ({"sentiment": "pos", "mood": "x"}, "values.mood", "the fields are"),
        (
            {"sentiment": "pos", "entities": [{"start": 3, "end": 30, "label": "brand"}]},
            "values.entities[0]",
            "within the text",
        ),
        (
            {"sentiment": "pos", "entities": [{"start": 0, "end": 3, "label": "person"}]},
            "values.entities[0].label",
            "allowed: brand, place",
        ),
    ]:
        with pytest.raises(SchemaError) as caught:
            validate_values(schema, values, text_length=20)
        assert caught.value.path == path and words in caught.value.message, values


def test_shortcut_keys_run_across_the_fields_in_order():
    keys = annotation.shortcuts(validate_schema(SCHEMA))
    assert keys["sentiment"] == [("1", "pos"), ("2", "neu"), ("3", "neg")]
    assert keys["topics"] == [("4", "price"), ("5", "delivery")]
    assert [k for k, _ in keys["quality"]] == ["6", "7", "8", "9", "a"]
    assert keys["note"] == [] and keys["entities"] == []


def test_agreement_equals_the_libraries_on_the_same_labels():
    schema = validate_schema(
        {
            "fields": [
                {"name": "c", "kind": "choice", "options": ["x", "y", "z"]},
                {"name": "r", "kind": "rating", "min": 1, "max": 5},
            ]
        }
    )
    rng = np.random.default_rng(4)
    people = ["ann", "bob", "cat"]
    truth = rng.integers(0, 3, 30)
    labels, matrix_c, matrix_r = [], np.full((3, 30), np.nan), np.full((3, 30), np.nan)
    for item in range(30):
        for p, person in enumerate(people):
            if item % 7 == 0 and person == "cat":
                continue  # some items have two labels only
            c = int(truth[item]) if rng.random() < 0.7 else int(rng.integers(0, 3))
            r = int(np.clip(truth[item] + 1 + rng.integers(-1, 2), 1, 5))
            labels.append((item, person, {"c": "xyz"[c], "r": r}))
            matrix_c[p, item], matrix_r[p, item] = c, r
    finals = {item: {"c": "xyz"[int(truth[item])], "r": int(truth[item]) + 1} for item in range(30)}
    found = annotation.agreement(schema, labels, finals, k=3)
    choice, rating = found["fields"]
    pairs = []
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        both = ~np.isnan(matrix_c[a]) & ~np.isnan(matrix_c[b])
        pairs.append(cohen_kappa_score(matrix_c[a][both], matrix_c[b][both], labels=[0, 1, 2]))
    assert choice["cohen_kappa"] == pytest.approx(np.mean(pairs))
    complete = ~np.isnan(matrix_c).any(axis=0)
    counts, _ = aggregate_raters(matrix_c[:, complete].T.astype(int), n_cat=3)
    assert choice["fleiss_kappa"] == pytest.approx(fleiss_kappa(counts))
    assert choice["fleiss_items"] == int(complete.sum()) == 25
    assert choice["krippendorff_alpha"] == pytest.approx(
        krippendorff.alpha(reliability_data=matrix_c, level_of_measurement="nominal")
    )
    assert rating["krippendorff_alpha"] == pytest.approx(
        krippendorff.alpha(reliability_data=matrix_r, level_of_measurement="interval")
    )
    ann = next(a for a in found["annotators"] if a["annotator"] == "ann")
    mine = [(v["c"], finals[i]["c"]) for i, who, v in labels if who == "ann"]
    assert ann["c_matches_final"] == pytest.approx(np.mean([x == y for x, y in mine]))
    assert ann["c_kappa_vs_final"] == pytest.approx(cohen_kappa_score(*zip(*mine, strict=True)))


# --- through the API ----------------------------------------------------------------------------

API = "/api/v1/workspaces/{ws}"
ROWS = [
    {"text": f"Review number {i}: the parcel from Acme arrived in Paris", "id": i} for i in range(6)
]


@pytest.fixture
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


@pytest.fixture
def source(db, artifact_root, workspace, members, client_for):
    developer = client_for(members[Role.DEVELOPER])
    body = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    response = developer.post(
        API.format(ws=workspace.slug) + "/record-sets/",
        {"name": "reviews", "file": SimpleUploadedFile("r.jsonl", body)},
        format="multipart",
    )
    return response.json()


def create_task(client, workspace, source, **change):
    body = {
        "name": "sentiment",
        "record_set": source["id"],
        "text_field": "text",
        "schema": SCHEMA,
        "annotators_per_item": 2,
        **change,
    }
    return client.post(API.format(ws=workspace.slug) + "/annotation-tasks/", body, format="json")


@pytest.mark.django_db
def test_two_annotators_label_a_reviewer_settles_the_disputes_and_the_labels_export(
    workspace, members, client_for, source
):
    ann, bob = (make_member(workspace, Role.VIEWER, username=n) for n in ("ann", "bob"))
    developer = client_for(members[Role.DEVELOPER])
    response = create_task(developer, workspace, source, annotators=["ann", "bob"])
    assert response.status_code == 201, response.content
    task_url = response["Location"]
    assert response.json()["item_count"] == 6
    clients = {"ann": client_for(ann), "bob": client_for(bob)}
    seen: dict[str, list[int]] = {"ann": [], "bob": []}
    for who in ("ann", "bob"):
        while True:
            item = clients[who].get(task_url + "next/").json()["item"]
            if item is None:
                break
            position = item["position"]
            seen[who].append(position)
            sentiment = "neg" if who == "bob" and position % 3 == 0 else "pos"
            labelled = clients[who].post(
                f"{task_url}items/{position}/labels/",
                {"values": {"sentiment": sentiment, "quality": 4, "note": f"{who} was here"}},
                format="json",
            )
            assert labelled.status_code == 201, labelled.content
    # each saw each item once, and never the same item twice
    assert sorted(seen["ann"]) == sorted(seen["bob"]) == list(range(6))
    again = clients["ann"].post(
        f"{task_url}items/0/labels/", {"values": {"sentiment": "pos"}}, format="json"
    )
    assert (again.status_code, again.json()["attr"]) == (409, "item")
    # a third person may not label (the task names its annotators); a developer may not review
    outsider = developer.post(
        f"{task_url}items/1/labels/", {"values": {"sentiment": "pos"}}, format="json"
    )
    assert outsider.status_code == 403
    detail = developer.get(task_url).json()
    assert detail["progress"]["by_status"] == {"open": 0, "agreed": 4, "disputed": 2, "resolved": 0}
    disputed = developer.get(task_url + "items/", {"status": "disputed"}).json()
    assert [i["position"] for i in disputed["results"]] == [0, 3] and "labels" not in disputed[
        "results"
    ][0]
    assert (
        developer.post(
            f"{task_url}items/0/adjudicate/", {"values": {"sentiment": "neg"}}, format="json"
        ).status_code
        == 403
    )
    reviewer = client_for(members[Role.MAINTAINER])
    shown = reviewer.get(task_url + "items/", {"status": "disputed"}).json()["results"][0]
    assert {label["annotator"] for label in shown["labels"]} == {"ann", "bob"}
    missing = reviewer.post(
        f"{task_url}items/0/adjudicate/", {"values": {"quality": 2}}, format="json"
    )
    assert (missing.status_code, missing.json()["attr"]) == (400, "values.sentiment")
    for position in (0, 3):
        settled = reviewer.post(
            f"{task_url}items/{position}/adjudicate/",
            {"values": {"sentiment": "neg", "quality": 4}},
            format="json",
        )
        assert settled.json()["status"] == "resolved"
    agreement = developer.get(task_url + "agreement/").json()
    sentiment = next(f for f in agreement["fields"] if f["field"] == "sentiment")
    a = ["pos"] * 6
    b = ["neg" if p % 3 == 0 else "pos" for p in range(6)]
    assert sentiment["cohen_kappa"] == pytest.approx(
        cohen_kappa_score(a, b, labels=["pos", "neu", "neg"])
    )
    exported = developer.post(task_url + "export/", {"name": "reviews_labelled"}, format="json")
    assert exported.status_code == 201, exported.content
    record_set = exported.json()
    assert record_set["source"] == "annotation" and record_set["row_count"] == 6
    assert record_set["built_from"]["name"] == "reviews"
    file = developer.get(f"{API.format(ws=workspace.slug)}/record-sets/{record_set['id']}/file/")
    table = pq.read_table(io.BytesIO(b"".join(file.streaming_content)))
    assert table.column("sentiment").to_pylist() == ["neg", "pos", "pos", "neg", "pos", "pos"]
    assert table.column("id").to_pylist() == list(range(6))
    assert table.column("note").to_pylist()[1] == "ann was here"
    project()
    up = developer.get(
        f"{API.format(ws=workspace.slug)}/lineage/",
        {"node": f"record_set:{record_set['id']}", "direction": "upstream"},
    ).json()
    keys = {n["key"] for n in up["nodes"]}
    assert f"record_set:{source['id']}" in keys
    assert any(k.startswith("annotation_task:") for k in keys)


@pytest.mark.django_db
def test_task_creation_refuses_bad_input_naming_the_field(
    workspace, members, client_for, source, other_workspace
):
    developer = client_for(members[Role.DEVELOPER])
    bad_schema = create_task(
        developer, workspace, source, schema={"fields": [{"name": "x", "kind": "slider"}]}
    )
    assert (bad_schema.status_code, bad_schema.json()["attr"]) == (400, "schema.fields[0].kind")
    bad_column = create_task(developer, workspace, source, text_field="body")
    assert (
        bad_column.json()["attr"] == "text_field"
        and "the columns are text, id" in bad_column.json()["detail"]
    )
    stranger = create_task(developer, workspace, source, annotators=["nobody_here"])
    assert stranger.json()["attr"] == "annotators"
    assert create_task(developer, workspace, source).status_code == 201
    again = create_task(developer, workspace, source)
    assert (again.status_code, again.json()["attr"]) == (409, "name")
    # another workspace's record set is not found, as one that exists nowhere
    visitor = client_for(make_member(other_workspace, Role.DEVELOPER))
    response = visitor.post(
        API.format(ws=other_workspace.slug) + "/annotation-tasks/",
        {"name": "x", "record_set": source["id"], "text_field": "text", "schema": SCHEMA},
        format="json",
    )
    assert (response.status_code, response.json()["attr"]) == (404, "record_set")
    assert (
        visitor.get(
            API.format(ws=other_workspace.slug) + "/annotation-tasks/sentiment/"
        ).status_code
        == 404
    )


@pytest.mark.django_db
def test_the_label_form_refuses_a_submission_without_a_required_field(
    workspace, members, client, source
):
    from curation import services
    from curation.models import AnnotationTask, RecordSet

    services.annotation_task_create(
        actor=None,
        workspace=workspace,
        name="sentiment",
        source=RecordSet.objects.for_workspace(workspace).get(pk=source["id"]),
        text_field="text",
        schema=SCHEMA,
    )
    client.force_login(members[Role.DEVELOPER])
    url = f"/w/{workspace.slug}/data/tasks/sentiment/label/"
    page = client.get(url).content.decode()
    assert "Review number 0" in page and "<kbd>1</kbd> pos" in page
    refused = client.post(url, {"position": "0", "f_quality": "3"})
    assert refused.status_code == 400
    assert 'data-field="sentiment">is required' in refused.content.decode()
    assert (
        not AnnotationTask.objects.for_workspace(workspace)
        .get()
        .items.filter(label_count__gt=0)
        .exists()
    )
    spans = json.dumps([{"start": 0, "end": 6, "label": "brand"}])
    done = client.post(
        url, {"position": "0", "f_sentiment": "neu", "f_topics": ["price"], "f_entities": spans}
    )
    assert done.status_code == 302
    item = AnnotationTask.objects.for_workspace(workspace).get().items.get(position=0)
    assert item.label_count == 1 and item.labels.get().values["entities"][0]["label"] == "brand"
    assert "Review number 1" in client.get(url).content.decode()  # the next one
    client.force_login(members[Role.VIEWER])
    assert client.get(url).status_code == 403


@pytest.mark.django_db
def test_exported_labels_formatted_as_instructions_are_a_record_set_an_lm_job_accepts(
    workspace, members, client_for, source, settings, tmp_path
):
    from curation import services
    from curation.models import RecordSet
    from training.tests.test_lm_lora import instruction_rows, save_tiny_model

    settings.TRAINING_BASE_MODEL_ROOTS = [tmp_path / "base_models"]
    base = save_tiny_model(tmp_path / "base_models" / "tiny", instruction_rows(20))
    developer = members[Role.DEVELOPER]
    client = client_for(developer)
    task_url = create_task(client, workspace, source, annotators_per_item=1).json()["name"]
    task_url = f"{API.format(ws=workspace.slug)}/annotation-tasks/{task_url}/"
    for position in range(6):
        labelled = client.post(
            f"{task_url}items/{position}/labels/",
            {"values": {"sentiment": "neg" if position % 2 else "pos"}},
            format="json",
        )
        assert labelled.json()["status"] == "agreed"
    exported = client.post(task_url + "export/", {"name": "reviews_labelled"}, format="json").json()
    jobs = f"{API.format(ws=workspace.slug)}/training-jobs/"

    def lm_job(record_set_id: int):
        body = {
            "name": f"sentiment-lm-{record_set_id}",
            "template": "lm_lora",
            "record_set": record_set_id,
            "params": {"base_model_path": str(base)},
        }
        return client.post(jobs, body, format="json")

    # as exported (the source's columns and the labels) it is not instructions yet
    refused = lm_job(exported["id"])
    assert (refused.status_code, refused.json()["attr"]) == (400, "record_set")
    formatted = services.pipeline_run(
        actor=developer,
        workspace=workspace,
        source=RecordSet.objects.for_workspace(workspace).get(pk=exported["id"]),
        name="sentiment_sft",
        stages=[
            {"kind": "format", "to": "instruction", "instruction": "text", "output": "sentiment"}
        ],
        background=False,
    )
    assert formatted.status == "ready" and formatted.row_count == 6
    accepted = lm_job(formatted.pk)
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["record_set"] == formatted.pk
