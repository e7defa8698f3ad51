"""Notifications: in-app messages to users, delivered by e-mail and signed webhooks after commit.

Every app notifies through ``notify``: it writes one Notification per recipient in the caller's
transaction (beside the event that caused it) and, once that transaction commits, enqueues the
Celery task that sends the e-mails and posts to the workspace's webhooks. A rolled-back change
therefore never notifies anyone.

Outbound webhook URLs are a server-side request forgery risk (BAD-INPUTS.md): only http(s) to
public addresses is allowed (``workspaces.outbound``, the platform's one SSRF guard), checked
when the webhook is created and again, against a fresh DNS answer, when delivering; the delivery
connects to the address that was checked (no second lookup an attacker could rebind) and never
follows redirects.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import secrets
import socket
import ssl
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from workspaces import outbound
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.models import ApiToken, Event, Notification, WebhookEndpoint, Workspace

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_SECONDS = 5
WEBHOOK_MAX_URL_LENGTH = 2000
WEBHOOK_SIGNATURE_HEADER = "X-RankOps-Signature"
MAX_WEBHOOKS_PER_WORKSPACE = 20
MIN_SECRET_LENGTH = 16
ALLOWED_SCHEMES = {"http": 80, "https": 443}


# --- outbound URL checks (SSRF) ------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookTarget:
    """A checked webhook URL: where to connect (one of ``addresses``) and what to ask for."""

    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]


def _refused(detail: str) -> ValidationError:
    return ValidationError({"url": detail})


def webhook_url_validate(url: Any) -> WebhookTarget:
    """Check a webhook URL and resolve its host; raises ValidationError naming ``url``.

    Only http and https; no credentials in the URL; a port, when given, is 1-65535; the host must
    resolve, and every address it resolves to must be public (no loopback, link-local such as
    169.254.169.254, private, reserved or multicast), unless ``settings.WEBHOOK_ALLOW_PRIVATE``
    is on. Decimal, hex and short IPv4 forms (``2130706433``, ``0x7f000001``, ``127.1``) resolve
    to the address they mean and are checked as that address.
    """
    if not isinstance(url, str) or not url.strip():
        raise _refused("give an http or https URL")
    if len(url) > WEBHOOK_MAX_URL_LENGTH:
        raise _refused(f"at most {WEBHOOK_MAX_URL_LENGTH} characters")
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        raise _refused("the URL contains spaces, control or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _refused(f"not a valid URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise _refused("only http and https URLs are allowed")
    if "@" in parts.netloc:
        raise _refused("credentials in the URL are not allowed; the secret signs each delivery")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise _refused("the URL has no host")
    if port == 0:
        raise _refused("port 0 is no port; give 1-65535 or none")
    port = port or ALLOWED_SCHEMES[scheme]
    try:
        if settings.WEBHOOK_ALLOW_PRIVATE:
            addresses = outbound.resolve(host, port)
        else:
            addresses = outbound.public_addresses(host, port)
    except outbound.OutboundRefused as exc:
        raise _refused(str(exc)) from exc
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return WebhookTarget(scheme=scheme, host=host, port=port, path=path, addresses=tuple(addresses))


def webhook_sign(secret: str, body: bytes) -> str:
    """The signature header value: ``sha256=<hex HMAC-SHA256 of the body under the secret>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _post(target: WebhookTarget, *, body: bytes, headers: dict[str, str]) -> int:
    """POST to the checked address (not a fresh lookup); redirects are not followed."""
    address = target.addresses[0]
    if target.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            target.host,
            target.port,
            timeout=WEBHOOK_TIMEOUT_SECONDS,
            context=ssl.create_default_context(),
        )
    else:
        connection = http.client.HTTPConnection(
            target.host, target.port, timeout=WEBHOOK_TIMEOUT_SECONDS
        )

    # TLS still verifies the certificate against the host name; only the TCP peer is pinned.
    def connect_pinned(_address, timeout, source_address=None):
        return socket.create_connection((address, target.port), timeout, source_address)

    # a private http.client hook, pinned to the checked address (SSRF guard).
    connection._create_connection = connect_pinned  # type: ignore[attr-defined]
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        response = connection.getresponse()
        response.read(64 * 1024)
        return response.status
    finally:
        connection.close()


# --- writes --------------------------------------------------------------------------------------


def _recipients(users: Iterable[User | AnonymousUser | None]) -> list[User]:
    unique: dict[Any, User] = {}
    for user in users:
        if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
            continue
        unique.setdefault(user.pk, user)
    return list(unique.values())


