"""The online store on a real Redis Cluster of three masters started on local ports.

The online-store tests (lookups, pushes, the fast path, health) run again in a child pytest whose
online store is the cluster (``ONLINE_STORE_REDIS_CLUSTER``); its database is the embedded
SQLite, so it never touches this run's test database. The store's own tests below check what
only a cluster shows: one group version spread over every master, with every script on one slot.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import redis
from django.conf import settings

from features import online_store
from features.tests.redis_cluster import redis_cluster

ONLINE_STORE_TESTS = [
    "features/tests/test_lookup.py",
    "features/tests/test_ingestion.py",
    "features/tests/test_fastpath.py",
    "features/tests/test_health.py",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as ports:
        yield ports


def _masters(ports: list[int]) -> list[redis.Redis]:
    return [redis.Redis(port=port) for port in ports]


@pytest.mark.one_backend  # the child runs on SQLite whatever this run's database is
def test_the_online_store_tests_pass_with_the_store_on_a_three_master_cluster(cluster, tmp_path):
    for master in _masters(cluster):
        master.config_resetstat()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"}
    }
    env |= {
        "ONLINE_STORE_REDIS_URL": f"redis://127.0.0.1:{cluster[0]}",
        "ONLINE_STORE_REDIS_CLUSTER": "1",
        "RANKOPS_VAR_DIR": str(tmp_path / "var"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ONLINE_STORE_TESTS],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 90, done.stdout[-2000:]
    # The child's rows went to the cluster, and to every master of it.
    for master in _masters(cluster):
        stats = master.info("commandstats")
        assert stats.get("cmdstat_evalsha", {}).get("calls", 0) > 0, stats
        assert stats.get("cmdstat_mget", {}).get("calls", 0) > 0, stats


@pytest.mark.one_backend  # the cluster alone: no database
def test_a_group_version_spreads_over_every_master_and_its_newest_rows_win(cluster):
    store = online_store._store_for(f"redis://127.0.0.1:{cluster[0]}", "cluster-test", "", True, 16)
    assert isinstance(store, online_store.RedisClusterOnlineStore)
    store.clear()
    rows = [(f"u{i}", 10.0, {"n": i}) for i in range(3000)]
    assert store.write(namespace="1:2:v1", rows=rows) == 3000
    masters = _masters(cluster)
    assert all(master.dbsize() > 0 for master in masters)

    # Older rows change nothing; newer ones replace, within one write too.
    assert store.write(namespace="1:2:v1", rows=[("u1", 5.0, {"n": -1})]) == 0
    assert store.write(namespace="1:2:v1", rows=[("u2", 11.0, {"n": -2}), ("u2", 12.0, {"n": -3})])
    lookup = online_store.Lookup(namespace="1:2:v1", entities=["u1", "u2", "gone"], counter="c")
    other = online_store.Lookup(namespace="1:2:v2", entities=["u1"], counter="c")
    assert store.read([lookup, other]) == [[{"n": 1}, {"n": -3}, None], [None]]
    assert store.coverage(counter="c", buckets=[online_store.hour_bucket()]) == (4, 2)

    # A master that lost its scripts (restart, SCRIPT FLUSH) is given them again.
    for master in masters:
        master.script_flush()
    assert store.write(namespace="1:2:v1", rows=[(f"u{i}", 20.0, {"n": 0}) for i in range(50)])
    assert store.read([lookup])[0][:2] == [{"n": 0}, {"n": 0}]

    store.drop_namespace("1:2:v1")
    assert store.read([lookup]) == [[None, None, None]]
    store.clear()
    assert sum(master.dbsize() for master in masters) == 0


@pytest.mark.every_pass  # the guard is on where the cache is Redis
def test_the_settings_choose_the_cluster_store_and_turn_the_fast_paths_guard_off(cluster, settings):
    from features.fastpath import _redis_guard_key

    guarded = _redis_guard_key() is not None  # on when the cache's Redis holds the store
    assert guarded == bool(settings.REDIS_URL)
    settings.ONLINE_STORE_REDIS_URL = f"redis://127.0.0.1:{cluster[1]}"
    settings.ONLINE_STORE_REDIS_CLUSTER = True
    store = online_store.get_online_store()
    assert isinstance(store, online_store.RedisClusterOnlineStore)
    assert store.shards == settings.ONLINE_STORE_CLUSTER_SHARDS
    # The guard key lives in the cache's Redis, not in the cluster: the fast path reads unguarded.
    assert _redis_guard_key() is None
