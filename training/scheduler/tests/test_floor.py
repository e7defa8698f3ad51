"""The placement floor (``floor.placement_floor``) against a brute-force optimum, the
workload-mix variants the benchmark generates (``simulate.trace_variant``) and the online
estimate of the workload (``placement.WorkloadEstimator``)."""

from __future__ import annotations

import random
from collections import Counter
from functools import cache

import pytest

from training.scheduler.floor import offline_placement, placement_floor, slice_patterns
from training.scheduler.placement import (
    WHOLE,
    Cluster,
    NodeInventory,
    Request,
    TaskClass,
    WorkloadEstimator,
    request_shape,
)
from training.scheduler.simulate import (
    MIXES,
    _node_loads,
    fractional_packing_waste_lb,
    parse_mix,
    simulate,
    trace_variant,
)


def optimum_unallocated(
    requests: list[Request], nodes: list[NodeInventory], *, must: frozenset[int] = frozenset()
) -> float:
    """The least unallocated GPU share of any placement, by trying every one: each request goes
    nowhere, or (whole GPUs) onto a node with enough of them free, or (a slice) onto one GPU.
    The requests at the positions in ``must`` may not go nowhere."""
    reqs = tuple(requests)
    capacity = sum(len(n.gpus) for n in nodes) * WHOLE

    @cache
    def best(k: int, state: tuple) -> float:
        if k == len(reqs):
            return 0
        r = reqs[k]
        top = best(k + 1, state) if k not in must else float("-inf")  # not placed
        for i, node in enumerate(nodes):
            cpu, mem, free = state[i]
            if cpu < r.cpu_milli or mem < r.memory_mb:
                continue
            if r.gpu_types and node.gpu_type not in r.gpu_types:
                continue
            options = []
            if r.gpu_count:
                whole = [g for g, f in enumerate(free) if f == WHOLE]
                if len(whole) >= r.gpu_count:
                    taken = set(whole[: r.gpu_count])
                    options.append(tuple(0 if g in taken else f for g, f in enumerate(free)))
            else:
                for g in {f: g for g, f in enumerate(free) if f >= r.gpu_milli}.values():
                    after = list(free)
                    after[g] -= r.gpu_milli
                    options.append(tuple(sorted(after)))
            for after in options:
                new = list(state)
                new[i] = (cpu - r.cpu_milli, mem - r.memory_mb, after)
                top = max(top, r.gpu_demand_milli + best(k + 1, tuple(new)))
        return top

    start = tuple((n.cpu_milli, n.memory_mb, tuple(n.gpus)) for n in nodes)
    return (capacity - best(0, start)) / capacity


def random_instance(rng: random.Random):
    nodes = [
        NodeInventory("a", rng.choice([6000, 12000]), 64000, "X", (WHOLE,) * rng.choice([1, 2])),
        NodeInventory("b", rng.choice([4000, 8000]), 64000, "Y", (WHOLE,) * rng.choice([1, 2])),
    ]
    requests = []
    for _ in range(rng.randint(3, 7)):
        cpu = rng.choice([1000, 3000, 5000])
        types = rng.choice([(), (), ("X",), ("Y",)])
        if rng.random() < 0.35:
            requests.append(Request(cpu, 1000, rng.choice([1, 1, 2]), 0, types))
        else:
            requests.append(Request(cpu, 1000, 0, rng.choice([250, 300, 450, 600, 700]), types))
    return requests, nodes


def test_the_floor_never_exceeds_the_brute_force_optimum_and_is_often_tight():
    rng = random.Random(7)
    tight = 0
    for _ in range(60):
        requests, nodes = random_instance(rng)
        floor = placement_floor(requests, nodes)["floor"]
        optimum = optimum_unallocated(requests, nodes)
        assert floor <= optimum + 1e-9, (requests, nodes, floor, optimum)
        tight += floor >= optimum - 1e-9
    # A floor of 0 everywhere would pass the line above: it must also meet the optimum often.
    assert tight >= 30


def test_the_floor_counts_slices_that_cannot_share_a_gpu():
    nodes = [NodeInventory("a", 8000, 8000, "X", (WHOLE, WHOLE))]
    # Three 0.6 slices on two GPUs: two placed at best, 0.8 of 2 GPUs idle.
    result = placement_floor([Request(0, 0, 0, 600)] * 3, nodes)
    assert result["floor"] == pytest.approx(0.4)
    assert optimum_unallocated([Request(0, 0, 0, 600)] * 3, nodes) == pytest.approx(0.4)
    # 0.6 pairs with 0.4: nothing idle.
    assert placement_floor([Request(0, 0, 0, 600), Request(0, 0, 0, 400)] * 2, nodes)[
        "floor"
    ] == pytest.approx(0.0)