def notify(
    *,
    workspace: Workspace,
    recipients: Iterable[User | None],
    verb: str,
    title: str,
    body: str,
    link: str = "",
    event: Event | None = None,
) -> list[Notification]:
    """Notify users of something in a workspace: one row each (duplicates and inactive users
    dropped), written in the caller's transaction; e-mail and webhooks follow after commit."""
    users = _recipients(recipients)
    if not users:
        return []
    with transaction.atomic():
        notifications = Notification.objects.bulk_create(
            [
                Notification(
                    workspace=workspace,
                    recipient=user,
                    verb=verb[:80],
                    title=title[:200],
                    body=body,
                    link=link[:500],
                    event=event,
                )
                for user in users
            ]
        )
        ids = [n.pk for n in notifications]
        # robust: a broker that is down must not turn the committed change into an error.
        transaction.on_commit(partial(_enqueue_delivery, ids), robust=True)
    return notifications


def _enqueue_delivery(notification_ids: list[int]) -> None:
    from workspaces.tasks import deliver_notifications

    deliver_notifications.delay(notification_ids)


@transaction.atomic
def webhook_create(
    *,
    actor: Actor,
    workspace: Workspace,
    url: str,
    secret: str | None = None,
) -> tuple[WebhookEndpoint, str]:
    """Add a webhook to a workspace; returns it and its signing secret (shown only once)."""
    target = webhook_url_validate(url)
    if secret is not None and not (MIN_SECRET_LENGTH <= len(secret) <= 200):
        raise ValidationError({"secret": f"give {MIN_SECRET_LENGTH}-200 characters, or omit it"})
    existing = WebhookEndpoint.objects.for_workspace(workspace)
    if existing.count() >= MAX_WEBHOOKS_PER_WORKSPACE:
        raise ValidationError({"url": f"at most {MAX_WEBHOOKS_PER_WORKSPACE} webhooks"})
    secret = secret or secrets.token_urlsafe(32)
    webhook = WebhookEndpoint.objects.create(
        workspace=workspace, url=url, secret=secret, created_by=actor_user(actor)
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="webhook.created",
        refs=[Ref(kind="webhook", object_id=webhook.pk, label=target.host)],
        # Only the host: paths and queries of webhook URLs often carry tokens.
        payload={"scheme": target.scheme, "host": target.host, "port": target.port},
    )
    return webhook, secret


@transaction.atomic
def webhook_delete(*, actor: Actor, webhook: WebhookEndpoint) -> None:
    """Remove a webhook; nothing more is sent to it."""
    host = urlsplit(webhook.url).hostname or ""
    event_record(
        actor=actor,
        workspace=webhook.workspace,
        verb="webhook.deleted",
        refs=[Ref(kind="webhook", object_id=webhook.pk, label=host)],
        payload={"host": host},
    )
    webhook.delete()


def notification_mark_read(*, user: User, notification: Notification) -> Notification:
    """Mark one of the user's notifications read; marking twice keeps the first time."""
    if notification.recipient_id != user.pk:
        raise Http404("No such notification.")
    if notification.read_at is None:
        notification.read_at = timezone.now()
        Notification.objects.filter(
            pk=notification.pk, workspace=notification.workspace_id, read_at__isnull=True
        ).update(read_at=notification.read_at)
    return notification


def notifications_mark_all_read(*, user: User, token: ApiToken | None = None) -> int:
    """Mark the user's unread notifications read (those of every workspace, or of the token's
    workspaces when it is narrowed to some); returns how many."""
    inbox = notifications_of(user=user, token=token).order_by()
    return inbox.filter(read_at__isnull=True).update(read_at=timezone.now())


def notifications_unread_count(*, user: User) -> int:
    """How many of the user's notifications are unread: the number on the shell's bell."""
    return Notification.objects.unscoped().filter(recipient=user, read_at__isnull=True).count()


# --- reads ---------------------------------------------------------------------------------------


def notifications_of(*, user: User, token: ApiToken | None = None) -> QuerySet[Notification]:
    """A user's own notifications, newest first; a token narrowed to workspaces sees only theirs."""
    # The recipient filter is the scope here: a user's inbox spans their workspaces.
    inbox = Notification.objects.unscoped().filter(recipient=user)
    if token is not None:
        scoped_ids = list(token.workspaces.values_list("pk", flat=True))
        if scoped_ids:
            inbox = inbox.filter(workspace_id__in=scoped_ids)
    return inbox.select_related("workspace").order_by("-created_at", "-id")


