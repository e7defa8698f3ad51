"""Feature group health (F7, F8) and scheduled online materialisation, on a controllable clock.

The clock starts at the real present (the online store counts lookups in real hourly buckets)
and moves forward only when a test says so; every check gets it as ``now``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from config.celery import app as celery_app
from features import health, ingestion, materialization, online_store, registry, tasks
from features.lookup import online_lookup
from features.models import (
    Batch,
    ConsumerKind,
    DriftSketch,
    FeatureGroup,
    HealthCheck,
    HealthStatus,
    Lifecycle,
)
from features.tests.factories import make_group, user_row
from workspaces.models import Event, Notification, Role
from workspaces.notifications import WEBHOOK_SIGNATURE_HEADER, webhook_create
from workspaces.testing.factories import make_member, make_workspace

SLA = 3600


@dataclass
class Clock:
    current: datetime

    def now(self) -> datetime:
        return self.current

    def advance(self, **delta: float) -> datetime:
        self.current += timedelta(**delta)
        return self.current


@pytest.fixture
def clock(monkeypatch):
    """The test's clock; ingestion stamps ``last_ingested_at`` with it too."""
    clock = Clock(timezone.now())
    # touch_ingested() reads the wall clock; batch_ingest() has no `now` to hand it.
    monkeypatch.setattr(registry, "timezone", SimpleNamespace(now=clock.now))
    return clock


class Receiver:
    """A webhook receiver on 127.0.0.1 in a thread."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append({"headers": dict(self.headers.items()), "body": body})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    receiver = Receiver()
    yield receiver
    receiver.close()


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def push(group, actor, rows, clock):
    body = json.dumps({"rows": rows}).encode()
    return ingestion.batch_ingest(
        actor=actor, group=group, body=body, format="json", now=clock.now()
    )


def check(group, clock, capture):
    """One health check at the clock's time; its notifications are delivered after commit."""
    with capture(execute=True):
        return health.group_health_check(group=group, now=clock.now())


def notified(group, verb: str) -> list[str]:
    return sorted(
        Notification.objects.for_workspace(group.workspace)
        .filter(verb=verb)
        .values_list("recipient__username", flat=True)
    )


def events(group, verb: str) -> int:
    return Event.objects.for_workspace(group.workspace).filter(verb=verb).count()


# --- the acceptance test: broken once, recovered once, to producer and consumers ---------------


