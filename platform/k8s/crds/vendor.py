"""Vendor the CRD schemas the manifests are validated against (test_manifest_schemas.py).

    python platform/k8s/crds/vendor.py CRD.yaml [CRD.yaml ...]

For each CustomResourceDefinition, writes ``<group>_<kind>_<version>.json``: that version's
``openAPIV3Schema`` with its ``description`` texts left out (they are most of the bytes). The
schemas are the upstream projects' (Apache-2.0; see NOTICE.md for the sources and commits).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: without_descriptions(value)
            for key, value in node.items()
            if not (key == "description" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def vendor(path: Path) -> list[Path]:
    written = []
    for crd in yaml.safe_load_all(path.read_text()):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = without_descriptions(version["schema"]["openAPIV3Schema"])
            out = HERE / f"{spec['group']}_{spec['names']['kind']}_{version['name']}.json"
            out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            written.append(out)
    return written


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        for out in vendor(Path(argument)):
            print(out.name, out.stat().st_size)
