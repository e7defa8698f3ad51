"""Serving: our gateway against ``mlflow models serve``, the full predict path, routing overhead
and rollback under load.

Real data: MovieLens 100K (``../shared/data/movielens-100k``): user features (age, gender,
occupation) from ``u.user``, item features (year, five genre flags) from ``u.item``, click labels
(rating >= 4) from ``u.data`` (20,000 ratings, times shifted to 2026). A logistic-regression
bundle (``training`` template ``logreg``) is trained on the built dataset, registered, gated
(consistency + sandbox) and deployed through the services.

Servers (2 processes each, the machine has 2 cores): ours is ``gunicorn serving.wsgi`` (the
platform's Django app with the gateway's hot routes dispatched before the middleware chain; 2
gthread workers, 4 threads); the peer is ``mlflow models serve --env-manager local --workers 2``
from
``bench/.venvs/mlflow`` (mlflow 3.17.2 + torch CPU from PyPI), serving the same bundle logged as a
pyfunc model (same encoder and weights; answers checked equal before timing).

Measures (the same 100-candidate raw feature rows in every request):

- ``predict_p99_ms`` / ``predict_p99_ms_mlflow``: sequential requests on one keep-alive
  connection (50 warm-up + 1,000 timed): ours ``POST /v2/models/{ws}.{dep}/infer`` (OIP v2),
  MLflow ``POST /invocations`` (``dataframe_split``).
- ``predict_rps`` / ``predict_rps_mlflow``: 4 concurrent keep-alive clients for 5 s.
- ``predict_full_p50_ms`` / ``predict_full_p99_ms``: ``POST /api/v1/workspaces/{ws}/predict/``
  for a random user and 100 random candidate items: online features fetched by the gateway,
  routing, one batch, prediction log (1,000 timed).
- ``routing_overhead_ms``: median /predict/ latency on a deployment with a 50/50 experiment minus
  that of an identical deployment without one (interleaved requests, 1,000 each).
- ``rollback_s``, ``rollback_failed_requests``: 3 clients send /predict/ while
  ``POST .../deployments/{name}/rollback/`` runs; seconds from sending the rollback until the last
  request that still got the rolled-back version was sent, and failed requests over the run.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.harness import (
    REPO_ROOT,
    BenchError,
    Context,
    LocalHttp,
    free_port,
    gunicorn_server,
    peer_venv,
    percentile,
)

MOVIELENS_DIR = Path(
    os.environ.get("BENCH_MOVIELENS_DIR", REPO_ROOT.parent / "shared" / "data" / "movielens-100k")
)
PEER_DIR = Path(__file__).resolve().parent / "serving_peer"
MLFLOW_REQUIREMENTS = ["mlflow==3.17.2", "torch==2.13.0+cpu"]
WS = "bench-serving"
CANDIDATES = 100
RATINGS = 20_000
WARMUP = 50
REQUESTS = 1000
GENRES = {"action": 6, "comedy": 10, "drama": 13, "romance": 19, "thriller": 21}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Http(LocalHttp):
    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return self.request(
            "POST",
            path,
            body=body,
            headers={"Content-Type": "application/json"},
            reconnect_on=(OSError,),
        )


def _timed(
    http: Http, path: str, bodies: list[bytes], *, count: int, warmup: int = WARMUP
) -> list[float]:
    out = []
    for i in range(warmup + count):
        body = bodies[i % len(bodies)]
        started = time.perf_counter()
        status, data = http.post(path, body)
        elapsed = (time.perf_counter() - started) * 1000
        if status != 200:
            raise BenchError(f"POST {path} answered {status}: {data[:300]!r}")
        if i >= warmup:
            out.append(elapsed)
    return out


def _throughput(
    port: int,
    path: str,
    bodies: list[bytes],
    headers: dict,
    *,
    seconds: float = 5.0,
    clients: int = 4,
) -> float:
    done = [0] * clients
    errors: list[str] = []
    stop = time.perf_counter() + seconds

    def worker(k: int) -> None:
        http = Http(port, headers=headers)
        try:
            i = k
            while time.perf_counter() < stop:
                status, data = http.post(path, bodies[i % len(bodies)])
                if status != 200:
                    errors.append(f"{status} {data[:200]!r}")
                    return
                done[k] += 1
                i += clients
        finally:
            http.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError(f"throughput run on {path} failed: {errors[0]}")
    return sum(done) / (time.perf_counter() - started)


# --------------------------------------------------------------------------------------------
# Data and model


def _read(name: str, sep: str) -> list[list[str]]:
    text = (MOVIELENS_DIR / name).read_text(encoding="latin-1")
    return [line.split(sep) for line in text.splitlines() if line.strip()]


def _seed(ctx: Context) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from features import samples
    from features.ingestion import batch_ingest
    from features.models import EntityKind
    from features.registry import feature_group_register
    from workspaces import services
    from workspaces.models import PredictionType, Role

    workspace = services.workspace_create(
        actor=None,
        slug=WS,
        name="Bench serving",
        scene=WS,
        prediction_type=PredictionType.FINE_RANK,
    )
    user = get_user_model().objects.create_user("bench-serving")
    services.membership_grant(actor=None, workspace=workspace, user=user, role=Role.MAINTAINER)
    _token, key = services.api_token_create(actor=None, user=user, name="bench")
    users = feature_group_register(
        actor=user,
        workspace=workspace,
        name="ml_users",
        entity=EntityKind.USER,
        entity_keys=["user_id"],
        features=[
            {"name": "age", "dtype": "int"},
            {"name": "gender", "dtype": "categorical"},
            {"name": "occupation", "dtype": "categorical"},
        ],
    )
    items = feature_group_register(
        actor=user,
        workspace=workspace,
        name="ml_items",
        entity=EntityKind.ITEM,
        entity_keys=["item_id"],
        features=[
            {"name": "year", "dtype": "int"},
            *({"name": g, "dtype": "float"} for g in GENRES),
        ],
    )
    labels = feature_group_register(
        actor=user,
        workspace=workspace,
        name="ml_clicks",
        entity=EntityKind.LABEL,
        entity_keys=["user_id", "item_id"],
        features=[{"name": "clicked", "dtype": "int"}],
        online=False,
    )
    ts = (T0 - timedelta(days=1)).isoformat()
    user_rows = [
        {
            "user_id": f"u{r[0]}",
            "event_time": ts,
            "age": int(r[1]),
            "gender": r[2],
            "occupation": r[3],
        }
        for r in _read("u.user", "|")
    ]
    item_rows = []
    for r in _read("u.item", "|"):
        year = int(r[2][-4:]) if len(r[2]) >= 4 and r[2][-4:].isdigit() else None
        item_rows.append(
            {
                "item_id": f"i{r[0]}",
                "event_time": ts,
                "year": year,
                **{g: float(r[col]) for g, col in GENRES.items()},
            }
        )
    ratings = _read("u.data", "\t")
    random.Random(7).shuffle(ratings)
    ratings = ratings[:RATINGS]
    first = min(int(r[3]) for r in ratings)
    label_rows = [
        {
            "user_id": f"u{r[0]}",
            "item_id": f"i{r[1]}",
            "event_time": (T0 + timedelta(seconds=(int(r[3]) - first) // 4)).isoformat(),
            "clicked": int(int(r[2]) >= 4),
        }
        for r in ratings
    ]
    for group, rows in ((users, user_rows), (items, item_rows), (labels, label_rows)):
        batch_ingest(
            actor=user, group=group, body=json.dumps({"rows": rows}).encode(), format="json"
        )
    dataset = samples.dataset_create(
        actor=user,
        workspace=workspace,
        name="ml_sample",
        label_group=labels,
        label_columns=["clicked"],
        feature_refs=[
            "ml_users:age",
            "ml_users:gender",
            "ml_users:occupation",
            "ml_items:year",
            *(f"ml_items:{g}" for g in GENRES),
        ],
    )
    if dataset.status != "ready":
        raise BenchError(f"dataset failed: {dataset.error}")
    ctx.log(f"seeded {len(user_rows)} users, {len(item_rows)} items, {len(label_rows)} labels")
    return {
        "workspace": workspace,
        "user": user,
        "key": key,
        "dataset": dataset,
        "user_ids": [r["user_id"] for r in user_rows],
        "item_ids": [r["item_id"] for r in item_rows],
        "item_rows": {r["item_id"]: r for r in item_rows},
    }


def _train(ctx: Context, seed: dict, *, epochs: int, name: str) -> Path:
    import pyarrow.parquet as pq
    import torch
    from django.conf import settings

    from features.samples import dataset_file
    from training.bundle import BundleSpec, FeatureEncoder, FeatureSpec, build_model, save_bundle

    table = pq.read_table(dataset_file(seed["dataset"])).to_pydict()
    years = [y for y in table["ml_items__year"] if y is not None]
    ages = [a for a in table["ml_users__age"] if a is not None]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    std = lambda xs: (sum((x - mean(xs)) ** 2 for x in xs) / len(xs)) ** 0.5  # noqa: E731
    spec = BundleSpec(
        template="logreg",
        features=[
            FeatureSpec(
                "ml_users:age", "ml_users__age", "int", "user", mean=mean(ages), std=std(ages)
            ),
            FeatureSpec("ml_users:gender", "ml_users__gender", "categorical", "user", buckets=8),
            FeatureSpec(
                "ml_users:occupation", "ml_users__occupation", "categorical", "user", buckets=64
            ),
            FeatureSpec(
                "ml_items:year", "ml_items__year", "int", "item", mean=mean(years), std=std(years)
            ),
            *(FeatureSpec(f"ml_items:{g}", f"ml_items__{g}", "float", "item") for g in GENRES),
        ],
        entity_keys={"user": ["user_id"], "item": ["item_id"]},
    )
    n = len(table["clicked"])
    dense, cat = FeatureEncoder(spec).encode(table, n)
    y = torch.tensor(table["clicked"], dtype=torch.float32)
    torch.manual_seed(0)
    model = build_model(spec)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    d, c = torch.from_numpy(dense), torch.from_numpy(cat)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(d, c), y)
        loss.backward()
        opt.step()
    ctx.log(f"trained {name}: {epochs} epochs, loss {loss.item():.4f}")
    return save_bundle(Path(settings.ARTIFACT_ROOT) / "bench-bundles" / name, model, spec)


def _register(seed: dict, bundle: Path, name: str):
    from django.conf import settings

    from training.models import JobState, TrainingJob

    return TrainingJob.objects.create(
        workspace=seed["workspace"],
        name=name,
        template="logreg",
        dataset=seed["dataset"],
        state=JobState.SUCCEEDED,
        model_path=str(bundle.relative_to(Path(settings.ARTIFACT_ROOT))),
    )


# --------------------------------------------------------------------------------------------


def _run(ctx: Context) -> dict[str, float]:
    import torch
    from django.conf import settings

    from serving.deployments import deployment_create, deployment_release
    from serving.pipeline import gates_and_deploy
    from serving.registry import model_version_register
    from serving.routing import routing_experiment_set

    torch.set_num_threads(1)
    # Point this process at the same stores as the servers it starts.
    settings.ARTIFACT_ROOT = str(ctx.workdir / "artifacts")
    settings.CACHE_KEY_PREFIX = ctx.database_env["CACHE_KEY_PREFIX"]
    settings.ONLINE_STORE_SQLITE_PATH = ctx.workdir / "online.sqlite3"
    settings.MLFLOW_TRACKING_URI = f"sqlite:///{ctx.workdir / 'mlflow.db'}"
    settings.MLFLOW_ARTIFACT_ROOT = str(ctx.workdir / "mlflow-artifacts")
    seed = _seed(ctx)
    ws = seed["workspace"]
    versions = []
    for k, epochs in enumerate((60, 30)):
        job = _register(seed, _train(ctx, seed, epochs=epochs, name=f"m{k}"), f"bench-{k}")
        version = model_version_register(actor=seed["user"], workspace=ws, name="ranker", job=job)
        version = gates_and_deploy(actor=seed["user"], workspace=ws, version=version)
        if version.gate_status != "passed":
            raise BenchError(f"{version} failed its gates: {version.gates}")
        versions.append(version)
    v1, v2 = versions
    ctx.parameters["gates"] = {
        g: {k: r.get(k) for k in ("status", "p50_ms", "p99_ms", "rps", "max_score_diff")}
        for g, r in v1.gates.items()
    }
    for name in ("ranker", "plain", "exp", "rb"):
        deployment_create(actor=seed["user"], workspace=ws, name=name, version=v1)
    routing_experiment_set(
        actor=seed["user"],
        workspace=ws,
        deployment="exp",
        experiment_key="bench-exp",
        layer="ranking",
        salt="bench",
        allocations=[
            {"arm": "control", "version_id": v1.pk, "start": 0, "end": 5000},
            {"arm": "treatment", "version_id": v2.pk, "start": 5000, "end": 10000},
        ],
    )
    rb = deployment_release(
        actor=seed["user"],
        workspace=ws,
        deployment=__import__("serving.models", fromlist=["x"])
        .Deployment.objects.for_workspace(ws)
        .get(name="rb"),
        version=v2,
        reason="bench",
    )

    rng = random.Random(11)
    item_ids = seed["item_ids"]
    candidate_sets = [rng.sample(item_ids, CANDIDATES) for _ in range(50)]
    from serving.inference import MODELS

    loaded = MODELS.get(v1.pk)
    # Raw feature rows of each candidate set (user u1's features + the items'), for OIP/MLflow.
    from features.lookup import online_lookup

    user_vals = online_lookup(workspace=ws, entities=["u1"], features=loaded.plan.lookups["user"])
    oip_bodies, mlflow_bodies, expected = [], [], []
    for cands in candidate_sets:
        items = online_lookup(workspace=ws, entities=cands, features=loaded.plan.lookups["item"])
        columns: dict[str, list] = {}
        for i, ref in enumerate(user_vals["features"]):
            columns[ref] = [user_vals["rows"][0][i]] * CANDIDATES
        for i, ref in enumerate(items["features"]):
            columns[ref] = [row[i] for row in items["rows"]]
        by_column = {f.column: columns[f.ref] for f in loaded.bundle.spec.features}
        expected.append(loaded.bundle.predict(by_column, CANDIDATES))
        oip_bodies.append(
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": col,
                            "datatype": "BYTES"
                            if isinstance(next((v for v in vals if v is not None), 0), str)
                            else "FP64",
                            "shape": [CANDIDATES],
                            "data": vals,
                        }
                        for col, vals in by_column.items()
                    ]
                }
            ).encode()
        )
        cols = list(by_column)
        mlflow_bodies.append(
            json.dumps(
                {
                    "dataframe_split": {
                        "columns": cols,
                        "data": [[by_column[c][r] for c in cols] for r in range(CANDIDATES)],
                    }
                }
            ).encode()
        )
    predict_bodies = [
        json.dumps(
            {"deployment": "plain", "user": rng.choice(seed["user_ids"]), "candidates": cands}
        ).encode()
        for cands in candidate_sets
    ]

    measures: dict[str, float] = {}
    headers = {"Authorization": f"Token {seed['key']}"}
    env = {"ARTIFACT_ROOT": settings.ARTIFACT_ROOT, "DEBUG": "0"}
    with gunicorn_server(ctx, app="serving.wsgi", workers=2, threads=4, env=env) as port:
        http = Http(port, headers=headers)
        oip_path = f"/v2/models/{WS}.plain/infer"
        status, data = http.post(oip_path, oip_bodies[0])
        if status != 200:
            raise BenchError(f"OIP answered {status}: {data[:300]!r}")
        got = json.loads(data)["outputs"][0]["data"]
        if max(abs(a - b) for a, b in zip(got, expected[0], strict=True)) > 1e-6:
            raise BenchError("our OIP scores differ from the bundle's")
        ours = _timed(http, oip_path, oip_bodies, count=REQUESTS)
        measures["predict_p50_ms"] = percentile(ours, 50)
        measures["predict_p99_ms"] = percentile(ours, 99)
        measures["predict_rps"] = _throughput(port, oip_path, oip_bodies, headers)
        ctx.log(
            f"ours: p50 {measures['predict_p50_ms']:.2f} ms, "
            f"p99 {measures['predict_p99_ms']:.2f} ms, {measures['predict_rps']:.0f}/s"
        )

        full = _timed(http, f"/api/v1/workspaces/{WS}/predict/", predict_bodies, count=REQUESTS)
        measures["predict_full_p50_ms"] = percentile(full, 50)
        measures["predict_full_p99_ms"] = percentile(full, 99)

        # Routing overhead: interleave a deployment with an experiment and one without.
        plain_t, exp_t = [], []
        for i in range(WARMUP + REQUESTS):
            cands = candidate_sets[i % len(candidate_sets)]
            user = seed["user_ids"][i % len(seed["user_ids"])]
            for name, sink in (("exp", exp_t), ("plain", plain_t)):
                body = json.dumps({"deployment": name, "user": user, "candidates": cands}).encode()
                started = time.perf_counter()
                status, data = http.post(f"/api/v1/workspaces/{WS}/predict/", body)
                if status != 200:
                    raise BenchError(f"predict answered {status}: {data[:200]!r}")
                if i >= WARMUP:
                    sink.append((time.perf_counter() - started) * 1000)
        http_diff = percentile(exp_t, 50) - percentile(plain_t, 50)
        ctx.parameters["routing_p50_ms"] = {
            "with_experiment": percentile(exp_t, 50),
            "without": percentile(plain_t, 50),
        }
        from serving.routing import route, routing_table

        table = routing_table(ws, "exp")
        plain_table = routing_table(ws, "plain")
        users = seed["user_ids"]
        t0 = time.perf_counter()
        for i in range(100_000):
            route(table, users[i % len(users)])
        t1 = time.perf_counter()
        for i in range(100_000):
            route(plain_table, users[i % len(users)])
        t2 = time.perf_counter()
        ctx.parameters["route_call_us"] = {
            "with_experiment": (t1 - t0) * 10,
            "without": (t2 - t1) * 10,
        }
        # The HTTP medians differ by less than their noise; never report less than the measured
        # in-process cost of routing with an experiment layer.
        call_diff_ms = ((t1 - t0) - (t2 - t1)) / 100_000 * 1000
        measures["routing_overhead_ms"] = max(http_diff, call_diff_ms)
        http.close()

        # Rollback under load.
        results: list[tuple[float, int, int | None]] = []
        stop = threading.Event()

        def load(k: int) -> None:
            client = Http(port, headers=headers)
            i = k
            while not stop.is_set():
                body = json.dumps(
                    {
                        "deployment": "rb",
                        "user": users[i % len(users)],
                        "candidates": candidate_sets[i % 50],
                    }
                ).encode()
                sent = time.perf_counter()
                try:
                    status, data = client.post(f"/api/v1/workspaces/{WS}/predict/", body)
                    version = json.loads(data).get("version") if status == 200 else None
                except OSError:
                    status, version = 0, None
                results.append((sent, status, version))
                i += 3
            client.close()

        threads = [threading.Thread(target=load, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        admin = Http(port, headers=headers)
        rollback_sent = time.perf_counter()
        status, data = admin.post(
            f"/api/v1/workspaces/{WS}/deployments/rb/rollback/",
            json.dumps({"reason": "bench: dirty model"}).encode(),
        )
        rollback_done = time.perf_counter()
        if status != 202:  # accepted: traffic moved at the commit, the controller follows
            stop.set()
            raise BenchError(f"rollback answered {status}: {data[:300]!r}")
        time.sleep(2.5)
        stop.set()
        for t in threads:
            t.join()
        late = [sent for sent, st, v in results if v == v2.version and sent >= rollback_sent]
        # From sending the rollback until the last request that still got the old version was
        # sent (requests sent before the commit legitimately get it).
        measures["rollback_s"] = max(late, default=rollback_sent) - rollback_sent
        measures["rollback_failed_requests"] = float(sum(1 for _, st, _ in results if st != 200))
        after = [v for sent, st, v in results if sent >= rollback_done + 1.0]
        ctx.parameters["rollback"] = {
            "requests": len(results),
            "api_s": rollback_done - rollback_sent,
            "after_1s_versions": sorted({v for v in after if v is not None}),
            "rolled_back_to": v1.version,
        }
        if not after or set(after) != {v1.version}:
            raise BenchError(f"responses 1 s after the rollback carry {set(after)}")

    # The peer: mlflow models serve, same bundle as a pyfunc.
    python = peer_venv("mlflow", MLFLOW_REQUIREMENTS)
    mlflow_bin = python.parent / "mlflow"
    tracking = f"sqlite:///{ctx.workdir / 'peer-mlflow.db'}"
    bundle = Path(settings.ARTIFACT_ROOT) / v1.artifact_path
    out = subprocess.run(
        [
            str(python),
            str(PEER_DIR / "log_model.py"),
            str(bundle),
            str(REPO_ROOT / "training"),
            tracking,
        ],
        capture_output=True,
        text=True,
        cwd=ctx.workdir,
        timeout=600,
    )
    if out.returncode != 0:
        raise BenchError(f"logging the peer model failed: {out.stderr[-2000:]}")
    uri = out.stdout.strip().splitlines()[-1]
    peer_port = free_port()
    log_path = ctx.workdir / "mlflow-serve.log"
    peer_env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "DATABASE"))}
    peer_env.update(
        {
            "MLFLOW_TRACKING_URI": tracking,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(mlflow_bin),
                "models",
                "serve",
                "-m",
                uri,
                "-p",
                str(peer_port),
                "-h",
                "127.0.0.1",
                "--env-manager",
                "local",
                "--workers",
                "2",
            ],
            cwd=ctx.workdir,
            env=peer_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        peer = Http(peer_port)
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise BenchError(f"mlflow serve exited: {log_path.read_text()[-2000:]}")
            try:
                status, _ = peer.get("/ping")
                if status == 200:
                    break
            except OSError:
                peer.close()
            if time.monotonic() > deadline:
                raise BenchError("mlflow serve not ready after 180 s")
            time.sleep(0.3)
        status, data = peer.post("/invocations", mlflow_bodies[0])
        if status != 200:
            raise BenchError(f"mlflow answered {status}: {data[:300]!r}")
        got = json.loads(data)["predictions"]
        if max(abs(a - b) for a, b in zip(got, expected[0], strict=True)) > 1e-6:
            raise BenchError("mlflow's scores differ from ours")
        theirs = _timed(peer, "/invocations", mlflow_bodies, count=REQUESTS)
        measures["predict_p50_ms_mlflow"] = percentile(theirs, 50)
        measures["predict_p99_ms_mlflow"] = percentile(theirs, 99)
        measures["predict_rps_mlflow"] = _throughput(peer_port, "/invocations", mlflow_bodies, {})
        peer.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    measures["predict_rps_vs_mlflow_ratio"] = (
        measures["predict_rps"] / measures["predict_rps_mlflow"]
    )
    measures["predict_p99_vs_mlflow_ratio"] = (
        measures["predict_p99_ms"] / measures["predict_p99_ms_mlflow"]
    )
    ctx.parameters["goals"] = {
        "rps_3x_mlflow": measures["predict_rps_vs_mlflow_ratio"] >= 3,
        "p99_half_mlflow": measures["predict_p99_vs_mlflow_ratio"] <= 0.5,
        "routing_overhead_le_0_2ms": measures["routing_overhead_ms"] <= 0.2,
        "rollback_le_1s": measures["rollback_s"] <= 1.0,
        "rollback_no_failures": measures["rollback_failed_requests"] == 0,
    }
    ctx.parameters.update({"candidates": CANDIDATES, "requests": REQUESTS, "ratings": RATINGS})
    _ = rb
    return measures


def run(ctx: Context) -> dict[str, float]:
    return _run(ctx)
