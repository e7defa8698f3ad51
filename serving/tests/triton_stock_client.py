"""The stock ``tritonclient.http`` against the platform's Open Inference Protocol routes, in a
process of its own (no Django). ``<host:port> <token> <model> <rows JSON>``: server and model
metadata, readiness, inference with binary tensors (tritonclient's default) and with JSON ones,
the versioned route, and malformed requests; prints one JSON object on its last line."""

from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

DTYPES = {"FP64": np.float64, "FP32": np.float32, "BOOL": np.bool_, "BYTES": np.object_}


def main(url: str, token: str, model: str, rows: dict) -> dict:
    client = httpclient.InferenceServerClient(url=url)

    def auth() -> dict:
        """The token header, a new dict per call: tritonclient writes the binary request's
        Inference-Header-Content-Length into the dict it is given."""
        return {"Authorization": f"Token {token}"}

    seen: dict = {"server": client.get_server_metadata(headers=auth())}
    meta = client.get_model_metadata(model, headers=auth())
    seen["metadata"] = meta
    seen["ready"] = client.is_model_ready(model, headers=auth())

    def inputs(binary: bool, skip: str = "", reshape: str = "") -> list:
        made = []
        for spec in meta["inputs"]:
            if spec["name"] == skip:
                continue
            values = np.array(rows[spec["name"]], dtype=DTYPES[spec["datatype"]])
            if spec["name"] == reshape:
                values = np.stack([values, values], axis=1)
            item = httpclient.InferInput(spec["name"], list(values.shape), spec["datatype"])
            item.set_data_from_numpy(values, binary_data=binary)
            made.append(item)
        return made

    scores = {}
    for label, binary in (("binary", True), ("json", False)):
        output = httpclient.InferRequestedOutput("score", binary_data=binary)
        answer = client.infer(model, inputs(binary), outputs=[output], headers=auth())
        scores[label] = answer.as_numpy("score").tolist()
    version = meta["versions"][0]
    answer = client.infer(model, inputs(True), model_version=version, headers=auth())
    scores["versioned"] = answer.as_numpy("score").tolist()
    seen["scores"] = scores

    refused = {}
    first = meta["inputs"][0]["name"]
    for label, kwargs in (
        ("missing", {"skip": first}),
        ("shape", {"reshape": first}),
    ):
        try:
            client.infer(model, inputs(True, **kwargs), headers=auth())
            refused[label] = "answered"
        except InferenceServerException as exc:
            refused[label] = {"status": exc.status(), "message": exc.message()}
    unknown = httpclient.InferInput("nobody__nothing", [len(rows[first])], "FP64")
    unknown.set_data_from_numpy(np.zeros(len(rows[first])), binary_data=True)
    try:
        client.infer(model, [*inputs(True), unknown], headers=auth())
        refused["unknown"] = "answered"
    except InferenceServerException as exc:
        refused["unknown"] = {"status": exc.status(), "message": exc.message()}
    try:
        client.get_model_metadata(model, model_version="999", headers=auth())
        refused["version"] = "answered"
    except InferenceServerException as exc:
        refused["version"] = {"status": exc.status(), "message": exc.message()}
    seen["refused"] = refused
    return seen


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))
