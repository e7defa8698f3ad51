"""Rate limits on writes: each user may make ``DEFAULT_THROTTLE_RATES["workspace_write"]``
unsafe requests (POST, PUT, PATCH, DELETE) per workspace, so one script's loop cannot crowd out
everyone else's work. Reads are not limited here. Over the rate: 429 in the error envelope,
with ``Retry-After``.

The limiter keeps its counts in the shared cache. When that cache is down it lets the request
through (fails open) instead of refusing it: the limit is fairness between callers, not
protection of data, and a write needs only the database (a producer's push stays durable while
Redis is down). Refusing every write with 503 for as long as Redis was down turned a cache
outage into a write outage (the ``faults`` bench, ``redis_kill``: 15 pushes refused in 3 s).
"""

from __future__ import annotations

import logging
from typing import Any

from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from workspaces.api.errors import unavailable_code

logger = logging.getLogger(__name__)

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
        try:
            return super().allow_request(request, view)
        except Exception as exc:
            if unavailable_code(exc) != "cache_unavailable":
                raise
            logger.warning("write throttle skipped: the cache is unavailable (%s)", exc)
            return True

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        user = request.user
        if not user or not user.is_authenticated:
            return None  # anonymous writes are refused by authentication anyway
        workspace = getattr(view, "kwargs", {}).get("ws", "")
        return f"throttle:{self.scope}:{user.pk}:{workspace}"
