"""The OpenAPI schema documents the one error envelope, and the API answers it where Django
itself would answer an HTML page."""

from __future__ import annotations

import pytest
from django.conf import settings

from workspaces.models import Role


@pytest.mark.django_db
def test_too_many_form_fields_answer_the_error_envelope(client_for, workspace, members):
    fields = "&".join(f"f{i}=x" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    response = client_for(members[Role.ADMIN]).generic(
        "POST",
        f"/api/v1/workspaces/{workspace.slug}/feature-groups/",
        fields,
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["type"] == "validation_error"


@pytest.mark.django_db
def test_every_operation_documents_its_error_responses(client):
    schema = client.get("/api/schema/?format=json").json()
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    member = schema["paths"]["/api/v1/workspaces/{ws}/members/{username}/"]
    for method, codes in {"get": ["401", "403", "404"], "patch": ["400", "409", "413"]}.items():
        for code in codes:
            content = member[method]["responses"][code]["content"]["application/json"]
            assert content["schema"] == envelope, (method, code)
    token = schema["paths"]["/api/v1/auth/token/"]["post"]["responses"]
    assert "429" in token and "404" not in token
    created_by = schema["components"]["schemas"]["Dataset"]["properties"]["created_by"]
    assert created_by["nullable"] is True
