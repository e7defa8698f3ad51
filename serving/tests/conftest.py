import pytest

from serving.inference import MODELS
from serving.predlog import list_key, redis_client
from serving.routing import TABLES


@pytest.fixture(autouse=True)
def _fresh_serving_state(settings):
    settings.SERVING_SANDBOX = "inprocess"
    settings.SERVING_ROUTING_POLL_S = 0.05
    settings.SERVING_SANDBOX_SECONDS = 0.2
    MODELS.clear()
    TABLES.clear()
    client = redis_client()
    if client is not None:  # records of other tests' rolled-back rows
        client.delete(list_key())
    yield
    MODELS.clear()
    TABLES.clear()
