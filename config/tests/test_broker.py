"""The embedded broker (config/broker.py) on a real Celery worker and real consumer processes:
message files that do not decode are set aside, not fatal; a killed consumer's unacked message
is delivered again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import cache
from kombu import Connection

from config import broker
from workspaces.health import WORKER_HEARTBEAT_KEY
from workspaces.tasks import worker_heartbeat
from workspaces.testing.workers import embedded_worker

ROOT = Path(__file__).resolve().parents[2]


def _options() -> dict:
    return settings.CELERY_BROKER_TRANSPORT_OPTIONS


def _tmp_options(tmp_path: Path) -> dict:
    (tmp_path / "q").mkdir()
    return {
        "data_folder_in": str(tmp_path / "q"),
        "data_folder_out": str(tmp_path / "q"),
        "tmp_folder": str(tmp_path / "tmp"),
        "unacked_folder": str(tmp_path / "unacked"),
        "quarantine_folder": str(tmp_path / "quarantine"),
        "control_folder": str(tmp_path / "control"),
    }


def _queue_file(queue: str, content: bytes) -> Path:
    # Named like a real message and older than any message put below, so it is read first.
    path = Path(_options()["data_folder_in"]) / f"0_{uuid.uuid4()}.{queue}.msg"
    path.write_bytes(content)
    return path


def _poll(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.celery_worker
@pytest.mark.skipif(
    not settings.CELERY_BROKER_URL.startswith("embedded://"),
    reason="the platform's worker is on Redis in this run (REDIS_URL); the tests below still run",
)
@pytest.mark.django_db(transaction=True)
def test_a_worker_skips_empty_and_half_written_files_and_runs_the_next_message():
    queue = f"test-{uuid.uuid4().hex[:12]}"
    empty = _queue_file(queue, b"")
    half = _queue_file(queue, b'{"body": "eyJ0YXNrIjog", "headers": {')
    cache.delete(WORKER_HEARTBEAT_KEY)
    quarantine = Path(_options()["quarantine_folder"])
    with embedded_worker([queue]):
        worker_heartbeat.apply_async(queue=queue)
        # Stock kombu: the empty file raised JSONDecodeError and the worker stopped (kombu#1551).
        assert _poll(lambda: cache.get(WORKER_HEARTBEAT_KEY) is not None, 30), "never ran"
        # Retried BAD_FILE_TRIES times, a second apart, then set aside with a warning.
        limit = broker.BAD_FILE_TRIES * broker.BAD_FILE_RETRY_S + 20
        assert _poll(
            lambda: (quarantine / empty.name).exists() and (quarantine / half.name).exists(), limit
        )
        # The worker still consumes after setting them aside.
        cache.delete(WORKER_HEARTBEAT_KEY)
        worker_heartbeat.apply_async(queue=queue)
        assert _poll(lambda: cache.get(WORKER_HEARTBEAT_KEY) is not None, 30)
    assert not empty.exists() and not half.exists()
    assert (quarantine / half.name).read_bytes().startswith(b'{"body"')
    (quarantine / empty.name).unlink()
    (quarantine / half.name).unlink()


def test_a_message_is_never_visible_half_written(tmp_path):
    # _put stages the file in tmp/ and renames it: the queue folder only ever holds whole files.
    options = _tmp_options(tmp_path)
    with Connection("embedded://", transport_options=options) as conn:
        queue = conn.SimpleQueue("whole")
        queue.put({"n": 1})
        (message_file,) = (tmp_path / "q").iterdir()
        assert message_file.read_bytes().startswith(b"{")
        assert list((tmp_path / "tmp").iterdir()) == []
        message = queue.get(timeout=5)
        assert message.payload == {"n": 1}
        # Claimed, not deleted, until the ack.
        assert list((tmp_path / "q").iterdir()) == []
        (claimed,) = (tmp_path / "unacked").glob("*/*.msg")
        message.ack()
        assert not claimed.exists()
        queue.close()


CONSUMER = textwrap.dedent(
    """
    import json, sys, time
    from kombu import Connection
    options = json.loads(sys.argv[1])
    import config.broker  # noqa: F401 - registers embedded://
    config.broker.register()
    with Connection("embedded://", transport_options=options) as conn:
        queue = conn.SimpleQueue(sys.argv[2])
        message = queue.get(timeout=30)
        print(json.dumps(message.payload), flush=True)
        time.sleep(600)  # holds the message unacked until killed
    """
)


def test_a_killed_consumer_s_unacked_message_is_delivered_again(tmp_path):
    options = _tmp_options(tmp_path)
    name = f"kill-{uuid.uuid4().hex[:8]}"
    with Connection("embedded://", transport_options=options) as conn:
        queue = conn.SimpleQueue(name)
        queue.put({"job": 42})
        consumer = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, json.dumps(options), name],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert json.loads(consumer.stdout.readline()) == {"job": 42}
            # Held by a live consumer: nobody else gets it.
            with pytest.raises(queue.Empty):
                queue.get(timeout=broker.RECOVER_EVERY_S + 1)
            os.kill(consumer.pid, signal.SIGKILL)
            consumer.wait(timeout=10)
            message = queue.get(timeout=broker.RECOVER_EVERY_S + 10)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait(timeout=10)
            consumer.stdout.close()
        assert message.payload == {"job": 42}
        message.ack()
        queue.close()
    # The dead consumer's claim folder is gone; the one of this process holds nothing.
    assert list((tmp_path / "unacked").glob("*/*.msg")) == []
    assert not any(f"-{consumer.pid}-" in p.name for p in (tmp_path / "unacked").iterdir())


def test_a_new_exchange_file_is_never_empty(tmp_path):
    # Stock kombu created it empty, then wrote it: a fanout publish in between raised
    # JSONDecodeError. Here it is linked into place whole.
    options = _tmp_options(tmp_path)
    with Connection("embedded://", transport_options=options) as conn:
        channel = conn.default_channel
        channel._queue_bind("fan", "", "", "one")
        assert json.loads((tmp_path / "control" / "fan.exchange").read_text()) == [["", "", "one"]]
        channel._queue_bind("fan", "", "", "two")
        assert [q.queue for q in channel.get_table("fan")] == ["two", "one"]
        assert list((tmp_path / "tmp").iterdir()) == []