def test_a_stopped_producer_breaks_the_group_once_and_recovery_is_announced_once(
    workspace,
    clock,
    eager_celery,
    receiver,
    mailoutbox,
    django_capture_on_commit_callbacks,
):
    producer = make_member(workspace, Role.DEVELOPER, username="ctr_producer")
    owner = make_member(workspace, Role.DEVELOPER, username="feature_owner")
    model_owner = make_member(workspace, Role.MAINTAINER, username="model_owner")
    serving_owner = make_member(workspace, Role.DEVELOPER, username="serving_owner")
    gone_owner = make_member(workspace, Role.DEVELOPER, username="gone_owner")
    group = make_group(
        workspace, actor=owner, name="user_ctr", producer=producer, freshness_sla_seconds=SLA
    )
    registry.consumer_register(
        actor=owner,
        group=group,
        kind=ConsumerKind.MODEL,
        object_id=11,
        label="fine_rank_dcn v3",
        owner=model_owner,
    )
    registry.consumer_register(
        actor=owner,
        group=group,
        kind=ConsumerKind.DEPLOYMENT,
        object_id=12,
        label="feed production",
        owner=serving_owner,
    )
    # The producer also owns a dataset that uses the group: still one notification for them.
    registry.consumer_register(
        actor=producer,
        group=group,
        kind=ConsumerKind.DATASET,
        object_id=13,
        label="feed_clicks v1",
        owner=producer,
    )
    registry.consumer_register(
        actor=owner,
        group=group,
        kind=ConsumerKind.EXPERIMENT,
        object_id=14,
        label="old experiment",
        owner=gone_owner,
    )
    registry.consumer_release(
        actor=owner, workspace=workspace, kind=ConsumerKind.EXPERIMENT, object_id=14
    )
    _webhook, secret = webhook_create(actor=owner, workspace=workspace, url=receiver.url)
    expected = sorted(["ctr_producer", "feature_owner", "model_owner", "serving_owner"])

    push(group, producer, [user_row(i, when=iso(clock.now())) for i in range(5)], clock)
    clock.advance(minutes=10)
    first = check(group, clock, django_capture_on_commit_callbacks)
    assert first.status == HealthStatus.HEALTHY
    assert first.freshness_lag_seconds == pytest.approx(600)
    assert first.consistency == 1.0
    assert not Notification.objects.for_workspace(workspace).exists()  # unknown -> healthy

    # The producer stops: past the SLA the group breaks, and says so once.
    clock.advance(minutes=55)
    broken = check(group, clock, django_capture_on_commit_callbacks)
    assert broken.status == HealthStatus.BROKEN
    assert broken.problems[0]["kind"] == "freshness"
    assert notified(group, "feature_group.broken") == expected
    for minutes in (1, 30, 600):
        clock.advance(minutes=minutes)
        assert check(group, clock, django_capture_on_commit_callbacks).status == "broken"
    assert notified(group, "feature_group.broken") == expected
    assert events(group, "feature_group.broken") == 1
    group.refresh_from_db()
    assert group.health_status == HealthStatus.BROKEN
    assert group.health_changed_at == broken.checked_at

    # Data returns: one "recovered", to the same people.
    clock.advance(minutes=5)
    push(group, producer, [user_row(i, when=iso(clock.now())) for i in range(5)], clock)
    clock.advance(minutes=1)
    recovered = check(group, clock, django_capture_on_commit_callbacks)
    assert recovered.status == HealthStatus.HEALTHY
    for _ in range(3):
        clock.advance(minutes=5)
        check(group, clock, django_capture_on_commit_callbacks)
    assert notified(group, "feature_group.recovered") == expected
    assert notified(group, "feature_group.broken") == expected
    assert events(group, "feature_group.recovered") == 1
    group.refresh_from_db()
    assert group.health_status == HealthStatus.HEALTHY
    assert group.health_changed_at == recovered.checked_at
    assert HealthCheck.objects.for_workspace(workspace).filter(group=group).count() == 9

    event = Event.objects.for_workspace(workspace).get(verb="feature_group.broken")
    labels = {(ref.kind, ref.label) for ref in event.refs.all()}
    assert ("feature_group", "user_ctr") in labels
    assert ("deployment", "feed production") in labels
    assert ("experiment", "old experiment") not in labels
    assert event.payload["freshness_sla_seconds"] == SLA

    # E-mail: one per person per change.
    sent = sorted((m.subject, m.to[0]) for m in mailoutbox)
    assert len(sent) == 8
    broken_mail = [to for subject, to in sent if subject.endswith("'user_ctr' is broken")]
    assert sorted(broken_mail) == sorted(f"{name}@example.com" for name in expected)

    # Webhook: one signed post per change, naming everyone told.
    assert len(receiver.requests) == 2
    payloads = []
    for request in receiver.requests:
        signature = hmac.new(secret.encode(), request["body"], hashlib.sha256).hexdigest()
        assert request["headers"][WEBHOOK_SIGNATURE_HEADER] == f"sha256={signature}"
        payloads.append(json.loads(request["body"]))
    assert [p["verb"] for p in payloads] == ["feature_group.broken", "feature_group.recovered"]
    assert all(p["recipients"] == expected for p in payloads)
    assert payloads[0]["event_id"] == event.pk


def test_a_group_that_never_received_data_breaks_after_its_sla(
    workspace, clock, django_capture_on_commit_callbacks
):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, freshness_sla_seconds=SLA)
    assert check(group, clock, django_capture_on_commit_callbacks).status == "healthy"
    clock.advance(seconds=SLA + 1)
    result = check(group, clock, django_capture_on_commit_callbacks)
    assert result.status == HealthStatus.BROKEN
    assert result.freshness_lag_seconds is None
    assert "no batch" in result.problems[0]["detail"]
    assert notified(group, "feature_group.broken") == [owner.username]


