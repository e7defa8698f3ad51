"""The ``python_function`` loader of platform model versions (``mlflow.pyfunc.load_model``).

A version's folder holds its bundle and an ``MLmodel`` naming this module; MLflow calls
``_load_pyfunc(<folder>)``. The bundle loads as the platform loads it (tensors-only weights, or a
flavor's own safe file), without Django; ``predict`` takes a DataFrame whose columns are the
bundle's dataset columns (``<group>__<feature>``) or feature refs and returns click
probabilities.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class PlatformBundle:
    """A loaded bundle behind MLflow's pyfunc ``predict``."""

    def __init__(self, path: str) -> None:
        import serving.flavors  # noqa: F401  (registers the imported-model templates)
        from training.bundle import load_bundle

        self.bundle = load_bundle(path)

    def predict(self, model_input: Any, params: dict | None = None) -> np.ndarray:
        import pandas as pd

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        columns = {str(name): frame[name].tolist() for name in frame.columns}
        return self.bundle.predict(columns, len(frame))


def _load_pyfunc(path: str) -> PlatformBundle:
    return PlatformBundle(path)
