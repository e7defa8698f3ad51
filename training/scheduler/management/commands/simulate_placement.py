"""Replay a pod trace on a node list through the placement engine (the FGD paper's method)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from training.scheduler.placement import POLICIES
from training.scheduler.simulate import MIXES, load_nodes, load_pods, simulate, trace_variant


class Command(BaseCommand):
    help = (
        "Sample pods from --pods until their GPU demand reaches the GPU capacity of --nodes, "
        "place them with every policy and print the measures as one JSON object."
    )

    def add_arguments(self, parser):
        parser.add_argument("--pods", required=True, help="openb_pod_list_*.csv")
        parser.add_argument("--nodes", required=True, help="openb_node_list_*.csv")
        parser.add_argument("--seed", type=int, default=42)
        parser.add_argument(
            "--repeats", type=int, default=1, help="Average over this many seeds (seed, seed+1..)."
        )
        parser.add_argument(
            "--policies",
            default=",".join(POLICIES),
            help=f"Comma-separated policies to run (default: all of {', '.join(POLICIES)}).",
        )
        parser.add_argument(
            "--mix",
            default="default",
            help="A workload mix resampled from --pods (trace_variant): default, or "
            f"gpushare<P>, multigpu<P>, gpuspec<P> (the benchmark runs {', '.join(MIXES)}).",
        )
        parser.add_argument(
            "--workload",
            choices=("online", "trace"),
            default="online",
            help="How the default policy knows the workload: online (estimated from arrivals, "
            "as the live tick does) or trace (the whole pod list in advance, an oracle).",
        )
        parser.add_argument(
            "--warmup",
            type=int,
            default=1000,
            help="Arrivals of a previous period (an independent draw from the same mix) the "
            "online estimate has seen before the run starts; 0: a cold start (default 1000).",
        )
        parser.add_argument(
            "--no-slice-pricing",
            action="store_true",
            help="Run the default policy on FGD's fragmentation measure alone (the ablation).",
        )

    def handle(self, *args, **options):
        policies = tuple(p.strip() for p in options["policies"].split(",") if p.strip())
        unknown = sorted(set(policies) - set(POLICIES))
        if unknown or not policies:
            raise CommandError(f"--policies: unknown {', '.join(unknown) or '(none given)'}")
        nodes = load_nodes(options["nodes"])
        trace = load_pods(options["pods"])
        runs = []
        for i in range(max(options["repeats"], 1)):
            seed = options["seed"] + i
            try:
                pods = trace_variant(trace, options["mix"], nodes, seed=seed)
            except ValueError as exc:
                raise CommandError(f"--mix: {exc}") from exc
            runs.append(
                simulate(
                    pods,
                    nodes,
                    seed=seed,
                    policies=policies,
                    slice_pricing=not options["no_slice_pricing"],
                    workload=options["workload"],
                    warmup=max(options["warmup"], 0),
                )
            )
        result = {**average(runs), "mix": options["mix"]}
        self.stdout.write(json.dumps(result, sort_keys=True))


def average(runs: list[dict]) -> dict:
    """The mean of each numeric measure over runs (the ratio recomputed from the means); for
    throughputs the best run's."""
    if len(runs) == 1:
        return runs[0]
    out: dict = {"seeds": [r["seed"] for r in runs]}
    ran = {p for p in POLICIES if f"unallocated_gpu_share_{p}" in runs[0]}
    for key, value in runs[0].items():
        if isinstance(value, bool):
            out[key] = value
            continue
        if key == "seed" or not isinstance(value, int | float):
            continue
        values = [r[key] for r in runs if r.get(key) is not None]
        if key.startswith(("placements_per_", "cpu_time_placements_per_")):
            out[key] = max(values)  # throughput: the best run, the least disturbed by others
        else:
            out[key] = round(sum(values) / len(values), 4)
        if key in ("default_vs_floor", "default_vs_accepted_floor", "offline_vs_floor"):
            out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    others = [out[f"unallocated_gpu_share_{p}"] for p in POLICIES if p != "default" and p in ran]
    if "default" in ran and others and min(others):
        out["unallocated_vs_best_baseline"] = round(
            out["unallocated_gpu_share_default"] / min(others), 4
        )
    return out
