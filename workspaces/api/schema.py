"""OpenAPI (drf-spectacular) descriptions of the project's own authentication."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
