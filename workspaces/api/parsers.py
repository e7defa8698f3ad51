"""A JSON parser that refuses what Python's json module would quietly accept.

NaN, Infinity and overflowing numbers such as 1e999, duplicate keys and pathologically deep
nesting (the decoder's recursion guard) all answer 400 instead of reaching a service.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"duplicate key {duplicate[:60]!r}")
    return result


def parse_strict_json(raw: bytes, *, check_floats: bool = True) -> Any:
    """Parse JSON bytes strictly; raises ValueError naming what is wrong.

    ``check_floats=False`` leaves overflowing numbers (1e999 -> inf) to a caller that checks
    every number itself anyway (producer batches), which saves a Python call per number.
    """
    if not raw.strip():
        raise ValueError("the body is empty; send a JSON document")
    try:
        return json.loads(
            raw.decode("utf-8"),
            parse_constant=_reject_constant,
            parse_float=_parse_float if check_floats else float,
            object_pairs_hook=_no_duplicate_keys,
        )
    except UnicodeDecodeError as exc:
        raise ValueError(str(exc)) from exc
    except RecursionError as exc:
        # The C scanner guards its recursion: pathologically deep nesting ends here, not in a crash.
        raise ValueError("JSON is nested too deeply") from exc


class StrictJSONParser(JSONParser):
    """JSON bodies with finite numbers, unique keys and bounded nesting only."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            return parse_strict_json(raw)
        except ValueError as exc:
            raise ParseError(f"JSON parse error: {exc}") from exc
