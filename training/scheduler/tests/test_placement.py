"""The placement engine on small hand-made clusters (no database)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command

from training.scheduler.placement import POLICIES, Cluster, NodeInventory, Request, TaskClass
from training.scheduler.simulate import (
    arrival_sequence,
    fractional_packing_waste_lb,
    load_nodes,
    load_pods,
    simulate,
)

TRACES = Path(__file__).resolve().parents[4] / "shared" / "data" / "cluster-traces"


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
    cluster.free[0, :] = [0, 0, 0, 1000]
    cluster.cpu[0] = 9000
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


def test_simulation_on_a_trace_sample_ranks_the_default_first():
    pods = load_pods(TRACES / "openb_pod_list_default.csv")
    all_nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    sample = all_nodes[::8]  # 152 nodes: a quick but real replay
    result = simulate(pods, sample, seed=3)
    shares = {p: result[f"unallocated_gpu_share_{p}"] for p in POLICIES}
    assert shares["default"] <= min(v for k, v in shares.items() if k != "default")
    assert shares["spread"] > shares["default"]
    assert result["unallocated_vs_best_baseline"] < 1
    # No policy can beat the offline packing bound on the slivers of fractional pods.
    assert result["fractional_packing_waste_lb"] <= shares["default"]
    seq = arrival_sequence(pods, Cluster(sample).gpu_capacity_milli, 3)
    assert sum(p.gpu_demand_milli for p in seq[:-1]) < Cluster(sample).gpu_capacity_milli


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
