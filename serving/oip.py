"""Open Inference Protocol v2 (JSON) encoding for RankOps models. No Django imports.

Request: ``{"id": "...", "inputs": [{"name": <feature column "group__feature" or ref
"group:feature">, "shape": [N] (or [N, dim] for embeddings), "datatype": "FP32" | "FP64" |
"INT64" | "INT32" | "BOOL" | "BYTES", "data": [...]}]}``: the raw feature values of N candidates,
encoded by the model's own ``FeatureEncoder``. Response: one output ``score`` (FP64, shape [N]).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DATATYPES = {"FP32", "FP64", "FP16", "INT64", "INT32", "INT16", "INT8", "UINT8", "BOOL", "BYTES"}
MAX_ROWS = 10_000
MAX_INPUTS = 500


def decode_inputs(payload: Any) -> tuple[dict[str, list], int, str]:
    if not isinstance(payload, dict):
        raise ValueError("the body must be a JSON object")
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValueError("'inputs' must be a non-empty list")
    if len(inputs) > MAX_INPUTS:
        raise ValueError(f"at most {MAX_INPUTS} inputs")
    request_id = payload.get("id", "")
    if not isinstance(request_id, str) or len(request_id) > 100:
        raise ValueError("'id' must be a string of at most 100 characters")
    columns: dict[str, list] = {}
    n = None
    for i, item in enumerate(inputs):
        if not isinstance(item, dict):
            raise ValueError(f"inputs[{i}] must be an object")
        name, shape, datatype, data = (
            item.get("name"),
            item.get("shape"),
            item.get("datatype"),
            item.get("data"),
        )
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError(f"inputs[{i}].name must be a feature column")
        if datatype not in DATATYPES:
            raise ValueError(f"inputs[{i}].datatype must be one of {sorted(DATATYPES)}")
        if (
            not isinstance(shape, list)
            or not 1 <= len(shape) <= 2
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)
        ):
            raise ValueError(f"inputs[{i}].shape must be [N] or [N, dim]")
        rows = shape[0]
        if rows > MAX_ROWS:
            raise ValueError(f"at most {MAX_ROWS} rows")
        if n is None:
            n = rows
        elif rows != n:
            raise ValueError("all inputs must have the same first dimension")
        if not isinstance(data, list):
            raise ValueError(f"inputs[{i}].data must be a list")
        width = shape[1] if len(shape) == 2 else 1
        flat = data
        if data and isinstance(data[0], list):
            if len(data) != rows or any(not isinstance(r, list) or len(r) != width for r in data):
                raise ValueError(f"inputs[{i}].data does not match its shape")
            column = data
        else:
            if len(flat) != rows * width:
                raise ValueError(
                    f"inputs[{i}].data has {len(flat)} values; shape needs {rows * width}"
                )
            column = (
                flat if width == 1 else [flat[r * width : (r + 1) * width] for r in range(rows)]
            )
        if datatype != "BYTES":
            for value in flat if width == 1 else (v for r in column for v in r):
                if value is not None and (
                    isinstance(value, str)
                    or not isinstance(value, (int, float))
                    or (isinstance(value, float) and not math.isfinite(value))
                ):
                    raise ValueError(f"inputs[{i}].data must hold finite numbers")
        columns[name] = column
    return columns, n or 0, request_id


def encode_outputs(name: str, version: str, request_id: str, scores: np.ndarray) -> dict:
    return {
        "model_name": name,
        "model_version": version,
        "id": request_id,
        "outputs": [
            {
                "name": "score",
                "shape": [int(scores.shape[0])],
                "datatype": "FP64",
                "data": scores.tolist(),
            }
        ],
    }
