"""Permission-matrix rows for the scheduler's API routes."""

from __future__ import annotations

from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint

WS = "/api/v1/workspaces/{ws}/scheduler"

ENDPOINTS = [
    Endpoint("GET", WS + "/queue/", role=Role.VIEWER),
    # A GET body becomes the query string.
    Endpoint(
        "GET",
        WS + "/recommendation/",
        role=Role.VIEWER,
        body=lambda ctx: {"template": "logreg"},
    ),
    Endpoint("GET", WS + "/quotas/", role=Role.VIEWER),
    # Only platform admins (superusers, outside the workspace roles) change quotas: every
    # workspace role, the admin's included, is refused (test_quota_permissions has the 201).
    Endpoint(
        "POST",
        WS + "/quotas/",
        role=Role.ADMIN,
        success=403,
        body=lambda ctx: {"gpu_type": "V100", "gpu_milli": 4000},
    ),
    Endpoint("GET", WS + "/quota-requests/", role=Role.ADMIN),
    Endpoint(
        "POST",
        WS + "/quota-requests/",
        role=Role.ADMIN,
        success=201,
        body=lambda ctx: {"gpu_type": "V100", "gpu_milli": 4000, "reason": "more"},
    ),
]
