"""Webhook and e-mail delivery as a consumer of the event log: at least once, retried with
exponential backoff on a clock the test controls, every attempt in the delivery log, and the
event id on every post so that a receiver dedups.

The receiver is a real HTTP server on 127.0.0.1 (``WEBHOOK_ALLOW_PRIVATE`` lets the SSRF guard
admit it, as in test_notifications); the e-mail failures are a real SMTP connection refused.
"""

from __future__ import annotations

import json
import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction
from django.utils import timezone

from workspaces.models import Event, Notification, Role, WebhookDelivery
from workspaces.notifications import (
    WEBHOOK_EVENT_ID_HEADER,
    deliveries_send,
    delivery_backoff,
    notify,
    webhook_create,
)
from workspaces.outbox import consume
from workspaces.testing.factories import UserFactory, make_member


class FlakyReceiver:
    """Answers the statuses given in turn (the last one from then on) and keeps what a careful
    receiver keeps: the event ids it has processed, so a repeat is dropped."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.requests: list[dict] = []
        self.processed: dict[str, dict] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = (
                    receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                )
                receiver.requests.append({"headers": dict(self.headers.items()), "status": status})
                if status == 200:
                    receiver.processed.setdefault(
                        self.headers[WEBHOOK_EVENT_ID_HEADER], json.loads(body)
                    )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FlakyReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def allow_private(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    settings.WEBHOOK_RETRY_BASE_SECONDS = 30
    settings.WEBHOOK_RETRY_MAX_SECONDS = 3600


def _notify(workspace, user, verb="feature_group.broken"):
    with transaction.atomic():
        return notify(workspace=workspace, recipients=[user], verb=verb, title="T", body="B")


def _attempts(webhook):
    return list(
        WebhookDelivery.objects.for_workspace(webhook.workspace)
        .filter(webhook=webhook)
        .order_by("attempt")
    )


@pytest.mark.django_db
def test_a_receiver_that_fails_twice_gets_the_notification_once_after_backoff(
    workspace, allow_private, mailoutbox
):
    alice = make_member(workspace, Role.DEVELOPER)
    with FlakyReceiver([500, 503, 200]) as receiver:
        webhook, _ = webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        _notify(workspace, alice)
        assert deliveries_send() == {
            "emails": 0,
            "email_failures": 0,
            "webhook_posts": 0,
            "webhook_failures": 0,
        }  # nothing is due before the consumer has read the event
        assert consume("notifications").applied >= 1
        t0 = timezone.now()
        assert deliveries_send(now=t0)["webhook_failures"] == 1
        first, second = _attempts(webhook)
        assert (first.status_code, first.error, first.delivered_at) == (500, "HTTP 500", None)
        assert second.next_attempt_at == t0 + timedelta(seconds=30)

        # Not before its backoff: a second early, nothing is sent.
        assert deliveries_send(now=t0 + timedelta(seconds=29))["webhook_failures"] == 0
        assert len(receiver.requests) == 1
        t1 = t0 + timedelta(seconds=30)
        assert deliveries_send(now=t1)["webhook_failures"] == 1
        third = _attempts(webhook)[2]
        assert third.next_attempt_at == t1 + timedelta(seconds=60)  # doubled
        assert deliveries_send(now=t1 + timedelta(seconds=59))["webhook_posts"] == 0
        t2 = t1 + timedelta(seconds=60)
        assert deliveries_send(now=t2)["webhook_posts"] == 1
        # Nothing more is due, ever.
        assert deliveries_send(now=t2 + timedelta(days=1))["webhook_posts"] == 0

    announcement = Event.objects.for_workspace(workspace).get(verb="notification.created")
    assert [r["status"] for r in receiver.requests] == [500, 503, 200]
    assert {r["headers"][WEBHOOK_EVENT_ID_HEADER] for r in receiver.requests} == {
        str(announcement.pk)
    }
    assert list(receiver.processed) == [str(announcement.pk)]  # delivered exactly once
    assert receiver.processed[str(announcement.pk)]["verb"] == "feature_group.broken"
    log = _attempts(webhook)
    assert [(d.attempt, d.status_code) for d in log] == [(1, 500), (2, 503), (3, 200)]
    assert [d.attempted_at for d in log] == [t0, t1, t2]
    assert log[2].delivered_at == t2 and log[2].error == ""
    assert {d.event_id for d in log} == {announcement.pk}
    assert len(mailoutbox) == 1  # the e-mail went out at the first send


@pytest.mark.django_db
def test_an_attempt_whose_sender_died_is_taken_again_after_its_lease(
    workspace, allow_private, settings
):
    settings.DELIVERY_LEASE_SECONDS = 60
    alice = make_member(workspace, Role.DEVELOPER)
    with FlakyReceiver([200]) as receiver:
        webhook, _ = webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        _notify(workspace, alice)
        consume("notifications")
        t0 = timezone.now()
        # A sender took the attempt and died before posting (what its claim leaves behind).
        WebhookDelivery.objects.for_workspace(workspace).update(
            claimed_until=t0 + timedelta(seconds=60)
        )
        assert deliveries_send(now=t0 + timedelta(seconds=59))["webhook_posts"] == 0
        assert deliveries_send(now=t0 + timedelta(seconds=60))["webhook_posts"] == 1
    assert len(receiver.requests) == 1
    assert [d.delivered_at is not None for d in _attempts(webhook)] == [True]


@pytest.mark.django_db
def test_attempts_stop_at_the_limit_and_the_backoff_is_capped(workspace, allow_private, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 3
    settings.WEBHOOK_RETRY_MAX_SECONDS = 45
    assert [delivery_backoff(n).total_seconds() for n in (1, 2, 3)] == [30, 45, 45]
    alice = make_member(workspace, Role.DEVELOPER)
    with FlakyReceiver([500]) as receiver:
        webhook, _ = webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        _notify(workspace, alice)
        consume("notifications")
        now = timezone.now()
        for _ in range(5):
            deliveries_send(now=now)
            now += timedelta(hours=1)
    assert len(receiver.requests) == 3
    assert [(d.attempt, d.status_code) for d in _attempts(webhook)] == [
        (1, 500),
        (2, 500),
        (3, 500),
    ]


@pytest.mark.django_db
def test_an_email_that_fails_is_retried_with_backoff_until_sent(workspace, settings):
    alice = make_member(workspace, Role.DEVELOPER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens on it after the close
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 2
    settings.WEBHOOK_RETRY_BASE_SECONDS = 30
    (notification,) = _notify(workspace, alice)
    consume("notifications")
    t0 = timezone.now()
    assert deliveries_send(now=t0)["email_failures"] == 1
    notification.refresh_from_db()
    assert notification.delivered_at is None and notification.email_attempts == 1
    assert "ConnectionRefusedError" in notification.email_error
    assert notification.email_next_attempt_at == t0 + timedelta(seconds=30)

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    from django.core import mail

    mail.outbox = []
    assert deliveries_send(now=t0 + timedelta(seconds=29))["emails"] == 0
    assert deliveries_send(now=t0 + timedelta(seconds=30))["emails"] == 1
    assert deliveries_send(now=t0 + timedelta(days=1))["emails"] == 0
    assert [m.to for m in mail.outbox] == [[alice.email]]
    notification.refresh_from_db()
    assert notification.delivered_at == t0 + timedelta(seconds=30)
    assert (notification.email_attempts, notification.email_error) == (2, "")


@pytest.mark.django_db
def test_the_delivery_log_is_in_the_api_for_admins_only_and_in_the_admin(
    workspace, other_workspace, allow_private, client_for, client
):
    admin = make_member(workspace, Role.ADMIN)
    with FlakyReceiver([500, 200]) as receiver:
        webhook, _ = webhook_create(actor=admin, workspace=workspace, url=receiver.url)
        _notify(workspace, admin)
        consume("notifications")
        now = timezone.now()
        deliveries_send(now=now)
        deliveries_send(now=now + timedelta(seconds=30))
    url = f"/api/v1/workspaces/{workspace.slug}/webhooks/{webhook.pk}/deliveries/"
    response = client_for(admin).get(url)
    assert response.status_code == 200, response.content
    rows = response.json()["results"]
    assert [(r["attempt"], r["status_code"]) for r in rows] == [(2, 200), (1, 500)]
    announcement = Event.objects.for_workspace(workspace).get(verb="notification.created")
    assert {r["event_id"] for r in rows} == {announcement.pk}
    assert "payload" not in rows[0]
    assert client_for(make_member(workspace, Role.MAINTAINER)).get(url).status_code == 403
    stranger = make_member(other_workspace, Role.ADMIN)
    assert client_for(stranger).get(url).status_code == 404
    assert client_for(admin).post(url, {}).status_code == 403  # read-only: no write declared

    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    listing = client.get("/admin/workspaces/webhookdelivery/")
    assert listing.status_code == 200
    assert client.get("/admin/workspaces/webhookdelivery/add/").status_code == 403
    detail = client.get(f"/admin/workspaces/webhookdelivery/{rows[0]['id']}/change/")
    assert detail.status_code == 200 and b'name="status_code"' not in detail.content
    assert client.get("/admin/workspaces/consumercursor/").status_code == 200


@pytest.mark.django_db
def test_a_rolled_back_notification_is_never_delivered(workspace, allow_private):
    alice = make_member(workspace, Role.DEVELOPER)
    with FlakyReceiver([200]) as receiver:
        webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        with pytest.raises(RuntimeError), transaction.atomic():
            notify(workspace=workspace, recipients=[alice], verb="x.y", title="T", body="B")
            raise RuntimeError("the change failed")
        consume("notifications")
        deliveries_send(now=timezone.now() + timedelta(days=1))
    assert receiver.requests == []
    assert not Notification.objects.for_workspace(workspace).exists()


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_drains_the_log_and_retries_until_delivered(
    workspace, allow_private, settings
):
    """The drain task on a real worker (as beat sends it): the first post fails, the retry
    after its (short) backoff succeeds; the receiver processes the event once."""
    import time
    import uuid

    from workspaces.tasks import outbox_drain
    from workspaces.testing.workers import embedded_worker

    settings.WEBHOOK_RETRY_BASE_SECONDS = 0.2
    queue = f"test-{uuid.uuid4().hex[:12]}"  # a queue no other worker reads
    alice = make_member(workspace, Role.DEVELOPER)
    with FlakyReceiver([500, 200]) as receiver:
        webhook, _ = webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        _notify(workspace, alice)
        with embedded_worker([queue]):
            deadline = time.monotonic() + 30
            while not receiver.processed and time.monotonic() < deadline:
                outbox_drain.apply_async(queue=queue)  # what beat sends, more often
                time.sleep(0.5)
    assert len(receiver.processed) == 1, receiver.requests
    assert [r["status"] for r in receiver.requests] == [500, 200]
    assert [(d.attempt, d.status_code) for d in _attempts(webhook)] == [(1, 500), (2, 200)]
