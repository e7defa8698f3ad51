"""Nothing with a leading underscore crosses an app (CONVENTIONS.md, point 12).

Application code may use another app's public functions only; a helper two apps need gets a
public name in its home module. Tests may still reach into their own app's private helpers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("workspaces", "features", "curation", "training", "serving", "experiments", "lineage")


def _is_test(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return "tests" in parts or "testing" in parts or path.name.startswith(("test_", "conftest"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _crossings(path: Path, home: str) -> list[str]:
    """Each use in ``path`` (a module of the app ``home``) of another app's private name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: dict[str, str] = {}  # local name -> the dotted module (or object) it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                top = node.module.split(".")[0]
                if top in APPS and top != home and _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr) or node.attr == "_meta":
            continue
        base, chain = node.value, []
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in modules:
            dotted = ".".join([modules[base.id], *chain])
            if dotted.split(".")[0] in APPS and dotted.split(".")[0] != home:
                found.append(f"{node.lineno}: {dotted}.{node.attr}")
    return found


def test_no_app_uses_another_apps_private_names():
    crossings = {
        str(path.relative_to(ROOT)): found
        for app in APPS
        for path in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in path.parts and not _is_test(path)
        for found in [_crossings(path, app)]
        if found
    }
    assert crossings == {}


def test_the_check_sees_a_private_import_and_a_private_attribute(tmp_path):
    sample = tmp_path / "probe.py"
    sample.write_text(
        "from workspaces.views import _hidden\n"
        "from workspaces import access_cache\n"
        "access_cache._request.generation = None\n"
        "from serving.gateway import _own\n"
        "access_cache.public_name()\n"
    )
    assert _crossings(sample, "serving") == [
        "1: from workspaces.views import _hidden",
        "3: workspaces.access_cache._request",
    ]
