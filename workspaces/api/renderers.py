"""A JSON renderer on orjson: the same output as DRF's, several times faster on big bodies."""

from __future__ import annotations

from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_fallback = JSONEncoder()


class FastJSONRenderer(JSONRenderer):
    """orjson for what it knows (dicts, lists, numbers, datetimes); DRF's encoder for the rest
    (Decimal, lazy translations, querysets)."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context=None):
        if data is None:
            return b""
        if renderer_context and renderer_context.get("indent"):
            return super().render(data, accepted_media_type, renderer_context)
        return orjson.dumps(
            data, default=_fallback.default, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z
        )
