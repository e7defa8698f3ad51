"""Record sets through the REST API and the pages: upload, a pipeline built on a worker with a
report per stage, errors that name the field, isolation and the lineage it leaves."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from curation.models import RecordSet, RecordSetStatus
from lineage.projection import project
from workspaces.models import Event, Role

pytestmark = pytest.mark.django_db
API = "/api/v1/workspaces/{ws}/record-sets/"

RAW = [
    {
        "prompt": "How do I reset my password?",
        "answer": "Mail help@example.com or call 555 123 4567.",
    },
    {
        "prompt": "How do I reset my password?",
        "answer": "Mail help@example.com or call 555 123 4567.",
    },
    {"prompt": "ok", "answer": "fine"},
    {
        "prompt": "What does the ranking model predict for a new item today?",
        "answer": "A click rate.",
    },
]


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


@pytest.fixture
def developer(members, client_for):
    return client_for(members[Role.DEVELOPER])


def upload(client, workspace, name="raw", content=None, filename="raw.jsonl", **extra):
    return client.post(
        API.format(ws=workspace.slug),
        {"name": name, "file": SimpleUploadedFile(filename, content or jsonl(RAW)), **extra},
        format="multipart",
    )


PIPELINE = [
    {"kind": "filter", "field": "prompt", "rules": [{"rule": "min_words", "value": 3}]},
    {"kind": "scrub", "fields": ["answer"], "patterns": ["email", "phone"]},
    {"kind": "dedup", "field": "prompt"},
    {"kind": "format", "to": "instruction", "instruction": "prompt", "output": "answer"},
]


def test_upload_then_a_pipeline_builds_the_next_version_with_a_report_per_stage(
    developer, workspace, eager_celery, django_capture_on_commit_callbacks
):
    response = upload(developer, workspace)
    assert response.status_code == 201, response.content
    raw = response.json()
    assert (raw["name"], raw["version"], raw["row_count"], raw["status"]) == ("raw", 1, 4, "ready")
    assert [c["name"] for c in raw["columns"]] == ["prompt", "answer"]
    assert response["Location"].endswith(f"/record-sets/{raw['id']}/")
    with django_capture_on_commit_callbacks(execute=True):
        response = developer.post(
            f"{API.format(ws=workspace.slug)}{raw['id']}/pipeline/",
            {"name": "support_sft", "stages": PIPELINE},
            format="json",
        )
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "building"
    built = developer.get(response["Location"]).json()
    assert built["status"] == "ready", built["error"]
    assert built["built_from"] == {"id": raw["id"], "name": "raw", "version": 1}
    assert (built["stages_done"], built["stages_total"]) == (4, 4)
    assert [(r["kind"], r["rows_in"], r["rows_out"]) for r in built["reports"]] == [
        ("filter", 4, 3),
        ("scrub", 3, 3),
        ("dedup", 3, 2),
        ("format", 2, 2),
    ]
    assert built["reports"][0]["removed"] == {"min_words 3": 1}
    assert built["reports"][0]["examples"]["min_words 3"][0]["prompt"] == "ok"
    assert built["reports"][2]["removed"] == {"exact duplicate": 1, "near duplicate": 0}
    rows = developer.get(f"{API.format(ws=workspace.slug)}{built['id']}/rows/", {"limit": 5}).json()
    assert rows[0] == {
        "instruction": "How do I reset my password?",
        "input": "",
        "output": "Mail <EMAIL> or call <PHONE>.",
    }
    file = developer.get(f"{API.format(ws=workspace.slug)}{built['id']}/file/")
    assert file["Content-Type"] == "application/vnd.apache.parquet"
    assert pq.read_table(io.BytesIO(b"".join(file.streaming_content))).num_rows == 2
    # the lineage graph puts the raw records upstream of what was built from them
    project()
    up = developer.get(
        f"/api/v1/workspaces/{workspace.slug}/lineage/",
        {"node": f"record_set:{built['id']}", "direction": "upstream"},
    ).json()
    assert f"record_set:{raw['id']}" in {n["key"] for n in up["nodes"]}
    verbs = list(Event.objects.filter(workspace=workspace).values_list("verb", flat=True))
    assert {"record_set.uploaded", "record_set.created", "record_set.built"} <= set(verbs)


@pytest.mark.parametrize(
    ("content", "filename", "field", "words"),
    [
        (b"{not json\n", "bad.jsonl", "file", "not a jsonl file"),
        (b"PAR1garbage", "bad.parquet", "file", "not a parquet file"),
        (b"a,b\n1,2\n", "x.csv", None, None),  # a good CSV, for contrast
    ],
)
def test_a_file_that_does_not_parse_is_refused_naming_file(
    developer, workspace, content, filename, field, words
):
    response = upload(developer, workspace, content=content, filename=filename)
    if field is None:
        assert response.status_code == 201
        assert response.json()["row_count"] == 1
        return
    assert response.status_code == 400
    assert response.json()["attr"] == field
    assert words in response.json()["detail"]
    assert not RecordSet.objects.filter(workspace=workspace).exists()


def test_bad_names_and_stages_are_400_naming_the_field_and_nothing_is_created(developer, workspace):
    assert upload(developer, workspace, name="Bad Name").json()["attr"] == "name"
    raw = upload(developer, workspace).json()
    url = f"{API.format(ws=workspace.slug)}{raw['id']}/pipeline/"
    bad = developer.post(
        url,
        {
            "name": "out",
            "stages": [
                {"kind": "filter", "field": "prompt", "rules": [{"rule": "min_wrds", "value": 1}]}
            ],
        },
        format="json",
    )
    assert bad.status_code == 400
    assert bad.json()["attr"] == "stages[0].rules[0].rule"
    assert "allowed: min_length" in bad.json()["detail"]
    missing_column = developer.post(
        url, {"name": "out", "stages": [{"kind": "dedup", "field": "text"}]}, format="json"
    )
    assert missing_column.json()["attr"] == "stages[0].field"
    assert "the columns are prompt, answer" in missing_column.json()["detail"]
    assert developer.post(url, {"name": "out", "stages": []}, format="json").status_code == 400
    assert list(RecordSet.objects.filter(workspace=workspace).values_list("name", flat=True)) == [
        "raw"
    ]
    limit = developer.get(f"{API.format(ws=workspace.slug)}{raw['id']}/rows/", {"limit": "0"})
    assert (limit.status_code, limit.json()["attr"]) == (400, "limit")


def test_a_failed_build_records_the_error_and_the_stages_it_finished(
    developer, workspace, eager_celery, django_capture_on_commit_callbacks, monkeypatch
):
    raw = upload(developer, workspace).json()
    from curation import stages

    def broken(table, stage):
        raise RuntimeError("disk full")

    monkeypatch.setitem(stages.RUNNERS, "dedup", broken)
    with django_capture_on_commit_callbacks(execute=True):
        response = developer.post(
            f"{API.format(ws=workspace.slug)}{raw['id']}/pipeline/",
            {"name": "out", "stages": PIPELINE},
            format="json",
        )
    failed = developer.get(response["Location"]).json()
    assert failed["status"] == "failed"
    assert failed["error"] == "RuntimeError: disk full"
    assert [r["kind"] for r in failed["reports"]] == ["filter", "scrub"]
    rows = developer.get(f"{API.format(ws=workspace.slug)}{failed['id']}/rows/")
    assert rows.status_code == 409


def test_another_workspaces_record_set_is_404_and_a_pipeline_cannot_read_it(
    developer, workspace, other_workspace, members, client_for
):
    raw = upload(developer, workspace).json()
    from workspaces.testing.factories import make_member

    stranger = client_for(make_member(other_workspace, Role.DEVELOPER))
    for path in ("", "rows/", "file/"):
        assert (
            stranger.get(f"{API.format(ws=other_workspace.slug)}{raw['id']}/{path}").status_code
            == 404
        )
    response = stranger.post(
        f"{API.format(ws=other_workspace.slug)}{raw['id']}/pipeline/",
        {"name": "stolen", "stages": PIPELINE},
        format="json",
    )
    assert response.status_code == 404
    assert not RecordSet.objects.filter(workspace=other_workspace).exists()
    # a viewer reads but does not write
    viewer = client_for(members[Role.VIEWER])
    assert viewer.get(API.format(ws=workspace.slug)).json()["count"] == 1
    assert upload(viewer, workspace, name="mine").status_code == 403


def test_the_pages_upload_run_a_pipeline_and_show_each_rules_examples(
    client, members, workspace, eager_celery, django_capture_on_commit_callbacks
):
    client.force_login(members[Role.DEVELOPER])
    base = f"/w/{workspace.slug}/data/"
    empty = client.get(base)
    assert "Upload records" in empty.content.decode()
    bad = client.post(base, {"name": "raw", "file": SimpleUploadedFile("r.jsonl", b"{oops")})
    assert bad.status_code == 400 and "not a jsonl file" in bad.content.decode()
    response = client.post(base, {"name": "raw", "file": SimpleUploadedFile("r.jsonl", jsonl(RAW))})
    assert response.status_code == 302 and response["Location"] == f"{base}raw/v1/"
    page = client.get(f"{base}raw/v1/").content.decode()
    assert "How do I reset my password?" in page and "&quot;kind&quot;: &quot;dedup&quot;" in page
    wrong = client.post(f"{base}raw/v1/", {"name": "out", "stages": '[{"kind": "sort"}]'})
    assert wrong.status_code == 400
    assert "stages[0].kind: unknown kind" in wrong.content.decode()
    not_json = client.post(f"{base}raw/v1/", {"name": "out", "stages": "[{"})
    assert "not JSON" in not_json.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"{base}raw/v1/", {"name": "out", "stages": json.dumps(PIPELINE)})
    assert response["Location"] == f"{base}out/v1/"
    built = client.get(f"{base}out/v1/").content.decode()
    for shown in (
        "min_words 3",
        "exact duplicate",
        "email in answer",
        "Mail &lt;EMAIL&gt;",
        "raw v1",
    ):
        assert shown in built, shown
    assert RecordSet.objects.get(workspace=workspace, name="out").status == RecordSetStatus.READY
    assert client.get(f"{base}nope/v1/").status_code == 404


def test_chat_records_round_trip_as_lists_of_messages(
    developer, workspace, eager_celery, django_capture_on_commit_callbacks
):
    table = pa.table({"q": ["hi there friend", "bye now friend"], "a": ["hello", "goodbye"]})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    raw = upload(developer, workspace, content=sink.getvalue(), filename="chat.parquet").json()
    with django_capture_on_commit_callbacks(execute=True):
        response = developer.post(
            f"{API.format(ws=workspace.slug)}{raw['id']}/pipeline/",
            {
                "name": "chats",
                "stages": [{"kind": "format", "to": "chat", "user": "q", "assistant": "a"}],
            },
            format="json",
        )
    rows = developer.get(response["Location"] + "rows/").json()
    assert rows[1]["messages"] == [
        {"role": "user", "content": "bye now friend"},
        {"role": "assistant", "content": "goodbye"},
    ]
