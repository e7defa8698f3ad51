"""The stock ``mlflow`` client logging ecosystem models to the platform, in a process of its own.

MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN come from the environment, as a user sets them.
``log <rival token>`` logs one run holding an sklearn model (skops, with a column signature), a
PyTorch state dict (``mlflow.pytorch.log_state_dict``), a cloudpickled sklearn model and a
pickled PyTorch module, then looks at the run with the rival workspace's token;
``pyfunc <models:/ uri> <json rows>`` opens a platform version with ``mlflow.pyfunc.load_model``
and predicts. Each prints one JSON object on its last line.
"""

from __future__ import annotations

import json
import os
import sys

import mlflow
import mlflow.pytorch
import mlflow.sklearn
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from sklearn.linear_model import LogisticRegression

COLUMNS = ["age", "ctr", "price"]


def log(rival_token: str) -> dict:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.random((40, 3)) * [40, 0.2, 30], columns=COLUMNS)
    labels = (frame["price"] > 15).astype(int)
    sk = LogisticRegression().fit(frame, labels)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with mlflow.start_run() as run:
        mlflow.log_metric("auc", 0.8)
        sk_info = mlflow.sklearn.log_model(
            sk, name="sk", input_example=frame.head(2), pip_requirements=["scikit-learn"]
        )
        mlflow.pytorch.log_state_dict(net.state_dict(), "torch_state")
        pickled_sk = mlflow.sklearn.log_model(
            sk, name="sk_pickled", serialization_format="cloudpickle", pip_requirements=[]
        )
        pickled_torch = mlflow.pytorch.log_model(
            net, name="torch_pickled", serialization_format="pickle", pip_requirements=[]
        )
    os.environ["MLFLOW_TRACKING_TOKEN"] = rival_token
    client = mlflow.MlflowClient()
    seen: dict = {}
    for what, call in (
        ("run", lambda: client.get_run(run.info.run_id)),
        ("sk", lambda: client.get_logged_model(sk_info.model_id)),
        ("artifacts", lambda: client.list_artifacts(run.info.run_id)),
    ):
        try:
            call()
            seen[what] = "found"
        except MlflowException as exc:
            seen[what] = exc.get_http_status_code()
    seen["runs"] = [r.info.run_id for r in client.search_runs(["0"])]
    return {
        "run_id": run.info.run_id,
        "sk_uri": sk_info.model_uri,
        "sk_coef": sk.coef_[0].tolist(),
        "sk_intercept": float(sk.intercept_[0]),
        "torch_state": {k: v.tolist() for k, v in net.state_dict().items()},
        "pickled": [pickled_sk.model_uri, pickled_torch.model_uri],
        "rival_sees": seen,
    }


def pyfunc(uri: str, rows: str) -> dict:
    model = mlflow.pyfunc.load_model(uri)
    return {"predictions": np.asarray(model.predict(pd.DataFrame(json.loads(rows)))).tolist()}


if __name__ == "__main__":
    mode, arguments = sys.argv[1], sys.argv[2:]
    result = log(arguments[0]) if mode == "log" else pyfunc(arguments[0], arguments[1])
    print(json.dumps(result))
