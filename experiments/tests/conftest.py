import pytest

from serving.inference import MODELS
from serving.routing import TABLES


@pytest.fixture(autouse=True)
def _fresh_serving_state(settings):
    """Each test starts with empty per-process model and routing caches (like a new gateway)."""
    settings.SERVING_SANDBOX = "inprocess"
    settings.SERVING_ROUTING_POLL_S = 0.05
    MODELS.clear()
    TABLES.clear()
    yield
    MODELS.clear()
    TABLES.clear()
