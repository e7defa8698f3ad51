"""The fault stack swaps the Celery app's broker and puts it back (bench.faults_stack)."""

from __future__ import annotations

import pytest

from bench.faults_stack import drop_celery_pools


@pytest.mark.every_pass  # the broker the settings choose
def test_pools_dropped_around_a_broker_swap_open_again_for_the_original_broker():
    from config.celery import app

    saved = app.conf.broker_url
    with app.amqp.producer_pool.acquire(block=True, timeout=5):
        pass
    drop_celery_pools(app)
    app.conf.broker_url = "memory://"
    try:
        drop_celery_pools(app)
    finally:
        app.conf.broker_url = saved
    # The producer pool for the original URL is a new one, not the one closed above.
    with app.amqp.producer_pool.acquire(block=True, timeout=5) as producer:
        assert producer.connection.as_uri() == app.connection_for_write().as_uri()
