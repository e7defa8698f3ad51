"""Notifications: in-app messages to users, delivered by e-mail and signed webhooks from the log.

Every app notifies through ``notify``: it writes one Notification per recipient in the caller's
transaction (beside the event that caused it) and one ``notification.created`` event naming them,
and nothing else. Delivery is a consumer of the event log (``workspaces.outbox``): the
``notifications`` consumer reads each committed ``notification.created`` event after its cursor
and, in the same transaction that moves the cursor, marks the e-mails due and writes the first
``WebhookDelivery`` attempt for each active webhook of the workspace. ``deliveries_send`` then
sends what is due, outside any transaction: at least once, since an attempt whose sender died
is taken again after its lease; a failed one is retried after an exponential backoff
(``WEBHOOK_RETRY_BASE_SECONDS`` doubling per attempt, at most ``WEBHOOK_RETRY_MAX_SECONDS``,
``WEBHOOK_MAX_ATTEMPTS`` in all), each attempt a row of the delivery log. Every post carries the
announcement's event id (header ``X-RankOps-Event-Id``, also ``id`` in the body), the same on every
attempt, so a receiver dedups on it. A rolled-back change therefore never notifies anyone.

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
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.http import Http404
from django.utils import timezone

from workspaces import outbound
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.models import (
    ApiToken,
    Event,
    Notification,
    WebhookDelivery,
    WebhookEndpoint,
    Workspace,
)

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_SECONDS = 5
WEBHOOK_MAX_URL_LENGTH = 2000
WEBHOOK_SIGNATURE_HEADER = "X-RankOps-Signature"
WEBHOOK_EVENT_ID_HEADER = "X-RankOps-Event-Id"
NOTIFICATION_VERB = "notification.created"
CONSUMER = "notifications"
# Delivery retries (settings of the same names override these).
DELIVERY_DEFAULTS: dict[str, float] = {
    "WEBHOOK_RETRY_BASE_SECONDS": 30.0,
    "WEBHOOK_RETRY_MAX_SECONDS": 3600.0,
    "WEBHOOK_MAX_ATTEMPTS": 8,
    # How long a sender holds an attempt it took; past it (the sender died) another takes it.
    "DELIVERY_LEASE_SECONDS": 60.0,
    # Most e-mails and webhook attempts one ``deliveries_send`` call sends of each.
    "DELIVERY_BATCH_SIZE": 200,
}
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


class PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to one checked address, whatever the host name resolves to now."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.pinned_address = address

    def connect(self) -> None:
        """Open the TCP connection to the pinned address (``connect`` is the documented hook)."""
        self.sock = socket.create_connection(
            (self.pinned_address, self.port),
            self.timeout,
            self.source_address,  # type: ignore[attr-defined]  # set by HTTPConnection.__init__
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class PinnedHTTPSConnection(PinnedHTTPConnection):
    """HTTPS to one checked address: TLS still verifies the certificate against the host name;
    only the TCP peer is pinned."""

    default_port = http.client.HTTPS_PORT

    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, address=address, timeout=timeout)
        self.tls_context = ssl.create_default_context()

    def connect(self) -> None:
        """Connect to the pinned address, then wrap the socket in TLS for the host name."""
        super().connect()
        self.sock = self.tls_context.wrap_socket(self.sock, server_hostname=self.host)


def _post(target: WebhookTarget, *, body: bytes, headers: dict[str, str]) -> int:
    """POST to the checked address (not a fresh lookup); redirects are not followed."""
    kind = PinnedHTTPSConnection if target.scheme == "https" else PinnedHTTPConnection
    connection = kind(
        target.host, target.port, address=target.addresses[0], timeout=WEBHOOK_TIMEOUT_SECONDS
    )
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
    dropped) and one ``notification.created`` event, written in the caller's transaction; the
    notifications consumer of the log sends the e-mails and webhook posts after commit."""
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
        event_record(
            actor=None,
            workspace=workspace,
            verb=NOTIFICATION_VERB,
            refs=[Ref(kind="notification", object_id=notifications[0].pk, label=verb[:80])],
            payload={
                "notifications": [n.pk for n in notifications],
                "verb": verb[:80],
                "cause_event_id": event.pk if event is not None else None,
            },
        )
    return notifications


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


# --- delivery: the consumer of the log, then the sender ---------------------------------------


def delivery_setting(name: str) -> Any:
    """A delivery knob: ``settings.<name>`` when set, else the default here."""
    return getattr(settings, name, DELIVERY_DEFAULTS[name])


