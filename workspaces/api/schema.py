"""OpenAPI (drf-spectacular) descriptions shared by every API view.

``AutoSchema`` (the project's ``DEFAULT_SCHEMA_CLASS``) documents the one error envelope
(``workspaces.api.errors``) on every operation, for each status the request pipeline can answer
with before or around the view's own code: bad input, authentication, permissions, an unknown
object, a conflict, a body over the limit, an unsupported media type, throttling.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.fields import empty

from workspaces.api.errors import TYPES_BY_STATUS


class ApiTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "workspaces.api.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; keys come from POST /api/v1/auth/token/ or the UI.",
        }


class FieldErrorSerializer(serializers.Serializer):
    """One error of a request: field errors name ``attr`` and ``code``, batch rows ``row`` and
    ``column``."""

    attr = serializers.CharField(
        allow_null=True, required=False, help_text="The field, nested names joined by dots."
    )
    code = serializers.CharField(required=False)
    detail = serializers.CharField()
    row = serializers.IntegerField(allow_null=True, required=False, help_text="Batch row index.")
    column = serializers.CharField(allow_null=True, required=False, help_text="Batch column.")


class ErrorEnvelopeSerializer(serializers.Serializer):
    """The error body of every endpoint; some errors add keys (a conflict names its consumers)."""

    type = serializers.ChoiceField(choices=sorted({*TYPES_BY_STATUS.values(), "server_error"}))
    code = serializers.CharField()
    detail = serializers.CharField()
    attr = serializers.CharField(allow_null=True)
    # the envelope's field is called errors by contract; it shadows Serializer.errors here only.
    errors = FieldErrorSerializer(many=True, required=False, help_text="Every error (400).")  # type: ignore[assignment]


ERROR_DESCRIPTIONS = {
    "400": "Bad input; `attr` names the field.",
    "401": "Missing, invalid or expired credentials.",
    "403": "The caller's role does not allow this.",
    "404": "No such object, or one in a workspace the caller cannot see (in the path, the body "
    "or the query; `attr` names the body or query field).",
    "409": "Conflict with the current state (e.g. the object has consumers).",
    "413": "Request body over the size limit.",
    "415": "Unsupported request media type.",
    "429": "Too many requests.",
}
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's AutoSchema plus the error envelope on every operation."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        for code in self._error_codes(operation):
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorEnvelopeSerializer, description=ERROR_DESCRIPTIONS[code]),
                    code,
                )
        return operation

    def _get_serializer_field_meta(self, field, direction):
        meta = super()._get_serializer_field_meta(field, direction)
        # DRF answers None for a field whose source is missing on the way (``created_by.username``
        # of a row without a creator) when the field defaults to None; say so in the schema.
        if direction == "response" and getattr(field, "default", empty) is None:
            meta["nullable"] = True
        return meta

    def _error_codes(self, operation) -> list[str]:
        parameters = operation.get("parameters", [])
        has_body = "requestBody" in operation or self.method in {"POST", "PUT", "PATCH"}
        codes = []
        if has_body or any(p["in"] != "path" for p in parameters):
            codes.append("400")
        if operation.get("security"):
            codes += ["401", "403"]
        # 404 also answers a body or query that names an object the caller cannot see.
        in_path = any(p["in"] == "path" for p in parameters)
        signed_in = any(operation.get("security") or [])  # [{}]: anyone may call it
        if in_path or (signed_in and (parameters or has_body)):
            codes.append("404")
        if self.method in WRITE_METHODS:
            codes.append("409")
        if has_body:
            codes += ["413", "415"]
        if getattr(self.view, "throttle_classes", None):
            codes.append("429")
        return codes


class SingleAnswerSchema(AutoSchema):
    """For a viewset whose ``list`` route answers one object (a lineage graph around a node), not
    a page of its queryset: drf-spectacular would otherwise wrap the answer in a paginated
    array and name the operation ``..._list``."""

    def _is_list_view(self, serializer=None) -> bool:
        return False