def webhooks_of(*, workspace: Workspace) -> QuerySet[WebhookEndpoint]:
    return (
        WebhookEndpoint.objects.for_workspace(workspace)
        .select_related("created_by")
        .order_by("-created_at", "-id")
    )


# --- delivery (run by workspaces.tasks.deliver_notifications) ------------------------------------


def _claim(notification_ids: list[int]) -> list[Notification]:
    """Take the not-yet-delivered rows; a redelivered task finds none and sends nothing twice."""
    with transaction.atomic():
        claimed = list(
            Notification.objects.unscoped()
            .select_for_update()
            .filter(pk__in=notification_ids, delivered_at__isnull=True)
            .order_by("pk")
        )
        if claimed:
            Notification.objects.unscoped().filter(pk__in=[n.pk for n in claimed]).update(
                delivered_at=timezone.now()
            )
    if not claimed:
        return []
    return list(
        Notification.objects.unscoped()
        .filter(pk__in=[n.pk for n in claimed])
        .select_related("workspace", "recipient")
        .order_by("pk")
    )


def _send_emails(notifications: list[Notification]) -> int:
    messages = [
        EmailMessage(
            subject=f"[RankOps {n.workspace.slug}] {n.title}",
            body=f"{n.body}\n\n{n.link}".strip() if n.link else n.body,
            to=[n.recipient.email],
        )
        for n in notifications
        if n.recipient.email
    ]
    if not messages:
        return 0
    try:
        return get_connection().send_messages(messages) or 0
    except Exception:  # a mail outage must not stop the webhooks
        logger.exception("sending %d notification e-mails failed", len(messages))
        return 0


def _webhook_payload(notifications: list[Notification]) -> dict[str, Any]:
    first = notifications[0]
    return {
        "id": str(uuid.uuid4()),
        "workspace": first.workspace.slug,
        "verb": first.verb,
        "title": first.title,
        "body": first.body,
        "link": first.link,
        "event_id": first.event_id,
        "created_at": first.created_at,
        "recipients": sorted(n.recipient.get_username() for n in notifications),
    }


def webhook_deliver(*, webhook: WebhookEndpoint, payload: dict[str, Any]) -> int | None:
    """Post one signed payload to one webhook, re-checking its URL now; returns the HTTP status
    (None when refused or unreachable) and records the outcome on the webhook."""
    body = json.dumps(payload, cls=DjangoJSONEncoder, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "RankOps-Webhook/1",
        "X-RankOps-Event": str(payload.get("verb", "")),
        "X-RankOps-Delivery": str(payload.get("id", "")),
        WEBHOOK_SIGNATURE_HEADER: webhook_sign(webhook.secret, body),
    }
    status: int | None = None
    error = ""
    try:
        target = webhook_url_validate(webhook.url)
        status = _post(target, body=body, headers=headers)
        if status >= 400:
            error = f"HTTP {status}"
    except ValidationError as exc:
        error = f"refused: {'; '.join(exc.message_dict.get('url', exc.messages))}"
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}"[:1000]
    WebhookEndpoint.objects.filter(pk=webhook.pk, workspace=webhook.workspace_id).update(
        last_attempt_at=timezone.now(), last_status=status, last_error=error
    )
    if error:
        logger.warning("webhook %s delivery failed: %s", webhook.pk, error)
    return status


def notifications_deliver(notification_ids: list[int]) -> dict[str, int]:
    """Send the e-mails of these notifications and post them to their workspaces' webhooks.

    The notifications of one ``notify`` call are one announcement: each webhook gets one post for
    it, listing the recipients, while each recipient with an address gets one e-mail.
    """
    notifications = _claim(list(notification_ids))
    emails = _send_emails(notifications)
    announcements: dict[tuple, list[Notification]] = {}
    for n in notifications:
        key = (n.workspace_id, n.verb, n.title, n.body, n.link, n.event_id)
        announcements.setdefault(key, []).append(n)
    posts = 0
    for group in announcements.values():
        workspace = group[0].workspace
        payload = _webhook_payload(group)
        for webhook in WebhookEndpoint.objects.for_workspace(workspace).filter(active=True):
            webhook_deliver(webhook=webhook, payload=payload)
            posts += 1
    return {"notifications": len(notifications), "emails": emails, "webhook_posts": posts}
