"""The `make run` demo as ordered steps that apps register (workspaces never imports them).

Each app adds its step in ``AppConfig.ready``::

    register_demo_step(20, "training", run_training_demo)

``manage.py demo_run --base-url URL`` runs the steps in order once the platform is up; each step
is idempotent (a second `make run` adds nothing that is already there) and takes
``(base_url: str, stdout)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DemoStep:
    order: int
    name: str
    run: Callable[[str, Any], None]


_STEPS: dict[str, DemoStep] = {}


def register_demo_step(order: int, name: str, run: Callable[[str, Any], None]) -> None:
    _STEPS[name] = DemoStep(order, name, run)


def demo_steps() -> list[DemoStep]:
    return sorted(_STEPS.values(), key=lambda s: (s.order, s.name))
