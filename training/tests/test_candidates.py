"""F11: a candidate feature's values are joined, trained with and without, and the AUC/logloss
difference reported with a bootstrap interval; nothing is registered."""

from __future__ import annotations

import numpy as np
import pytest

from features.models import Feature, FeatureGroup
from training import candidates, synthetic
from training.models import RunState
from training.tests.factories import make_demo_dataset

pytestmark = pytest.mark.django_db


def test_an_informative_candidate_improves_auc_and_registers_nothing(workspace):
    from features import demo

    dataset = make_demo_dataset(workspace, scale=0.5)
    log = demo.generate(anchor=synthetic.ANCHOR, scale=0.5, seed=demo.SEED)
    # The true user affinity signal is the users' activity level: encode it as a number.
    level = {"low": -0.6, "medium": 0.0, "high": 0.9}
    rows = "user_id,value\n" + "".join(
        f"{uid},{level[a]}\n"
        for uid, a in zip(log.users["user_id"], log.users["activity_level"], strict=True)
    )
    groups_before = FeatureGroup.objects.for_workspace(workspace).count()
    features_before = Feature.objects.for_workspace(workspace).count()
    evaluation = candidates.candidate_evaluation_create(
        actor=None,
        workspace=workspace,
        name="activity-score",
        dataset=dataset,
        key_column="user_id",
        content=rows.encode(),
        dispatch=False,
        params={"epochs": 3},
    )
    # Drop the activity feature from the baseline so the candidate brings new information.
    dataset.feature_refs = [r for r in dataset.feature_refs if "activity_level" not in r]
    dataset.save()
    assert candidates.candidate_evaluate(evaluation.pk) == RunState.SUCCEEDED
    evaluation.refresh_from_db()
    result = evaluation.result
    assert result["coverage"] == 1.0
    low, high = result["auc_delta_ci95"]
    assert low <= result["auc_delta"] <= high
    assert result["auc_delta"] > 0
    assert FeatureGroup.objects.for_workspace(workspace).count() == groups_before
    assert Feature.objects.for_workspace(workspace).count() == features_before


def test_bad_uploads_are_refused(workspace):
    from django.core.exceptions import ValidationError

    dataset = make_demo_dataset(workspace, scale=0.01)
    with pytest.raises(ValidationError):
        candidates.candidate_evaluation_create(
            actor=None,
            workspace=workspace,
            name="x",
            dataset=dataset,
            key_column="city",
            content=b"city,value\na,1\n",
            dispatch=False,
        )
    with pytest.raises(ValidationError):
        candidates.candidate_evaluation_create(
            actor=None,
            workspace=workspace,
            name="x",
            dataset=dataset,
            key_column="user_id",
            content=b"user_id,score\nu1,1\n",
            dispatch=False,
        )


def test_bootstrap_interval_brackets_zero_for_identical_models():
    rng = np.random.default_rng(0)
    y = (rng.random(400) < 0.2).astype(float)
    p = np.clip(rng.random(400), 0.01, 0.99)
    result = candidates.bootstrap_deltas(y, p, p, rounds=50)
    assert result["auc_delta"] == 0 and result["auc_delta_ci95"] == [0.0, 0.0]