def delivery_backoff(attempt: int) -> timedelta:
    """How long after failed attempt number ``attempt`` (1, 2, ...) the next one is due:
    the base doubled per attempt, capped."""
    base = float(delivery_setting("WEBHOOK_RETRY_BASE_SECONDS"))
    cap = float(delivery_setting("WEBHOOK_RETRY_MAX_SECONDS"))
    return timedelta(seconds=min(cap, base * 2 ** max(0, attempt - 1)))


def _webhook_payload(event: Event, notifications: list[Notification]) -> dict[str, Any]:
    first = notifications[0]
    return {
        "id": str(event.pk),
        "workspace": first.workspace.slug,
        "verb": first.verb,
        "title": first.title,
        "body": first.body,
        "link": first.link,
        "event_id": first.event_id,
        "created_at": first.created_at,
        "recipients": sorted(n.recipient.get_username() for n in notifications),
    }


def notifications_consume(event: Event) -> None:
    """The ``notifications`` consumer's handler, for one ``notification.created`` event: marks
    its e-mails due and writes the first delivery attempt for each active webhook. Runs in the
    transaction that moves the consumer's cursor; applying an event twice adds nothing."""
    ids = [int(i) for i in (event.payload or {}).get("notifications", [])]
    if not ids or event.workspace_id is None:
        return
    rows = list(
        Notification.objects.for_workspace(event.workspace_id)
        .filter(pk__in=ids)
        .select_related("workspace", "recipient")
        .order_by("pk")
    )
    if not rows:
        return
    now = timezone.now()
    fresh = Notification.objects.for_workspace(event.workspace_id).filter(
        pk__in=[n.pk for n in rows], delivered_at__isnull=True, email_attempts=0
    )
    with_address = [n.pk for n in rows if n.recipient.email and n.recipient.is_active]
    fresh.filter(pk__in=with_address, email_next_attempt_at__isnull=True).update(
        email_next_attempt_at=now
    )
    fresh.exclude(pk__in=with_address).update(delivered_at=now)
    payload = json.loads(json.dumps(_webhook_payload(event, rows), cls=DjangoJSONEncoder))
    WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(
                workspace_id=event.workspace_id,
                webhook=webhook,
                event_id=event.pk,
                notification_id=rows[0].pk,
                attempt=1,
                payload=payload,
                next_attempt_at=now,
            )
            for webhook in WebhookEndpoint.objects.for_workspace(event.workspace_id).filter(
                active=True
            )
        ],
        ignore_conflicts=True,
    )


def webhook_post(
    *, webhook: WebhookEndpoint, payload: dict[str, Any], event_id: int
) -> tuple[int | None, str, bool]:
    """Post one signed payload to one webhook, re-checking its URL now. Returns the HTTP status
    (None when refused or unreachable), the error ("" on a 2xx answer) and whether a retry may
    help (not for a URL the SSRF guard refuses); records the outcome on the webhook."""
    body = json.dumps(payload, cls=DjangoJSONEncoder, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "RankOps-Webhook/1",
        "X-RankOps-Event": str(payload.get("verb", "")),
        "X-RankOps-Delivery": str(payload.get("id", "")),
        WEBHOOK_EVENT_ID_HEADER: str(event_id),
        WEBHOOK_SIGNATURE_HEADER: webhook_sign(webhook.secret, body),
    }
    status: int | None = None
    error = ""
    retry = True
    try:
        target = webhook_url_validate(webhook.url)
        status = _post(target, body=body, headers=headers)
        if not 200 <= status < 300:
            error = f"HTTP {status}"
    except ValidationError as exc:
        error = f"refused: {'; '.join(exc.message_dict.get('url', exc.messages))}"
        retry = False
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}"[:1000]
    WebhookEndpoint.objects.filter(pk=webhook.pk, workspace=webhook.workspace_id).update(
        last_attempt_at=timezone.now(), last_status=status, last_error=error
    )
    if error:
        logger.warning("webhook %s delivery of event %s failed: %s", webhook.pk, event_id, error)
    return status, error, retry


def _claim_attempt(attempt: WebhookDelivery, now: datetime) -> bool:
    lease = timedelta(seconds=float(delivery_setting("DELIVERY_LEASE_SECONDS")))
    return bool(
        WebhookDelivery.objects.for_workspace(attempt.workspace_id)
        .filter(pk=attempt.pk, attempted_at__isnull=True, next_attempt_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))
        .update(claimed_until=now + lease)
    )


