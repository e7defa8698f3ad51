"""The OpenAPI schema made complete (a drf-spectacular postprocessing hook).

drf-spectacular documents the DRF views; this hook adds what it cannot see or type:

- **the plain Django views that are API**: the gateway's ``predict/``, the Open Inference
  Protocol routes under ``/v2/``, ``/metrics`` and the ``/healthz`` and ``/readyz`` probes, each
  with its request and response bodies and its error responses (the one error envelope);
- **typed request bodies** where a serializer takes free JSON (training params, tuning search
  spaces, pipeline stages, feature definitions, scaling policies, entity keys, batch rows): named
  component schemas, written from what the services check;
- **an example for every operation**: a request body and every response body without one get an
  example built from their own schema (so it is valid by construction: the schema test validates
  each one against its schema).

A route of ``config/urls.py`` missing here fails ``config/tests/test_openapi_complete.py``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

ENVELOPE = {"$ref": "#/components/schemas/ErrorEnvelope"}
SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}

# ---------------------------------------------------------------------------------------------
# Component schemas of the free-JSON bodies

PARAM_VALUE = {
    "description": "A param's value: a number, a string, a boolean, a list of integers (e.g. "
    "hidden layer sizes) or an object of params (a nested group).",
    "anyOf": [
        {"type": "number"},
        {"type": "string"},
        {"type": "boolean"},
        {"type": "array", "items": {"type": "integer"}},
        {"type": "object", "additionalProperties": True},
    ],
}
COMPONENTS: dict[str, dict[str, Any]] = {
    "ParamValues": {
        "type": "object",
        "description": "Params by name, as the template's schema (GET training-templates/) "
        "declares them; an unknown name or a value out of range answers 400 naming "
        "`params.<name>`.",
        "additionalProperties": PARAM_VALUE,
        "example": {"epochs": 3, "lr": 0.01, "hidden": [64, 32]},
    },
    "SearchDimension": {
        "description": "A range (`low`/`high`, `log` for a log-uniform draw) or a list of choices.",
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "low": {"type": "number"},
                    "high": {"type": "number"},
                    "log": {"type": "boolean", "default": False},
                },
                "required": ["low", "high"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"choices": {"type": "array", "items": SCALAR, "minItems": 1}},
                "required": ["choices"],
                "additionalProperties": False,
            },
        ],
    },
    "SearchSpace": {
        "type": "object",
        "description": "The tuned params and their ranges, over the template's params.",
        "additionalProperties": {"$ref": "#/components/schemas/SearchDimension"},
        "example": {"lr": {"low": 0.0001, "high": 0.1, "log": True}, "dim": {"choices": [8, 16]}},
    },
    "PipelineStage": {
        "type": "object",
        "description": "One stage of a pipeline's DAG: it runs after the stages it names.",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 63},
            "kind": {"type": "string", "description": "A stage kind (training.pipelines)."},
            "after": {"type": "array", "items": {"type": "string"}, "default": []},
            "params": {"$ref": "#/components/schemas/ParamValues"},
        },
        "required": ["name", "kind"],
    },
    "PipelineStages": {
        "type": "array",
        "items": {"$ref": "#/components/schemas/PipelineStage"},
        "minItems": 1,
    },
    "FeatureDefinition": {
        "type": "object",
        "description": "A feature of a group: its column name and type (`dimension` for an "
        "embedding, the list length for categorical_list).",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 63},
            "dtype": {
                "type": "string",
                "enum": [
                    "int",
                    "float",
                    "bool",
                    "string",
                    "categorical",
                    "embedding",
                    "categorical_list",
                ],
            },
            "dimension": {"type": "integer", "minimum": 1, "nullable": True},
            "description": {"type": "string"},
        },
        "required": ["name", "dtype"],
    },
    "EntityKey": {
        "description": "An entity's key: its value, or an object of its key columns.",
        "anyOf": [
            {"type": "string", "maxLength": 200},
            {"type": "integer"},
            {
                "type": "object",
                "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "minProperties": 1,
                "maxProperties": 8,
            },
        ],
    },
    "BatchRow": {
        "type": "object",
        "description": "One row of a batch: the key columns, the event time and feature values.",
        "additionalProperties": {
            "nullable": True,
            "anyOf": [
                {"type": "string"},
                {"type": "number"},
                {"type": "boolean"},
                {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "string"}]}},
            ],
        },
    },
    "ScalingPolicy": {
        "description": "How many replicas a deployment runs: fixed, by a daily schedule, or "
        "by load.",
        "oneOf": [
            {
                "type": "object",
                "properties": {"mode": {"type": "string", "enum": ["fixed"]}},
                "required": ["mode"],
            },
            {
                "type": "object",
                "properties": {
                    "mode": {"type": "string", "enum": ["schedule"]},
                    "windows": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "start": {"type": "string", "example": "08:00"},
                                "end": {"type": "string", "example": "20:00"},
                                "replicas": {"type": "integer", "minimum": 1},
                            },
                            "required": ["start", "end", "replicas"],
                        },
                    },
                },
                "required": ["mode", "windows"],
            },
            {
                "type": "object",
                "properties": {
                    "mode": {"type": "string", "enum": ["load"]},
                    "target_qps_per_replica": {
                        "type": "number",
                        "exclusiveMinimum": True,
                        "minimum": 0,
                    },
                    "min": {"type": "integer", "minimum": 1},
                    "max": {"type": "integer", "minimum": 1},
                },
                "required": ["mode", "target_qps_per_replica"],
            },
        ],
    },
    "WorkspaceTemplate": {
        "type": "object",
        "description": "A workspace's starting content (a scene of demo objects), by name.",
        "additionalProperties": True,
    },
}

# (component, property) -> the typed schema of a request field drf-spectacular left free.
TYPED_FIELDS: dict[tuple[str, str], dict[str, Any]] = {
    ("TrainingJobCreateRequest", "params"): {"$ref": "#/components/schemas/ParamValues"},
    ("TuningJobCreateRequest", "params"): {
        "allOf": [{"$ref": "#/components/schemas/ParamValues"}],
        "nullable": True,
        "description": "Fixed params of every trial.",
    },
    ("TuningJobCreateRequest", "space"): {
        "allOf": [{"$ref": "#/components/schemas/SearchSpace"}],
        "nullable": True,
        "description": "The search space (default: the template's default space).",
    },
    ("PipelineRunCreateRequest", "params"): {"$ref": "#/components/schemas/ParamValues"},
    ("PipelineRequest", "stages"): {"$ref": "#/components/schemas/PipelineStages"},
    ("PatchedPipelineRequest", "stages"): {"$ref": "#/components/schemas/PipelineStages"},
    ("Pipeline", "stages"): {"$ref": "#/components/schemas/PipelineStages"},
    ("DeploymentCreateRequest", "scaling"): {"$ref": "#/components/schemas/ScalingPolicy"},
    ("ScaleRequest", "scaling"): {"$ref": "#/components/schemas/ScalingPolicy"},
    ("PatchedWorkspaceUpdateRequest", "template"): {
        "$ref": "#/components/schemas/WorkspaceTemplate"
    },
    ("OnlineLookupRequest", "entities"): {
        "type": "array",
        "items": {"$ref": "#/components/schemas/EntityKey"},
        "description": "Entity key values, or objects of key columns.",
    },
}
# Array fields whose items are free objects: (component, property) -> the items' schema.
TYPED_ITEMS: dict[tuple[str, str], dict[str, Any]] = {
    ("FeatureGroupCreateRequest", "features"): {"$ref": "#/components/schemas/FeatureDefinition"},
    ("PatchedFeatureGroupUpdateRequest", "features"): {
        "$ref": "#/components/schemas/FeatureDefinition"
    },
}

# ---------------------------------------------------------------------------------------------
# The plain Django views


def _errors(*codes: str) -> dict[str, Any]:
    from workspaces.api.schema import ERROR_DESCRIPTIONS

    return {
        code: {
            "description": ERROR_DESCRIPTIONS.get(code, "Service unavailable."),
            "content": {"application/json": {"schema": ENVELOPE}},
        }
        for code in codes
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


TOKEN_SECURITY: list[dict[str, list[str]]] = [{"tokenAuth": []}, {"cookieAuth": []}]
WS_PARAM = {
    "name": "ws",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$"},
    "description": "The workspace's slug.",
}
MODEL_PARAM = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "`<workspace slug>.<deployment name>`, e.g. `feed-pctr.ranker`.",
    "example": "feed-pctr.ranker",
}
VERSION_PARAM = {
    "name": "version",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The model version's number (the deployment's production version).",
    "example": "1",
}
GATEWAY_COMPONENTS: dict[str, dict[str, Any]] = {
    "PredictRequest": {
        "type": "object",
        "properties": {
            "request_id": {"type": "string", "minLength": 1, "maxLength": 100},
            "deployment": {"type": "string", "minLength": 1, "maxLength": 63},
            "user": _ref("EntityKey"),
            "context": {
                "type": "object",
                "maxProperties": 200,
                "additionalProperties": True,
                "description": "Context features (and context entity keys) of the request.",
            },
            "candidates": {
                "type": "array",
                "items": _ref("EntityKey"),
                "minItems": 1,
                "maxItems": 1000,
            },
        },
        "required": ["deployment", "user", "candidates"],
        "example": {
            "request_id": "r-1",
            "deployment": "ranker",
            "user": "u42",
            "context": {"device": "mobile"},
            "candidates": ["i1", "i2", "i3"],
        },
    },
    "PredictResponse": {
        "type": "object",
        "properties": {
            "request_id": {"type": "string"},
            "deployment": {"type": "string"},
            "model": {"type": "string"},
            "version": {"type": "integer"},
            "version_id": {"type": "integer"},
            "experiment": {"type": "string", "nullable": True},
            "arm": {"type": "string", "nullable": True},
            "scores": {"type": "array", "items": {"type": "number"}},
        },
        "required": ["request_id", "deployment", "model", "version", "version_id", "scores"],
    },
    "InferenceTensor": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "datatype": {
                "type": "string",
                "enum": [
                    "BOOL",
                    "UINT8",
                    "INT8",
                    "INT16",
                    "INT32",
                    "INT64",
                    "FP16",
                    "FP32",
                    "FP64",
                    "BYTES",
                ],
            },
            "shape": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
            "data": {"type": "array", "items": {}},
            "parameters": {"type": "object", "additionalProperties": True},
        },
        "required": ["name", "datatype", "shape", "data"],
        "example": {
            "name": "user_stats__ctr_7d",
            "datatype": "FP64",
            "shape": [2],
            "data": [0.1, 0.2],
        },
    },
    "InferenceRequest": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object", "additionalProperties": True},
            "inputs": {"type": "array", "items": _ref("InferenceTensor"), "minItems": 1},
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            },
        },
        "required": ["inputs"],
    },
    "InferenceResponse": {
        "type": "object",
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": _ref("InferenceTensor")},
        },
        "required": ["model_name", "outputs"],
    },
    "TensorMetadata": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["name", "datatype", "shape"],
    },
    "ModelMetadata": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": _ref("TensorMetadata")},
            "outputs": {"type": "array", "items": _ref("TensorMetadata")},
        },
        "required": ["name", "platform", "inputs", "outputs"],
    },
    "ProbeStatus": {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable"]},
            "checks": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "`ok` or `error: <reason>` per dependency (readyz).",
            },
        },
        "required": ["status"],
    },
}


_MINUTES = {"type": "integer", "minimum": 0}
# 200 bodies of DRF actions that document a description only: (path, method) -> schema.
RESPONSE_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("/api/v1/workspaces/{ws}/deployments/{name}/routing/", "get"): {
        "type": "object",
        "properties": {
            "workspace_id": {"type": "integer"},
            "deployment": {"type": "string"},
            "deployment_id": {"type": "integer"},
            "routing_version": {"type": "integer"},
            "production": {"type": "integer"},
            "stopped": {"type": "boolean"},
            "previous": {"type": "integer", "nullable": True},
            "buckets": {"type": "integer"},
            "layers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "layer": {"type": "string"},
                        "salt": {"type": "string"},
                        "allocations": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "experiment_key": {"type": "string"},
                                    "arm": {"type": "string"},
                                    "version_id": {"type": "integer"},
                                    "start": {"type": "integer"},
                                    "end": {"type": "integer"},
                                },
                            },
                        },
                    },
                },
            },
        },
        "required": ["deployment", "production", "buckets", "layers"],
    },
    ("/api/v1/workspaces/{ws}/deployments/{name}/stats/", "get"): {
        "type": "object",
        "properties": {
            "deployment": {"type": "string"},
            "window_minutes": {"type": "integer"},
            "requests": {"type": "integer"},
            "qps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"minutes_ago": _MINUTES, "qps": {"type": "number"}},
                },
            },
            "latency_ms": {
                "type": "object",
                "properties": {
                    "p50": {"type": "number", "nullable": True},
                    "p99": {"type": "number", "nullable": True},
                },
            },
            "latency_histogram": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "le": {"anyOf": [{"type": "number"}, {"type": "string", "enum": ["+Inf"]}]},
                        "count": {"type": "integer"},
                    },
                },
            },
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"minutes_ago": _MINUTES, "errors": {"type": "integer"}},
                },
            },
            "version_mix": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["deployment", "requests", "qps", "latency_ms", "errors", "version_mix"],
    },
}


def _gateway_paths() -> dict[str, dict[str, Any]]:
    model_ops = {
        "security": TOKEN_SECURITY,
        "parameters": [MODEL_PARAM],
        "tags": ["inference"],
    }
    paths: dict[str, dict[str, Any]] = {
        "/api/v1/workspaces/{ws}/predict/": {
            "post": {
                "operationId": "predict",
                "summary": "Score candidates for a user with a deployment",
                "description": "The gateway fetches the online features itself, routes the user "
                "to a version (production or an experiment arm), scores all candidates in one "
                "batch and logs the prediction.",
                "tags": ["inference"],
                "parameters": [WS_PARAM],
                "security": TOKEN_SECURITY,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("PredictRequest")}},
                },
                "responses": {
                    "200": _json(_ref("PredictResponse"), "One score per candidate, in order."),
                    **_errors("400", "401", "403", "404", "409", "413"),
                },
            }
        },
        "/v2/health/live": {
            "get": {
                "operationId": "v2_health_live",
                "summary": "Open Inference Protocol: server liveness",
                "tags": ["inference"],
                "security": [],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"live": {"type": "boolean"}},
                            "required": ["live"],
                        },
                        "The server is live.",
                    )
                },
            }
        },
        "/v2/health/ready": {
            "get": {
                "operationId": "v2_health_ready",
                "summary": "Open Inference Protocol: server readiness",
                "tags": ["inference"],
                "security": [],
                "responses": {
                    code: _json(
                        {
                            "type": "object",
                            "properties": {"ready": {"type": "boolean"}},
                            "required": ["ready"],
                        },
                        text,
                    )
                    for code, text in (("200", "Ready."), ("503", "Not ready (no database)."))
                },
            }
        },
        "/v2/models/{name}": {
            "get": {
                **model_ops,
                "operationId": "v2_model_metadata",
                "summary": "Open Inference Protocol: model metadata (inputs and outputs)",
                "responses": {
                    "200": _json(_ref("ModelMetadata"), "The production version's tensors."),
                    **_errors("401", "403", "404"),
                },
            }
        },
        "/v2/models/{name}/ready": {
            "get": {
                **model_ops,
                "operationId": "v2_model_ready",
                "summary": "Open Inference Protocol: model readiness",
                "responses": {
                    code: _json(
                        {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "ready": {"type": "boolean"},
                            },
                            "required": ["name", "ready"],
                        },
                        text,
                    )
                    for code, text in (("200", "Ready."), ("503", "Stopped."))
                }
                | _errors("401", "403", "404"),
            }
        },
        "/v2/models/{name}/infer": {
            "post": {
                **model_ops,
                "operationId": "v2_model_infer",
                "summary": "Open Inference Protocol: score feature tensors",
                "description": "Scores raw feature inputs (one tensor per feature column) with "
                "the deployment's production version.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("InferenceRequest")}},
                },
                "responses": {
                    "200": _json(_ref("InferenceResponse"), "The scores, as tensor `score`."),
                    **_errors("400", "401", "403", "404", "409", "413"),
                },
            }
        },
        "/v2": {
            "get": {
                "operationId": "v2_server_metadata",
                "summary": "Open Inference Protocol: server metadata (name, version, extensions)",
                "tags": ["inference"],
                "security": [],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "version": {"type": "string"},
                                "extensions": {"type": "array", "items": {"type": "string"}},
                            },
                            "required": ["name", "version", "extensions"],
                        },
                        "The server, and `binary_tensor_data` among its extensions.",
                    )
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (summed over the server's processes)",
                "description": "With METRICS_TOKEN set, `Authorization: Bearer <METRICS_TOKEN>` "
                "is required.",
                "tags": ["operations"],
                "security": [{"metricsBearer": []}, {}],
                "responses": {
                    "200": {
                        "description": "The Prometheus text exposition format.",
                        "content": {
                            "text/plain": {
                                "schema": {"type": "string"},
                                "examples": {
                                    "exposition": {
                                        "value": "# TYPE rankops_serving_requests_total counter\n"
                                    }
                                },
                            }
                        },
                    },
                    "401": {"description": "METRICS_TOKEN is set and the bearer token differs."},
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness probe",
                "tags": ["operations"],
                "security": [],
                "responses": {"200": _json(_ref("ProbeStatus"), "The process serves.")},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness probe (database, cache, broker, a consuming worker)",
                "tags": ["operations"],
                "security": [],
                "responses": {
                    "200": _json(_ref("ProbeStatus"), "Every dependency answers."),
                    "503": _json(_ref("ProbeStatus"), "A dependency is down (named in checks)."),
                },
            }
        },
    }
    # The same model routes for one version: /v2/models/{name}/versions/{version}[/ready|/infer]
    # (the production version's number; another answers 404).
    for tail in ("", "/ready", "/infer"):
        for method, operation in paths[f"/v2/models/{{name}}{tail}"].items():
            versioned = {
                **operation,
                "operationId": operation["operationId"] + "_version",
                "parameters": [*operation["parameters"], VERSION_PARAM],
            }
            paths[f"/v2/models/{{name}}/versions/{{version}}{tail}"] = {method: versioned}
    return paths


# ---------------------------------------------------------------------------------------------
# Examples built from a schema

_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "uuid": "3fa85f64-5717-4562-b3fc-2c963f66afa6",
    "uri": "https://example.com/",
    "email": "user@example.com",
    "binary": "",
    "ipv4": "127.0.0.1",
}


class ExampleBuilder:
    """A value that is valid for a schema (OpenAPI 3.0), with component references resolved."""

    def __init__(self, components: dict[str, Any]) -> None:
        self.components = components

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = self.components[schema["$ref"].rsplit("/", 1)[-1]]
        return schema

    def build(self, schema: dict[str, Any], *, direction: str, depth: int = 0) -> Any:
        schema = self._resolve(schema)
        for key in ("example", "default"):
            if key in schema and schema[key] is not None:
                return copy.deepcopy(schema[key])
        if "enum" in schema:
            return next((v for v in schema["enum"] if v is not None), None)
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(self._resolve(part))
            return self.build(merged, direction=direction, depth=depth)
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return self.build(schema[key][0], direction=direction, depth=depth)
        kind = schema.get("type")
        if kind is None and "properties" in schema:
            kind = "object"
        if kind == "object":
            return self._object(schema, direction=direction, depth=depth)
        if kind == "array":
            if depth > 6:
                return []
            count = max(1, schema.get("minItems", 1))
            if "maxItems" in schema:
                count = min(count, schema["maxItems"])
            item = self.build(schema.get("items", {}), direction=direction, depth=depth + 1)
            return [copy.deepcopy(item) for _ in range(count)]
        if kind == "integer":
            return int(self._number(schema, 1))
        if kind == "number":
            return float(self._number(schema, 0.5))
        if kind == "boolean":
            return True
        if kind == "string":
            return self._string(schema)
        return "value"

    def _object(self, schema: dict[str, Any], *, direction: str, depth: int) -> dict[str, Any]:
        skip = "writeOnly" if direction == "response" else "readOnly"
        value = {}
        for name, prop in (schema.get("properties") or {}).items():
            resolved = self._resolve(prop)
            if prop.get(skip) or resolved.get(skip):
                continue
            if depth > 6 and name not in schema.get("required", []):
                continue
            value[name] = self.build(prop, direction=direction, depth=depth + 1)
        extra = schema.get("additionalProperties")
        if not value and isinstance(extra, dict) and extra:
            value["key"] = self.build(extra, direction=direction, depth=depth + 1)
        return value

    @staticmethod
    def _number(schema: dict[str, Any], default: float) -> float:
        low, high = schema.get("minimum"), schema.get("maximum")
        value = default
        if low is not None:
            value = low + (1 if schema.get("exclusiveMinimum") else 0)
            value = max(value, low)
            if schema.get("exclusiveMinimum") and value <= low:
                value = low + 1
        if high is not None and value > high:
            value = high - (1 if schema.get("exclusiveMaximum") else 0)
        return value

    @staticmethod
    def _string(schema: dict[str, Any]) -> str:
        value = _FORMATS.get(schema.get("format", ""), "example")
        pattern = schema.get("pattern")
        if pattern and not re.search(pattern, value):
            for candidate in ("example", "a", "1", "ab-1", "group:feature", "x" * 8):
                if re.search(pattern, candidate):
                    value = candidate
                    break
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if len(value) < low:
            value = value + "x" * (low - len(value))
        if high is not None and len(value) > high:
            value = value[:high]
        return value


def _add_examples(result: dict[str, Any]) -> None:
    builder = ExampleBuilder(result["components"]["schemas"])
    for item in result["paths"].values():
        for method, operation in item.items():
            if method not in {"get", "put", "post", "patch", "delete"}:
                continue
            bodies = [("request", operation.get("requestBody", {}))] + [
                ("response", response)
                for code, response in operation["responses"].items()
                if code.startswith("2")
            ]
            for direction, body in bodies:
                for media in (body.get("content") or {}).values():
                    if "schema" in media and "example" not in media and "examples" not in media:
                        media["examples"] = {
                            "example": {
                                "summary": "Generated from the schema",
                                "value": builder.build(media["schema"], direction=direction),
                            }
                        }


def _type_fields(result: dict[str, Any]) -> None:
    schemas = result["components"]["schemas"]
    for (component, field), typed in TYPED_FIELDS.items():
        prop = schemas.get(component, {}).get("properties", {}).get(field)
        if prop is None:
            continue  # the component is not in this schema (e.g. no PATCH variant)
        described = {k: prop[k] for k in ("description", "writeOnly", "readOnly") if k in prop}
        schemas[component]["properties"][field] = {**described, **typed}
    for (component, field), items in TYPED_ITEMS.items():
        prop = schemas.get(component, {}).get("properties", {}).get(field)
        if prop is not None and prop.get("type") == "array":
            prop["items"] = items


def postprocess_complete(result, generator, request, public):
    """drf-spectacular postprocessing hook: the plain views, typed bodies, examples."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(copy.deepcopy(COMPONENTS))
    schemas.update(copy.deepcopy(GATEWAY_COMPONENTS))
    security_schemes = result["components"].setdefault("securitySchemes", {})
    security_schemes["metricsBearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "The METRICS_TOKEN of the environment (when set).",
    }
    _type_fields(result)
    for (path, method), body in RESPONSE_BODIES.items():
        response = result["paths"].get(path, {}).get(method, {}).get("responses", {}).get("200")
        if response is not None and not response.get("content"):
            response["content"] = {"application/json": {"schema": copy.deepcopy(body)}}
    for path, item in _gateway_paths().items():
        result["paths"].setdefault(path, {}).update(item)
    batches = result["paths"].get("/api/v1/workspaces/{ws}/feature-groups/{name}/batches/", {})
    for media in batches.get("post", {}).get("requestBody", {}).get("content", {}).values():
        rows = media.get("schema", {}).get("properties", {}).get("rows")
        if rows is not None and rows.get("type") == "array":
            rows["items"] = _ref("BatchRow")
    lineage = result["paths"].get("/api/v1/lineage", {}).get("post", {})
    if lineage and "200" not in lineage["responses"]:
        # An event of a namespace that maps to no workspace of the caller is answered, not kept.
        lineage["responses"]["200"] = _json(
            {
                "type": "object",
                "properties": {"status": {"type": "string"}, "detail": {"type": "string"}},
                "required": ["status"],
            },
            "Not recorded (`status: ignored`, `detail` says why).",
        )
    _idempotency_headers(result)
    _add_examples(result)
    return result


IDEMPOTENCY_PARAM = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
    "description": "Send a write again with the same key to get its first answer, not a second "
    "write (workspaces.idempotency); the key with another request is a 409.",
}


def _idempotency_headers(result: dict[str, Any]) -> None:
    """Every write under /api/v1/ honours Idempotency-Key (the middleware, or the view itself)."""
    for path, item in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in item.items():
            if method not in ("post", "put", "patch", "delete"):
                continue
            parameters = operation.setdefault("parameters", [])
            if not any(p.get("name") == "Idempotency-Key" for p in parameters):
                parameters.append(copy.deepcopy(IDEMPOTENCY_PARAM))
            # A key over 200 characters is a 400; a key reused or still running, a 409.
            responses = operation.setdefault("responses", {})
            for code, response in _errors("400", "409").items():
                responses.setdefault(code, response)
