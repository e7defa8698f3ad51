"""A JSON parser that refuses what Python's json module would quietly accept.

NaN, Infinity and overflowing numbers such as 1e999, duplicate keys and pathologically deep
nesting all answer 400 instead of reaching a service.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 64


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key[:60]!r}")
        result[key] = value
    return result


def _depth_exceeds(raw: bytes, limit: int) -> bool:
    """Bracket depth outside strings, checked before json recurses into it."""
    depth = 0
    in_string = False
    escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


class StrictJSONParser(JSONParser):
    """JSON bodies with finite numbers, unique keys and bounded nesting only."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        if not raw.strip():
            raise ParseError("Request body is empty; send a JSON document.")
        if _depth_exceeds(raw, MAX_JSON_DEPTH):
            raise ParseError(f"JSON is nested deeper than {MAX_JSON_DEPTH} levels.")
        try:
            return json.loads(
                raw.decode("utf-8"),
                parse_constant=_reject_constant,
                parse_float=_parse_float,
                object_pairs_hook=_no_duplicate_keys,
            )
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ParseError(f"JSON parse error: {exc}") from exc
