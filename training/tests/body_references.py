"""Body-reference rows of the training API: datasets, record sets, base jobs, entry points,
pipeline params."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from training.models import TrainingJob
from training.tests import matrix
from workspaces.testing.permission_matrix import BodyReference, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_n = itertools.count(1)


def _dataset_id(ctx: MatrixContext) -> int:
    return matrix._dataset(ctx).pk


def _succeeded_job_id(ctx: MatrixContext) -> int:
    """A finished job with a model (what an incremental job may start from)."""
    from training.models import JobState

    pk = matrix._job(ctx)["pk"]
    TrainingJob.objects.for_workspace(ctx.workspace).filter(pk=pk).update(
        state=JobState.SUCCEEDED, model_path="matrix/base"
    )
    return pk


def _entry_point(ctx: MatrixContext) -> str:
    return matrix._entry_point(ctx)["name"]


def _job_body(ctx: MatrixContext, **refs) -> dict:
    return {
        "name": f"ref-job-{next(_n)}",
        "template": "logreg",
        "dataset": _dataset_id(ctx),
        **refs,
    }


def _record_set_id(ctx: MatrixContext) -> int:
    from curation.services import record_set_upload

    row = {"instruction": "say hi", "input": "", "output": "hi"}
    content = (json.dumps(row) + "\n").encode()
    name = f"ref_records_{next(_n)}"
    return record_set_upload(
        actor=None, workspace=ctx.workspace, name=name, content=content, fmt="jsonl"
    ).pk


def _lm_job_body(ctx: MatrixContext, record_set) -> dict:
    """A language-model job: it names a record set instead of a dataset."""
    base = Path(settings.TRAINING_BASE_MODEL_ROOTS[0]) / "matrix-model"
    return {
        "name": f"ref-lm-{next(_n)}",
        "template": "lm_lora",
        "record_set": record_set,
        "params": {"base_model_path": str(base)},
    }


def _candidate_body(ctx: MatrixContext, ref) -> dict:
    return {
        "name": f"ref-cand-{next(_n)}",
        "dataset": ref,
        "key_column": "user_id",
        "file": SimpleUploadedFile("v.csv", b"user_id,value\nu0001,1.5\n"),
    }


def _pipeline(ctx: MatrixContext) -> dict:
    return matrix._pipeline(ctx)


def _tuning_body(ctx: MatrixContext, **refs) -> dict:
    return {"name": f"ref-tune-{next(_n)}", "template": "logreg", "n_trials": 1, **refs}


REFERENCES = [
    BodyReference(
        "POST",
        WS + "/tuning-jobs/",
        "dataset",
        make=_dataset_id,
        body=lambda ctx, ref: _tuning_body(ctx, dataset=ref),
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/tuning-jobs/",
        "base_job",
        make=lambda ctx: matrix._job(ctx)["pk"],
        body=lambda ctx, ref: _tuning_body(ctx, base_job=ref),
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/training-jobs/",
        "dataset",
        make=_dataset_id,
        body=lambda ctx, ref: _job_body(ctx, dataset=ref),
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/training-jobs/",
        "record_set",
        make=_record_set_id,
        body=_lm_job_body,
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/training-jobs/",
        "base_job",
        make=_succeeded_job_id,
        body=lambda ctx, ref: _job_body(ctx, base_job=ref),
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/training-jobs/",
        "entry_point",
        make=_entry_point,
        body=lambda ctx, ref: _job_body(ctx, template="", entry_point=ref),
        missing="no-such-entry-point",
    ),
    BodyReference(
        "POST",
        WS + "/candidate-evaluations/",
        "dataset",
        make=_dataset_id,
        body=_candidate_body,
        missing=999_999,
        format="multipart",
    ),
    BodyReference(
        "POST",
        WS + "/pipelines/{name}/run/",
        "params.dataset_id",
        setup=_pipeline,
        make=_dataset_id,
        body=lambda ctx, ref: {"params": {"dataset_id": ref}},
        missing=999_999,
    ),
    BodyReference(
        "POST",
        WS + "/pipelines/",
        "stages.params.dataset_id",
        make=_dataset_id,
        body=lambda ctx, ref: {
            "name": f"ref-pipeline-{next(_n)}",
            "stages": [{"name": "samples", "kind": "build_samples", "params": {"dataset_id": ref}}],
        },
        missing=999_999,
        attr="stages.0.params.dataset_id",
    ),
]

NO_REFERENCES = {
    "POST " + WS + "/training-jobs/{pk}/cancel/": "no body; the job is in the URL",
    "POST " + WS + "/tuning-jobs/{pk}/cancel/": "no body; the tuning job is in the URL",
    "POST " + WS + "/entry-points/": "a name and code only",
    "POST " + WS + "/pipeline-runs/{pk}/retry/": "no body; the run is in the URL",
    "POST " + WS + "/notebooks/": "no body; the server is the caller's in the URL's workspace",
    "POST " + WS + "/notebooks/{pk}/stop/": "no body; the server is in the URL",
}
