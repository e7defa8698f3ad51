"""Typed training params: each built-in template's schema (its own params plus the shared ones
the runner reads), the one check at job creation (400 naming ``params.<name>`` with what it
allows), the defaults filled in, the templates listing with their schemas, and entry points'
free-form params."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from training import services
from training.demo import PARAMS as DEMO_PARAMS
from training.models import TrainingJob
from training.params import (
    COMMON,
    job_hyperparameters,
    job_params_check,
    params_resolved,
    template_schemas,
)
from training.services import job_create
from training.tests.factories import FAST, make_demo_dataset
from workspaces.models import Role
from workspaces.services import workspace_policy_set
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def dev(workspace, client_for):
    return client_for(make_member(workspace, Role.DEVELOPER))


@pytest.fixture
def dataset(workspace):
    return make_demo_dataset(workspace, scale=0.01)


def _submit(client, workspace, dataset, params, **fields):
    body = {"name": "ctr", "template": "fine_ranking", "dataset": dataset.pk, "params": params}
    body.update(fields)
    return client.post(f"/api/v1/workspaces/{workspace.slug}/training-jobs/", body, format="json")


def _errors(response) -> dict[str, str]:
    body = response.json()
    return {e["attr"]: e["detail"] for e in body.get("errors") or [body]}


def test_every_built_in_template_declares_a_schema():
    schemas = template_schemas()
    assert sorted(schemas) == [
        "deepfm",
        "fine_ranking",
        "lightgbm",
        "lm_full",
        "lm_lora",
        "logreg",
        "two_tower",
    ]
    assert set(schemas["fine_ranking"]) == {
        "members",
        "cv_folds",
        "embedding_dim",
        "cross_layers",
        "hidden",
        "dropout",
    }
    assert set(schemas["deepfm"]) == {
        "members",
        "cv_folds",
        "embedding_dim",
        "hidden",
        "dropout",
        "batch_norm",
        "embedding_l2",
    }
    assert set(schemas["two_tower"]) == {"embedding_dim", "tower_dim", "hidden", "temperature"}
    assert set(schemas["logreg"]) == {"solver", "l2", "max_iter", "cv_folds"}
    # a template's own params redefine a shared one only for a default of its own (lm_full's
    # lr and batch_size): the type and bounds stay the shared param's
    for name, own in schemas.items():
        for shared in set(own) & set(COMMON):
            mine, common = own[shared], COMMON[shared]
            assert (mine.type, mine.min, mine.max, mine.choices) == (
                common.type,
                common.min,
                common.max,
                common.choices,
            ), (name, shared)
    assert {name for name, own in schemas.items() if set(own) & set(COMMON)} == {"lm_full"}


def test_an_unknown_param_is_400_naming_it_and_the_allowed_names(workspace, dev, dataset):
    response = _submit(dev, workspace, dataset, {"epochs": 1, "hiden": [64]})
    assert response.status_code == 400, response.content
    errors = _errors(response)
    assert list(errors) == ["params.hiden"]
    allowed = errors["params.hiden"].split("use one of: ")[1].split(", ")
    assert "hidden" in allowed and "epochs" in allowed and "cross_layers" in allowed
    assert "tower_dim" not in allowed  # two_tower's, not fine_ranking's
    assert not TrainingJob.objects.for_workspace(workspace).exists()


@pytest.mark.parametrize(
    ("params", "attr", "message"),
    [
        ({"lr": "fast"}, "params.lr", "Give a number from 0 to 10."),
        ({"lr": 11}, "params.lr", "Give a number from 0 to 10."),
        ({"dropout": 1.5}, "params.dropout", "Give a number from 0 to 0.9."),
        ({"cross_layers": 2.5}, "params.cross_layers", "Give a whole number from 0 to 8."),
        ({"cross_layers": True}, "params.cross_layers", "Give a whole number from 0 to 8."),
        (
            {"hidden": [64, 0]},
            "params.hidden",
            "Give whole numbers separated by commas, each from 1 to 4096.",
        ),
        ({"epoch_eval": "yes"}, "params.epoch_eval", "Give true or false."),
        ({"device": 0}, "params.device", "Give text."),
        (
            {"scheduler": {"auto_recommend": 1}},
            "params.scheduler",
            "auto_recommend: Give true or false.",
        ),
        (
            {"epochs": 0},
            "params.epochs",
            "Give a whole number from 1 to 1000 (the workspace's limit).",
        ),
    ],
)
def test_a_wrong_type_or_range_is_400_naming_the_param_and_what_it_allows(
    workspace, dev, dataset, params, attr, message
):
    response = _submit(dev, workspace, dataset, params)
    assert response.status_code == 400, response.content
    assert _errors(response) == {attr: message}
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_every_bad_param_is_named_at_once(workspace, dev, dataset):
    response = _submit(dev, workspace, dataset, {"lr": -1, "tower_dim": 8, "epochs": 2})
    assert response.status_code == 400
    assert set(_errors(response)) == {"params.lr", "params.tower_dim"}


def test_the_workspace_policy_bounds_epochs_in_the_schema_too(workspace, dev, dataset):
    workspace_policy_set(actor=None, workspace=workspace, max_job_epochs=3)
    response = _submit(dev, workspace, dataset, {"epochs": 4})
    assert _errors(response) == {
        "params.epochs": "Give a whole number from 1 to 3 (the workspace's limit)."
    }
    listing = dev.get(f"/api/v1/workspaces/{workspace.slug}/training-templates/").json()
    assert {row["params"]["epochs"]["max"] for row in listing} == {3}


def test_valid_params_are_stored_normalised_and_the_defaults_fill_in_the_rest(
    workspace, dev, dataset
):
    response = _submit(dev, workspace, dataset, {"epochs": 1.0, "hidden": "128, 64", "lr": 1})
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert job.params == {"epochs": 1, "hidden": [128, 64], "lr": 1.0}
    assert isinstance(job.params["epochs"], int) and isinstance(job.params["lr"], float)
    resolved = params_resolved(job.template, job.params)
    assert resolved["hidden"] == [128, 64] and resolved["batch_size"] == 512
    assert (resolved["embedding_dim"], resolved["dropout"], resolved["seed"]) == (8, 0.0, 0)
    rows = {row["name"]: row for row in job_hyperparameters(job)}
    assert rows["epochs"] == {"name": "epochs", "value": 1, "source": "set"}
    assert rows["cross_layers"] == {"name": "cross_layers", "value": 2, "source": "default"}


def test_entry_point_jobs_take_free_params_within_the_shared_rules(workspace, dev, dataset):
    services.entry_point_register(
        actor=None, workspace=workspace, name="mine", module="training.templates.logreg"
    )
    free = {"depth": 3, "hiden": [1, 2], "epochs": 1, "anything": {"nested": True}}
    accepted = _submit(dev, workspace, dataset, free, template="", entry_point="mine")
    assert accepted.status_code == 201, accepted.content
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert (job.entry_point, job.params) == ("mine", free)
    # the shared params are read by the runner for user code too: their rules hold
    refused = _submit(
        dev, workspace, dataset, {"depth": 3, "epochs": 0}, template="", entry_point="mine"
    )
    assert refused.status_code == 400
    assert set(_errors(refused)) == {"params.epochs"}


def test_the_service_holds_the_schema_for_every_caller(workspace, dataset):
    """Pages, pipelines and demos call the service, not the serializer."""
    with pytest.raises(ValidationError) as refused:
        job_create(
            actor=None, workspace=workspace, name="typo", dataset=dataset, template="logreg",
            params={"epoch": 2},
        )  # fmt: skip
    assert list(refused.value.message_dict) == ["params.epoch"]
    assert not TrainingJob.objects.for_workspace(workspace).exists()


@pytest.mark.parametrize(
    ("template", "params"),
    [("fine_ranking", DEMO_PARAMS), ("logreg", FAST), ("fine_ranking", FAST)],
)
def test_the_platforms_own_callers_pass_valid_params(template, params):
    cleaned, errors = job_params_check(template=template, params=params)
    assert errors == {}
    assert cleaned == params


def test_the_bench_params_are_valid():
    from bench.areas import training as bench

    for params in (bench.DEMO_PARAMS, bench.ML_PARAMS):
        full = {**params, "holdout_fraction": bench.HOLDOUT}
        assert job_params_check(template="fine_ranking", params=full)[1] == {}
    cuda = {**bench.DEMO_PARAMS, "device": "cuda"}
    assert job_params_check(template="fine_ranking", params=cuda)[1] == {}


def test_the_templates_endpoint_lists_descriptions_and_schemas(workspace, dev):
    response = dev.get(f"/api/v1/workspaces/{workspace.slug}/training-templates/")
    assert response.status_code == 200
    rows = {row["name"]: row for row in response.json()}
    assert sorted(rows) == [
        "deepfm",
        "fine_ranking",
        "lightgbm",
        "lm_full",
        "lm_lora",
        "logreg",
        "two_tower",
    ]
    fine = rows["fine_ranking"]
    assert fine["description"].startswith("Fine ranking CTR model")
    assert fine["params"]["hidden"] == {
        "type": "int_list",
        "default": [64, 32],
        "label": "Hidden layers",
        "help": "Widths of the MLP's hidden layers, e.g. 64,32.",
        "allowed": "whole numbers separated by commas, each from 1 to 4096",
        "advanced": False,
        "min": 1.0,
        "max": 4096.0,
    }
    assert fine["params"]["epoch_eval"]["type"] == "bool"
    assert fine["params"]["epoch_eval"]["default"] is True
    assert fine["params"]["epoch_eval"]["advanced"] is True
    assert fine["params"]["scheduler"]["fields"]["auto_recommend"]["type"] == "bool"
    # the shared params are in every template's schema; a template's own only in its own
    assert set(COMMON) <= set(rows["logreg"]["params"])
    assert "tower_dim" in rows["two_tower"]["params"] and "tower_dim" not in fine["params"]
    one = dev.get(f"/api/v1/workspaces/{workspace.slug}/training-templates/two_tower/")
    assert one.status_code == 200 and one.json()["params"]["temperature"]["default"] == 0.1
    missing = dev.get(f"/api/v1/workspaces/{workspace.slug}/training-templates/nope/")
    assert missing.status_code == 404
