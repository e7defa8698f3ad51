"""The demo ads log of the feed-pctr workspace, and a producer that pushes it over the REST API.

``generate`` builds users, ads, contexts and a week of impressions deterministically (a numpy
Generator with a fixed seed); clicks are drawn from ``CLICK_MODEL``, a known logistic model of
user, ad and context features, so whatever is trained on the demo has something real to find.

``DemoProducer`` registers the demo feature groups and pushes every batch through the same
endpoints upstream producers use, with an ``Idempotency-Key`` per batch. The keys carry the time
the demo log is anchored at; a rerun finds that anchor in the stored batches, rebuilds the same
bodies and is answered with replays, so nothing is stored twice.
"""

from __future__ import annotations

import io
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from django.db import transaction
from django.utils import timezone

from features.models import Batch, FeatureGroup
from workspaces.models import Workspace

SEED = 20_261_130
DAYS = 7
BASE_USERS = 500
BASE_ADS = 200
BASE_IMPRESSIONS = 20_000
EMBEDDING_DIMENSION = 8

AGE_BUCKETS = ["18-24", "25-34", "35-44", "45-54", "55+"]
GENDERS = ["f", "m", "u"]
ACTIVITY_LEVELS = ["low", "medium", "high"]
CATEGORIES = ["games", "shopping", "travel", "finance", "food", "auto", "beauty", "education"]
DEVICES = ["ios", "android", "desktop"]

# The click model, on the log-odds scale. Tests check that the log recovers it.
CLICK_MODEL: dict[str, Any] = {
    "intercept": -3.8,
    "activity": {"low": -0.6, "medium": 0.0, "high": 0.9},
    "device": {"ios": 0.25, "android": 0.0, "desktop": -0.35},
    "evening": 0.4,  # impressions from 18:00 to 23:59 UTC
    "ctr_prior": 1.0,  # weight on logit(ad ctr prior) - logit(mean prior)
    "affinity": 1.2,  # weight on (user embedding . ad category embedding)
}

# How often each activity level browses, relative to "low".
ACTIVITY_TRAFFIC = {"low": 1.0, "medium": 2.5, "high": 5.0}


@dataclass
class DemoLog:
    """The generated log: one dict of numpy columns per table, and the moment it ends."""

    anchor: datetime
    users: dict[str, np.ndarray]
    ads: dict[str, np.ndarray]
    impressions: dict[str, np.ndarray]

    @property
    def start(self) -> datetime:
        return self.anchor - timedelta(days=DAYS)


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1 - p))


def sizes(scale: float) -> tuple[int, int, int]:
    """Users, ads and impressions at ``scale`` (1.0 is the full demo)."""
    return (
        max(20, round(BASE_USERS * scale)),
        max(10, round(BASE_ADS * scale)),
        max(200, round(BASE_IMPRESSIONS * scale)),
    )