def test_freshness_is_the_age_of_the_newest_event_not_of_the_last_batch(
    workspace, clock, django_capture_on_commit_callbacks
):
    """A batch that arrives now but whose newest event is 8 days old is stale: the lag is
    measured from the event-time column, so a one-day SLA is broken and the page badge says so."""
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="week_old", freshness_sla_seconds=86400)
    newest = clock.now() - timedelta(days=8)
    rows = [user_row(i, when=iso(newest - timedelta(hours=i))) for i in range(3)]
    push(group, owner, rows, clock)
    group.refresh_from_db()
    assert group.last_ingested_at == clock.now()  # ingested just now

    result = check(group, clock, django_capture_on_commit_callbacks)

    assert result.status == HealthStatus.BROKEN
    assert result.freshness_lag_seconds == pytest.approx(8 * 86400, abs=1)
    assert result.problems[0] == {
        "kind": "freshness",
        "detail": "newest event is 8.0 days old (freshness SLA 24.0 h)",
    }
    assert notified(group, "feature_group.broken") == [owner.username]
    web = Client()
    web.force_login(owner)
    page = web.get(
        reverse("features-group", kwargs={"ws": workspace.slug, "name": group.name})
    ).content.decode()
    assert '<span class="health health-broken" data-testid="health">broken</span>' in page

    # Fresh events (not just a fresh batch) recover it.
    clock.advance(minutes=1)
    push(group, owner, [user_row(9, when=iso(clock.now()))], clock)
    recovered = check(group, clock, django_capture_on_commit_callbacks)
    assert recovered.status == HealthStatus.HEALTHY
    assert recovered.freshness_lag_seconds == pytest.approx(0, abs=1)


# --- drift -------------------------------------------------------------------------------------


def _rows(rng, start: datetime, hours: float, count: int, *, ctr_mean: float, prefix: str):
    rows = []
    for index in range(count):
        moment = start + timedelta(hours=hours * index / count)
        rows.append(
            user_row(
                index,
                user_id=f"{prefix}{index}",
                when=iso(moment),
                age=rng.randint(18, 65),
                ctr_7d=max(0.0, rng.gauss(ctr_mean, 0.01)),
            )
        )
    return rows


