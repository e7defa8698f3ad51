"""Feature group health (F7, F8): freshness, online coverage, value drift and online/offline
consistency, measured per check and turned into notifications when the state changes.

A check measures outside any transaction (DuckDB over the Parquet record, the online store), then
locks the group row and compares with the stored state: the group's ``health_status`` for
freshness, the previous HealthCheck for coverage and drift. Only a change notifies (once, to the
producer, the owner and every live consumer's owner) and writes its event, in the transaction that
records the check, so concurrent or repeated checks never notify twice.

Every function takes ``now``: the clock is the caller's, so tests and backfills control it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from features import offline_engine, offline_store, online_store, sketches
from features.models import (
    Batch,
    Consumer,
    DriftSketch,
    Dtype,
    FeatureGroup,
    FeatureGroupVersion,
    HealthCheck,
    HealthStatus,
    Lifecycle,
)
from features.offline_store import quote
from workspaces.events import Ref, event_record
from workspaces.notifications import notify

logger = logging.getLogger(__name__)

COVERAGE_THRESHOLD = 0.9
COVERAGE_HOURS = 24
DRIFT_PSI_THRESHOLD = 0.2
DRIFT_BINS = 10
DRIFT_RECENT = timedelta(hours=24)
DRIFT_REFERENCE = timedelta(days=7)
# Fewer rows than this in either window give no PSI: noise, not drift.
DRIFT_MIN_ROWS = 30
PSI_EPSILON = 1e-4
CONSISTENCY_SAMPLE = 200
NUMERIC_DTYPES = {Dtype.INT, Dtype.FLOAT}
CHECKED_LIFECYCLES = (Lifecycle.ACTIVE, Lifecycle.DEPRECATED)
# Checks run every minute; older ones are pruned (transitions only look at recent checks).
HISTORY_DAYS = 30


@dataclass
class Measures:
    """What one check measured, before it is compared with the stored state."""

    freshness_lag_seconds: float | None
    stale: bool
    coverage: float | None
    drift_psi: dict[str, float] = field(default_factory=dict)
    consistency: float | None = None
    problems: list[dict[str, Any]] = field(default_factory=list)

    @property
    def drifting(self) -> set[str]:
        return drifting_features(self.drift_psi)


def drifting_features(drift_psi: dict[str, float]) -> set[str]:
    return {name for name, psi in drift_psi.items() if psi > DRIFT_PSI_THRESHOLD}


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# --- measures ------------------------------------------------------------------------------------


def measure_freshness(*, group: FeatureGroup, now: datetime) -> tuple[float | None, bool]:
    """Age in seconds of the group's newest event (its event-time column, not the moment a batch
    arrived: a producer that re-sends week-old rows keeps nothing fresh), and whether that age
    breaks the freshness SLA. A group that never got a batch breaks it once it is older than its
    SLA; one whose batches carried no event time falls back to when the last batch arrived."""
    sla = group.freshness_sla_seconds
    newest = group.last_event_time or group.last_ingested_at
    if newest is None:
        return None, (now - group.created_at).total_seconds() > sla
    lag = max(0.0, (now - newest).total_seconds())
    return lag, lag > sla


def measure_coverage(*, group: FeatureGroup, now: datetime) -> float | None:
    """Share of online lookups of the group that found a row over the last 24 hourly buckets;
    None for offline-only groups and when nobody looked anything up."""
    if not group.online:
        return None
    buckets = [online_store.hour_bucket(now - timedelta(hours=h)) for h in range(COVERAGE_HOURS)]
    requested, found = online_store.get_online_store().coverage(
        counter=f"{group.workspace_id}:{group.pk}", buckets=buckets
    )
    if requested == 0:
        return None
    return found / requested


def population_stability_index(expected: list[int], actual: list[int]) -> float:
    """PSI of two histograms over the same bins: sum((a - e) * ln(a / e)) over bin shares."""
    expected_total, actual_total = sum(expected), sum(actual)
    psi = 0.0
    for e_count, a_count in zip(expected, actual, strict=True):
        e = max(e_count / expected_total, PSI_EPSILON)
        a = max(a_count / actual_total, PSI_EPSILON)
        psi += (a - e) * math.log(a / e)
    return psi


def measure_drift(
    *, group: FeatureGroup, version: FeatureGroupVersion, now: datetime
) -> dict[str, float]:
    """PSI per numeric feature: the last 24 h of event time against the 7 days before, over 10
    quantile bins of that reference window. When every batch with rows in those 8 days left its
    sketches (every push since they exist), from the merged hourly sketches
    (``features.sketches``), reading no Parquet; otherwise read from the offline Parquet with
    DuckDB (only the date partitions of those 8 days, see ``drift_psi``). Categorical, string,
    list-of-categories and embedding features have no quantiles and are not measured (their
    freshness, coverage and consistency still are)."""
    numeric = [s["name"] for s in version.features if s["dtype"] in NUMERIC_DTYPES]
    if not numeric:
        return {}
    reference_start = now - DRIFT_RECENT - DRIFT_REFERENCE
    in_window = Batch.objects.for_workspace(group.workspace_id).filter(
        group=group,
        version=version.version,
        max_event_time__gte=sketches.hour_of(reference_start),
        min_event_time__lt=now,
    )
    if not in_window.filter(sketched=False).exists():
        hours = (
            DriftSketch.objects.for_workspace(group.workspace_id)
            .filter(
                group=group,
                version=version.version,
                hour__gte=sketches.hour_of(reference_start),
                hour__lt=now,
            )
            .values_list("hour", "sketches")
        )
        return drift_psi_of_sketches(hours.iterator(), numeric=numeric, now=now)
    pattern = offline_store.parquet_glob(
        workspace_id=group.workspace_id, group_id=group.pk, version=version.version
    )
    if pattern is None:
        return {}
    return drift_psi(files=pattern, time_column=group.event_time_column, numeric=numeric, now=now)


def drift_psi_of_sketches(
    hours: Iterable[tuple[datetime, dict[str, str]]], *, numeric: list[str], now: datetime
) -> dict[str, float]:
    """``measure_drift``'s windows, bins and floor over hourly sketches (``features.sketches``):
    (hour, {feature: sketch}) pairs, those outside the two windows ignored."""
    return sketches.drift_psi_from_sketches(
        hours,
        numeric=numeric,
        now=now,
        recent=DRIFT_RECENT,
        reference=DRIFT_REFERENCE,
        bins=DRIFT_BINS,
        min_rows=DRIFT_MIN_ROWS,
        epsilon=PSI_EPSILON,
    )


def drift_psi(
    *, files: list[str], time_column: str, numeric: list[str], now: datetime
) -> dict[str, float]:
    """``measure_drift`` over these files: only those in the date partitions the two windows
    cover are read (a group's files are partitioned by event day), so a run costs the 8 days it
    compares, not the group's whole history."""
    recent_start = now - DRIFT_RECENT
    reference_start = recent_start - DRIFT_REFERENCE
    pattern = list(
        offline_engine.prune_by_day(
            tuple(files),
            reference_start.astimezone(UTC).date(),
            now.astimezone(UTC).date(),
        )
    )
    if not pattern:
        return {}
    time = quote(time_column)
    source = "read_parquet(?, union_by_name = true)"
    fractions = [i / DRIFT_BINS for i in range(1, DRIFT_BINS)]
    quantile_sql = ", ".join(
        f"count({quote(n)}), quantile_cont({quote(n)}::DOUBLE, {fractions})" for n in numeric
    )
    with offline_store.connect() as connection:
        reference = connection.sql(
            f"SELECT {quantile_sql} FROM {source} WHERE {time} >= ? AND {time} < ?",  # noqa: S608
            params=[pattern, reference_start, recent_start],
        ).fetchall()[0]
        edges: dict[str, list[float]] = {}
        for index, name in enumerate(numeric):
            count, quantiles = reference[2 * index], reference[2 * index + 1]
            if count >= DRIFT_MIN_ROWS and quantiles:
                edges[name] = sorted({float(q) for q in quantiles if q is not None})
        if not edges:
            return {}
        # Parameters in the order they appear: the window split, the cuts, the file, the range.
        params: list[Any] = [recent_start]
        histograms = []
        for name, cuts in edges.items():
            column = f"{quote(name)}::DOUBLE"
            cases = " ".join(f"WHEN {column} <= ? THEN {i}" for i in range(len(cuts)))
            histograms.append(
                f"histogram(CASE WHEN {column} IS NULL THEN NULL {cases} ELSE {len(cuts)} END)"
            )
            params.extend(cuts)
        params.extend([pattern, reference_start, now])
        rows = connection.sql(
            f"SELECT {time} >= ? AS recent, {', '.join(histograms)} FROM {source} "  # noqa: S608
            f"WHERE {time} >= ? AND {time} < ? GROUP BY ALL",
            params=params,
        ).fetchall()
    by_window = {bool(row[0]): row[1:] for row in rows}
    if True not in by_window or False not in by_window:
        return {}
    result: dict[str, float] = {}
    for index, (name, cuts) in enumerate(edges.items()):
        bins = len(cuts) + 1
        expected = [int((by_window[False][index] or {}).get(b, 0)) for b in range(bins)]
        actual = [int((by_window[True][index] or {}).get(b, 0)) for b in range(bins)]
        if sum(expected) < DRIFT_MIN_ROWS or sum(actual) < DRIFT_MIN_ROWS:
            continue
        result[name] = round(population_stability_index(expected, actual), 4)
    return result


def _same(offline: Any, online: Any) -> bool:
    if isinstance(offline, float) and isinstance(online, (int, float)):
        return math.isclose(offline, online, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(offline, list) and isinstance(online, list):
        return len(offline) == len(online) and all(
            _same(a, b) for a, b in zip(offline, online, strict=True)
        )
    return offline == online


def measure_consistency(*, group: FeatureGroup, version: FeatureGroupVersion) -> float | None:
    """Share of up to 200 sampled entities whose online row equals their latest offline row
    (current version); None for offline-only groups and groups without data."""
    if not group.online:
        return None
    pattern = offline_store.parquet_glob(
        workspace_id=group.workspace_id, group_id=group.pk, version=version.version
    )
    if pattern is None:
        return None
    features = [s["name"] for s in version.features]
    keys = ", ".join(quote(k) for k in group.entity_keys)
    selected = ", ".join(quote(c) for c in [*group.entity_keys, *features])
    with offline_store.connect() as connection:
        sample = connection.sql(
            f"SELECT {selected} FROM ("  # noqa: S608 - quoted identifiers
            f"SELECT * FROM read_parquet(?, union_by_name = true) "
            f"QUALIFY row_number() OVER (PARTITION BY {keys} "
            f"ORDER BY {quote(group.event_time_column)} DESC) = 1"
            f") USING SAMPLE reservoir({CONSISTENCY_SAMPLE} ROWS)",
            params=[pattern],
        ).to_arrow_table()
    if sample.num_rows == 0:
        return None
    offline_rows = sample.to_pylist()
    entities = [online_store.entity_id([row[k] for k in group.entity_keys]) for row in offline_rows]
    # A counter of its own, so that sampling never counts towards the group's lookup coverage.
    (online_rows,) = online_store.get_online_store().read(
        [
            online_store.Lookup(
                namespace=online_store.namespace(
                    workspace_id=group.workspace_id, group_id=group.pk, version=version.version
                ),
                entities=entities,
                counter=f"{group.workspace_id}:{group.pk}:consistency",
            )
        ]
    )
    online_rows = [online_store.row_mapping(row, features) for row in online_rows]
    equal = sum(
        1
        for offline, online in zip(offline_rows, online_rows, strict=True)
        if online is not None and all(_same(offline[f], online.get(f)) for f in features)
    )
    return equal / len(offline_rows)


def measure(*, group: FeatureGroup, now: datetime) -> Measures:
    """Every measure of one group at ``now``, with the problems they show."""
    version = (
        FeatureGroupVersion.objects.for_workspace(group.workspace_id)
        .filter(group=group, version=group.current_version)
        .get()
    )
    lag, stale = measure_freshness(group=group, now=now)
    measures = Measures(
        freshness_lag_seconds=lag,
        stale=stale,
        coverage=measure_coverage(group=group, now=now),
        drift_psi=measure_drift(group=group, version=version, now=now),
        consistency=measure_consistency(group=group, version=version),
    )
    sla = _duration(group.freshness_sla_seconds)
    if stale and lag is None:
        age = _duration((now - group.created_at).total_seconds())
        measures.problems.append(
            {
                "kind": "freshness",
                "detail": f"no batch in the {age} since it was registered (freshness SLA {sla})",
            }
        )
    elif stale:
        measures.problems.append(
            {
                "kind": "freshness",
                "detail": f"newest event is {_duration(lag)} old (freshness SLA {sla})",
            }
        )
    if measures.coverage is not None and measures.coverage < COVERAGE_THRESHOLD:
        measures.problems.append(
            {"kind": "coverage", "detail": f"online lookups found {measures.coverage:.1%}"}
        )
    for name in sorted(measures.drifting):
        measures.problems.append(
            {"kind": "drift", "feature": name, "detail": f"PSI {measures.drift_psi[name]:.3f}"}
        )
    if measures.consistency is not None and measures.consistency < 1:
        measures.problems.append(
            {
                "kind": "consistency",
                "detail": f"{measures.consistency:.1%} of sampled online rows equal offline",
            }
        )
    return measures


# --- the check and its transitions ---------------------------------------------------------------


def _recipients(group: FeatureGroup) -> list:
    consumers = (
        Consumer.objects.for_workspace(group.workspace_id)
        .filter(group=group, live=True)
        .select_related("owner")
        .order_by("pk")
    )
    return [group.producer, group.owner, *(c.owner for c in consumers)]


def _transition_messages(
    group: FeatureGroup, measures: Measures, transitions: list[str], new_drift: set[str]
) -> dict[str, tuple[str, str]]:
    sla = _duration(group.freshness_sla_seconds)
    lag = measures.freshness_lag_seconds
    texts = {
        "broken": (
            f"Feature group '{group.name}' is broken",
            (
                f"Its newest event is {_duration(lag)} old; its freshness SLA is {sla}."
                if lag is not None
                else f"No batch has ever arrived; its freshness SLA is {sla}."
            )
            + " Models and datasets that use it may read stale values.",
        ),
        "recovered": (
            f"Feature group '{group.name}' recovered",
            f"Fresh events arrive again (the newest is {_duration(lag or 0)} old, SLA {sla}).",
        ),
        "coverage_dropped": (
            f"Online coverage of '{group.name}' dropped to {(measures.coverage or 0):.0%}",
            f"Over the last {COVERAGE_HOURS} hours only {(measures.coverage or 0):.1%} of online "
            f"lookups found a value (threshold {COVERAGE_THRESHOLD:.0%}).",
        ),
        "drift_detected": (
            f"Value drift in '{group.name}': {', '.join(sorted(new_drift))}",
            "The last 24 hours differ from the 7 days before: "
            + ", ".join(f"{n} PSI {measures.drift_psi[n]:.3f}" for n in sorted(new_drift))
            + f" (threshold {DRIFT_PSI_THRESHOLD}).",
        ),
    }
    return {t: texts[t] for t in transitions}


def group_health_check(*, group: FeatureGroup, now: datetime | None = None) -> HealthCheck:
    """Check one group at ``now`` and record it; a changed state (broken, recovered, coverage
    dropped, drift detected) writes its event and notifies the producer, the owner and every live
    consumer's owner once."""
    now = now or timezone.now()
    # Measure the stored group, not the caller's copy (an ingest may have moved it since).
    current = (
        FeatureGroup.objects.for_workspace(group.workspace_id)
        .select_related("workspace")
        .get(pk=group.pk)
    )
    measures = measure(group=current, now=now)
    status = HealthStatus.BROKEN if measures.stale else HealthStatus.HEALTHY
    with transaction.atomic():
        locked = (
            FeatureGroup.objects.select_for_update(of=("self",))
            .filter(pk=group.pk, workspace=group.workspace_id)
            .select_related("workspace", "owner", "producer")
            .get()
        )
        history = HealthCheck.objects.for_workspace(locked.workspace_id).filter(group=locked)
        last_coverage = (
            history.filter(coverage__isnull=False).values_list("coverage", flat=True).first()
        )
        last_drift = history.exclude(drift_psi={}).values_list("drift_psi", flat=True).first()
        check = HealthCheck.objects.create(
            workspace=locked.workspace,
            group=locked,
            checked_at=now,
            status=status,
            freshness_lag_seconds=measures.freshness_lag_seconds,
            coverage=measures.coverage,
            drift_psi=measures.drift_psi,
            consistency=measures.consistency,
            problems=measures.problems,
        )
        transitions: list[str] = []
        previous_status = locked.health_status
        if status != previous_status:
            if status == HealthStatus.BROKEN:
                transitions.append("broken")
            elif previous_status == HealthStatus.BROKEN:
                transitions.append("recovered")
            locked.health_status = status
            locked.health_changed_at = now
            locked.save(update_fields=["health_status", "health_changed_at"])
        if (
            measures.coverage is not None
            and measures.coverage < COVERAGE_THRESHOLD
            and last_coverage is not None
            and last_coverage >= COVERAGE_THRESHOLD
        ):
            transitions.append("coverage_dropped")
        new_drift = measures.drifting - drifting_features(last_drift or {})
        if new_drift:
            transitions.append("drift_detected")
        if transitions:
            _announce(locked, check, measures, transitions, new_drift, previous_status)
    group.health_status = locked.health_status
    group.health_changed_at = locked.health_changed_at
    return check


def _announce(
    group: FeatureGroup,
    check: HealthCheck,
    measures: Measures,
    transitions: list[str],
    new_drift: set[str],
    previous_status: str,
) -> None:
    recipients = _recipients(group)
    consumer_refs = [
        Ref(kind=c.kind, object_id=c.object_id, label=c.label, role="related")
        for c in Consumer.objects.for_workspace(group.workspace_id)
        .filter(group=group, live=True)
        .order_by("pk")
    ]
    link = f"/w/{group.workspace.slug}/features/groups/{group.name}/"  # the page, not JSON
    for transition, (title, body) in _transition_messages(
        group, measures, transitions, new_drift
    ).items():
        verb = f"feature_group.{transition}"
        event = event_record(
            actor=None,
            workspace=group.workspace,
            verb=verb,
            refs=[Ref.to(group), *consumer_refs],
            payload={
                "name": group.name,
                "version": group.current_version,
                "health_check": check.pk,
                "status": check.status,
                "previous_status": previous_status,
                "freshness_lag_seconds": measures.freshness_lag_seconds,
                "freshness_sla_seconds": group.freshness_sla_seconds,
                "coverage": measures.coverage,
                "drift_psi": measures.drift_psi,
                "drifting": sorted(new_drift) if transition == "drift_detected" else [],
                "consistency": measures.consistency,
                "problems": measures.problems,
            },
        )
        notify(
            workspace=group.workspace,
            recipients=recipients,
            verb=verb,
            title=title,
            body=body,
            link=link,
            event=event,
        )


def health_check_all(now: datetime | None = None) -> dict[str, int]:
    """Check every active or deprecated group of every workspace; one failing group is logged and
    does not stop the others."""
    now = now or timezone.now()
    # Platform maintenance across all workspaces: unscoped on purpose.
    groups = (
        FeatureGroup.objects.unscoped()
        .filter(status__in=CHECKED_LIFECYCLES)
        .select_related("workspace")
        .order_by("pk")
    )
    summary = {"checked": 0, "broken": 0, "failed": 0}
    HealthCheck.objects.unscoped().filter(
        checked_at__lt=now - timedelta(days=HISTORY_DAYS)
    ).delete()
    for group in groups.iterator(chunk_size=200):
        try:
            check = group_health_check(group=group, now=now)
        except Exception:  # one group's bad data must not stop the others' checks
            logger.exception("health check of feature group %s failed", group.pk)
            summary["failed"] += 1
            continue
        summary["checked"] += 1
        summary["broken"] += check.status == HealthStatus.BROKEN
    return summary
