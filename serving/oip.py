"""Open Inference Protocol v2 (JSON) encoding for RankOps models. No Django imports.

Request: ``{"id": "...", "inputs": [{"name": <feature column "group__feature" or ref
"group:feature">, "shape": [N] (or [N, dim] for embeddings), "datatype": "FP32" | "FP64" |
"INT64" | "INT32" | "BOOL" | "BYTES", "data": [...]}]}``: the raw feature values of N candidates,
encoded by the model's own ``FeatureEncoder``. Response: one output ``score`` (FP64, shape [N]).

The binary tensor extension (what ``tritonclient`` sends by default): the request's JSON header
is the first ``Inference-Header-Content-Length`` bytes of the body and an input whose
``parameters.binary_data_size`` is set takes that many bytes of what follows, in input order
(little-endian values; BYTES as a 4-byte length before each element). The answer is binary when
the request asks (``parameters.binary_data_output`` or an output's ``parameters.binary_data``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DATATYPES = {"FP32", "FP64", "FP16", "INT64", "INT32", "INT16", "INT8", "UINT8", "BOOL", "BYTES"}
MAX_ROWS = 10_000
MAX_INPUTS = 500


NUMPY = {
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8", "INT8": "<i1", "INT16": "<i2", "INT32": "<i4",
    "INT64": "<i8", "UINT8": "<u1", "BOOL": "?",
}  # fmt: skip


def model_inputs(features: Any) -> list[dict]:
    """A bundle's inputs as OIP metadata: one per feature column, its datatype and shape."""
    inputs = []
    for f in features:
        if f.dtype == "embedding":
            inputs.append({"name": f.column, "datatype": "FP32", "shape": [-1, f.dim]})
        elif f.dtype in ("categorical", "string"):
            inputs.append({"name": f.column, "datatype": "BYTES", "shape": [-1]})
        elif f.dtype == "categorical_list":
            # Each row's items, null-padded to the slots the model reads.
            inputs.append({"name": f.column, "datatype": "BYTES", "shape": [-1, f.slots]})
        elif f.dtype == "bool":
            inputs.append({"name": f.column, "datatype": "BOOL", "shape": [-1]})
        else:
            inputs.append({"name": f.column, "datatype": "FP64", "shape": [-1]})
    return inputs


OUTPUTS = [{"name": "score", "datatype": "FP64", "shape": [-1]}]
SERVER = {"name": "rankops", "version": "0.1.0", "extensions": ["binary_tensor_data"]}


def encode_inputs(columns: dict[str, list], n: int, inputs: list[dict], request_id: str) -> dict:
    """An OIP infer request for ``n`` rows of raw columns (keyed as ``Bundle.predict`` takes
    them) against a model whose metadata ``inputs`` are given: each column under the input's
    name, a list row null-padded or cut to the slots the input's shape names."""
    by_name = {item["name"]: item for item in inputs}
    encoded = []
    for ref, column in columns.items():
        name = ref if ref in by_name else ref.replace(":", "__", 1)
        meta = by_name.get(name)
        if meta is None:
            continue  # a column the model does not read
        shape = meta["shape"]
        if len(shape) == 2 and meta["datatype"] == "BYTES":
            width = shape[1]
            column = [(list(row or [])[:width] + [None] * width)[:width] for row in column]
        encoded.append(
            {
                "name": name,
                "datatype": meta["datatype"],
                "shape": [n, shape[1]] if len(shape) == 2 else [n],
                "data": column,
            }
        )
    return {"id": request_id, "inputs": encoded}


