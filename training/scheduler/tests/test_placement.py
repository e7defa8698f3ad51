"""The placement engine on small hand-made clusters (no database)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from training.scheduler.placement import (
    POLICIES,
    Cluster,
    NodeInventory,
    Placement,
    Request,
    SlicePrices,
    TaskClass,
    workload_classes,
)
from training.scheduler.simulate import (
    arrival_sequence,
    fractional_packing_waste_lb,
    load_nodes,
    load_pods,
    simulate,
)


def nodes(*specs):
    return [
        NodeInventory(f"n{i}", cpu, mem, typ, (1000,) * gpus)
        for i, (cpu, mem, gpus, typ) in enumerate(specs)
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_respects_capacity(policy):
    cluster = Cluster(nodes((8000, 32000, 2, "V100"), (8000, 32000, 1, "T4")), seed=1)
    placed = 0
    while cluster.place(Request(1000, 1000, 0, 300), policy):
        placed += 1
    assert placed == 9  # three 0.3 slices per GPU, three GPUs
    assert (cluster.free[cluster.gpu_index >= 0] >= 0).all()
    assert cluster.place(Request(1000, 1000, 1, 0), policy) is None


def test_gang_is_all_or_nothing():
    cluster = Cluster(nodes((8000, 32000, 2, "V100"), (8000, 32000, 1, "V100")))
    assert cluster.place(Request(1000, 1000, 2, 0, workers=2)) is None
    assert cluster.gpu_free_milli == 3000  # nothing left allocated by the failed gang
    placed = cluster.place(Request(1000, 1000, 1, 0, workers=3))
    assert placed is not None
    assert sorted(p.node for p in placed) == [0, 0, 1]
    assert cluster.gpu_free_milli == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_goes_onto_one_node_where_one_holds_it(policy):
    cluster = Cluster(
        nodes((8000, 32000, 2, "V100"), (16000, 32000, 4, "V100"), (4000, 32000, 4, "V100")),
        seed=3,
    )
    # Node 0 has two GPUs; node 2 too little CPU for four ranks: only node 1 holds them all.
    placed = cluster.place(Request(2000, 1000, 1, 0, workers=4), policy)
    assert [p.node for p in placed] == [1, 1, 1, 1]
    assert sorted(g for p in placed for g, _ in p.gpus) == [0, 1, 2, 3]
    # Three slices of 0.5: one node, two GPUs.
    cluster = Cluster(nodes((8000, 32000, 1, "V100"), (8000, 32000, 2, "V100")), seed=3)
    placed = cluster.place(Request(1000, 1000, 0, 500, workers=3), policy)
    assert {p.node for p in placed} == {1}
    # No node holds the whole gang: spread across nodes, as before.
    cluster = Cluster(nodes((8000, 32000, 2, "V100"), (8000, 32000, 2, "V100")), seed=3)
    placed = cluster.place(Request(1000, 1000, 1, 0, workers=3), policy)
    assert sorted(p.node for p in placed) in ([0, 0, 1], [0, 1, 1])


def test_gpu_type_constraint_and_reason():
    cluster = Cluster(nodes((8000, 32000, 2, "V100"), (8000, 32000, 2, "T4")))
    placed = cluster.place(Request(1000, 1000, 2, 0, ("T4",)))
    assert placed[0].node_name == "n1"
    assert cluster.place(Request(1000, 1000, 1, 0, ("T4",))) is None
    assert cluster.why_not(Request(1000, 1000, 1, 0, ("T4",))) == "waiting for 1 x T4"
    assert cluster.why_not(Request(0, 0, 1, 0, ("A100",))) == "no node has A100"


def test_cpu_and_memory_limit_placement():
    cluster = Cluster(nodes((2000, 4000, 4, "V100")))
    assert cluster.place(Request(3000, 1000, 1, 0)) is None
    assert cluster.place(Request(1000, 5000, 1, 0)) is None
    assert cluster.place(Request(2000, 4000, 1, 0)) is not None


def test_spread_and_binpack_differ():
    specs = ((16000, 64000, 4, "V100"), (16000, 64000, 4, "V100"))
    spread, packed = Cluster(nodes(*specs)), Cluster(nodes(*specs))
    for _ in range(2):
        spread.place(Request(1000, 1000, 1, 0), "spread")
        packed.place(Request(1000, 1000, 1, 0), "binpack")
    assert sorted(spread.gpu_cap - spread.free.clip(0).sum(axis=1)) == [1000, 1000]
    assert sorted(packed.gpu_cap - packed.free.clip(0).sum(axis=1)) == [0, 2000]


def test_best_fit_scores_free_cpu_and_gpu_against_the_largest_node():
    # The FGD paper's best-fit: 0.5 x free CPU / max CPU + 0.5 x free GPU / max GPU after
    # placement. Both nodes end with no free GPU; n1 keeps 7 of the largest node's 64 cores,
    # n0 keeps 8, so n1 wins (a per-node-share score would pick n0: 8/64 of it is left, 7/8
    # of n1).
    cluster = Cluster(nodes((64000, 64000, 4, "V100"), (8000, 8000, 1, "V100")))
    cluster.allocate(Placement(0, "n0", [(0, 1000), (1, 1000), (2, 1000)]), Request(55000, 0, 3, 0))
    placed = cluster.place(Request(1000, 1000, 1, 0), "best_fit")
    assert placed[0].node_name == "n1"


def test_fractional_packing_bound():
    # Two 0.6 slices need two GPUs (0.8 idle), a 0.4 fills one: 0.4 idle of 4 GPUs at least.
    seq = [Request(0, 0, 0, 600), Request(0, 0, 0, 600), Request(0, 0, 0, 400), Request(0, 0, 1)]
    assert fractional_packing_waste_lb(seq, 4000) == pytest.approx(0.1)
    assert fractional_packing_waste_lb([Request(0, 0, 2)], 4000) == 0.0


def test_default_policy_keeps_whole_gpus_for_whole_gpu_work():
    # The workload is mostly whole GPUs: a 0.5 slice should go where a half GPU is already
    # taken, not break a fresh GPU, so a whole-GPU job still fits afterwards.
    cluster = Cluster(
        nodes((16000, 64000, 1, "V100"), (16000, 64000, 1, "V100")),
        workload=[TaskClass(1000, 1000, 1, 0, 0.8), TaskClass(1000, 1000, 0, 500, 0.2)],
    )
    cluster.place(Request(1000, 1000, 0, 500))
    cluster.place(Request(1000, 1000, 0, 500))
    assert cluster.place(Request(1000, 1000, 1, 0)) is not None
    assert cluster.fragmentation() == 0.0


def test_slice_prices_are_the_optimal_packings_duals():
    # One 0.65 to three 0.32 to two 0.47: the optimum pairs 0.65+0.32, packs the other 0.32s
    # three to a GPU and the 0.47s two to one, so a 0.32 costs a third of a GPU, a 0.47 half and
    # a 0.65 the rest of its GPU. A 0.81 leaves room for nothing and costs a whole one.
    prices = SlicePrices({650: 1, 320: 3, 470: 2, 810: 1})
    assert prices.price[320] == pytest.approx(1 / 3)
    assert prices.price[470] == pytest.approx(1 / 2)
    assert prices.price[650] == pytest.approx(2 / 3)
    assert prices.price[810] == pytest.approx(1)
    assert prices.value[1000] == pytest.approx(1)  # the LP optimum: no pattern beats a GPU
    assert prices.value[530] == pytest.approx(1 / 2) and prices.value[300] == 0
    assert list(prices.value) == sorted(prices.value)
    # A 0.32 beside a 0.65 loses nothing; beside a 0.47 it spoils the half GPU left there.
    loss = prices.loss(np.array([350, 530, 1000]), 320)
    assert loss == pytest.approx([0, 1 / 6, 0])


def test_slice_prices_without_convergence_stay_feasible():
    # Very many sizes and one round: the scaled prices still value no GPU above one.
    prices = SlicePrices(dict.fromkeys(range(30, 1000, 30), 1), max_rounds=1)
    assert prices.value[1000] == pytest.approx(1)
    assert 0 < max(prices.price.values()) <= 1


def test_default_policy_pairs_slices_like_the_optimal_packing():
    # Two 0.59 to three 0.47 to five 0.32: the optimum packs 0.59+0.32, 0.47+0.47 and three
    # 0.32s to a GPU. Node a's GPU has 0.53 free (a 0.47 on it), node b's 0.84. FGD's measure
    # alone puts the next 0.32 on a (it closes a's gap), and then only one of the next two 0.47s
    # finds a place; the slice prices keep a's half GPU for a 0.47 and all three fit.
    workload = [
        TaskClass(1000, 1000, 0, milli, 1.0, (), share / 10)
        for milli, share in ((590, 2), (470, 3), (320, 5))
    ]
    cluster = Cluster(
        [
            NodeInventory("a", 8000, 32000, "V100", (530,)),
            NodeInventory("b", 8000, 32000, "V100", (840,)),
        ],
        workload=workload,
    )
    placed = [cluster.place(Request(1000, 1000, 0, milli)) for milli in (320, 470, 470)]
    assert [p[0].node_name for p in placed if p] == ["b", "b", "a"]
    assert cluster.gpu_free_milli == 50 + 60
    # The same with the prices switched off (SCHEDULER_SLICE_PRICING = False): FGD alone.
    cluster = Cluster(
        [
            NodeInventory("a", 8000, 32000, "V100", (530,)),
            NodeInventory("b", 8000, 32000, "V100", (840,)),
        ],
        workload=workload,
        slice_pricing=False,
    )
    placed = [cluster.place(Request(1000, 1000, 0, milli)) for milli in (320, 470, 470)]
    assert [p[0].node_name if p else None for p in placed] == ["a", "b", None]


def write_trace(directory: Path, seed: int) -> tuple[Path, Path]:
    """A synthetic trace in the openb CSV format (the real one lives outside the repository):
    150 nodes of five GPU models, and pods mixing whole GPUs, large slices that leave slivers,
    small slices, multi-GPU and CPU-only pods, like production GPU-sharing traces."""
    rng = random.Random(seed)
    node_kinds = [
        ((64000, 262144, 2, "P100"), 2),
        ((96000, 393216, 8, "V100M32"), 4),
        ((96000, 786432, 8, "A100"), 2),
        ((64000, 262144, 4, "T4"), 3),
        ((128000, 786432, 8, "G3"), 3),
    ]
    kinds, weights = zip(*node_kinds, strict=True)
    node_file = directory / "nodes.csv"
    with node_file.open("w") as handle:
        handle.write("sn,cpu_milli,memory_mib,gpu,model\n")
        for i in range(150):
            cpu, memory, gpus, model = rng.choices(kinds, weights)[0]
            handle.write(f"node-{i},{cpu},{memory},{gpus},{model}\n")
    pod_file = directory / "pods.csv"
    with pod_file.open("w") as handle:
        handle.write(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
            "deletion_time,scheduled_time\n"
        )
        for i in range(3000):
            r = rng.random()
            if r < 0.35:
                cpu, mem, gpus, milli = rng.choice([4000, 8000, 12000]), 16384, 1, 1000
            elif r < 0.50:
                cpu, mem, gpus, milli = 6000, 12288, 1, rng.choice([810, 750])
            elif r < 0.62:
                cpu, mem, gpus, milli = 4000, 8192, 1, rng.choice([500, 460])
            elif r < 0.70:
                cpu, mem, gpus, milli = 2000, 4096, 1, rng.choice([250, 200, 100])
            elif r < 0.82:
                cpu, mem, gpus, milli = 16000, 65536, rng.choice([2, 4, 8]), 1000
            else:
                cpu, mem, gpus, milli = rng.choice([1000, 2000, 4000]), 4096, 0, 0
            handle.write(f"pod-{i},{cpu},{mem},{gpus},{milli},,LS,Running,0,1,0\n")
    return pod_file, node_file


def test_simulation_on_a_trace_ranks_the_default_first(tmp_path):
    pod_file, node_file = write_trace(tmp_path, seed=3)
    pods, trace_nodes = load_pods(pod_file), load_nodes(node_file)
    assert len(pods) == 3000 and len(trace_nodes) == 150
    result = simulate(pods, trace_nodes, seed=3)
    shares = {p: result[f"unallocated_gpu_share_{p}"] for p in POLICIES}
    assert shares["default"] <= min(v for k, v in shares.items() if k != "default")
    assert shares["spread"] > 2 * shares["default"]
    assert shares["random"] > 2 * shares["default"]
    assert result["unallocated_vs_best_baseline"] <= 1
    capacity = Cluster(trace_nodes).gpu_capacity_milli
    seq = arrival_sequence(pods, capacity, 3)
    # The idle slivers under the fractional pods a policy placed are at least the offline
    # packing bound of those pods: replayed here, the default cannot beat it.
    cluster = Cluster(trace_nodes, workload=workload_classes(pods), seed=3)
    placed = [r for r in seq if cluster.place(r) is not None]
    unallocated = cluster.gpu_free_milli / capacity
    assert unallocated == pytest.approx(shares["default"], abs=1e-4)
    assert 0 < fractional_packing_waste_lb(placed, capacity) <= unallocated + 1e-9
    assert (
        sum(p.gpu_demand_milli for p in seq[:-1]) < capacity <= sum(p.gpu_demand_milli for p in seq)
    )


def test_simulate_command_prints_one_json_object(tmp_path, capsys):
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n"
        + "".join(
            f"p{i},4000,8192,{g},{m},,LS,Running,0,1,0\n"
            for i, (g, m) in enumerate([(1, 1000), (1, 500), (2, 1000), (0, 0), (1, 250)] * 4)
        )
    )
    node_file = tmp_path / "nodes.csv"
    node_file.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},64000,262144,{4 if i % 2 else 8},V100\n" for i in range(6))
    )
    call_command(
        "simulate_placement", "--pods", str(pods), "--nodes", str(node_file), "--seed", "2"
    )
    result = json.loads(capsys.readouterr().out)
    for policy in ("random", "best_fit", "binpack", "spread", "default"):
        assert 0 <= result[f"unallocated_gpu_share_{policy}"] <= 1
    assert result["placements_per_s"] > 0
    assert "unallocated_vs_best_baseline" in result
    assert result["slice_pricing"] is True
    call_command(
        "simulate_placement",
        *("--pods", str(pods), "--nodes", str(node_file), "--seed", "2", "--repeats", "2"),
        "--no-slice-pricing",
        "--policies",
        "default",
    )
    ablation = json.loads(capsys.readouterr().out)
    assert ablation["slice_pricing"] is False and ablation["seeds"] == [2, 3]
    assert "unallocated_gpu_share_default" in ablation
    assert "unallocated_gpu_share_best_fit" not in ablation
    with pytest.raises(CommandError, match="unknown worst_fit"):
        call_command(
            "simulate_placement",
            *("--pods", str(pods), "--nodes", str(node_file), "--policies", "default,worst_fit"),
        )


def test_bench_table_and_chart_show_every_policy():
    from bench.areas import scheduler as area

    result = {"unallocated_vs_best_baseline": 0.6, "gpus": 10, "pods_submitted": 20, "seed": 1}
    for i, policy in enumerate(POLICIES):
        result[f"unallocated_gpu_share_{policy}"] = 0.1 * (i + 1)
        result[f"fragmentation_share_{policy}"] = 0.05 * (i + 1)
        result[f"placements_per_s_{policy}"] = 1000.0
    table = area._table(result)
    chart = area._chart(result)
    for policy in POLICIES:
        assert f"| {policy} |" in table
        assert f">{policy}</text>" in chart
    assert "default / best other: 0.600" in table
    assert chart.startswith("<svg") and chart.rstrip().endswith("</svg>")


def _knapsack_by_capacity(sizes: list[int], duals: np.ndarray) -> np.ndarray:
    """The most value in at most f milli, f = 0..1000, one capacity at a time (the reference)."""
    best = np.zeros(1001)
    for f in range(1, 1001):
        best[f] = max(
            [best[f - 1]] + [best[f - s] + d for s, d in zip(sizes, duals, strict=True) if s <= f]
        )
    return best


def test_slice_knapsack_matches_the_capacity_by_capacity_one():
    rng = random.Random(7)
    for _ in range(40):
        sizes = sorted(rng.sample(range(20, 1000), rng.randint(1, 12)))
        prices = SlicePrices(dict.fromkeys(sizes, 1.0))
        duals = np.array(
            [rng.random() * s / 1000 * 1.3 if rng.random() > 0.1 else 0 for s in sizes]
        )
        best, pattern = prices._knapsack(duals)
        assert best == pytest.approx(_knapsack_by_capacity(sizes, duals), abs=1e-12)
        # The pattern fits in one GPU and is worth what the knapsack says a GPU is worth.
        assert pattern @ np.array(sizes) <= 1000
        assert pattern @ duals == pytest.approx(best[1000], abs=1e-12)


def _fragmentation_by_class(cluster: Cluster, free, cpu, mem, typ) -> np.ndarray:
    """The expected unusable free milli-GPU of each state, class by class (the reference)."""
    out = []
    for row, c_free, m_free, t in zip(free, cpu, mem, typ, strict=True):
        gpus = [int(v) for v in row if v >= 0]
        total, frag = sum(gpus), 0.0
        for k in range(len(cluster.c_p)):
            n, d = int(cluster.c_n[k]), int(cluster.c_d[k])
            fits = cluster.c_cpu[k] <= c_free and cluster.c_mem[k] <= m_free
            fits &= bool(cluster.c_typeok_any[k, t])
            if n:
                fits &= sum(v >= 1000 for v in gpus) >= n
            elif d:
                fits &= max(gpus, default=0) >= d
            frag += cluster.c_p[k] * (sum(v for v in gpus if v < d) if fits else total)
        out.append(frag)
    return np.array(out)


def _random_cluster_and_requests(seed: int) -> tuple[list[NodeInventory], list[Request]]:
    rng = random.Random(seed)
    kinds = [(16000, 64000, 2, "P100"), (96000, 393216, 8, "V100"), (64000, 262144, 4, "T4")]
    inventory = []
    for i in range(30):
        cpu, mem, gpus, typ = rng.choice(kinds)
        inventory.append(NodeInventory(f"n{i}", cpu, mem, typ, (1000,) * gpus))
    requests = []
    for _ in range(400):
        r = rng.random()
        cpu = rng.choice([1000, 4000, 8000, 12000])
        types = (rng.choice(["P100", "V100", "T4"]),) if rng.random() < 0.2 else ()
        if r < 0.45:
            requests.append(Request(cpu, 8192, 0, rng.choice([160, 320, 470, 650, 810]), types))
        elif r < 0.85:
            requests.append(Request(cpu, 16384, rng.choice([1, 1, 2, 4]), 0, types))
        else:
            requests.append(Request(cpu, 4096, 0, 0))
    return inventory, requests


def test_fragmentation_matches_the_class_by_class_sum():
    inventory, requests = _random_cluster_and_requests(3)
    cluster = Cluster(inventory, workload=workload_classes(requests[:200]), seed=3)
    states = []
    for k, req in enumerate(requests[:150]):
        cluster.place(req)
        if k in (20, 60, 149):  # nearly empty, half full, full
            states.append((cluster.free.copy(), cluster.cpu.copy(), cluster.mem.copy()))
    free, cpu, mem = (np.concatenate(part) for part in zip(*states, strict=True))
    typ = np.tile(cluster.typ, len(states))
    want = _fragmentation_by_class(cluster, free, cpu, mem, typ)
    got = cluster.fragmentation_of(free, cpu, mem, typ)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-9)
    assert len(set(np.round(want, 6))) > 20  # the states differ, and so do their values
    # Some states hold fewer whole free GPUs than a class asks for, and more than none.
    whole = (free >= 1000).sum(axis=1)
    assert ((whole > 0) & (whole < cluster.c_n.max())).any()


class _Unremembered(Cluster):
    """The default policy evaluating every candidate state afresh (no ``_after_frag`` memo)."""

    def _after_frag(self, req, rows, owners, choice):
        cpu, mem = self.cpu[owners] - req.cpu_milli, self.mem[owners] - req.memory_mb
        return self.fragmentation_of(rows, cpu, mem, self.typ[owners])


@pytest.mark.parametrize("seed", [1, 2])
def test_remembered_states_place_exactly_as_fresh_ones(seed):
    # The memo of states after placement is kept per node version and dropped when the workload
    # changes: with placements, releases and a workload change, every decision is the same.
    inventory, requests = _random_cluster_and_requests(seed)
    clusters = [
        kind(inventory, workload=workload_classes(requests[:100]), seed=seed)
        for kind in (Cluster, _Unremembered)
    ]
    placed: list[list] = [[], []]
    for k, req in enumerate(requests):
        if k == 200:  # the workload moves on
            for cluster in clusters:
                cluster.set_workload(workload_classes(requests[200:]))
        for cluster, done in zip(clusters, placed, strict=True):
            got = cluster.place(req)
            done.append(None if got is None else [(p.node, tuple(p.gpus)) for p in got])
            if k % 7 == 6 and got is not None:  # some work ends
                for p in got:
                    cluster.release(p, req)
    assert placed[0] == placed[1]
    assert sum(p is not None for p in placed[0]) > 100
    assert np.array_equal(clusters[0].free, clusters[1].free)


def test_a_simulated_run_prices_on_its_own_whatever_ran_before_it(tmp_path, monkeypatch):
    """Which prices a mix gets depends on the mixes solved before it (within the tolerance,
    the first found is reused): ``simulate`` keeps a cache per run, so a seed's result is the
    same alone or after other runs, and the live tick's shared cache is never read."""
    from training.scheduler import placement

    pod_file, node_file = write_trace(tmp_path, seed=5)
    pods, trace_nodes = load_pods(pod_file), load_nodes(node_file)
    alone = simulate(pods, trace_nodes, seed=5, policies=("default",), warmup=300)

    class Untouchable(placement.PriceCache):
        def get(self, shares):
            raise AssertionError("simulate read the shared price cache")

    monkeypatch.setattr(placement, "SHARED_PRICES", Untouchable())
    simulate(pods, trace_nodes, seed=6, policies=("default",), warmup=300)
    again = simulate(pods, trace_nodes, seed=5, policies=("default",), warmup=300)
    for key in (
        "unallocated_gpu_share_default",
        "placed_pods_default",
        "fragmentation_share_default",
    ):
        assert again[key] == alone[key], key


def test_the_price_cache_reuses_prices_within_its_tolerance_only():
    from training.scheduler.placement import PRICE_TOLERANCE, PriceCache

    cache, other = PriceCache(), PriceCache()
    first = cache.get({250: 0.5, 500: 0.5})
    near = {250: 0.5 + PRICE_TOLERANCE / 2, 500: 0.5 - PRICE_TOLERANCE / 2}
    assert cache.get(near) is first  # drift within the tolerance: the same prices
    far = cache.get({250: 0.8, 500: 0.2})
    assert far is not first  # solved anew
    assert other.get({250: 0.5, 500: 0.5}) is not first  # caches share nothing
    cache.clear()
    assert cache.get({250: 0.5, 500: 0.5}) is not first