def test_the_floor_sees_cpu_gpu_types_and_whole_gpus_per_node():
    nodes = [
        NodeInventory("a", 4000, 8000, "X", (WHOLE,) * 2),
        NodeInventory("b", 64000, 8000, "Y", (WHOLE,) * 2),
    ]
    # Only node b has the CPU for these: two of its GPUs, half the cluster, stay usable.
    hungry = [Request(32000, 0, 1, 0)] * 4
    assert placement_floor(hungry, nodes)["floor"] == pytest.approx(0.5)
    # Pinned to X: node b's GPUs are out of reach.
    pinned = [Request(0, 0, 1, 0, ("X",))] * 4
    assert placement_floor(pinned, nodes)["floor"] == pytest.approx(0.5)
    # A 3-GPU worker fits on no node.
    assert placement_floor([Request(0, 0, 3, 0)], nodes)["floor"] == pytest.approx(1.0)


def test_the_slice_only_bound_is_not_a_floor_when_arrivals_exceed_capacity():
    """Why the benchmark's floor is ``placement_floor``: the cutting-stock waste of placing every
    slice overstates the least idle capacity once not every request can be placed (a wasteful
    slice is better left waiting while a whole-GPU worker takes its GPU)."""
    nodes = [NodeInventory("a", 8000, 8000, "X", (WHOLE, WHOLE))]
    requests = [Request(0, 0, 0, 650), Request(0, 0, 0, 650), Request(0, 0, 1, 0)]
    optimum = optimum_unallocated(requests, nodes)
    assert optimum == pytest.approx(0.175)  # 0.65 + 1 placed on 2 GPUs
    assert placement_floor(requests, nodes)["floor"] == pytest.approx(optimum)
    slices_only = fractional_packing_waste_lb(requests, 2 * WHOLE)
    assert slices_only == pytest.approx(0.35)
    assert slices_only > optimum


def test_the_accepted_floor_places_what_a_policy_placed_and_never_exceeds_the_optimum():
    """``placed``: the floor of placements that must place the requests a policy placed sits
    between the free floor and the brute-force optimum of placements that place them."""
    rng = random.Random(11)
    raised = tight = 0
    for _ in range(60):
        requests, nodes = random_instance(rng)
        cluster = Cluster(nodes)
        taken = frozenset(i for i, r in enumerate(requests) if cluster.place(r, "best_fit"))
        free = placement_floor(requests, nodes)["floor"]
        accepted = placement_floor(requests, nodes, placed=[requests[i] for i in taken])["floor"]
        optimum = optimum_unallocated(requests, nodes, must=taken)
        assert free - 1e-9 <= accepted <= optimum + 1e-9, (requests, nodes, free, accepted)
        assert optimum <= cluster.gpu_free_milli / cluster.gpu_capacity_milli + 1e-9
        raised += accepted > free + 1e-9
        tight += accepted >= optimum - 1e-9
    assert raised >= 3 and tight >= 30


def test_a_policy_that_took_the_wasteful_slices_is_held_to_more():
    nodes = [NodeInventory("a", 8000, 8000, "X", (WHOLE, WHOLE))]
    requests = [Request(0, 0, 0, 650), Request(0, 0, 0, 650), Request(0, 0, 1, 0)]
    assert placement_floor(requests, nodes)["floor"] == pytest.approx(0.175)
    # Both 0.65 slices placed: they need a GPU each, and the whole-GPU pod has none left.
    accepted = placement_floor(requests, nodes, placed=requests[:2])["floor"]
    assert accepted == pytest.approx(0.35)
    assert optimum_unallocated(requests, nodes, must=frozenset({0, 1})) == pytest.approx(0.35)
    with pytest.raises(ValueError, match="do not fit"):
        placement_floor([Request(0, 0, 0, 600)] * 3, nodes, placed=[Request(0, 0, 0, 600)] * 3)
    with pytest.raises(ValueError, match="must be one of the requests"):
        placement_floor(requests, nodes, placed=[Request(0, 0, 0, 300)])
    with pytest.raises(ValueError, match="no node can hold"):
        placement_floor([Request(0, 0, 3, 0)], nodes, placed=[Request(0, 0, 3, 0)])


def policy_loads(requests, nodes, policy):
    """What each node holds after ``policy`` placed ``requests``, and what it left unallocated."""
    cluster = Cluster(nodes)
    placed = [(r, where) for r in requests if (where := cluster.place(r, policy)) is not None]
    return _node_loads(placed), cluster.gpu_free_milli / cluster.gpu_capacity_milli


