"""Lineage: downstream impact queries on a platform-sized graph in the real lineage tables.

Builds a synthetic graph shaped like a large platform straight into ``lineage_node`` and
``lineage_edge`` with PostgreSQL ``COPY`` (SQLite: executemany): 2,000 feature groups with 25
features each; 20,000 datasets each reading 30 features drawn Zipf-skewed (popular features get
thousands of consumers) plus the groups those features belong to; one training job per dataset,
one model version per job, deployments for 30% of the model versions and experiments testing two
deployments each. Every edge is live, every node live.

It then times ``lineage.queries.impact`` (what ``GET .../lineage/impact/`` runs: counts by kind
and owner of the live jobs, model versions, deployments and experiments within 6 steps, read from
the precomputed ``lineage_reach`` rows by an index-only range scan, plus the first 100 of them)
starting from features in the top 1% by consumers, one query after another in this process.

Measures:

- ``impact_depth6_p50_ms`` / ``impact_depth6_p99_ms``: latency of one impact query.
- ``impact_depth6_impacted_mean`` / ``_max``: live jobs, models, deployments and experiments
  found per query.
- ``graph_nodes`` / ``graph_edges``: the size of the graph.
- ``load_s``: building and bulk-loading the graph (with ANALYZE).
- ``reach_build_s``: computing the precomputed impact table ``lineage_reach`` for the whole graph
  in one recursive query (``lineage.reach.reach_bulk_rebuild``), plus VACUUM ANALYZE. The
  projection keeps the same rows up to date edge by edge (tests check both agree).
"""

from __future__ import annotations

import io
import time

import numpy as np
from django.db import connection
from django.utils import timezone

from bench.harness import Context, percentile

GROUPS = 2_000
FEATURES_PER_GROUP = 25
DATASETS = 20_000
FEATURES_PER_DATASET = 30
DEPLOYED_SHARE = 0.3
DEPLOYMENTS_PER_EXPERIMENT = 2
ZIPF_A = 1.0
ZIPF_OFFSET = 10
QUERIES = 300
WARMUP = 20
SEED = 7


def _shape(rng: np.random.Generator):
    """Node kinds and edges (src, dst, type) as numpy arrays, ids starting at 1."""
    kinds: list[tuple[str, int]] = []
    next_id = 1

    def block(kind: str, n: int) -> np.ndarray:
        nonlocal next_id
        ids = np.arange(next_id, next_id + n, dtype=np.int64)
        kinds.append((kind, n))
        next_id += n
        return ids

    groups = block("feature_group", GROUPS)
    n_features = GROUPS * FEATURES_PER_GROUP
    features = block("feature", n_features)
    datasets = block("dataset", DATASETS)
    jobs = block("training_job", DATASETS)
    models = block("model_version", DATASETS)
    n_deployed = int(DATASETS * DEPLOYED_SHARE)
    deployments = block("deployment", n_deployed)
    experiments = block("experiment", n_deployed // DEPLOYMENTS_PER_EXPERIMENT)

    edges = []
    # group -> its features
    edges.append((np.repeat(groups, FEATURES_PER_GROUP), features, "related"))
    # datasets read Zipf-skewed features (a random popularity order over all features).
    # Power-law popularity, weight 1 / (rank + ZIPF_OFFSET) ** ZIPF_A over a random order.
    popularity = rng.permutation(n_features)
    weights = 1.0 / (np.arange(n_features) + ZIPF_OFFSET) ** ZIPF_A
    draws = rng.choice(
        n_features, size=(DATASETS, FEATURES_PER_DATASET * 2), p=weights / weights.sum()
    )
    src_f, dst_d, src_g, dst_g = [], [], [], []
    for d in range(DATASETS):
        _, first = np.unique(draws[d], return_index=True)
        chosen = popularity[draws[d][np.sort(first)][:FEATURES_PER_DATASET]]
        if len(chosen) < FEATURES_PER_DATASET:
            extra = rng.choice(n_features, FEATURES_PER_DATASET, replace=False)
            chosen = np.unique(np.concatenate([chosen, extra]))[:FEATURES_PER_DATASET]
        src_f.append(features[chosen])
        dst_d.append(np.full(len(chosen), datasets[d]))
        g = np.unique(chosen // FEATURES_PER_GROUP)
        src_g.append(groups[g])
        dst_g.append(np.full(len(g), datasets[d]))
    edges.append((np.concatenate(src_f), np.concatenate(dst_d), "consumes"))
    edges.append((np.concatenate(src_g), np.concatenate(dst_g), "consumes"))
    edges.append((datasets, jobs, "consumes"))
    edges.append((jobs, models, "produces"))
    deployed = rng.choice(DATASETS, n_deployed, replace=False)
    edges.append((models[deployed], deployments, "deployed_as"))
    tested = rng.permutation(n_deployed)[: len(experiments) * DEPLOYMENTS_PER_EXPERIMENT]
    edges.append(
        (deployments[tested], np.repeat(experiments, DEPLOYMENTS_PER_EXPERIMENT), "tested_in")
    )
    consumers = np.bincount(np.concatenate(src_f) - features[0], minlength=n_features)
    return kinds, edges, features, consumers


def _copy(table: str, columns: list[str], lines: io.StringIO, rows: list[tuple]) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            raw = cursor.cursor
            with raw.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                copy.write(lines.getvalue())
    else:
        marks = ", ".join(["%s"] * len(columns))
        with connection.cursor() as cursor:
            cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)


def _load(workspace_id: int, kinds, edges) -> tuple[int, int]:
    from lineage.models import Edge, Node

    now = timezone.now().isoformat()
    node_cols = [
        "id",
        "workspace_id",
        "kind",
        "object_id",
        "label",
        "owner_name",
        "live",
        "status",
        "first_seen_at",
        "last_seen_at",
        "first_event_id",
        "last_event_id",
    ]
    buffer, rows = io.StringIO(), []
    pk = 1
    sqlite = connection.vendor != "postgresql"
    for kind, n in kinds:
        for i in range(n):
            row = (
                pk,
                workspace_id,
                kind,
                str(i),
                f"{kind}-{i}",
                f"owner{i % 97}",
                True,
                "",
                now,
                now,
                0,
                0,
            )
            if sqlite:
                rows.append(row)
            else:
                buffer.write(
                    f"{pk}\t{workspace_id}\t{kind}\t{i}\t{kind}-{i}\towner{i % 97}\tt\t\t"
                    f"{now}\t{now}\t0\t0\n"
                )
            pk += 1
    _copy(Node._meta.db_table, node_cols, buffer, rows)
    edge_cols = [
        "workspace_id",
        "src_id",
        "dst_id",
        "type",
        "active",
        "created_at",
        "first_event_id",
        "last_event_id",
    ]
    buffer, rows = io.StringIO(), []
    total = 0
    for src, dst, kind in edges:
        total += len(src)
        if sqlite:
            rows.extend(
                (workspace_id, int(s), int(d), kind, True, now, 0, 0)
                for s, d in zip(src, dst, strict=True)
            )
        else:
            tail = f"\t{kind}\tt\t{now}\t0\t0\n"
            buffer.write(
                "".join(
                    f"{workspace_id}\t{s}\t{d}{tail}"
                    for s, d in zip(src.tolist(), dst.tolist(), strict=True)
                )
            )
    _copy(Edge._meta.db_table, edge_cols, buffer, rows)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{Node._meta.db_table}', 'id'), %s)", [pk]
            )
            cursor.execute(f"ANALYZE {Node._meta.db_table}")
            cursor.execute(f"ANALYZE {Edge._meta.db_table}")
    return pk - 1, total


