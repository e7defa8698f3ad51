"""The demo ads log: deterministic, its click model recoverable, and pushed over the REST API by
``demo_features`` against a live server, storing nothing twice when run again."""

from __future__ import annotations

import importlib.util
import io
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from features import demo
from features.models import Batch, FeatureGroup, HealthStatus
from workspaces.models import ApiToken, Workspace

ANCHOR = datetime(2026, 11, 20, 14, tzinfo=UTC)


def _logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


# The generator ------------------------------------------------------------------------------------


def test_same_seed_and_anchor_give_the_same_log_and_the_same_bytes():
    first, second = demo.generate(anchor=ANCHOR), demo.generate(anchor=ANCHOR)
    for table in ("users", "ads", "impressions"):
        left, right = getattr(first, table), getattr(second, table)
        assert left.keys() == right.keys()
        for column in left:
            np.testing.assert_array_equal(left[column], right[column], err_msg=column)
    assert [b.body for b in demo.batches(first)] == [b.body for b in demo.batches(second)]
    other = demo.generate(anchor=ANCHOR, seed=demo.SEED + 1)
    assert not np.array_equal(other.impressions["click"], first.impressions["click"])


def test_sizes_follow_the_scale():
    full = demo.generate(anchor=ANCHOR)
    assert len(full.users["user_id"]) == 500
    assert len(full.ads["ad_id"]) == 200
    assert len(full.impressions["click"]) == 20_000
    small = demo.generate(anchor=ANCHOR, scale=0.05)
    assert (len(small.users["user_id"]), len(small.ads["ad_id"])) == (25, 10)
    assert len(small.impressions["click"]) == 1000