def generate(*, anchor: datetime, scale: float = 1.0, seed: int = SEED) -> DemoLog:
    """The demo log ending at ``anchor``; the same arguments always give the same log."""
    rng = np.random.default_rng(seed)
    n_users, n_ads, n_impressions = sizes(scale)

    users = {
        "user_id": np.array([f"u{i:04d}" for i in range(n_users)]),
        "age_bucket": rng.choice(AGE_BUCKETS, size=n_users, p=[0.2, 0.3, 0.25, 0.15, 0.1]),
        "gender": rng.choice(GENDERS, size=n_users, p=[0.48, 0.47, 0.05]),
        "activity_level": rng.choice(ACTIVITY_LEVELS, size=n_users, p=[0.4, 0.4, 0.2]),
        "device": rng.choice(DEVICES, size=n_users, p=[0.4, 0.45, 0.15]),
        "embedding": rng.normal(
            0, 1 / np.sqrt(EMBEDDING_DIMENSION), (n_users, EMBEDDING_DIMENSION)
        ),
    }
    category_vectors = rng.normal(
        0, 1 / np.sqrt(EMBEDDING_DIMENSION), (len(CATEGORIES), EMBEDDING_DIMENSION)
    )
    ad_category = rng.integers(0, len(CATEGORIES), size=n_ads)
    ads = {
        "ad_id": np.array([f"a{i:03d}" for i in range(n_ads)]),
        "category": np.array(CATEGORIES)[ad_category],
        "category_index": ad_category,
        "price": np.round(rng.lognormal(mean=3.0, sigma=0.8, size=n_ads), 2),
        "ctr_prior": np.round(rng.beta(2, 60, size=n_ads), 4),
        "is_video": rng.random(n_ads) < 0.3,
    }
    ads["ctr_prior"] = np.clip(ads["ctr_prior"], 0.001, 0.5)

    # Who sees what, and when: active users browse more; evenings are busier.
    traffic = np.array([ACTIVITY_TRAFFIC[level] for level in users["activity_level"]])
    user_index = rng.choice(n_users, size=n_impressions, p=traffic / traffic.sum())
    ad_index = rng.integers(0, n_ads, size=n_impressions)
    hour_weights = np.array(
        [1, 1, 1, 1, 1, 2, 3, 4, 5, 5, 5, 5, 6, 5, 5, 5, 5, 6, 8, 9, 9, 8, 5, 3]
    )
    day = rng.integers(0, DAYS, size=n_impressions)
    hour = rng.choice(24, size=n_impressions, p=hour_weights / hour_weights.sum())
    second = rng.integers(0, 3600, size=n_impressions)
    # Calendar hours follow hour_weights; a time before the window moves a week on, so every
    # impression lies in [anchor - 7 days, anchor) and keeps its hour of day.
    window_start = int((anchor - timedelta(days=DAYS)).timestamp())
    midnight = window_start - window_start % 86_400
    timestamps = midnight + day * 86_400 + hour * 3600 + second
    timestamps = np.where(timestamps < window_start, timestamps + DAYS * 86_400, timestamps)
    hour_of_day = (timestamps // 3600) % 24
    own_device = users["device"][user_index]
    device = np.where(
        rng.random(n_impressions) < 0.8, own_device, rng.choice(DEVICES, n_impressions)
    )

    logit = click_logit(
        activity=users["activity_level"][user_index],
        device=device,
        hour=hour_of_day,
        ctr_prior=ads["ctr_prior"][ad_index],
        mean_prior=float(ads["ctr_prior"].mean()),
        affinity=np.einsum(
            "ij,ij->i",
            users["embedding"][user_index],
            category_vectors[ads["category_index"][ad_index]],
        ),
    )
    p_click = 1 / (1 + np.exp(-logit))
    click = rng.random(n_impressions) < p_click
    order = np.argsort(timestamps, kind="stable")
    impressions = {
        "user_id": users["user_id"][user_index][order],
        "ad_id": ads["ad_id"][ad_index][order],
        "timestamp": timestamps[order],
        "hour": hour_of_day[order],
        "device": device[order],
        "context_id": np.array(
            [f"h{h:02d}_{d}" for h, d in zip(hour_of_day[order], device[order], strict=True)]
        ),
        "activity_level": users["activity_level"][user_index][order],
        "p_click": p_click[order],
        "click": click[order],
    }
    return DemoLog(anchor=anchor, users=users, ads=ads, impressions=impressions)


def click_logit(
    *,
    activity: np.ndarray,
    device: np.ndarray,
    hour: np.ndarray,
    ctr_prior: np.ndarray,
    mean_prior: float,
    affinity: np.ndarray,
) -> np.ndarray:
    """The log-odds of a click under ``CLICK_MODEL``."""
    model = CLICK_MODEL
    return (
        model["intercept"]
        + np.vectorize(model["activity"].get)(activity)
        + np.vectorize(model["device"].get)(device)
        + model["evening"] * (hour >= 18)
        + model["ctr_prior"] * (_logit(ctr_prior) - _logit(np.array(mean_prior)))
        + model["affinity"] * affinity * np.sqrt(EMBEDDING_DIMENSION)
    )


# --- the feature groups and their batches --------------------------------------------------------

DAY_SLA = 24 * 3600

GROUPS: list[dict[str, Any]] = [
    {
        "name": "user_profile",
        "entity": "user",
        "entity_keys": ["user_id"],
        "description": "Demographics and activity of feed users (daily snapshot).",
        "tags": ["demo", "user"],
        "freshness_sla_seconds": 2 * DAY_SLA,
        "features": [
            {"name": "age_bucket", "dtype": "categorical", "description": "Age range."},
            {"name": "gender", "dtype": "categorical", "description": "f, m or u (unknown)."},
            {"name": "activity_level", "dtype": "categorical", "description": "low/medium/high."},
            {"name": "impressions_7d", "dtype": "int", "description": "Feed ads seen in 7 days."},
        ],
    },
    {
        "name": "ad_profile",
        "entity": "item",
        "entity_keys": ["ad_id"],
        "description": "Ad creatives: category, price and the historical CTR prior.",
        "tags": ["demo", "ad"],
        "freshness_sla_seconds": 2 * DAY_SLA,
        "features": [
            {"name": "category", "dtype": "categorical", "description": "Advertiser vertical."},
            {"name": "price", "dtype": "float", "description": "Product price (EUR)."},
            {"name": "ctr_prior", "dtype": "float", "description": "CTR prior from history."},
            {"name": "is_video", "dtype": "bool", "description": "Video creative."},
        ],
    },
    {
        "name": "context_stats",
        "entity": "context",
        "entity_keys": ["context_id"],
        "description": "CTR by hour of day and device over the previous day. Its job stopped "
        "three days ago, so its freshness SLA of one day is broken.",
        "tags": ["demo", "context"],
        "freshness_sla_seconds": DAY_SLA,
        "features": [
            {"name": "hour", "dtype": "int", "description": "Hour of day (UTC)."},
            {"name": "device", "dtype": "categorical", "description": "ios, android, desktop."},
            {"name": "impressions_1d", "dtype": "int", "description": "Impressions in a day."},
            {"name": "ctr_1d", "dtype": "float", "description": "Clicks per impression."},
        ],
    },
    {
        "name": "user_embedding",
        "entity": "semantic",
        "entity_keys": ["user_id"],
        "description": "Interest embedding of each user, from the semantic model.",
        "tags": ["demo", "embedding"],
        "freshness_sla_seconds": 2 * DAY_SLA,
        "features": [
            {
                "name": "interest",
                "dtype": "embedding",
                "dimension": EMBEDDING_DIMENSION,
                "description": "Interest vector.",
            }
        ],
    },
    {
        "name": "impressions",
        "entity": "label",
        "entity_keys": ["user_id", "ad_id"],
        "description": "Feed ad impressions with their click label: the label source of samples.",
        "tags": ["demo", "labels"],
        "freshness_sla_seconds": 2 * DAY_SLA,
        "online": False,
        "features": [
            {"name": "click", "dtype": "bool", "description": "The user clicked the ad."},
            {"name": "context_id", "dtype": "string", "description": "hNN_device."},
            {"name": "hour", "dtype": "int", "description": "Hour of day (UTC)."},
            {"name": "device", "dtype": "categorical", "description": "ios, android, desktop."},
        ],
    },
]


@dataclass
class DemoBatch:
    """One push: the group, its body, the content type and a name unique within the demo."""

    group: str
    label: str
    body: bytes
    content_type: str
    rows: int


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_body(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps({"rows": rows}, separators=(",", ":"), sort_keys=True).encode()


def batches(log: DemoLog) -> Iterator[DemoBatch]:
    """Every batch of the demo, in push order."""
    start, anchor = log.start, log.anchor
    users, ads, imp = log.users, log.ads, log.impressions
    seen = dict(zip(*np.unique(imp["user_id"], return_counts=True), strict=True))

    # Profiles and embeddings: a snapshot before the first impression, and a fresh one now.
    for label, moment in (("initial", start - timedelta(hours=1)), ("daily", anchor)):
        stamp = _iso(moment - timedelta(minutes=5))
        yield DemoBatch(
            "user_profile",
            label,
            _json_body(
                [
                    {
                        "user_id": uid,
                        "event_time": stamp,
                        "age_bucket": str(users["age_bucket"][i]),
                        "gender": str(users["gender"][i]),
                        "activity_level": str(users["activity_level"][i]),
                        "impressions_7d": int(seen.get(uid, 0)),
                    }
                    for i, uid in enumerate(users["user_id"].tolist())
                ]
            ),
            "application/json",
            len(users["user_id"]),
        )
        yield DemoBatch(
            "ad_profile",
            label,
            _json_body(
                [
                    {
                        "ad_id": aid,
                        "event_time": stamp,
                        "category": str(ads["category"][i]),
                        "price": float(ads["price"][i]),
                        "ctr_prior": float(ads["ctr_prior"][i]),
                        "is_video": bool(ads["is_video"][i]),
                    }
                    for i, aid in enumerate(ads["ad_id"].tolist())
                ]
            ),
            "application/json",
            len(ads["ad_id"]),
        )
        yield DemoBatch(
            "user_embedding",
            label,
            _json_body(
                [
                    {
                        "user_id": uid,
                        "event_time": stamp,
                        "interest": [round(float(v), 5) for v in users["embedding"][i]],
                    }
                    for i, uid in enumerate(users["user_id"].tolist())
                ]
            ),
            "application/json",
            len(users["user_id"]),
        )

    # Context statistics: one batch a day over the previous day, until the job "stopped" at
    # anchor - 3 days (the freshness SLA is one day, so the group is broken).
    for day in range(1, DAYS - 3 + 1):
        day_end = start + timedelta(days=day)
        window = (imp["timestamp"] >= int((day_end - timedelta(days=1)).timestamp())) & (
            imp["timestamp"] < int(day_end.timestamp())
        )
        rows = []
        for hour in range(24):
            for device in DEVICES:
                mask = window & (imp["hour"] == hour) & (imp["device"] == device)
                shown = int(mask.sum())
                rows.append(
                    {
                        "context_id": f"h{hour:02d}_{device}",
                        "event_time": _iso(day_end),
                        "hour": hour,
                        "device": device,
                        "impressions_1d": shown,
                        "ctr_1d": round(float(imp["click"][mask].mean()), 5) if shown else None,
                    }
                )
        yield DemoBatch("context_stats", f"day{day}", _json_body(rows), "application/json", 72)

    # Impressions with click labels: one Parquet file a day.
    for day in range(DAYS):
        low = int((start + timedelta(days=day)).timestamp())
        high = int((start + timedelta(days=day + 1)).timestamp())
        mask = (imp["timestamp"] >= low) & (imp["timestamp"] < high)
        if not mask.any():
            continue
        table = pa.table(
            {
                "user_id": pa.array(imp["user_id"][mask].tolist(), pa.string()),
                "ad_id": pa.array(imp["ad_id"][mask].tolist(), pa.string()),
                "event_time": pa.array(
                    (imp["timestamp"][mask] * 1_000_000).tolist(), pa.timestamp("us", tz="UTC")
                ),
                "click": pa.array(imp["click"][mask].tolist(), pa.bool_()),
                "context_id": pa.array(imp["context_id"][mask].tolist(), pa.string()),
                "hour": pa.array(imp["hour"][mask].tolist(), pa.int64()),
                "device": pa.array(imp["device"][mask].tolist(), pa.string()),
            }
        )
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        yield DemoBatch(
            "impressions",
            f"day{day}",
            sink.getvalue(),
            "application/vnd.apache.parquet",
            len(table),
        )


# --- pushing it over HTTP -------------------------------------------------------------------------

KEY_PATTERN = re.compile(r"^demo-(\d{8}T\d{4}Z)-s([0-9.e-]+)-")


class DemoPushError(RuntimeError):
    """The platform refused a demo request; the message carries its error body."""


def scale_tag(scale: float) -> str:
    return f"{scale:g}"


def idempotency_key(*, anchor: datetime, scale: float, batch: DemoBatch) -> str:
    return f"demo-{anchor:%Y%m%dT%H%MZ}-s{scale_tag(scale)}-{batch.group}-{batch.label}"


def anchor_from_key(key: str | None, *, scale: float) -> datetime | None:
    match = KEY_PATTERN.match(key or "")
    if match is None or match.group(2) != scale_tag(scale):
        return None
    return datetime.strptime(match.group(1), "%Y%m%dT%H%MZ").replace(tzinfo=UTC)


@dataclass
class PushReport:
    """What a demo run did: groups registered, batches stored, replayed or skipped."""

    anchor: datetime | None = None
    registered: list[str] = field(default_factory=list)
    stored: int = 0
    replayed: int = 0
    conflicts: int = 0
    rows: int = 0


@dataclass
class Response:
    status: int
    body: Any


class DemoProducer:
    """Pushes the demo into a workspace through the public REST API, as a producer would."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        workspace: str,
        producer: str,
        log: Callable[[str], None] = print,
        timeout: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.workspace = workspace
        self.producer = producer
        self.log = log
        self.timeout = timeout

    def _url(self, path: str) -> str:
        return f"{self.base_url}/api/v1/workspaces/{self.workspace}/{path}"

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> Response:
        request = urllib.request.Request(  # noqa: S310 - the base URL is ours (http only)
            self._url(path),
            data=body,
            method=method,
            headers={
                "Authorization": f"Token {self.token}",
                "Accept": "application/json",
                **({"Content-Type": content_type} if body is not None else {}),
                **(headers or {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310
                status, raw = answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")[:500]
        return Response(status, parsed)

    def ensure_groups(self, report: PushReport) -> None:
        for spec in GROUPS:
            found = self.request("GET", f"feature-groups/{spec['name']}/")
            if found.status == 200:
                continue
            if found.status != 404:
                raise DemoPushError(f"GET {spec['name']}: {found.status} {found.body}")
            created = self.request(
                "POST",
                "feature-groups/",
                body=json.dumps({**spec, "producer": self.producer}).encode(),
            )
            if created.status != 201:
                raise DemoPushError(f"registering {spec['name']}: {created.status} {created.body}")
            report.registered.append(spec["name"])
            self.log(f"registered feature group {spec['name']}")

    def stored_anchor(self, *, scale: float) -> datetime | None:
        """The anchor of an earlier run at the same scale, read from its batches' keys."""
        for spec in GROUPS:
            listing = self.request("GET", f"feature-groups/{spec['name']}/batches/?limit=500")
            if listing.status != 200:
                continue
            results = listing.body.get("results", []) if isinstance(listing.body, dict) else []
            for batch in results:
                anchor = anchor_from_key(batch.get("idempotency_key"), scale=scale)
                if anchor is not None:
                    return anchor
        return None

    def push(self, *, anchor: datetime, scale: float, seed: int = SEED) -> PushReport:
        report = PushReport(anchor=anchor)
        self.ensure_groups(report)
        earlier = self.stored_anchor(scale=scale)
        if earlier is not None:
            anchor = report.anchor = earlier
            self.log(f"an earlier demo run is anchored at {_iso(anchor)}; replaying it")
        log = generate(anchor=anchor, scale=scale, seed=seed)
        for batch in batches(log):
            key = idempotency_key(anchor=anchor, scale=scale, batch=batch)
            answer = self.request(
                "POST",
                f"feature-groups/{batch.group}/batches/",
                body=batch.body,
                content_type=batch.content_type,
                headers={"Idempotency-Key": key},
            )
            if answer.status == 201:
                report.stored += 1
                report.rows += batch.rows
            elif answer.status == 200:
                report.replayed += 1
            elif answer.status == 409 and _attr(answer.body) == "Idempotency-Key":
                # Same key, other bytes (e.g. another pyarrow wrote the Parquet): already stored.
                report.conflicts += 1
            else:
                raise DemoPushError(
                    f"pushing {batch.group} {batch.label}: {answer.status} {answer.body}"
                )
        return report


def _attr(body: Any) -> str | None:
    return body.get("attr") if isinstance(body, dict) else None


ARRIVAL_DELAY = timedelta(minutes=10)


def simulate_arrival_times(*, workspace: Workspace, anchor: datetime, scale: float) -> int:
    """Demo only: date each demo batch as if its producer had pushed it when its data closed.

    The batches were all pushed just now, but a week of history looks like a week only if each
    batch arrived ten minutes after its last event; so context_stats, whose producer "stopped"
    three days ago, last arrived three days ago and breaks its one-day freshness SLA. It sets
    absolute times, so running it again changes nothing. Returns how many batches it dated.
    """
    now = timezone.now()
    prefix = f"demo-{anchor:%Y%m%dT%H%MZ}-s{scale_tag(scale)}-"
    latest: dict[int, datetime] = {}
    dated = 0
    with transaction.atomic():
        demo_batches = (
            Batch.objects.for_workspace(workspace)
            .filter(idempotency_key__startswith=prefix, max_event_time__isnull=False)
            .select_for_update()
        )
        for batch in demo_batches:
            arrived = min(batch.max_event_time + ARRIVAL_DELAY, now)
            Batch.objects.for_workspace(workspace).filter(pk=batch.pk).update(created_at=arrived)
            latest[batch.group_id] = max(arrived, latest.get(batch.group_id, arrived))
            dated += 1
        for group_id, arrived in latest.items():
            FeatureGroup.objects.for_workspace(workspace).filter(pk=group_id).update(
                last_ingested_at=arrived
            )
    return dated