def split_binary(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary tail of a request (all JSON without the header)."""
    if header_length is None or header_length == "":
        return body, b""
    text = str(header_length)
    if not text.isdigit() or int(text) > len(body):
        raise ValueError("Inference-Header-Content-Length must be the JSON header's byte count")
    cut = int(text)
    return body[:cut], body[cut:]


def _binary_values(datatype: str, raw: bytes, count: int, where: str) -> list:
    if datatype == "BYTES":
        values, at = [], 0
        while at < len(raw):
            if at + 4 > len(raw):
                raise ValueError(f"{where}: a BYTES element's 4-byte length is cut short")
            size = int.from_bytes(raw[at : at + 4], "little")
            at += 4
            if at + size > len(raw):
                raise ValueError(f"{where}: a BYTES element is cut short")
            values.append(raw[at : at + size].decode("utf-8", errors="replace"))
            at += size
    else:
        width = np.dtype(NUMPY[datatype]).itemsize
        if len(raw) != count * width:
            raise ValueError(
                f"{where}: {len(raw)} bytes; {count} {datatype} values need {count * width}"
            )
        array = np.frombuffer(raw, dtype=NUMPY[datatype])
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise ValueError(f"{where} must hold finite numbers")
        values = array.tolist()
    if len(values) != count:
        raise ValueError(f"{where} holds {len(values)} values; its shape needs {count}")
    return values


def decode_inputs(payload: Any, binary: bytes = b"") -> tuple[dict[str, list], int, str]:
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
    taken = 0
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
        width = shape[1] if len(shape) == 2 else 1
        parameters = item.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ValueError(f"inputs[{i}].parameters must be an object")
        size = parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"inputs[{i}].parameters.binary_data_size must be a byte count")
            if size > len(binary) - taken:
                raise ValueError(f"inputs[{i}]: the body holds fewer binary bytes than it names")
            data = _binary_values(
                datatype, binary[taken : taken + size], rows * width, f"inputs[{i}].data"
            )
            taken += size
        if not isinstance(data, list):
            raise ValueError(f"inputs[{i}].data must be a list")
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
        if name in columns:
            raise ValueError(f"inputs[{i}]: '{name}' is given twice")
        columns[name] = column
    if taken != len(binary):
        raise ValueError("the body holds binary bytes no input names (binary_data_size)")
    return columns, n or 0, request_id


def check_against(columns: dict[str, list], n: int, inputs: list[dict]) -> dict[str, list]:
    """The request's columns checked against the model's metadata inputs (names as metadata
    gives them; a feature ref ``group:feature`` names the same column): every input given,
    none unknown, each one's width as its shape says. Returns the columns by metadata name."""
    by_name = {item["name"]: item for item in inputs}
    given: dict[str, list] = {}
    for name, column in columns.items():
        key = name.replace(":", "__", 1) if name not in by_name else name
        if key not in by_name:
            raise ValueError(
                f"unknown input '{name}'; the model's inputs are {', '.join(sorted(by_name))}"
            )
        given[key] = column
    missing = sorted(set(by_name) - set(given))
    if missing:
        raise ValueError(f"missing inputs: {', '.join(missing)} (see GET /v2/models/NAME)")
    for key, column in given.items():
        shape = by_name[key]["shape"]
        want = shape[1] if len(shape) == 2 else None
        rows_2d = bool(column) and isinstance(column[0], list)
        if want is None and rows_2d:
            raise ValueError(f"input '{key}' has shape [N]; it was given [{n}, {len(column[0])}]")
        if want is not None and (not rows_2d or any(len(row) != want for row in column)):
            raise ValueError(f"input '{key}' has shape [N, {want}]")
    return given


def wants_binary(payload: dict) -> bool:
    """Whether the request asks for the score as binary data (the binary tensor extension)."""
    parameters = payload.get("parameters") or {}
    if isinstance(parameters, dict) and parameters.get("binary_data_output") is True:
        return True
    return any(
        isinstance(output, dict)
        and isinstance(output.get("parameters"), dict)
        and output["parameters"].get("binary_data") is True
        for output in payload.get("outputs") or []
    )


def check_outputs(payload: dict) -> None:
    outputs = payload.get("outputs")
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise ValueError("'outputs' must be a list")
    for output in outputs:
        if not isinstance(output, dict) or output.get("name") != "score":
            raise ValueError("the model has one output, 'score'")


def encode_outputs(
    name: str, version: str, request_id: str, scores: np.ndarray, *, binary: bool = False
) -> tuple[dict, bytes]:
    """The answer's JSON and, when ``binary``, the score's bytes that follow it."""
    output: dict[str, Any] = {"name": "score", "shape": [int(scores.shape[0])], "datatype": "FP64"}
    raw = b""
    if binary:
        raw = np.ascontiguousarray(scores, dtype="<f8").tobytes()
        output["parameters"] = {"binary_data_size": len(raw)}
    else:
        output["data"] = scores.tolist()
    body = {"model_name": name, "model_version": version, "id": request_id, "outputs": [output]}
    return body, raw
