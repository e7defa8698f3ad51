"""Modules of the client package loaded from the repository: the platform's virtualenv (where
these tests run) has no httpx, and the modules tested here need none."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[1]


def load(name: str):
    """``rankops.<name>``, from ``client/rankops/<name>.py``."""
    spec = importlib.util.spec_from_file_location(
        f"rankops.{name}", CLIENT / "rankops" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def client_module():
    return load
