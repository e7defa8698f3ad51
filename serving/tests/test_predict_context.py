"""predict/'s context: a context group kept online is looked up by the keys the request names
(in its context, its user or each candidate), a value given in the context wins, and a context
that does not fit the model (an unknown key, a feature neither given nor reachable) is a 400
naming it instead of a score on nulls."""

from __future__ import annotations

import pytest

from features import registry as feature_registry
from features.models import EntityKind
from serving.inference import build_plan, context_refusal, serving_columns
from serving.tests.factories import T0, ingest_rows, make_scene, make_spec
from serving.tests.helpers import deployed, predict_body
from training.bundle import FeatureSpec
from workspaces.models import Role

pytestmark = pytest.mark.django_db


def test_a_context_group_is_looked_up_by_the_keys_the_request_names(workspace, members):
    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor)
    slot = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="user_slot",
        entity=EntityKind.CONTEXT,
        entity_keys=["user_id", "slot"],
        features=[{"name": "shown", "dtype": "int"}],
    )
    ingest_rows(
        actor,
        slot,
        [
            {"user_id": "u1", "slot": "top", "event_time": T0.isoformat(), "shown": 7},
            {"user_id": "u2", "slot": "top", "event_time": T0.isoformat(), "shown": 3},
        ],
    )
    spec = make_spec(scene)
    spec.features.append(FeatureSpec(ref="user_slot:shown", column="user_slot__shown", dtype="int"))
    plan = build_plan(workspace.pk, spec)
    assert plan.context_groups == {"user_slot": (["user_id", "slot"], ["user_slot:shown"])}

    rows = [{"slot": "top", "user_id": "u1", "item_id": i} for i in scene.item_ids[:3]]
    columns = serving_columns(
        workspace=workspace, plan=plan, entities={"user": ["u1"], "item": scene.item_ids[:3]},
        context={"slot": "top"}, n=3, key_rows=rows,
    )  # fmt: skip
    assert columns["user_slot:shown"] == [7, 7, 7]
    # A value the request gives wins over the stored one.
    given = serving_columns(
        workspace=workspace, plan=plan, entities={"user": ["u1"], "item": scene.item_ids[:3]},
        context={"slot": "top", "shown": 1}, n=3, key_rows=rows,
    )  # fmt: skip
    assert given["user_slot:shown"] == [1, 1, 1]

    assert context_refusal(plan, {"slot": "top"}, rows) == ""
    assert context_refusal(plan, {"shown": 2}, [{}]) == ""
    missing = context_refusal(plan, {}, [{"user_id": "u1"}])
    assert "misses shown (user_slot:shown)" in missing and "user_id, slot" in missing
    unknown = context_refusal(plan, {"slot": "top", "hour": 3}, rows)
    assert unknown.startswith("unknown context key hour") and "slot" in unknown


def test_predict_refuses_a_context_the_model_reads_nothing_from(workspace, members, client_for):
    scene, _versions, _dep = deployed(workspace, members[Role.MAINTAINER])
    client = client_for(members[Role.VIEWER])
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    body = predict_body(scene, request_id="ctx-1")
    assert client.post(url, body, format="json").status_code == 200
    refused = client.post(url, {**body, "context": {"hour": 3}}, format="json")
    assert refused.status_code == 400 and refused.json()["attr"] == "context"
    assert "unknown context key hour" in refused.json()["detail"]
