"""Assignment: the split is even, layers are independent, arms survive processes and ramps."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from scipy import stats as sps

from experiments import assignment
from experiments import stats as xstats
from serving.routing import BUCKETS

ARMS = [{"name": "control", "version_id": 1}, {"name": "treatment", "version_id": 2}]


def test_a_million_units_split_fifty_fifty_and_pass_srm():
    allocs = assignment.allocations(block_start=0, arms=ARMS, max_percent=50, percent=50)
    assert [(a["start"], a["end"]) for a in allocs] == [(0, 5000), (5000, 10000)]
    buckets = assignment.buckets_of((f"user-{i}" for i in range(1_000_000)), "layer-salt")
    arms = assignment.arms_of_buckets(buckets, allocs)
    counts = np.bincount(arms, minlength=2)
    share = counts[1] / counts.sum()
    assert abs(share - 0.5) < 0.005
    assert not xstats.srm_check(counts, [1, 1]).mismatch


def test_two_layers_split_independently():
    ids = [f"u{i}" for i in range(200_000)]
    a = assignment.buckets_of(ids, "layer-a") < BUCKETS // 2
    b = assignment.buckets_of(ids, "layer-b") < BUCKETS // 2
    table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]])
    p = sps.chi2_contingency(table).pvalue
    assert p > 0.001


def test_ramping_up_keeps_treatment_units_in_treatment():
    ids = [f"u{i}" for i in range(50_000)]
    salt = "ramp-salt"
    before = {
        u: assignment.assign(
            u, salt, assignment.allocations(block_start=1000, arms=ARMS, max_percent=20, percent=5)
        )
        for u in ids
    }
    after = {
        u: assignment.assign(
            u, salt, assignment.allocations(block_start=1000, arms=ARMS, max_percent=20, percent=20)
        )
        for u in ids
    }
    moved = [u for u, arm in before.items() if arm is not None and after[u] != arm]
    assert moved == []
    assert sum(a is not None for a in after.values()) > 3 * sum(
        a is not None for a in before.values()
    )


def test_blocks_in_a_layer_never_overlap():
    taken = []
    for size in (2000, 1000, 4000, 3000):
        start = assignment.find_block(taken, size)
        assert start is not None
        for other_start, other_size in taken:
            assert start + size <= other_start or other_start + other_size <= start
        taken.append((start, size))
    assert assignment.find_block(taken, 1) is None
    assert assignment.find_block([(0, 2000), (5000, 5000)], 3000) == 2000


def test_the_largest_free_run_is_the_biggest_block_that_still_fits():
    assert assignment.largest_free_run([]) == assignment.BUCKETS
    taken = [(0, 2000), (5000, 4000)]
    assert assignment.largest_free_run(taken) == 3000
    assert assignment.find_block(taken, 3000) == 2000 and assignment.find_block(taken, 3001) is None
    assert assignment.largest_free_run([(0, 10000)]) == 0


def test_the_same_unit_gets_the_same_arm_in_another_process():
    allocs = assignment.allocations(block_start=200, arms=ARMS, max_percent=30, percent=30)
    ids = [f"user-{i}" for i in range(2000)]
    here = [assignment.assign(u, "salt-x", allocs) for u in ids]
    code = (
        "import json,sys,django,os;"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE','config.settings');"
        "django.setup();from experiments import assignment;d=json.load(sys.stdin);"
        "print(json.dumps([assignment.assign(u,'salt-x',d['a']) for u in d['ids']]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps({"a": allocs, "ids": ids}),
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "PYTHONHASHSEED": "12345"},
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == here
    assert {"control", "treatment", None} <= set(here)
