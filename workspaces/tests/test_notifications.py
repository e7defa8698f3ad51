"""Notifications: the inbox API, e-mail delivery, signed webhooks and the SSRF guard on them."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from config.celery import app as celery_app
from workspaces.models import Event, Notification, Role, WebhookEndpoint
from workspaces.notifications import (
    WEBHOOK_EVENT_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    deliveries_send,
    notify,
    webhook_create,
    webhook_url_validate,
)
from workspaces.outbox import consume
from workspaces.tasks import DRAIN_QUEUED_KEY
from workspaces.testing.factories import UserFactory, make_member

PUBLIC_URL = "https://93.184.216.34/rankops-hook"

# BAD-INPUTS.md, "Outbound URLs (SSRF)", plus the encodings that mean the same addresses.
REFUSED_URLS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1/",
    "http://127.0.0.1:6379/",
    "http://localhost:8000/hook",
    "http://LOCALHOST./hook",
    "http://api.localhost/hook",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[fe80::1]/",
    "http://10.0.0.5/hook",
    "http://192.168.1.10/hook",
    "http://172.16.3.4/hook",
    "http://100.64.0.1/hook",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://0177.0.0.1/",
    "http://127.1/",
    "http://[::]/",
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_INFO",
    "ftp://example.com/x",
    "javascript:alert(1)",
    "dict://127.0.0.1:11211/",
    "http://user:pass@93.184.216.34/",
    "http://93.184.216.34:99999/",
    "http://93.184.216.34/a b",
    "http://93.184.216.34/\nX-Injected: 1",
    "http:///path-only",
    "",
]


class Receiver:
    """A webhook receiver on 127.0.0.1 in a thread; records each request it gets."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.requests: list[dict] = []
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                receiver.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers.items()),
                        "body": self.rfile.read(length),
                    }
                )
                self.send_response(receiver.status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/rankops?team=ads"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def eager_celery():
    """Tasks enqueued with .delay() run at once in this process (no broker, no worker)."""
    from django.core.cache import cache

    cache.delete(DRAIN_QUEUED_KEY)  # a drain queued by an earlier test would coalesce ours away
    before = (celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates)
    celery_app.conf.task_always_eager = celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = before


@pytest.fixture
def allow_private(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True


def _resolver_returning(address: str):
    def fake_getaddrinfo(host, port, *args, **kwargs):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    return fake_getaddrinfo


# --- the SSRF guard ----------------------------------------------------------------------------


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_refused_webhook_urls_answer_400_naming_url_and_write_nothing(
    url, workspace, members, client_for
):
    client = client_for(members[Role.ADMIN])
    events = Event.objects.for_workspace(workspace).count()
    response = client.post(f"/api/v1/workspaces/{workspace.slug}/webhooks/", {"url": url})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["attr"] == "url"
    assert set(body) >= {"type", "code", "detail", "attr"}
    assert not WebhookEndpoint.objects.for_workspace(workspace).exists()
    assert Event.objects.for_workspace(workspace).count() == events


def test_a_host_name_that_resolves_to_a_private_address_is_refused(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _resolver_returning("10.1.2.3"))
    with pytest.raises(ValidationError, match=r"resolves to 10\.1\.2\.3, a private address"):
        webhook_url_validate("https://hooks.internal.example.com/x")


def test_every_resolved_address_must_be_public(monkeypatch):
    def two_answers(host, port, *args, **kwargs):
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", two_answers)
    with pytest.raises(ValidationError, match=r"169\.254\.169\.254, a link-local address"):
        webhook_url_validate("https://mixed.example.com/x")


def test_an_unresolvable_host_is_refused(monkeypatch):
    def no_answer(*args, **kwargs):
        raise socket.gaierror("Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_answer)
    with pytest.raises(ValidationError, match="cannot resolve"):
        webhook_url_validate("https://nowhere.invalid/x")


def test_allow_private_admits_private_hosts_but_never_other_schemes(allow_private):
    assert webhook_url_validate("http://127.0.0.1:8080/x").addresses == ("127.0.0.1",)
    assert webhook_url_validate("http://localhost:8080/x").host == "localhost"
    for url in ("file:///etc/passwd", "gopher://127.0.0.1/", "ftp://127.0.0.1/"):
        with pytest.raises(ValidationError, match="only http and https"):
            webhook_url_validate(url)


# --- the webhook API -------------------------------------------------------------------------


def test_admin_adds_lists_and_deletes_a_webhook(
    workspace, members, client_for, django_assert_max_num_queries
):
    client = client_for(members[Role.ADMIN])
    base = f"/api/v1/workspaces/{workspace.slug}/webhooks/"
    created = client.post(base, {"url": PUBLIC_URL}, format="json")
    assert created.status_code == 201, created.content
    secret = created.json()["secret"]
    assert len(secret) >= 32
    stored = WebhookEndpoint.objects.for_workspace(workspace).get()
    assert stored.secret == secret
    assert stored.created_by == members[Role.ADMIN]
    event = Event.objects.for_workspace(workspace).filter(verb="webhook.created").get()
    assert event.payload == {"scheme": "https", "host": "93.184.216.34", "port": 443}

    for index in range(3):
        webhook_create(actor=None, workspace=workspace, url=f"{PUBLIC_URL}/{index}")
    with django_assert_max_num_queries(8):
        listed = client.get(base)
    assert listed.status_code == 200
    assert listed.json()["count"] == 4
    assert all("secret" not in row for row in listed.json()["results"])

    removed = client.delete(f"{base}{stored.pk}/")
    assert removed.status_code == 204
    assert not WebhookEndpoint.objects.for_workspace(workspace).filter(pk=stored.pk).exists()
    assert Event.objects.for_workspace(workspace).filter(verb="webhook.deleted").count() == 1


def test_a_chosen_secret_is_kept_and_a_short_one_refused(workspace, members, client_for):
    client = client_for(members[Role.ADMIN])
    base = f"/api/v1/workspaces/{workspace.slug}/webhooks/"
    short = client.post(base, {"url": PUBLIC_URL, "secret": "short"}, format="json")
    assert short.status_code == 400
    assert short.json()["attr"] == "secret"
    chosen = "s" * 40
    ok = client.post(base, {"url": PUBLIC_URL, "secret": chosen}, format="json")
    assert ok.status_code == 201
    assert ok.json()["secret"] == chosen


def test_mass_assignment_on_webhook_create_is_ignored(
    workspace, other_workspace, members, client_for
):
    client = client_for(members[Role.ADMIN])
    response = client.post(
        f"/api/v1/workspaces/{workspace.slug}/webhooks/",
        {
            "url": PUBLIC_URL,
            "workspace": other_workspace.pk,
            "created_by": members["outsider"].pk,
            "last_status": 200,
            "active": False,
        },
        format="json",
    )
    assert response.status_code == 201
    webhook = WebhookEndpoint.objects.for_workspace(workspace).get()
    assert webhook.active is True
    assert webhook.last_status is None
    assert webhook.created_by == members[Role.ADMIN]
    assert not WebhookEndpoint.objects.for_workspace(other_workspace).exists()


# --- delivery ----------------------------------------------------------------------------------


def test_notify_emails_recipients_and_posts_a_signed_webhook(
    workspace, allow_private, eager_celery, mailoutbox, django_capture_on_commit_callbacks
):
    alice = make_member(workspace, Role.DEVELOPER)
    bob = make_member(workspace, Role.VIEWER)
    no_mail = make_member(workspace, Role.VIEWER, email="")
    inactive = make_member(workspace, Role.VIEWER)
    inactive.is_active = False
    inactive.save()
    with Receiver() as receiver:
        webhook, secret = webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            with transaction.atomic():
                sent = notify(
                    workspace=workspace,
                    recipients=[alice, bob, alice, no_mail, inactive, None],
                    verb="feature_group.broken",
                    title="user_ctr is broken",
                    body="No batch for 2 hours (SLA 1 hour).",
                    link="/api/v1/workspaces/x/feature-groups/user_ctr/health/",
                )
        # Nothing is sent from the transaction: one drain of the log's consumers after commit.
        assert sum(getattr(c, "__name__", "") == "_enqueue_drain" for c in callbacks) == 1
    assert {n.recipient for n in sent} == {alice, bob, no_mail}

    assert sorted(m.to[0] for m in mailoutbox) == sorted([alice.email, bob.email])
    assert mailoutbox[0].subject == f"[RankOps {workspace.slug}] user_ctr is broken"
    assert "No batch for 2 hours" in mailoutbox[0].body

    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    assert request["path"] == "/hooks/rankops?team=ads"
    expected = "sha256=" + hmac.new(secret.encode(), request["body"], hashlib.sha256).hexdigest()
    assert request["headers"][WEBHOOK_SIGNATURE_HEADER] == expected
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["X-RankOps-Event"] == "feature_group.broken"
    announcement = Event.objects.for_workspace(workspace).get(verb="notification.created")
    assert request["headers"][WEBHOOK_EVENT_ID_HEADER] == str(announcement.pk)
    payload = json.loads(request["body"])
    assert payload["id"] == str(announcement.pk)
    assert payload["verb"] == "feature_group.broken"
    assert payload["workspace"] == workspace.slug
    assert payload["recipients"] == sorted(u.username for u in (alice, bob, no_mail))

    webhook.refresh_from_db()
    assert webhook.last_status == 200
    assert webhook.last_error == ""
    assert all(n.delivered_at is not None for n in Notification.objects.for_workspace(workspace))

    # The consumer and the sender run again (a redelivered task): nothing is sent twice.
    assert consume("notifications").applied == 0
    assert deliveries_send() == {
        "emails": 0,
        "email_failures": 0,
        "webhook_posts": 0,
        "webhook_failures": 0,
    }
    assert len(mailoutbox) == 2
    assert len(receiver.requests) == 1
    assert [(d.attempt, d.status_code) for d in webhook.deliveries.all()] == [(1, 200)]


def test_a_rolled_back_change_notifies_nobody(
    workspace, eager_celery, mailoutbox, django_capture_on_commit_callbacks
):
    alice = make_member(workspace, Role.DEVELOPER)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            notify(workspace=workspace, recipients=[alice], verb="x.y", title="T", body="B")
            raise RuntimeError("the change failed")
    assert callbacks == []
    assert not Notification.objects.for_workspace(workspace).exists()
    assert mailoutbox == []


def test_delivery_rechecks_the_url_against_dns_rebinding(
    workspace, monkeypatch, eager_celery, mailoutbox, django_capture_on_commit_callbacks
):
    alice = make_member(workspace, Role.DEVELOPER)
    with Receiver() as receiver:
        hook_url = f"http://hooks.example.com:{receiver.port}/x"
        monkeypatch.setattr(socket, "getaddrinfo", _resolver_returning("93.184.216.34"))
        webhook, _secret = webhook_create(actor=alice, workspace=workspace, url=hook_url)
        # The name now points at the loopback receiver: delivery must refuse, not connect.
        monkeypatch.setattr(socket, "getaddrinfo", _resolver_returning("127.0.0.1"))
        with django_capture_on_commit_callbacks(execute=True):
            notify(workspace=workspace, recipients=[alice], verb="x.y", title="T", body="B")
    assert receiver.requests == []
    webhook.refresh_from_db()
    assert webhook.last_status is None
    assert webhook.last_error.startswith("refused")
    assert "127.0.0.1" in webhook.last_error
    assert len(mailoutbox) == 1  # e-mail still goes out


def test_failures_and_redirects_are_recorded_not_followed(
    workspace, allow_private, eager_celery, django_capture_on_commit_callbacks
):
    alice = make_member(workspace, Role.DEVELOPER)
    with Receiver(status=302, headers={"Location": "http://169.254.169.254/"}) as receiver:
        webhook, _ = webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        with django_capture_on_commit_callbacks(execute=True):
            notify(workspace=workspace, recipients=[alice], verb="x.y", title="T", body="B")
        receiver.status = 500
        with django_capture_on_commit_callbacks(execute=True):
            notify(workspace=workspace, recipients=[alice], verb="x.z", title="T", body="B")
    assert len(receiver.requests) == 2
    webhook.refresh_from_db()
    assert webhook.last_status == 500
    assert webhook.last_error == "HTTP 500"


def test_an_unreachable_webhook_is_recorded(
    workspace, allow_private, eager_celery, mailoutbox, django_capture_on_commit_callbacks
):
    alice = make_member(workspace, Role.DEVELOPER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens on it after the close
    webhook, _ = webhook_create(actor=alice, workspace=workspace, url=f"http://127.0.0.1:{port}/x")
    with django_capture_on_commit_callbacks(execute=True):
        notify(workspace=workspace, recipients=[alice], verb="x.y", title="T", body="B")
    webhook.refresh_from_db()
    assert webhook.last_status is None
    assert "ConnectionRefusedError" in webhook.last_error
    assert len(mailoutbox) == 1


def test_inactive_webhooks_and_other_workspaces_get_nothing(
    workspace, other_workspace, allow_private, eager_celery, django_capture_on_commit_callbacks
):
    alice = make_member(workspace, Role.DEVELOPER)
    with Receiver() as receiver:
        webhook_create(actor=alice, workspace=workspace, url=receiver.url)
        WebhookEndpoint.objects.for_workspace(workspace).update(active=False)
        webhook_create(actor=alice, workspace=other_workspace, url=receiver.url)
        with django_capture_on_commit_callbacks(execute=True):
            notify(workspace=workspace, recipients=[alice], verb="x.y", title="T", body="B")
    assert receiver.requests == []


# --- the inbox API -----------------------------------------------------------------------------


def _notification(workspace, user, title="T"):
    return Notification.objects.create(
        workspace=workspace, recipient=user, verb="x.y", title=title, body="B"
    )


def test_inbox_lists_own_notifications_newest_first_and_filters_unread(
    workspace, other_workspace, client_for, django_assert_max_num_queries
):
    alice = make_member(workspace, Role.VIEWER)
    stranger = UserFactory()
    first = _notification(workspace, alice, "first")
    second = _notification(other_workspace, alice, "second")
    _notification(workspace, stranger, "not hers")
    for index in range(5):
        _notification(workspace, alice, f"bulk {index}")
    client = client_for(alice)
    with django_assert_max_num_queries(6):
        response = client.get("/api/v1/notifications/")
    assert response.status_code == 200
    titles = [row["title"] for row in response.json()["results"]]
    assert "not hers" not in titles
    assert titles[-2:] == ["second", "first"]
    assert response.json()["count"] == 7

    read = client.post(f"/api/v1/notifications/{first.pk}/read/")
    assert read.status_code == 200
    assert read.json()["read"] is True
    first.refresh_from_db()
    read_at = first.read_at
    assert read_at is not None
    assert client.post(f"/api/v1/notifications/{first.pk}/read/").status_code == 200
    first.refresh_from_db()
    assert first.read_at == read_at

    unread = client.get("/api/v1/notifications/?unread=true").json()
    assert first.pk not in [row["id"] for row in unread["results"]]
    assert unread["count"] == 6
    assert client.get("/api/v1/notifications/?unread=false").json()["count"] == 1
    bad = client.get("/api/v1/notifications/?unread=maybe")
    assert bad.status_code == 400
    assert bad.json()["attr"] == "unread"

    # A token narrowed to one workspace sees that workspace's notifications only.
    narrowed = client_for(alice, workspaces=[workspace])
    slugs = {row["workspace"] for row in narrowed.get("/api/v1/notifications/").json()["results"]}
    assert slugs == {workspace.slug}
    assert narrowed.post(f"/api/v1/notifications/{second.pk}/read/").status_code == 404


def test_someone_elses_notification_cannot_be_marked_read(workspace, client_for):
    alice = make_member(workspace, Role.VIEWER)
    bob = make_member(workspace, Role.ADMIN)
    hers = _notification(workspace, alice)
    response = client_for(bob).post(f"/api/v1/notifications/{hers.pk}/read/")
    assert response.status_code == 404
    hers.refresh_from_db()
    assert hers.read_at is None


def test_read_all_marks_only_the_callers_notifications_within_the_tokens_scope(
    workspace, other_workspace, client_for
):
    alice = make_member(workspace, Role.VIEWER)
    bob = make_member(workspace, Role.VIEWER)
    here, there, bobs = (
        _notification(workspace, alice),
        _notification(other_workspace, alice),
        _notification(workspace, bob),
    )
    narrowed = client_for(alice, workspaces=[workspace])
    response = narrowed.post("/api/v1/notifications/read-all/")
    assert response.status_code == 200 and response.json() == {"marked_read": 1}
    for n in (here, there, bobs):
        n.refresh_from_db()
    assert here.read_at is not None and there.read_at is None and bobs.read_at is None
    assert client_for(alice).post("/api/v1/notifications/read-all/").json() == {"marked_read": 1}
    there.refresh_from_db()
    assert there.read_at is not None and bobs.read_at is None


def test_admin_console_lists_notifications_and_webhooks_read_only(workspace, client):
    admin_user = UserFactory(is_staff=True, is_superuser=True)
    alice = make_member(workspace, Role.VIEWER)
    notification = _notification(workspace, alice, "<script>alert(1)</script>")
    webhook, secret = webhook_create(actor=None, workspace=workspace, url=PUBLIC_URL)
    client.force_login(admin_user)
    listing = client.get("/admin/workspaces/notification/")
    assert listing.status_code == 200
    assert b"<script>alert(1)</script>" not in listing.content
    detail = client.get(f"/admin/workspaces/notification/{notification.pk}/change/")
    assert detail.status_code == 200
    assert b'name="title"' not in detail.content  # read-only: no input
    assert client.get("/admin/workspaces/notification/add/").status_code == 403
    hooks = client.get(f"/admin/workspaces/webhookendpoint/{webhook.pk}/change/")
    assert hooks.status_code == 200
    assert secret.encode() not in hooks.content
    removed = client.post(
        f"/admin/workspaces/webhookendpoint/{webhook.pk}/delete/", {"post": "yes"}
    )
    assert removed.status_code == 302
    assert not WebhookEndpoint.objects.for_workspace(workspace).exists()
    assert Event.objects.for_workspace(workspace).filter(verb="webhook.deleted").count() == 1
