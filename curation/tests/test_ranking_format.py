"""The ``format`` stage's ``ranking`` target: raw rows (ratings, numbers, text, a time) become a
ranking sample that a ranking template trains on through a node agent, and what it cannot use
is refused naming the field."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from curation import services, stages
from curation.models import RecordSetStatus
from training import agent
from training.models import JobState, TrainingJob
from training.tests.factories import make_node, place
from workspaces.models import Role
from workspaces.testing.factories import make_member


def ratings(n: int = 1200, seed: int = 0) -> pa.Table:
    """Ratings 1-5 driven by ``score`` and ``genre``, a tenth of them missing."""
    rng = np.random.default_rng(seed)
    score = rng.normal(size=n)
    genre = rng.choice(["drama", "comedy", "horror"], n)
    noise = rng.normal(scale=0.5, size=n)
    stars = np.clip(np.round(3 + score + (genre == "comedy") - (genre == "horror") + noise), 1, 5)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            "when": pa.array([start + timedelta(minutes=i) for i in range(n)], pa.timestamp("us")),
            "stars": pa.array([None if i % 10 == 0 else int(s) for i, s in enumerate(stars)]),
            "score": pa.array(score),
            "genre": pa.array(genre.tolist()),
            "vip": pa.array((rng.random(n) < 0.3).tolist()),
            "note": pa.array([[1, 2]] * n),
        }
    )


RANKING = {
    "kind": "format",
    "to": "ranking",
    "label": "stars",
    "positive_at_least": 4,
    "features": ["score", "genre", "vip"],
    "event_time": "when",
}


def test_the_ranking_format_makes_a_labelled_sample_and_reports_rows_without_a_label():
    table = ratings()
    [stage] = stages.validate([RANKING], table.schema)
    out, [report] = stages.run(table, [stage])
    assert out.schema.names == ["event_time", "label", "score", "genre", "vip"]
    assert out.schema == stages._output_schema(stage, table.schema)
    assert out.num_rows == report.rows_out == 1080 and report.removed == {"label_missing": 120}
    kept = [s for s in table.column("stars").to_pylist() if s is not None]
    assert out.column("label").to_pylist() == [int(s >= 4) for s in kept]
    assert report.changed["positive"] == sum(s >= 4 for s in kept)
    assert report.examples["label_missing"][0]["stars"] is None
    # examples are stored as JSON: the times as ISO 8601
    stored = json.loads(json.dumps(report.as_dict()))
    assert stored["examples"]["formatted"][0]["event_time"].startswith("2026-01-01T00:01:00")
    # a boolean label is taken as it is
    flags = pa.table({"clicked": [True, False, None], "x": [1.0, 2.0, 3.0]})
    spec = {"kind": "format", "to": "ranking", "label": "clicked", "features": ["x"]}
    done, _ = stages.run(flags, stages.validate([spec], flags.schema))
    assert done.to_pydict() == {"label": [1, 0], "x": [1.0, 2.0]}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"label": "genre"}, "stages[0].label", "a label is a boolean or a number"),
        ({"label": "nope"}, "stages[0].label", "not a column"),
        ({"features": []}, "stages[0].features", "distinct column names"),
        ({"features": ["score", "score"]}, "stages[0].features", "distinct"),
        ({"features": ["note"]}, "stages[0].features[0]", "a number, a boolean or text"),
        ({"features": ["stars"]}, "stages[0].features[0]", "the label or the time"),
        ({"event_time": "score"}, "stages[0].event_time", "not a timestamp"),
        ({"positive_at_least": "4"}, "stages[0].positive_at_least", "must be a number"),
        ({"weights": [1]}, "stages[0].weights", "allowed: "),
    ],
)
def test_what_the_ranking_format_cannot_use_is_refused_naming_the_field(change, field, words):
    with pytest.raises(stages.StageError) as refused:
        stages.validate([{**RANKING, **change}], ratings(20).schema)
    assert refused.value.path == field and words in refused.value.message


def _upload(workspace, table: pa.Table, name: str):
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return services.record_set_upload(
        actor=None,
        workspace=workspace,
        name=name,
        content=sink.getvalue().to_pybytes(),
        fmt="parquet",
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_a_ranking_sample_from_a_pipeline_trains_a_ranking_template_on_a_node_agent(
    workspace, client_for, settings, tmp_path
):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    raw = _upload(workspace, ratings(3000, seed=1).drop_columns(["note"]), "ratings_raw")
    sample = services.pipeline_run(
        actor=None,
        workspace=workspace,
        source=raw,
        name="ratings_sample",
        stages=[RANKING],
        background=False,
    )
    assert sample.status == RecordSetStatus.READY, sample.error
    assert services.ranking_features(sample) == [
        ("score", "float"),
        ("genre", "categorical"),
        ("vip", "bool"),
    ]

    client = client_for(make_member(workspace, Role.DEVELOPER))
    jobs = f"/api/v1/workspaces/{workspace.slug}/training-jobs/"
    created = client.post(
        jobs,
        {"name": "stars", "template": "logreg", "record_set": sample.pk, "params": {"epochs": 5}},
        format="json",
    )
    assert created.status_code == 201, created.content
    # raw rows are not a ranking sample: refused naming the record set and what makes one
    refused = client.post(
        jobs, {"name": "raw", "template": "logreg", "record_set": raw.pk}, format="json"
    )
    assert refused.status_code == 400 and refused.json()["attr"] == "record_set"
    assert "to: ranking" in json.dumps(refused.json())

    job = TrainingJob.objects.for_workspace(workspace).get(pk=created.json()["id"])
    place(job, make_node())
    assert agent.execute_job(job.pk) == JobState.SUCCEEDED
    job.refresh_from_db()
    # the ratings follow score and genre: the model ranks held-out rows well
    assert job.metrics["holdout"]["auc"] > 0.8, job.metrics["holdout"]
    assert job.metrics["holdout"]["rows"] == 540  # the newest 20% of the 2,700 labelled rows


@pytest.mark.django_db
def test_the_new_job_page_trains_on_a_picked_record_set(
    client, workspace, other_workspace, settings, tmp_path
):
    from django.urls import reverse

    from training.tests.factories import make_demo_dataset
    from training.tests.test_forms import _job_post

    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    dataset = make_demo_dataset(workspace, scale=0.01)
    raw = _upload(workspace, ratings(200).drop_columns(["note"]), "ratings_raw")
    sample = services.pipeline_run(
        actor=None, workspace=workspace, source=raw, name="sample", stages=[RANKING],
        background=False,
    )  # fmt: skip
    theirs = _upload(other_workspace, ratings(50).drop_columns(["note"]), "theirs")
    client.force_login(make_member(workspace, Role.DEVELOPER))
    url = reverse("training-job-new", kwargs={"ws": workspace.slug})
    page = client.get(url).content.decode()
    assert f'<option value="{sample.pk}">sample v1</option>' in page
    assert 'value="template:lm_lora"' in page  # record sets are here: lm_lora is offered

    foreign = client.post(url, _job_post(dataset, record_set=str(theirs.pk)))
    assert foreign.status_code == 400
    assert f"use one of: {raw.pk}, {sample.pk}" in " ".join(
        foreign.context["form"].errors["record_set"]
    )
    unusable = client.post(url, _job_post(dataset, record_set=str(raw.pk)))
    assert unusable.status_code == 400
    assert "to: ranking" in " ".join(unusable.context["form"].errors["record_set"])
    assert not TrainingJob.objects.unscoped().exists()

    created = client.post(url, _job_post(dataset, record_set=str(sample.pk)))
    assert created.status_code == 302, created.context["form"].errors
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert (job.record_set_id, job.dataset_id, job.template) == (sample.pk, None, "logreg")