def every_load(requests, nodes):
    """Every set of the requests each node can hold at once (brute force), as loads."""
    loads = []
    gpu = [r for r in requests if r.gpu_demand_milli]
    for position, node in enumerate(nodes):
        for mask in range(1, 1 << len(gpu)):
            chosen = [r for i, r in enumerate(gpu) if mask >> i & 1]
            held = optimum_unallocated(chosen, [node], must=frozenset(range(len(chosen))))
            if held != float("inf"):
                loads.append((position, Counter(request_shape(r) for r in chosen)))
    return loads


def test_the_offline_placement_is_a_placement_between_the_optimum_and_every_policy():
    """Assembled from the loads the policies left on the nodes, it is never better than the
    brute-force optimum (it is a placement) nor worse than any of those policies' (each of
    them is one of its choices); from every load a node can hold it is the optimum itself."""
    rng = random.Random(19)
    for _ in range(40):
        requests, nodes = random_instance(rng)
        optimum = optimum_unallocated(requests, nodes)
        runs = [policy_loads(requests, nodes, p) for p in ("best_fit", "binpack", "spread")]
        offline = offline_placement(requests, nodes, [load for loads, _ in runs for load in loads])
        best_policy = min(left for _, left in runs)
        if offline is None:  # no policy placed a GPU request: nothing to assemble
            assert best_policy == pytest.approx(1.0)
            continue
        assert offline["optimal"]
        assert optimum - 1e-9 <= offline["unallocated"] <= best_policy + 1e-9
        complete = offline_placement(requests, nodes, every_load(requests, nodes))
        assert complete["unallocated"] == pytest.approx(optimum), (requests, nodes)
        floor = placement_floor(requests, nodes)["floor"]
        assert floor <= complete["unallocated"] + 1e-9


def test_the_offline_placement_takes_no_more_than_arrived_and_no_more_nodes_than_exist():
    nodes = [NodeInventory("a", 8000, 8000, "X", (WHOLE, WHOLE))] * 2
    two_slices = Counter({request_shape(Request(0, 0, 0, 600)): 2})
    # Two nodes could each take two 0.6 slices, but only three arrived: one node takes two.
    done = offline_placement([Request(0, 0, 0, 600)] * 3, nodes, [(0, two_slices)])
    assert done["placed_milli"] == 1200 and done["nodes_loaded"] == 1
    assert done["unallocated"] == pytest.approx(1 - 1200 / 4000)
    # Loads of two runs, each of which left one node idle: together they load both.
    pinned = [Request(0, 0, 1, 0, ("X",)), Request(0, 0, 1, 0, ("Y",))]
    two = [
        NodeInventory("a", 8000, 8000, "X", (WHOLE,)),
        NodeInventory("b", 8000, 8000, "Y", (WHOLE,)),
    ]
    runs = [
        (0, Counter({request_shape(pinned[0]): 1})),
        (1, Counter({request_shape(pinned[1]): 1})),
    ]
    assert offline_placement(pinned, two, runs)["unallocated"] == 0
    assert offline_placement(pinned, two, runs[:1])["unallocated"] == pytest.approx(0.5)
    # A load of more than arrived is no placement of these requests.
    assert offline_placement([Request(0, 0, 0, 600)], nodes, [(0, two_slices)]) is None
    # Gang workers may not be split, which per-worker loads cannot promise.
    gang = Request(0, 0, 1, 0, workers=2)
    assert offline_placement([gang], nodes, [(0, Counter({request_shape(gang): 2}))]) is None


def test_slice_patterns_are_every_fitting_multiset():
    patterns = slice_patterns({600: 2, 400: 3})
    assert sorted(map(tuple, patterns)) == [(0, 1), (0, 2), (1, 0), (1, 1)]
    assert slice_patterns({10: 100}, max_patterns=5) is None


def trace(n: int = 2000):
    rng = random.Random(3)
    pods = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.1:
            pods.append(Request(2000, 1000))
        elif roll < 0.5:
            pods.append(Request(4000, 1000, 0, rng.choice([250, 500, 700])))
        elif roll < 0.9:
            pods.append(Request(8000, 1000, 1, 0))
        else:
            pods.append(Request(16000, 1000, rng.choice([2, 4, 8]), 0))
    nodes = [NodeInventory("a", 96000, 1 << 20, "G2", (WHOLE,) * 8)] * 3 + [
        NodeInventory("b", 64000, 1 << 20, "V100M16", (WHOLE,) * 2),
        NodeInventory("c", 64000, 1 << 20, "V100M32", (WHOLE,) * 4),
    ]
    return pods, nodes


