"""No module names two of its functions alike where one could be taken for the other: twice in
one scope, or a nested helper named like a function of an enclosing scope. Methods are left out
(a class is their namespace), as are helpers of the same name nested in sibling functions."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = (
    "workspaces",
    "features",
    "curation",
    "training",
    "serving",
    "experiments",
    "lineage",
    "bench",
)


def _defs(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions defined directly in ``body`` (also under if/try/with), not in classes."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody"):
                found.extend(_defs(getattr(node, block, [])))
            for handler in getattr(node, "handlers", []):
                found.extend(_defs(handler.body))
    return found


def _duplicates(source: str) -> set[str]:
    """Names defined twice in one scope, or a nested function named like one it can see."""
    duplicates: set[str] = set()

    def visit(body: list[ast.stmt], visible: set[str]) -> None:
        defs = _defs(body)
        counts = Counter(node.name for node in defs)
        duplicates.update(name for name, count in counts.items() if count > 1)
        duplicates.update(name for name in counts if name in visible)
        for node in defs:
            visit(node.body, visible | set(counts))

    visit(ast.parse(source).body, set())
    return duplicates


def test_no_module_defines_one_function_name_twice():
    found = {
        str(path.relative_to(ROOT)): duplicates
        for app in APPS
        for path in sorted((ROOT / app).rglob("*.py"))
        # bench/.venvs: the peers' virtualenvs a bench run installs (third-party code)
        if "migrations" not in path.parts and ".venvs" not in path.parts
        for duplicates in [_duplicates(path.read_text())]
        if duplicates
    }
    assert found == {}


def test_the_check_sees_a_nested_function_shadowing_a_module_one():
    source = (
        "def publish():\n    def _bump():\n        pass\n\n"
        "def _bump(dep):\n    pass\n\n"
        "class A:\n    def run(self):\n        pass\n\n"
        "class B:\n    def run(self):\n        pass\n\n"
        "def one():\n    def helper():\n        pass\n\n"
        "def two():\n    def helper():\n        pass\n"
    )
    assert _duplicates(source) == {"_bump"}
