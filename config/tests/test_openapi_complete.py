"""The OpenAPI schema is complete: a valid OpenAPI 3 document (openapi-spec-validator) holding
every API route of ``config/urls.py`` (the DRF views, the gateway, /v2/, /metrics, the probes),
typed request bodies, and for every operation an example that validates against its own schema
and the 4xx responses it can answer, with the error envelope."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import EndpointEnumerator, SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

# Routes of config/urls.py that are not this API: the schema itself and its HTML docs, and
# MLflow's own tracking server (its REST API is MLflow's, documented by MLflow).
NOT_THIS_API = re.compile(r"^/api/(schema|docs)/$|^/mlflow")
# Plain Django views outside /api/ and /v2/ that are API all the same.
PLAIN_API = {"/metrics", "/healthz", "/readyz"}
METHODS = {"get", "put", "post", "patch", "delete"}
ENVELOPE = {"$ref": "#/components/schemas/ErrorEnvelope"}


@pytest.fixture(scope="module")
def schema() -> dict:
    generated = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(generated, renderer_context={}))


def _routes(patterns, prefix: str = "^"):
    """(OpenAPI path, view) of every URL pattern, as drf-spectacular names paths."""
    enumerator = EndpointEnumerator()
    for pattern in patterns:
        regex = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, regex)
        elif isinstance(pattern, URLPattern):
            # drf-spectacular names a {pk} parameter after the model's key: {id}
            path = enumerator.get_path_from_regex(regex).replace("{pk}", "{id}")
            yield path, pattern.callback


def _is_api(path: str, view) -> bool:
    is_drf = hasattr(view, "cls")
    return is_drf or path.startswith(("/api/", "/v2/")) or path in PLAIN_API


def _operations(schema: dict):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


def test_the_schema_is_valid_openapi_with_every_api_route_and_typed_bodies(schema):
    validate(schema)

    routes = [(path, view) for path, view in _routes(get_resolver().url_patterns)]
    api = {path for path, view in routes if _is_api(path, view) and not NOT_THIS_API.search(path)}
    assert {"/api/v1/workspaces/{ws}/predict/", "/v2/models/{name}/infer", "/metrics"} <= api
    assert len(api) > 80
    missing = sorted(path for path in api if not set(schema["paths"].get(path, {})) & METHODS)
    assert missing == []

    components = schema["components"]["schemas"]
    typed = {
        ("TrainingJobCreateRequest", "params"): "ParamValues",
        ("PipelineRunCreateRequest", "params"): "ParamValues",
        ("PipelineRequest", "stages"): "PipelineStages",
        ("DeploymentCreateRequest", "scaling"): "ScalingPolicy",
    }
    for (component, field), target in typed.items():
        assert components[component]["properties"][field]["$ref"].endswith(f"/{target}")
    features = components["FeatureGroupCreateRequest"]["properties"]["features"]["items"]
    assert features == {"$ref": "#/components/schemas/FeatureDefinition"}
    tuning = components["TuningJobCreateRequest"]["properties"]["space"]
    assert tuning["allOf"] == [{"$ref": "#/components/schemas/SearchSpace"}]
    assert components["PipelineStage"]["required"] == ["name", "kind"]


def test_every_operation_has_a_valid_example_and_its_error_responses(schema):
    with_components = {"components": schema["components"]}
    count = 0
    for path, method, operation in _operations(schema):
        where = f"{method.upper()} {path}"
        bodies = [operation.get("requestBody", {})] + [
            response for code, response in operation["responses"].items() if code[0] == "2"
        ]
        examples, contents = 0, 0
        for body in bodies:
            contents += len(body.get("content") or {})
            for media_type, media in (body.get("content") or {}).items():
                assert media.get("examples"), (where, media_type)
                validator = OAS30Validator({**media["schema"], **with_components})
                for name, example in media["examples"].items():
                    errors = [e.message for e in validator.iter_errors(example["value"])]
                    assert errors == [], (where, media_type, name, errors[:3])
                    examples += 1
        # An operation without any body (a DELETE answering 204) has nothing to exemplify.
        assert examples >= contents and (examples or method == "delete"), where

        responses = operation["responses"]
        parameters = operation.get("parameters", [])
        signed_in = any(requirement for requirement in operation.get("security", [{}]))
        expected = set()
        if signed_in:
            expected |= {"401"} if path == "/metrics" else {"401", "403"}
        if "requestBody" in operation:
            expected |= {"400", "413"}
        if any(p["in"] == "path" for p in parameters):
            expected.add("404")
        if method != "get" and signed_in:
            expected.add("409")
        assert expected <= set(responses), (where, sorted(expected - set(responses)))
        for code, response in responses.items():
            if code[0] == "4" and path != "/metrics":
                assert response["content"]["application/json"]["schema"] == ENVELOPE, (where, code)
        count += 1
    assert count > 100