@pytest.mark.parametrize("mix", [m for m in MIXES if m != "default"] + ["gpushare100"])
def test_trace_variants_have_the_share_they_name(mix):
    pods, nodes = trace()
    family, percent = parse_mix(mix)
    variant = trace_variant(pods, mix, nodes, seed=1)
    assert len(variant) == len(pods)
    cpu_only = sum(not p.gpu_demand_milli for p in variant)
    assert cpu_only == sum(not p.gpu_demand_milli for p in pods)  # CPU-only work kept as is
    gpu = [p for p in variant if p.gpu_demand_milli]
    kind = {
        "gpushare": lambda p: not p.gpu_count,
        "multigpu": lambda p: p.gpu_count >= 2,
        "gpuspec": lambda p: bool(p.gpu_types),
    }[family]
    assert sum(map(kind, gpu)) == round(len(gpu) * percent / 100)
    if family == "gpuspec":
        # Pinned to what the cluster has, the V100 models together.
        assert {p.gpu_types for p in gpu if p.gpu_types} <= {("G2",), ("V100M16", "V100M32")}
    else:
        # The rest of the distribution kept: the other kinds in their original proportion.
        others = Counter(p.gpu_milli or p.gpu_count for p in gpu if not kind(p))
        assert set(others) <= {p.gpu_milli or p.gpu_count for p in pods if not kind(p)}
    assert trace_variant(pods, mix, nodes, seed=1) == variant  # seeded
    assert trace_variant(pods, mix, nodes, seed=2) != variant


@pytest.mark.parametrize("bad", ["gpushare", "gpushare101", "fancy20", "multi-gpu20", ""])
def test_unknown_mixes_are_refused_naming_the_families(bad):
    with pytest.raises(ValueError, match="gpushare"):
        parse_mix(bad)


def test_the_workload_estimate_follows_a_change_of_mix():
    estimator = WorkloadEstimator(half_life=100)
    whole, half = Request(8000, 1000, 1, 0), Request(4000, 1000, 0, 500)
    took = [estimator.observe(whole) for _ in range(1000)]  # every arrival counted
    assert any(took)
    assert [(c.gpu_count, c.share) for c in estimator.classes()] == [(1, 1.0)]
    # The same mix again: nothing to take.
    assert not any(estimator.observe(whole) for _ in range(500))
    took = [estimator.observe(half) for _ in range(300)]
    assert any(took)
    slices = sum(c.share for c in estimator.classes() if c.gpu_milli == 500)
    # Three half-lives after the change: 1 - 2**-3 of the weight is the new mix.
    assert slices == pytest.approx(0.875, abs=1e-3)
    assert estimator.drift() == 0.0


def test_the_simulator_learns_the_mix_online_or_takes_the_trace():
    pods, nodes = trace(600)
    online = simulate(pods, nodes, seed=1, policies=("default",), warmup=0)
    assert online["workload"] == "online" and online["workload_updates"] >= 3
    oracle = simulate(pods, nodes, seed=1, policies=("default",), workload="trace")
    assert "workload_updates" not in oracle or oracle["workload_updates"] == 0
    assert 0 <= online["placement_floor"] <= online["unallocated_gpu_share_default"] + 1e-9
    # The accepted floor: above the floor, and the default policy never gets under it.
    assert online["placement_floor"] <= online["accepted_floor"]
    assert online["accepted_floor"] <= online["unallocated_gpu_share_default"] + 1e-4
    assert online["default_vs_accepted_floor"] >= 1 - 1e-3
    # A placement the policies' loads make up: between the floor and the default's own.
    assert online["placement_floor"] - 1e-4 <= online["offline_placement"]
    assert online["offline_placement"] <= online["unallocated_gpu_share_default"] + 1e-4
    with pytest.raises(ValueError, match="online or trace"):
        simulate(pods, nodes, seed=1, workload="psychic")


