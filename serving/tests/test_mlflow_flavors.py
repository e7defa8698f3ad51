"""Models from the ecosystem deploy (issue 19, item 2).

The stock ``mlflow`` client, pointed at the platform over HTTP with a workspace token, logs an
sklearn model (skops) and a PyTorch state dict; both import with their input mapping, pass the
gates, deploy and answer predictions equal to the stock models' own arithmetic; pickles are
refused naming the safe flavors; the rival workspace's token sees none of it; the version,
mirrored to an HTTP MLflow server (the platform's /mlflow), opens with
``mlflow.pyfunc.load_model``. ONNX, LightGBM and XGBoost models import and serve the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from django.conf import settings
from django.core.exceptions import ValidationError

from serving import registry
from serving.models import Deployment, GateStatus, ModelVersion
from serving.tests.factories import make_scene
from serving.tests.helpers import predict_body
from workspaces.models import Role
from workspaces.testing.factories import make_member, make_workspace, token_for

SCRIPT = Path(__file__).with_name("mlflow_flavor_client.py")
ROOT = Path(__file__).resolve().parents[2]


def stock(base_url: str, token: str, *args: str) -> dict:
    """The stock client script in its own process (no Django), the platform importable for the
    pyfunc loader as a user's environment would have it installed."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_", "DJANGO_", "DATABASE_", "REDIS_"))
    }
    env.update(
        MLFLOW_TRACKING_URI=base_url,
        MLFLOW_TRACKING_TOKEN=token,
        NO_PROXY="127.0.0.1,localhost",
        GIT_PYTHON_REFRESH="quiet",
        PYTHONPATH=str(ROOT),
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_stock_client_sklearn_and_pytorch_models_import_gate_deploy_predict_and_stay_private(
    live_server, client_for, monkeypatch
):
    workspace = make_workspace(slug=f"eco-{uuid.uuid4().hex[:8]}")
    rival = make_workspace(slug=f"rival-{uuid.uuid4().hex[:8]}")
    actor = make_member(workspace, Role.MAINTAINER)
    ours = token_for(actor, workspaces=[workspace])
    theirs = token_for(make_member(rival, Role.DEVELOPER), workspaces=[rival])
    scene = make_scene(workspace, actor, labels=30)
    u, i = scene.users.name, scene.items.name
    mapping = {"age": f"{u}:age", "ctr": f"{u}:ctr", "price": f"{i}:price"}

    logged = stock(f"{live_server.url}/mlflow", ours, "log", theirs)
    assert logged["rival_sees"] == {"run": 404, "sk": 404, "artifacts": 404, "runs": []}

    api = client_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/"
    base = {"dataset_id": scene.dataset.pk, "run_gates": True}
    # Pickles are refused before anything is opened, naming the safe flavors.
    for source in logged["pickled"]:
        refused = api.post(url, {**base, "model": "p", "source": source}, format="json")
        assert refused.status_code == 400, refused.json()
        assert refused.json()["attr"] == "source" and "skops" in refused.json()["detail"]
        assert "onnx" in refused.json()["detail"] and "pickle" in refused.json()["detail"]
    # A mapping that misses a signature column names the columns; a ref outside the dataset
    # names the dataset's features.
    bad = api.post(
        url,
        {**base, "model": "sk", "source": logged["sk_uri"], "inputs": {"age": f"{u}:age"}},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["attr"] == "inputs"
    assert "age, ctr, price" in bad.json()["detail"]
    outside = {**mapping, "ctr": f"{scene.labels.name}:clicked"}
    bad = api.post(
        url,
        {**base, "model": "sk", "source": logged["sk_uri"], "inputs": outside},
        format="json",
    )
    assert bad.status_code == 400 and f"{u}:ctr" in bad.json()["detail"]
    assert not ModelVersion.objects.for_workspace(workspace).exists()

    sk = api.post(
        url,
        {**base, "model": "sk", "source": logged["sk_uri"], "inputs": mapping, "auto_deploy": "sk"},
        format="json",
    )
    assert sk.status_code == 201, sk.json()
    torch_body = {
        **base,
        "model": "pt",
        "source": f"runs:/{logged['run_id']}/torch_state",
        "inputs": list(mapping.values()),
        "architecture": {"kind": "mlp", "activation": "relu", "output": "logit"},
        "auto_deploy": "pt",
    }
    pt = api.post(url, torch_body, format="json")
    assert pt.status_code == 201, pt.json()
    for body in (sk.json(), pt.json()):
        assert body["source"] == "mlflow_import" and body["metrics"] == {"auc": 0.8}
        assert body["gate_status"] == GateStatus.PASSED, body["gates"]
        assert body["gates"]["consistency"]["entities"] > 5
    assert set(Deployment.objects.for_workspace(workspace).values_list("name", flat=True)) == {
        "sk",
        "pt",
    }

    # Predictions through the gateway equal the stock models' arithmetic on the online values.
    x = np.array([[21, 0.01, 1.5 * n] for n in range(len(scene.item_ids))], dtype=np.float64)
    expected_sk = sigmoid(x @ np.array(logged["sk_coef"]) + logged["sk_intercept"])
    state = {k: np.array(v) for k, v in logged["torch_state"].items()}
    hidden = np.maximum(x @ state["0.weight"].T + state["0.bias"], 0)
    expected_pt = sigmoid((hidden @ state["2.weight"].T + state["2.bias"]).reshape(-1))
    predict = f"/api/v1/workspaces/{workspace.slug}/predict/"
    for name, expected in (("sk", expected_sk), ("pt", expected_pt)):
        answer = api.post(
            predict, predict_body(scene, request_id=f"r-{name}", deployment=name), format="json"
        )
        assert answer.status_code == 200, answer.content
        assert np.allclose(answer.json()["scores"], expected, atol=1e-5), name

    # The consistency gate checks the mapping against the dataset: a version whose dataset
    # lacks a mapped feature fails it, naming the feature.
    from serving.gates import consistency_check

    version = ModelVersion.objects.for_workspace(workspace).get(pk=sk.json()["id"])
    version.spec = {**version.spec, "extra": {"input_mapping": {**mapping, "x": "gone:feature"}}}
    failed = consistency_check(version)
    assert failed["status"] == GateStatus.FAILED and "gone:feature" in failed["detail"]

    # Mirrored to an HTTP MLflow server (the platform's own /mlflow), the version opens with
    # mlflow.pyfunc.load_model and scores as the platform does.
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", ours)
    http = mlflow.MlflowClient(tracking_uri=f"{live_server.url}/mlflow")
    monkeypatch.setattr(registry, "mlflow_client", lambda: http)
    version = ModelVersion.objects.for_workspace(workspace).get(pk=pt.json()["id"])
    version.mlflow_version = ""
    registry._sync_mlflow(version)
    # The MLflow store outlives a test's database: an earlier test may have used the name.
    assert version.mlflow_version.isdigit()
    mirrored = http.get_model_version(registry.mlflow_name(workspace, "pt"), version.mlflow_version)
    assert mirrored.source.startswith("models:/m-")
    rows = {f"{u}__age": [21, 21], f"{u}__ctr": [0.01, 0.01], f"{i}__price": [0.0, 1.5]}
    opened = stock(
        f"{live_server.url}/mlflow",
        ours,
        "pyfunc",
        f"models:/{registry.mlflow_name(workspace, 'pt')}/{version.mlflow_version}",
        json.dumps(rows),
    )
    assert np.allclose(opened["predictions"], expected_pt[:2], atol=1e-6)
    folder = Path(settings.ARTIFACT_ROOT) / version.artifact_path
    assert "serving.mlflow_pyfunc" in (folder / "MLmodel").read_text()


@pytest.mark.django_db
def test_onnx_lightgbm_and_xgboost_models_import_and_serve_and_the_registry_page_imports(
    workspace, members, client
):
    import lightgbm
    import mlflow.lightgbm
    import mlflow.onnx
    import onnx
    from onnx import TensorProto, helper

    from serving.inference import MODELS

    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor, labels=30)
    u, i = scene.users.name, scene.items.name
    refs = [f"{u}:age", f"{u}:ctr", f"{i}:price"]
    root = Path(settings.MLFLOW_ARTIFACT_ROOT) / workspace.slug / uuid.uuid4().hex

    # ONNX: a logistic model built by hand (a tensor signature: inputs in order).
    weights = np.array([[0.05], [2.0], [-0.1]], dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["z"]),
            helper.make_node("Sigmoid", ["z"], ["p"]),
        ],
        "logistic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 1], weights.reshape(-1).tolist())],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    sample = np.zeros((2, 3), dtype=np.float32)
    mlflow.onnx.save_model(proto, root / "onnx", input_example=sample, pip_requirements=[])
    # LightGBM: a Booster in its text format.
    rng = np.random.default_rng(1)
    x = rng.random((200, 3)) * [40, 0.2, 30]
    booster = lightgbm.train(
        {"objective": "binary", "verbose": -1, "num_leaves": 4},
        lightgbm.Dataset(x, label=(x[:, 2] > 15).astype(int)),
        num_boost_round=5,
    )
    mlflow.lightgbm.save_model(booster, root / "lgb", pip_requirements=[])
    # XGBoost: the sklearn wrapper trained on a DataFrame (named columns), saved by MLflow in
    # XGBoost's JSON format (the bundle keeps it as UBJSON).
    import mlflow.xgboost
    import pandas as pd
    import xgboost

    frame = pd.DataFrame(x, columns=["age", "ctr", "price"])
    boosted = xgboost.XGBClassifier(n_estimators=8, max_depth=2).fit(
        frame, (x[:, 2] > 15).astype(int)
    )
    mlflow.xgboost.save_model(boosted, root / "xgb", model_format="json", pip_requirements=[])

    x_serve = np.array([[21, 0.01, 1.5 * n] for n in range(len(scene.item_ids))])
    expected = {
        "onnx": sigmoid(x_serve @ weights.astype(np.float64)).reshape(-1),
        "lgb": booster.predict(x_serve),
        "xgb": boosted.predict_proba(pd.DataFrame(x_serve, columns=frame.columns))[:, 1],
    }
    assert len(set(np.round(expected["xgb"], 4))) > 1  # the scores differ between items
    for name in ("onnx", "lgb", "xgb"):
        version = registry.model_version_import_mlflow(
            actor=actor,
            workspace=workspace,
            name=name,
            source=(root / name).as_uri(),
            inputs=refs,
            dataset=scene.dataset,
        )
        version = registry_gates(actor, workspace, version)
        assert version.gate_status == GateStatus.PASSED, version.gates
        loaded = MODELS.get(version.pk)
        from features.lookup import online_lookup

        users = online_lookup(workspace=workspace, entities=["u1"], features=refs[:2])
        items = online_lookup(workspace=workspace, entities=scene.item_ids, features=refs[2:])
        n = len(scene.item_ids)
        columns = {refs[0]: [users["rows"][0][0]] * n, refs[1]: [users["rows"][0][1]] * n}
        columns[refs[2]] = [row[0] for row in items["rows"]]
        assert np.allclose(loaded.predict(columns, n), expected[name], atol=1e-5), name
    xgb_bundle = (
        Path(settings.ARTIFACT_ROOT)
        / ModelVersion.objects.get(workspace=workspace, model__name="xgb").artifact_path
    )
    assert (xgb_bundle / "model.ubj").read_bytes()[:1] == b"{"  # UBJSON's object marker
    assert not (xgb_bundle / "model.ubj").read_bytes().startswith(b'{"')  # not the JSON
    # An xgboost model in another format (the legacy binary) is refused, naming the formats.
    (root / "xgb-old").mkdir()
    (root / "xgb-old" / "MLmodel").write_text("flavors:\n  xgboost: {data: model.xgb}\n")
    (root / "xgb-old" / "model.xgb").write_bytes(b"\x00binary")
    with pytest.raises(ValidationError) as refused:
        registry.model_version_import_mlflow(
            actor=actor, workspace=workspace, name="x", source=(root / "xgb-old").as_uri(),
            inputs=refs, dataset=scene.dataset,
        )  # fmt: skip
    assert "saved as .xgb; log it as .ubj or .json" in str(refused.value)

    # The registry page's import form: field errors name the allowed values, then it imports.
    import mlflow.sklearn
    from sklearn.linear_model import LogisticRegression

    estimator = LogisticRegression().fit(frame, (x[:, 2] > 15).astype(int))
    mlflow.sklearn.save_model(
        estimator, root / "sk", input_example=frame.head(2), pip_requirements=[]
    )
    # A skops file naming a type outside the trusted list is refused, the type named.
    import operator
    import shutil

    import skops.io
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    shutil.copytree(root / "sk", root / "sk-untrusted")
    piped = make_pipeline(FunctionTransformer(operator.neg), LogisticRegression()).fit(
        frame, (x[:, 2] > 15).astype(int)
    )
    skops.io.dump(piped, root / "sk-untrusted" / "model.skops")
    with pytest.raises(ValidationError, match=r"untrusted types in the skops file: _operator\.neg"):
        registry.model_version_import_mlflow(
            actor=actor, workspace=workspace, name="u", source=(root / "sk-untrusted").as_uri(),
            inputs=dict(zip(["age", "ctr", "price"], refs, strict=True)), dataset=scene.dataset,
        )  # fmt: skip
    client.force_login(actor)
    page = f"/w/{workspace.slug}/models/"
    assert b'data-testid="import-form"' in client.get(page).content
    form = {
        "model": "from-page",
        "source": (root / "sk").as_uri(),
        "dataset": "999999",
        "inputs": f"age = {refs[0]}\nctr = {refs[1]}",
        "output": "probability",
    }
    answer = client.post(f"{page}import/", form)
    assert answer.status_code == 400
    errors = answer.context["import_form"].errors
    assert str(scene.dataset.pk) in errors["dataset"][0]
    answer = client.post(f"{page}import/", {**form, "dataset": str(scene.dataset.pk)})
    assert answer.status_code == 400
    assert "age, ctr, price" in answer.context["import_form"].errors["inputs"][0]
    form.update(dataset=str(scene.dataset.pk), inputs=form["inputs"] + f"\nprice = {refs[2]}")
    answer = client.post(f"{page}import/", form)
    assert answer.status_code == 302, answer.context["import_form"].errors
    assert answer["Location"] == f"/w/{workspace.slug}/models/from-page/v1/"


def registry_gates(actor, workspace, version):
    from serving.gates import version_gates_run

    return version_gates_run(actor=actor, workspace=workspace, version=version)