def test_drift_reads_only_the_date_partitions_of_its_two_windows(tmp_path):
    """A file of a day older than the reference window is not read: here it is not Parquet at
    all, so reading it would fail the run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    now = datetime(2026, 11, 20, 12, tzinfo=UTC)
    rng = random.Random(3)
    files = []
    for day in range(9):  # the 8 days the windows span, and the day of ``now``
        moment = now - timedelta(days=8) + timedelta(days=day)
        folder = tmp_path / f"date={moment.date().isoformat()}"
        folder.mkdir()
        times = [moment.replace(hour=h) for h in range(24)] * 20
        table = pa.table(
            {
                "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
                "ctr_7d": [rng.gauss(0.05 if day < 8 else 0.09, 0.01) for _ in times],
            }
        )
        pq.write_table(table, folder / f"batch-{day + 1}.parquet")
        files.append(str(folder / f"batch-{day + 1}.parquet"))
    stale = tmp_path / "date=2026-10-01" / "batch-99.parquet"
    stale.parent.mkdir()
    stale.write_bytes(b"not parquet")
    psi = health.drift_psi(
        files=[str(stale), *files], time_column="event_time", numeric=["ctr_7d"], now=now
    )
    assert psi["ctr_7d"] > health.DRIFT_PSI_THRESHOLD


def test_drift_merges_the_pushes_sketches_and_reads_the_parquet_for_a_batch_without(
    workspace, clock
):
    """Pushes leave hourly sketches and drift is measured from them; a batch in the window
    without sketches (pushed before they existed) sends the run to the Parquet, which still
    sees that batch's shifted rows (from the other batches' sketches alone it would not)."""
    rng = random.Random(11)
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_sketched")
    now = clock.now()
    push(
        group,
        owner,
        _rows(rng, now - timedelta(days=8), 7 * 24, 700, ctr_mean=0.05, prefix="r"),
        clock,
    )
    push(
        group,
        owner,
        _rows(rng, now - timedelta(hours=23), 22, 100, ctr_mean=0.05, prefix="s"),
        clock,
    )
    shifted = push(
        group,
        owner,
        _rows(rng, now - timedelta(hours=20), 19, 900, ctr_mean=0.09, prefix="x"),
        clock,
    ).batch
    version = group.versions.get(version=1)
    assert DriftSketch.objects.for_workspace(workspace).filter(batch=shifted).count() >= 19
    from_sketches = health.measure_drift(group=group, version=version, now=now)
    assert from_sketches["ctr_7d"] > health.DRIFT_PSI_THRESHOLD

    DriftSketch.objects.for_workspace(workspace).filter(batch=shifted).delete()
    Batch.objects.for_workspace(workspace).filter(pk=shifted.pk).update(sketched=False)
    from_parquet = health.measure_drift(group=group, version=version, now=now)
    assert from_parquet["ctr_7d"] > health.DRIFT_PSI_THRESHOLD
    assert from_parquet["ctr_7d"] == pytest.approx(from_sketches["ctr_7d"], rel=0.2)


def test_a_shifted_distribution_is_reported_as_drift_once(
    workspace, clock, django_capture_on_commit_callbacks
):
    rng = random.Random(7)
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_stats", freshness_sla_seconds=86400)
    now = clock.now()
    reference_start = now - timedelta(days=8)
    push(
        group,
        owner,
        _rows(rng, reference_start, 7 * 24, 700, ctr_mean=0.05, prefix="ref"),
        clock,
    )
    push(
        group,
        owner,
        _rows(rng, now - timedelta(hours=23), 22, 300, ctr_mean=0.05, prefix="same"),
        clock,
    )
    steady = check(group, clock, django_capture_on_commit_callbacks)
    assert set(steady.drift_psi) == {"age", "ctr_7d"}
    assert max(steady.drift_psi.values()) < health.DRIFT_PSI_THRESHOLD
    assert events(group, "feature_group.drift_detected") == 0

    push(
        group,
        owner,
        _rows(rng, now - timedelta(hours=20), 19, 1500, ctr_mean=0.09, prefix="shift"),
        clock,
    )
    clock.advance(minutes=1)
    drifted = check(group, clock, django_capture_on_commit_callbacks)
    assert drifted.drift_psi["ctr_7d"] > health.DRIFT_PSI_THRESHOLD
    assert drifted.drift_psi["age"] < health.DRIFT_PSI_THRESHOLD
    assert drifted.status == HealthStatus.HEALTHY  # drift is a problem, not a broken stream
    assert {p["kind"] for p in drifted.problems} == {"drift"}
    for _ in range(3):
        clock.advance(minutes=1)
        check(group, clock, django_capture_on_commit_callbacks)
    assert events(group, "feature_group.drift_detected") == 1
    event = Event.objects.for_workspace(workspace).get(verb="feature_group.drift_detected")
    assert event.payload["drifting"] == ["ctr_7d"]
    assert notified(group, "feature_group.drift_detected") == [owner.username]


def test_too_few_rows_give_no_psi(workspace, clock, django_capture_on_commit_callbacks):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner)
    push(group, owner, [user_row(i, when=iso(clock.now())) for i in range(10)], clock)
    assert check(group, clock, django_capture_on_commit_callbacks).drift_psi == {}


def test_population_stability_index():
    assert health.population_stability_index([10] * 10, [10] * 10) == 0
    assert health.population_stability_index([10] * 10, [100] + [0] * 9) > 2


# --- coverage ----------------------------------------------------------------------------------


def test_a_coverage_drop_is_reported_once(workspace, clock, django_capture_on_commit_callbacks):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_profile")
    push(group, owner, [user_row(i, when=iso(clock.now())) for i in range(10)], clock)
    features = ["user_profile:age"]
    present = [f"u{i}" for i in range(10)]
    assert check(group, clock, django_capture_on_commit_callbacks).coverage is None

    online_lookup(workspace=workspace, entities=present, features=features)
    healthy = check(group, clock, django_capture_on_commit_callbacks)
    assert healthy.coverage == 1.0

    missing = [f"nobody{i}" for i in range(40)]
    online_lookup(workspace=workspace, entities=missing, features=features)
    clock.advance(minutes=1)
    dropped = check(group, clock, django_capture_on_commit_callbacks)
    assert dropped.coverage == pytest.approx(10 / 50)
    assert dropped.problems == [
        {"kind": "coverage", "detail": "online lookups found 20.0%"},
    ]
    for _ in range(2):
        clock.advance(minutes=1)
        check(group, clock, django_capture_on_commit_callbacks)
    assert events(group, "feature_group.coverage_dropped") == 1
    assert notified(group, "feature_group.coverage_dropped") == [owner.username]

    # Back above the threshold and down again: a new change, a new notice.
    online_lookup(workspace=workspace, entities=present * 40, features=features)
    assert check(group, clock, django_capture_on_commit_callbacks).coverage > 0.9
    online_lookup(workspace=workspace, entities=missing * 20, features=features)
    check(group, clock, django_capture_on_commit_callbacks)
    assert events(group, "feature_group.coverage_dropped") == 2


def test_offline_only_groups_have_no_coverage_or_consistency(
    workspace, clock, django_capture_on_commit_callbacks
):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, online=False)
    push(group, owner, [user_row(i, when=iso(clock.now())) for i in range(3)], clock)
    result = check(group, clock, django_capture_on_commit_callbacks)
    assert (result.coverage, result.consistency) == (None, None)


# --- consistency -------------------------------------------------------------------------------


def test_an_online_value_that_differs_from_offline_lowers_consistency(
    workspace, clock, django_capture_on_commit_callbacks
):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_profile")
    rows = [user_row(i, when=iso(clock.now())) for i in range(10)]
    push(group, owner, rows, clock)
    assert check(group, clock, django_capture_on_commit_callbacks).consistency == 1.0

    wrong = dict(rows[3], age=999)
    del wrong["user_id"], wrong["event_time"]
    newer = (clock.now() + timedelta(minutes=5)).timestamp()
    online_store.get_online_store().write(
        namespace=online_store.namespace(
            workspace_id=workspace.pk, group_id=group.pk, version=group.current_version
        ),
        rows=[("u3", newer, wrong)],
    )
    looked_up = online_lookup(workspace=workspace, entities=["u3"], features=["user_profile:age"])
    assert looked_up["rows"] == [[999]]
    result = check(group, clock, django_capture_on_commit_callbacks)
    assert result.consistency == pytest.approx(0.9)
    assert result.problems == [
        {"kind": "consistency", "detail": "90.0% of sampled online rows equal offline"}
    ]
    # Sampling for consistency is not counted as lookups.
    assert result.coverage == 1.0


# --- materialisation ---------------------------------------------------------------------------


def test_materialisation_rebuilds_online_rows_from_the_offline_record(workspace, clock):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_profile")
    offline_only = make_group(workspace, actor=owner, name="user_offline", online=False)
    older = clock.now() - timedelta(hours=2)
    push(group, owner, [user_row(i, when=iso(older), age=1) for i in range(5)], clock)
    latest = push(group, owner, [user_row(i, when=iso(clock.now())) for i in range(5)], clock)
    push(offline_only, owner, [user_row(1, when=iso(clock.now()))], clock)

    Batch.objects.for_workspace(workspace).filter(pk=latest.batch.pk).update(online_written=False)
    online_store.get_online_store().drop_namespace(
        online_store.namespace(workspace_id=workspace.pk, group_id=group.pk, version=1)
    )
    features = ["user_profile:age", "user_profile:emb"]
    assert online_lookup(workspace=workspace, entities=["u2"], features=features)["rows"] == [
        [None, None]
    ]

    result = tasks.materialize_online()
    assert result == {"groups": 1, "rows_written": 5, "batches": 1}
    assert online_lookup(workspace=workspace, entities=["u2"], features=features)["rows"] == [
        [22, [0.5, 1.5, 2.0]]
    ]
    assert Batch.objects.for_workspace(workspace).get(pk=latest.batch.pk).online_written
    group.refresh_from_db()
    assert group.online_materialized_at is not None
    event = Event.objects.for_workspace(workspace).get(verb="feature_group.materialized")
    assert event.payload["entities"] == 5
    # Offline-only groups are not materialised; their batches stay as they are.
    assert not Batch.objects.for_workspace(workspace).get(group=offline_only).online_written

    # Idempotent: nothing pending, nothing done; a forced rebuild replaces nothing newer.
    assert tasks.materialize_online() == {"groups": 0, "rows_written": 0, "batches": 0}
    forced = tasks.materialize_online(group_ids=[group.pk, offline_only.pk])
    assert forced["groups"] == 1
    assert online_lookup(workspace=workspace, entities=["u2"], features=["user_profile:age"])[
        "rows"
    ] == [[22]]


def test_materialisation_never_replaces_a_newer_online_row(workspace, clock):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_profile")
    old = push(group, owner, [user_row(1, when=iso(clock.now() - timedelta(hours=1)))], clock)
    push(group, owner, [user_row(1, when=iso(clock.now()), age=77)], clock)
    Batch.objects.for_workspace(workspace).filter(pk=old.batch.pk).update(online_written=False)
    tasks.materialize_online()
    rows = online_lookup(workspace=workspace, entities=["u1"], features=["user_profile:age"])
    assert rows["rows"] == [[77]]


# --- all groups, tasks and schedule ------------------------------------------------------------


def test_health_check_all_covers_every_workspace_and_survives_a_failing_group(
    workspace, clock, monkeypatch
):
    other = make_workspace()
    owner = make_member(workspace, Role.DEVELOPER)
    checked = [
        make_group(workspace, actor=owner, name="a_group"),
        make_group(other, name="b_group"),
        make_group(workspace, actor=owner, name="c_group", status=Lifecycle.ACTIVE),
    ]
    make_group(workspace, actor=owner, name="draft_group", status=Lifecycle.DRAFT)
    retired = make_group(workspace, actor=owner, name="retired_group")
    registry.feature_group_set_status(actor=owner, group=retired, status=Lifecycle.RETIRED)

    real_measure = health.measure

    def failing_for_c(*, group, now):
        if group.name == "c_group":
            raise RuntimeError("corrupt parquet")
        return real_measure(group=group, now=now)

    monkeypatch.setattr(health, "measure", failing_for_c)
    ancient = HealthCheck.objects.create(
        workspace=workspace,
        group=checked[0],
        checked_at=clock.now() - timedelta(days=health.HISTORY_DAYS + 1),
        status=HealthStatus.HEALTHY,
    )
    summary = health.health_check_all(now=clock.advance(hours=30))
    assert summary == {"checked": 2, "broken": 2, "failed": 1}
    assert not HealthCheck.objects.for_workspace(workspace).filter(pk=ancient.pk).exists()
    statuses = dict(
        FeatureGroup.objects.unscoped()
        .filter(pk__in=[g.pk for g in checked])
        .values_list("name", "health_status")
    )
    assert statuses == {"a_group": "broken", "b_group": "broken", "c_group": "unknown"}


def test_the_health_task_skips_while_a_run_is_in_progress(db):
    from django.core.cache import cache

    cache.set(tasks.HEALTH_LOCK_KEY, "1", timeout=60)
    try:
        assert tasks.health_check_all() == {"skipped": 1}
    finally:
        cache.delete(tasks.HEALTH_LOCK_KEY)
    assert tasks.health_check_all() == {"checked": 0, "broken": 0, "failed": 0}


def test_materialisation_writes_in_bounded_batches_and_reports_its_rate(
    workspace, clock, monkeypatch
):
    """Seven entities through batches of two rows: every entity's latest row lands online, no
    batch holds more than two, and the event says how fast it went."""
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_batches")
    older = clock.now() - timedelta(hours=1)
    push(group, owner, [user_row(i, when=iso(older), age=1) for i in range(7)], clock)
    push(group, owner, [user_row(i, when=iso(clock.now()), age=40 + i) for i in range(7)], clock)
    online_store.get_online_store().drop_namespace(
        online_store.namespace(workspace_id=workspace.pk, group_id=group.pk, version=1)
    )
    sizes: list[int] = []
    real_write = materialization.write_online

    def counting(**kwargs):
        sizes.append(kwargs["table"].num_rows)
        return real_write(**kwargs)

    monkeypatch.setattr(materialization, "MATERIALIZE_BATCH_ROWS", 2)
    monkeypatch.setattr(materialization, "write_online", counting)
    done = materialization.group_materialize(group=group)

    assert (done.entities, done.rows_written) == (7, 7)
    assert sorted(sizes) == [1, 2, 2, 2]
    entities = [f"u{i}" for i in range(7)]
    rows = online_lookup(workspace=workspace, entities=entities, features=["user_batches:age"])
    assert rows["rows"] == [[40 + i] for i in range(7)]
    event = Event.objects.for_workspace(workspace).get(verb="feature_group.materialized")
    assert event.payload["entities"] == 7 and event.payload["rows_per_s"] > 0


def test_beat_schedules_health_and_materialisation():
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["feature-health"] == {
        "task": "features.tasks.health_check_all",
        "schedule": 60.0,
    }
    # Materialisation is a consumer of the event log: the outbox drain runs it (and catches up).
    assert "feature-materialize" not in schedule
    assert schedule["outbox-drain"]["task"] == "workspaces.tasks.outbox_drain"
    for entry in (schedule["feature-health"], schedule["outbox-drain"]):
        assert entry["task"] in celery_app.tasks
    from features.materialization import CONSUMER
    from workspaces.outbox import consumer_get

    assert consumer_get(CONSUMER).verbs == ("feature_batch.ingested",)


# --- the API -----------------------------------------------------------------------------------


def test_health_api_shows_the_state_and_paginated_history(
    workspace, clock, client_for, django_capture_on_commit_callbacks, django_assert_max_num_queries
):
    owner = make_member(workspace, Role.DEVELOPER)
    group = make_group(workspace, actor=owner, name="user_profile", freshness_sla_seconds=SLA)
    push(group, owner, [user_row(i, when=iso(clock.now())) for i in range(3)], clock)
    for _ in range(3):
        clock.advance(minutes=1)
        check(group, clock, django_capture_on_commit_callbacks)
    clock.advance(hours=2)
    check(group, clock, django_capture_on_commit_callbacks)
    client = client_for(make_member(workspace, Role.VIEWER))
    url = f"/api/v1/workspaces/{workspace.slug}/feature-groups/user_profile/health/"

    with django_assert_max_num_queries(11):  # 7 of them authenticate and resolve the workspace
        client.get(url, {"limit": 50})
    with django_assert_max_num_queries(11):
        response = client.get(url, {"limit": 2})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["health_status"] == "broken"
    assert body["latest"]["status"] == "broken"
    assert body["latest"]["problems"][0]["kind"] == "freshness"
    assert body["count"] == 4
    assert [row["status"] for row in body["results"]] == ["broken", "healthy"]
    assert body["next"] is not None

    second_page = client.get(url, {"limit": 2, "offset": 2}).json()
    assert second_page["latest"]["status"] == "broken"  # the latest, whatever the page
    assert client.get(url, {"status": "healthy"}).json()["count"] == 3
    bad = client.get(url, {"status": "sick"})
    assert bad.status_code == 400
    assert bad.json()["attr"] == "status"
    missing = client.get(f"/api/v1/workspaces/{workspace.slug}/feature-groups/nope/health/")
    assert missing.status_code == 404
