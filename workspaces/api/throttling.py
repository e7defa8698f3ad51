"""Rate limits on writes: each user may make ``DEFAULT_THROTTLE_RATES["workspace_write"]``
unsafe requests (POST, PUT, PATCH, DELETE) per workspace, so one script's loop cannot crowd out
everyone else's work. Reads are not limited here. Over the rate: 429 in the error envelope,
with ``Retry-After``."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

# Data-plane routes that read (or record telemetry) by POST at serving rates: the online
# feature lookup and experiment feedback. Their capacity is the gateway's concern, not a
# write quota's.
DATA_PLANE_BASENAMES = frozenset({"online-features", "feedback"})


class WorkspaceWriteThrottle(SimpleRateThrottle):
    """Unsafe requests per user and workspace (``{ws}`` in the URL; one bucket for routes
    outside a workspace, e.g. the OpenLineage intake)."""

    scope = "workspace_write"

    def get_rate(self) -> str | None:
        # Read at request time (not at import, as DRF's class attribute is), so a changed
        # setting applies at once.
        # the stubs type the rates as numbers; DRF's are strings such as '100/min'.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)  # type: ignore[return-value]

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS or getattr(view, "basename", "") in DATA_PLANE_BASENAMES:
            return True
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        user = request.user
        if not user or not user.is_authenticated:
            return None  # anonymous writes are refused by authentication anyway
        workspace = getattr(view, "kwargs", {}).get("ws", "")
        return f"throttle:{self.scope}:{user.pk}:{workspace}"