def test_work_that_runs_anywhere_leaves_room_for_work_pinned_to_a_model():
    nodes = [
        NodeInventory("a", 64000, 1 << 20, "A", (WHOLE,) * 2),
        NodeInventory("b", 64000, 1 << 20, "B", (WHOLE,) * 2),
    ]
    anywhere, on_a = Request(1000, 100, 1, 0), Request(1000, 100, 1, 0, ("A",))
    estimate = WorkloadEstimator().observe_all([anywhere, on_a] * 10)
    assert estimate.pinned() == {
        (): pytest.approx(0.5, abs=1e-3),
        ("A",): pytest.approx(0.5, abs=1e-3),
    }
    cluster = Cluster(nodes, workload=estimate.classes(), pinned=estimate.pinned(), seed=1)
    assert [cluster.place(anywhere)[0].node_name for _ in range(2)] == ["b", "b"]
    assert [cluster.place(on_a)[0].node_name for _ in range(2)] == ["a", "a"]
    # The reservation never turns away work that fits: with b full, A's GPUs take it.
    cluster = Cluster(nodes, workload=estimate.classes(), pinned=estimate.pinned(), seed=1)
    assert sorted(cluster.place(anywhere)[0].node_name for _ in range(4)) == ["a", "a", "b", "b"]


def test_the_reservation_reads_the_pinned_shares_beyond_the_classes():
    """Pinned work among many rare shapes may be missing from the ``max_classes`` classes; the
    estimate's pinned shares still count it (``WorkloadEstimator.pinned``)."""
    nodes = [
        NodeInventory("a", 64000, 1 << 20, "A", (WHOLE,) * 2),
        NodeInventory("b", 64000, 1 << 20, "B", (WHOLE,) * 4),
    ]
    classes = [TaskClass(1000, 100, 1, 0, 1.0)]
    pinned = {(): 0.5, ("A",): 0.5}
    anywhere = Request(1000, 100, 1, 0)
    # Best fit alone takes the smaller node, where the pinned work will need room.
    unaware = Cluster(nodes, workload=classes, pinned=pinned, reserve=False)
    assert unaware.place(anywhere)[0].node_name == "a"
    aware = Cluster(nodes, workload=classes, pinned=pinned)
    assert aware.place(anywhere)[0].node_name == "b"


def test_work_that_fits_anywhere_leaves_the_large_machines_to_work_that_needs_them():
    """An unpinned class too large for most groups (48 CPUs: only node "big") is owed room on
    the groups that can hold it (``Cluster._size_reservations``)."""
    nodes = [
        NodeInventory("big", 64000, 1 << 20, "A", (WHOLE,) * 2),
        NodeInventory("a", 16000, 1 << 20, "A", (WHOLE,) * 8),
        NodeInventory("b", 16000, 1 << 20, "A", (WHOLE,) * 8),
    ]
    small, large, whole = (
        Request(1000, 100, 2, 0),
        Request(48000, 100, 2, 0),
        Request(1000, 100, 8, 0),
    )
    classes = WorkloadEstimator().observe_all([small, large, whole] * 10).classes()
    arrivals = [small, small, large, large, small, small]
    unaware = Cluster(nodes, workload=classes, reserve=False)
    placed = [p[0].node_name if (p := unaware.place(r)) else None for r in arrivals]
    # Small work took "big" first: neither large pod finds a node.
    assert placed == ["big", "a", None, None, "a", "a"]
    aware = Cluster(nodes, workload=classes)
    # The large class is a sixth of the demand (3 of 18 GPUs), "big" has 2 to give.
    assert aware.g_owed.sum() == pytest.approx(2 / 18, abs=0.01)
    placed = [p[0].node_name if (p := aware.place(r)) else None for r in arrivals]
    assert placed == ["a", "a", "big", None, "a", "a"]
    assert aware.gpu_free_milli < unaware.gpu_free_milli


def test_the_narrowest_restricted_work_claims_its_machines_first():
    nodes = [
        NodeInventory("wide", 96000, 1 << 20, "A", (WHOLE,) * 8),
        NodeInventory("big", 128000, 1 << 20, "A", (WHOLE,) * 8),
    ] + [NodeInventory(f"small{i}", 16000, 1 << 20, "A", (WHOLE,) * 8) for i in range(4)]
    # A quarter of the demand fits only "big" (120 CPUs), an eighth "wide" and "big".
    classes = [
        TaskClass(120000, 100, 8, 0, 1.0, share=0.25 / 8),
        TaskClass(64000, 100, 8, 0, 1.0, share=0.125 / 8),
        TaskClass(1000, 100, 1, 0, 1.0, share=0.625),
    ]
    cluster = Cluster(nodes, workload=classes)
    owed = dict(zip((int(k[2]) for k in cluster.g_key), cluster.g_owed, strict=True))
    # 48 GPUs: the 120-CPU work wants 12 and claims all 8 of "big"; the 64-CPU work's 6 then
    # come from "wide", "big" having nothing left.
    assert owed[128000] == pytest.approx(8 / 48)
    assert owed[96000] == pytest.approx(6 / 48)
    assert owed[16000] == 0