def _webhook_attempt(attempt: WebhookDelivery, now: datetime) -> bool:
    """Send one claimed attempt and log its outcome; a failure writes the next attempt."""
    webhook = attempt.webhook
    if not webhook.active:
        status, error, retry = None, "webhook deactivated", False
    else:
        status, error, retry = webhook_post(
            webhook=webhook, payload=attempt.payload, event_id=attempt.event_id
        )
    with transaction.atomic():
        WebhookDelivery.objects.for_workspace(attempt.workspace_id).filter(pk=attempt.pk).update(
            attempted_at=now,
            status_code=status,
            error=error,
            delivered_at=None if error else now,
            claimed_until=None,
        )
        if error and retry and attempt.attempt < int(delivery_setting("WEBHOOK_MAX_ATTEMPTS")):
            WebhookDelivery.objects.bulk_create(
                [
                    WebhookDelivery(
                        workspace_id=attempt.workspace_id,
                        webhook_id=attempt.webhook_id,
                        event_id=attempt.event_id,
                        notification_id=attempt.notification_id,
                        attempt=attempt.attempt + 1,
                        payload=attempt.payload,
                        next_attempt_at=now + delivery_backoff(attempt.attempt),
                    )
                ],
                ignore_conflicts=True,
            )
    return not error


def _email_attempt(notification: Notification, now: datetime, connection: Any) -> bool:
    message = EmailMessage(
        subject=f"[RankOps {notification.workspace.slug}] {notification.title}",
        body=(
            f"{notification.body}\n\n{notification.link}".strip()
            if notification.link
            else notification.body
        ),
        to=[notification.recipient.email],
    )
    error = ""
    try:
        sent = connection.send_messages([message]) or 0
        if not sent:
            error = "the mail backend sent nothing"
    except Exception as exc:  # noqa: BLE001 - a mail outage is retried, never raised
        error = f"{type(exc).__name__}: {exc}"[:1000]
        logger.warning("e-mail of notification %s failed: %s", notification.pk, error)
    rows = Notification.objects.for_workspace(notification.workspace_id).filter(pk=notification.pk)
    attempts = notification.email_attempts + 1  # the claim counted this attempt
    if not error:
        rows.update(delivered_at=now, email_next_attempt_at=None, email_error="")
    elif attempts < int(delivery_setting("WEBHOOK_MAX_ATTEMPTS")):
        rows.update(email_next_attempt_at=now + delivery_backoff(attempts), email_error=error)
    else:
        rows.update(email_next_attempt_at=None, email_error=error)
    return not error


def deliveries_send(*, now: datetime | None = None) -> dict[str, int]:
    """Send the e-mails and webhook attempts due at ``now`` (default: the clock), each claimed
    first so that concurrent senders never send one twice at once, and none inside a
    transaction. Returns how many of each were sent successfully and how many failed."""
    now = now or timezone.now()
    size = int(delivery_setting("DELIVERY_BATCH_SIZE"))
    lease = timedelta(seconds=float(delivery_setting("DELIVERY_LEASE_SECONDS")))
    counts = {"emails": 0, "email_failures": 0, "webhook_posts": 0, "webhook_failures": 0}
    # Platform-wide maintenance across workspaces: unscoped on purpose.
    due_mail = list(
        Notification.objects.unscoped()
        .filter(delivered_at__isnull=True, email_next_attempt_at__lte=now)
        .select_related("workspace", "recipient")
        .order_by("email_next_attempt_at", "pk")[:size]
    )
    connection = get_connection() if due_mail else None
    for notification in due_mail:
        claimed = (
            Notification.objects.for_workspace(notification.workspace_id)
            .filter(
                pk=notification.pk,
                delivered_at__isnull=True,
                email_next_attempt_at=notification.email_next_attempt_at,
            )
            .update(email_next_attempt_at=now + lease, email_attempts=F("email_attempts") + 1)
        )
        if claimed:
            ok = _email_attempt(notification, now, connection)
            counts["emails" if ok else "email_failures"] += 1
    due_posts = list(
        WebhookDelivery.objects.unscoped()
        .filter(attempted_at__isnull=True, next_attempt_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))
        .select_related("webhook")
        .order_by("next_attempt_at", "pk")[:size]
    )
    for attempt in due_posts:
        if _claim_attempt(attempt, now):
            ok = _webhook_attempt(attempt, now)
            counts["webhook_posts" if ok else "webhook_failures"] += 1
    return counts


def webhook_deliveries_of(*, webhook: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """A webhook's delivery log, newest attempt first."""
    return WebhookDelivery.objects.for_workspace(webhook.workspace_id).filter(webhook=webhook)