def test_impressions_lie_in_the_week_before_the_anchor_and_reference_known_entities():
    log = demo.generate(anchor=ANCHOR)
    imp = log.impressions
    assert imp["timestamp"].min() >= (ANCHOR - timedelta(days=7)).timestamp()
    assert imp["timestamp"].max() < ANCHOR.timestamp()
    assert np.all(np.diff(imp["timestamp"]) >= 0)
    assert set(imp["user_id"]) <= set(log.users["user_id"])
    assert set(imp["ad_id"]) <= set(log.ads["ad_id"])
    np.testing.assert_array_equal(imp["hour"], (imp["timestamp"] // 3600) % 24)
    # Every day of the week has traffic; evenings are busier than nights.
    days = (imp["timestamp"] - int((ANCHOR - timedelta(days=7)).timestamp())) // 86_400
    assert set(days.tolist()) == set(range(7))
    assert (imp["hour"] == 20).sum() > 3 * (imp["hour"] == 3).sum()


def test_the_click_model_is_recoverable_from_the_log():
    imp = demo.generate(anchor=ANCHOR).impressions
    click = imp["click"]
    # Clicks are drawn from p_click: observed rates match it overall and by decile.
    assert abs(click.mean() - imp["p_click"].mean()) < 0.01
    deciles = np.quantile(imp["p_click"], np.linspace(0, 1, 11))
    bucket = np.clip(np.searchsorted(deciles, imp["p_click"], side="right") - 1, 0, 9)
    for b in range(10):
        mask = bucket == b
        assert abs(click[mask].mean() - imp["p_click"][mask].mean()) < 0.04, b

    def ctr(mask) -> float:
        return float(click[mask].mean())

    # Activity drives clicks: high > medium > low, with about the model's log-odds gap.
    by_activity = {level: ctr(imp["activity_level"] == level) for level in demo.ACTIVITY_LEVELS}
    assert by_activity["high"] > by_activity["medium"] > by_activity["low"]
    model = demo.CLICK_MODEL
    gap = _logit(by_activity["high"]) - _logit(by_activity["low"])
    assert gap == pytest.approx(model["activity"]["high"] - model["activity"]["low"], abs=0.4)
    # So do the device and the evening.
    device_gap = _logit(ctr(imp["device"] == "ios")) - _logit(ctr(imp["device"] == "desktop"))
    assert device_gap == pytest.approx(model["device"]["ios"] - model["device"]["desktop"], abs=0.3)
    evening_gap = _logit(ctr(imp["hour"] >= 18)) - _logit(ctr(imp["hour"] < 18))
    assert evening_gap == pytest.approx(model["evening"], abs=0.25)
    assert 0.03 < click.mean() < 0.12


def test_batches_cover_every_group_with_a_stale_context_stats():
    log = demo.generate(anchor=ANCHOR, scale=0.1)
    pushed = list(demo.batches(log))
    assert {b.group for b in pushed} == {spec["name"] for spec in demo.GROUPS}
    labels = [(b.group, b.label) for b in pushed]
    assert len(labels) == len(set(labels))

    last_context = [b for b in pushed if b.group == "context_stats"][-1]
    times = {row["event_time"] for row in json.loads(last_context.body)["rows"]}
    assert times == {"2026-11-17T14:00:00Z"}  # three days before the anchor
    spec = next(s for s in demo.GROUPS if s["name"] == "context_stats")
    assert spec["freshness_sla_seconds"] == 24 * 3600

    profile = [b for b in pushed if b.group == "user_profile"][-1]
    newest = max(row["event_time"] for row in json.loads(profile.body)["rows"])
    assert newest == "2026-11-20T13:55:00Z"

    impressions = [b for b in pushed if b.group == "impressions"]
    assert all(b.content_type == "application/vnd.apache.parquet" for b in impressions)
    total = sum(pq.read_table(io.BytesIO(b.body)).num_rows for b in impressions)
    assert total == len(log.impressions["click"]) == sum(b.rows for b in impressions)
    embedding = next(b for b in pushed if b.group == "user_embedding")
    assert len(json.loads(embedding.body)["rows"][0]["interest"]) == demo.EMBEDDING_DIMENSION


def test_idempotency_keys_carry_the_anchor_and_the_scale():
    batch = next(demo.batches(demo.generate(anchor=ANCHOR, scale=0.05)))
    key = demo.idempotency_key(anchor=ANCHOR, scale=0.05, batch=batch)
    assert key == "demo-20261120T1400Z-s0.05-user_profile-initial"
    assert demo.anchor_from_key(key, scale=0.05) == ANCHOR
    assert demo.anchor_from_key(key, scale=1.0) is None
    assert demo.anchor_from_key("something-else", scale=0.05) is None
    assert demo.anchor_from_key(None, scale=0.05) is None


# The command against a live server ----------------------------------------------------------------


def demo_batches() -> list[Batch]:
    feed = Workspace.objects.get(slug="feed-pctr")
    return list(Batch.objects.for_workspace(feed).select_related("group", "producer"))


@pytest.mark.django_db(transaction=True)
def test_command_pushes_the_demo_over_http_and_a_rerun_stores_nothing(live_server, capsys):
    call_command("demo_setup")
    call_command("demo_features", base_url=live_server.url, scale=0.05, wait=5)
    out = capsys.readouterr().out
    assert "5 groups registered" in out

    feed = Workspace.objects.get(slug="feed-pctr")
    groups = {g.name: g for g in FeatureGroup.objects.for_workspace(feed)}
    assert set(groups) == {spec["name"] for spec in demo.GROUPS}
    assert groups["user_embedding"].entity == "semantic"
    assert groups["impressions"].entity_keys == ["user_id", "ad_id"]
    assert groups["impressions"].online is False
    assert groups["context_stats"].freshness_sla_seconds == 24 * 3600
    assert all(g.producer.username == "feed-producer" for g in groups.values())

    stored = demo_batches()
    anchor = timezone.now().replace(minute=0, second=0, microsecond=0)
    expected = list(demo.batches(demo.generate(anchor=anchor, scale=0.05)))
    assert len(stored) == len(expected)
    assert {b.producer.username for b in stored} == {"feed-producer"}
    assert all(b.idempotency_key.startswith("demo-") for b in stored)
    assert {b.format for b in stored if b.group.name == "impressions"} == {"parquet"}
    assert sum(b.rows for b in stored if b.group.name == "impressions") == 1000
    # Arrival times are those of a producer that pushed each batch as its data closed; the
    # context_stats job "stopped" three days ago, beyond its one-day SLA.
    now = timezone.now()
    assert now - groups["context_stats"].last_event_time > timedelta(days=2, hours=23)
    assert now - groups["context_stats"].last_ingested_at > timedelta(days=2, hours=23)
    # The data closes on the hour (``anchor``): measured from it, not from now, which failed in
    # the last ten minutes of every hour (impressions close 70 minutes before the anchor).
    for name in ("user_profile", "ad_profile", "user_embedding", "impressions"):
        assert anchor - groups[name].last_ingested_at < timedelta(hours=2), name
    for batch in stored:
        assert batch.created_at == min(batch.max_event_time + timedelta(minutes=10), now) or (
            batch.created_at <= now and batch.created_at >= batch.max_event_time
        )
    # One impressions file per 24 h of the window, each arriving after its last event: seven
    # arrivals over the week (two may share a calendar date when the window starts late at night).
    arrived = sorted(b.created_at for b in stored if b.group.name == "impressions")
    assert len(arrived) == 7 and arrived[-1] - arrived[0] > timedelta(days=5)
    # The command's token was only for this run.
    tokens = ApiToken.objects.filter(user__username="feed-producer", name="demo_features")
    assert tokens.count() == 1
    assert tokens.get().revoked_at is not None

    call_command("demo_features", base_url=live_server.url, scale=0.05, wait=5)
    again = capsys.readouterr().out
    assert "0 groups registered, 0 batches stored" in again
    assert f"{len(expected)} replayed" in again
    assert len(demo_batches()) == len(stored)
    assert FeatureGroup.objects.for_workspace(feed).count() == 5


@pytest.mark.skipif(
    importlib.util.find_spec("features.health") is None, reason="no features.health yet"
)
@pytest.mark.django_db(transaction=True)
def test_the_command_runs_the_health_check_and_context_stats_is_broken(live_server):
    call_command("demo_setup")
    call_command("demo_features", base_url=live_server.url, scale=0.05, wait=5)
    feed = Workspace.objects.get(slug="feed-pctr")
    health = dict(FeatureGroup.objects.for_workspace(feed).values_list("name", "health_status"))
    assert health["context_stats"] == HealthStatus.BROKEN
    assert health["user_profile"] != HealthStatus.BROKEN
    assert health["impressions"] != HealthStatus.BROKEN


@pytest.mark.django_db(transaction=True)
def test_a_rerun_later_replays_the_first_runs_anchor(live_server, capsys, monkeypatch):
    call_command("demo_setup")
    call_command("demo_features", base_url=live_server.url, scale=0.05, wait=5)
    first = len(demo_batches())
    later = timezone.now() + timedelta(hours=5)
    monkeypatch.setattr(timezone, "now", lambda: later)
    call_command("demo_features", base_url=live_server.url, scale=0.05, wait=5)
    assert "anchored at" in capsys.readouterr().out
    assert len(demo_batches()) == first


@pytest.mark.django_db
def test_command_needs_the_demo_workspace():
    with pytest.raises(CommandError, match="run demo_setup first"):
        call_command("demo_features", base_url="http://127.0.0.1:9", wait=0)


@pytest.mark.django_db
def test_command_refuses_odd_arguments():
    with pytest.raises(CommandError, match="http"):
        call_command("demo_features", base_url="file:///etc/passwd", wait=0)
    with pytest.raises(CommandError, match="scale"):
        call_command("demo_features", scale=0, wait=0)


@pytest.mark.django_db
def test_command_gives_up_when_the_server_does_not_answer():
    call_command("demo_setup")
    with pytest.raises(CommandError, match="did not answer"):
        call_command("demo_features", base_url="http://127.0.0.1:9", wait=0.2)
