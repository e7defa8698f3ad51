"""Regenerate ``rankops/operations.json``, which ``rankops.operations`` loads, from the
server's OpenAPI schema.

The client reaches every operation through one table keyed by ``operationId`` (method, path,
path parameters, whether the operation is paginated and whether it honours an
``Idempotency-Key``). The table is generated, never hand-edited, and a test compares it with the
live ``/api/schema/`` so the two cannot drift::

    python -m rankops.codegen https://rankops.example/api/schema/?format=json  # or a file
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

METHODS = ("get", "post", "put", "patch", "delete")


def operations_from_schema(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The operation table the client dispatches on, read from an OpenAPI 3 document."""
    table: dict[str, dict[str, Any]] = {}
    for path, item in schema.get("paths", {}).items():
        shared = item.get("parameters", [])
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = [*shared, *op.get("parameters", [])]
            query = sorted(p["name"] for p in params if p.get("in") == "query")
            headers = {p["name"] for p in params if p.get("in") == "header"}
            body = op.get("requestBody", {}).get("content", {})
            table[op["operationId"]] = {
                "method": method.upper(),
                "path": path,
                "path_params": [p["name"] for p in params if p.get("in") == "path"],
                "query": query,
                "paginated": "limit" in query and "offset" in query,
                "idempotent_key": "Idempotency-Key" in headers,
                "content_types": sorted(body),
                "summary": (op.get("summary") or op.get("description") or "").split("\n")[0][:120],
            }
    return dict(sorted(table.items()))


def render(table: dict[str, dict[str, Any]]) -> str:
    """The text of ``rankops/operations.json``: one operation a line, sorted, so a
    regeneration diffs line by line."""
    lines = [
        f"  {json.dumps(name)}: {json.dumps(op, sort_keys=True, ensure_ascii=False)}"
        for name, op in sorted(table.items())
    ]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    source = args[0]
    if source.startswith(("http://", "https://")):
        import httpx

        schema = httpx.get(source, params={"format": "json"}, timeout=60).json()
    else:
        schema = json.loads(Path(source).read_text())
    target = Path(__file__).with_name("operations.json")
    target.write_text(render(operations_from_schema(schema)))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
