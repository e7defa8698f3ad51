"""A JSON parser that refuses what Python's json module would quietly accept.

NaN, Infinity and overflowing numbers such as 1e999, duplicate keys, pathologically deep nesting
(the decoder's recursion guard) and strings with a lone surrogate escape such as ``"\\ud800"`` (not
Unicode text: the database and the JSON renderer cannot encode it) all answer 400 instead of
reaching a service.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# A body can only hold a lone surrogate through an escape from \uD800 to \uDFFF (UTF-8 cannot
# encode one), so the parsed document is searched only when the raw bytes hold such an escape.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


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
        # seen.add() returns None on purpose: it records the key and lets the scan go on.
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {duplicate[:60]!r}")
    return result


def _surrogate_path(document: Any) -> str | None:
    """Where the first string (key or value) with a lone surrogate is ("" for the top level)."""
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                if _SURROGATE.search(key):
                    return child
                pending.append((child, item))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                pending.append((f"{path}.{index}" if path else str(index), item))
    return None


def parse_strict_json(raw: bytes, *, check_floats: bool = True) -> Any:
    """Parse JSON bytes strictly; raises ValueError naming what is wrong.

    ``check_floats=False`` leaves overflowing numbers (1e999 -> inf) to a caller that checks
    every number itself anyway (producer batches), which saves a Python call per number.
    """
    if not raw.strip():
        raise ValueError("the body is empty; send a JSON document")
    try:
        document = json.loads(
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
    if b"\\u" in raw and _SURROGATE_ESCAPE.search(raw):
        path = _surrogate_path(document)
        if path is not None:
            shown = path[:80].encode("utf-8", "backslashreplace").decode("utf-8")
            where = f"the string at {shown!r}" if path else "the string"
            raise ValueError(
                f"{where} holds a lone surrogate (a \\ud800-\\udfff escape without its pair), "
                "which is not Unicode text"
            )
    return document


class StrictJSONParser(JSONParser):
    """JSON bodies with finite numbers, unique keys, bounded nesting and Unicode strings only."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            return parse_strict_json(raw)
        except ValueError as exc:
            raise ParseError(f"JSON parse error: {exc}") from exc
