"""Times on the experiment page as people read them: ``{{ at|utc_when }}`` gives
"1 Dec 2026, 14:05 UTC" and ``{{ at|relative }}`` gives "in 3 h" or "3 h ago". Both take a
datetime or the ISO string the experiment's JSON fields store (ramp history, review, decision)."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime

register = template.Library()


def _moment(value) -> datetime | None:
    if isinstance(value, str):
        value = parse_datetime(value.strip()) if value.strip() else None
    if not isinstance(value, datetime):
        return None
    if timezone.is_naive(value):
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


@register.filter
def utc_when(value) -> str:
    """ "1 Dec 2026, 14:05 UTC" (empty for nothing or an unreadable value)."""
    moment = _moment(value)
    if moment is None:
        return ""
    return f"{moment.day} {moment:%b %Y, %H:%M} UTC"


def span_text(seconds: float) -> str:
    """A duration in its largest useful unit: "40 s", "12 min", "3 h", "2 d"."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400:
        hours = seconds / 3600
        text = f"{hours:.0f}" if hours >= 10 else f"{hours:.1f}".rstrip("0").rstrip(".")
        return f"{text} h"
    return f"{seconds / 86400:.0f} d"


@register.filter
def relative(value, now=None) -> str:
    """ "in 3 h" for a future moment, "3 h ago" for a past one, "now" within a second."""
    moment = _moment(value)
    if moment is None:
        return ""
    seconds = (moment - (_moment(now) or timezone.now())).total_seconds()
    if abs(seconds) < 1:
        return "now"
    return f"in {span_text(seconds)}" if seconds > 0 else f"{span_text(seconds)} ago"