def run(ctx: Context) -> dict[str, float]:
    from lineage.models import Edge, Node
    from lineage.queries import impact
    from lineage.reach import reach_bulk_rebuild
    from workspaces import services
    from workspaces.models import PredictionType

    rng = np.random.default_rng(SEED)
    workspace = services.workspace_create(
        actor=None,
        slug="bench-lineage",
        name="Bench lineage",
        scene="bench-lineage",
        prediction_type=PredictionType.FINE_RANK,
    )
    started = time.perf_counter()
    ctx.log("shaping the synthetic graph ...")
    kinds, edges, features, consumers = _shape(rng)
    ctx.log("bulk-loading it ...")
    _load(workspace.pk, kinds, edges)
    load_s = time.perf_counter() - started
    ctx.log("precomputing impact (lineage_reach) with one recursive query ...")
    started = time.perf_counter()
    reach_rows = reach_bulk_rebuild(workspace.pk)
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            # What autovacuum does on a live database: the visibility map lets index-only scans
            # skip the heap.
            for table in ("lineage_node", "lineage_edge", "lineage_reach"):
                cursor.execute(f"VACUUM ANALYZE {table}")
    reach_s = time.perf_counter() - started
    graph_nodes = Node.objects.for_workspace(workspace).count()
    graph_edges = Edge.objects.for_workspace(workspace).count()
    ctx.log(f"{graph_nodes} nodes, {graph_edges} edges in {load_s:.1f}s")

    top = np.argsort(-consumers)[: max(1, len(consumers) // 100)]
    ctx.parameters.update(
        {
            "groups": GROUPS,
            "features_per_group": FEATURES_PER_GROUP,
            "datasets": DATASETS,
            "features_per_dataset": FEATURES_PER_DATASET,
            "zipf_a": ZIPF_A,
            "zipf_offset": ZIPF_OFFSET,
            "reach_rows": reach_rows,
            "queries": QUERIES,
            "top1pct_features": len(top),
            "top1pct_consumers_min": int(consumers[top].min()),
            "top1pct_consumers_max": int(consumers[top].max()),
        }
    )
    starts = [Node.objects.for_workspace(workspace).get(pk=int(features[i])) for i in top]
    latencies, reached = [], []
    for i in range(WARMUP + QUERIES):
        node = starts[i % len(starts)]
        t0 = time.perf_counter()
        result = impact(workspace=workspace, node=node, depth=6)
        elapsed = (time.perf_counter() - t0) * 1000
        if i >= WARMUP:
            latencies.append(elapsed)
            reached.append(result["total"])
    ctx.parameters["latency_ms_max"] = max(latencies)
    return {
        "impact_depth6_p50_ms": percentile(latencies, 50),
        "impact_depth6_p99_ms": percentile(latencies, 99),
        "impact_depth6_impacted_mean": float(np.mean(reached)),
        "impact_depth6_impacted_max": float(np.max(reached)),
        "graph_nodes": float(graph_nodes),
        "graph_edges": float(graph_edges),
        "load_s": load_s,
        "reach_build_s": reach_s,
    }
