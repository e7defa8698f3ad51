"""The stock ``mlflow`` client against the platform, in a process of its own (the tests run it).

MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN come from the environment, as a user sets them.
``log <folder>`` logs a run (param, metric, artifact, an sklearn model registered as ``ranker``)
and reads it all back; ``look <run id>`` reports what this token sees of another's run;
``bundle <spec.json> <state_dict.pth>`` logs a RankOps bundle to the experiment ``ctr-study`` and
registers it as ``ranker`` twice: from the run's folder and as a logged model. Each prints
one JSON object on its last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlflow
import mlflow.sklearn
import numpy as np
from mlflow.exceptions import MlflowException
from sklearn.linear_model import LogisticRegression


def log(folder: Path) -> dict:
    rng = np.random.default_rng(0)
    features = rng.random((40, 3))
    labels = (features[:, 0] > 0.5).astype(int)
    model = LogisticRegression().fit(features, labels)
    note = folder / "note.txt"
    note.write_text("logged through the platform")
    with mlflow.start_run() as run:
        mlflow.log_param("learning_rate", 0.1)
        mlflow.log_metric("auc", 0.75, step=1)
        mlflow.log_artifact(str(note))
        info = mlflow.sklearn.log_model(
            model, name="model", input_example=features[:2], registered_model_name="ranker"
        )
    client = mlflow.MlflowClient()
    experiment = mlflow.set_experiment("ctr-study")
    with mlflow.start_run() as second:
        mlflow.log_metric("auc", 0.5)
    runs = client.search_runs([run.info.experiment_id])
    downloaded = Path(client.download_artifacts(run.info.run_id, "note.txt", str(folder)))
    loaded = mlflow.pyfunc.load_model("models:/ranker/1")
    return {
        "run_id": run.info.run_id,
        "experiment_id": run.info.experiment_id,
        "artifact_uri": client.get_run(run.info.run_id).info.artifact_uri,
        "named_experiment": [experiment.name, second.info.experiment_id],
        "searched": [r.info.run_id for r in runs],
        "params": client.get_run(run.info.run_id).data.params,
        "metrics": [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "auc")],
        "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
        "downloaded": downloaded.read_text(),
        "model_uri": info.model_uri,
        "registered": [v.version for v in client.search_model_versions("name='ranker'")],
        "experiments": sorted(e.name for e in client.search_experiments()),
        "predictions": loaded.predict(features[:4]).tolist(),
        "expected": model.predict(features[:4]).tolist(),
    }


def look(run_id: str) -> dict:
    client = mlflow.MlflowClient()
    seen: dict = {}
    try:
        client.get_run(run_id)
        seen["get_run"] = "found"
    except MlflowException as exc:
        seen["get_run"] = [exc.error_code, exc.get_http_status_code()]
    try:
        client.log_param(run_id, "intruder", "1")
        seen["log_param"] = "written"
    except MlflowException as exc:
        seen["log_param"] = [exc.error_code, exc.get_http_status_code()]
    seen["default_runs"] = [r.info.run_id for r in client.search_runs(["0"])]
    seen["experiments"] = sorted(e.name for e in client.search_experiments())
    seen["models"] = [m.name for m in client.search_registered_models()]
    try:
        client.get_registered_model("ranker")
        seen["get_model"] = "found"
    except MlflowException as exc:
        seen["get_model"] = [exc.error_code, exc.get_http_status_code()]
    return seen


def bundle(spec: Path, state: Path) -> dict:
    mlflow.set_experiment("ctr-study")
    with mlflow.start_run() as run:
        mlflow.log_dict(json.loads(spec.read_text()), "model/spec.json")
        mlflow.log_artifact(str(state), "model")
        mlflow.log_metric("auc", 0.73)
    # A plain folder of artifacts, not a logged model: registered by its runs:/ URI.
    client = mlflow.MlflowClient()
    client.create_registered_model("ranker")
    version = client.create_model_version(
        "ranker", source=f"runs:/{run.info.run_id}/model", run_id=run.info.run_id
    )
    # The same files as an MLflow 3 logged model, registered by its models:/m-... URI.
    folder = spec.parent / "bundle"
    folder.mkdir()
    (folder / "spec.json").write_text(spec.read_text())
    (folder / "state_dict.pth").write_bytes(state.read_bytes())
    logged = mlflow.initialize_logged_model(name="ranker-bundle", source_run_id=run.info.run_id)
    client.log_model_artifacts(logged.model_id, str(folder))
    client.finalize_logged_model(logged.model_id, "READY")
    second = client.create_model_version(
        "ranker", source=f"models:/{logged.model_id}", model_id=logged.model_id
    )
    return {
        "run_id": run.info.run_id,
        "version": str(version.version),
        "logged_model_version": str(second.version),
    }


if __name__ == "__main__":
    mode, arguments = sys.argv[1], sys.argv[2:]
    if mode == "log":
        result = log(Path(arguments[0]))
    elif mode == "look":
        result = look(arguments[0])
    else:
        result = bundle(Path(arguments[0]), Path(arguments[1]))
    print(json.dumps(result))
