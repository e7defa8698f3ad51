"""A model-server process: one bundle, scored in process. No Django needed.

    python -m serving.model_server sandbox --path DIR --candidates 100 --seconds 1.0
        Load the bundle, warm it, score synthetic requests of the workspace's request shape for
        the given time and print {"p50_ms", "p99_ms", "rps", "requests"} as JSON (the release
        gate's sandbox performance check runs exactly this, one process, one thread).
    python -m serving.model_server serve --path DIR --port 8801 [--name NAME] [--host ADDR]
        Serve the Open Inference Protocol (``/v2/health/live|ready``, ``/v2/models/NAME``,
        ``/v2/models/NAME/infer``) for the bundle; started and supervised by the local backend.
    python -m serving.model_server score --path DIR < {"columns": {...}, "n": N}
        Score one request of raw feature values read from stdin and print {"scores", "ms"}
        (the playground's sandbox replica: a version tried before it takes any traffic).

The path must be a platform-written bundle; the caller resolves it inside ARTIFACT_ROOT.
Weights are loaded with ``weights_only=True`` (``training.bundle.load_bundle``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np


def synthetic_columns(spec, n: int, seed: int = 0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    columns: dict[str, list] = {}
    for f in spec.features:
        if f.dtype == "embedding":
            columns[f.column] = rng.normal(size=(n, f.dim)).tolist()
        elif f.dtype in ("categorical", "string"):
            columns[f.column] = [f"v{int(x)}" for x in rng.integers(0, 1000, n)]
        elif f.dtype == "categorical_list":
            lengths = rng.integers(0, f.slots + 1, n)
            columns[f.column] = [[f"v{int(x)}" for x in rng.integers(0, 1000, k)] for k in lengths]
        elif f.dtype == "bool":
            columns[f.column] = (rng.random(n) > 0.5).tolist()
        else:
            columns[f.column] = rng.normal(f.mean, f.std or 1.0, n).tolist()
    return columns


def sandbox(bundle, *, candidates: int, seconds: float, windows: int = 3) -> dict[str, float]:
    """Score synthetic requests for ``seconds``, split into ``windows`` equal windows, and
    report the best window's p50/p99 and throughput (each window's too).

    Load from elsewhere on the machine only ever adds latency, so the best window estimates
    what the model itself costs (the rule ``timeit`` follows): one busy moment no longer fails
    a model that meets its limits."""
    columns = synthetic_columns(bundle.spec, candidates)
    for _ in range(5):
        bundle.predict(columns, candidates)
    runs = []
    for _ in range(max(1, windows)):
        latencies = []
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            bundle.predict(columns, candidates)
            t1 = time.perf_counter()
            latencies.append((t1 - t0) * 1000)
            if t1 - start >= seconds / max(1, windows) and len(latencies) >= 20:
                break
        arr = np.asarray(latencies)
        runs.append(
            {
                "p50_ms": float(np.percentile(arr, 50)),
                "p99_ms": float(np.percentile(arr, 99)),
                "rps": len(latencies) / (time.perf_counter() - start),
                "requests": len(latencies),
            }
        )
    return {
        "p50_ms": min(r["p50_ms"] for r in runs),
        "p99_ms": min(r["p99_ms"] for r in runs),
        "rps": max(r["rps"] for r in runs),
        "requests": sum(r["requests"] for r in runs),
        "candidates": candidates,
        "windows": runs,
    }


def score(bundle, columns: dict[str, list], n: int) -> dict[str, Any]:
    """One request's click probabilities, and the milliseconds the model took."""
    began = time.perf_counter()
    scores = bundle.predict(columns, n)
    return {"scores": [float(x) for x in scores], "ms": (time.perf_counter() - began) * 1000}


def oip_app(bundle, name: str, version: str = "1"):
    """A minimal WSGI app speaking OIP v2 JSON for one bundle, with the statistics extension's
    per-model counts (``/v2/models/NAME/stats``: successful inferences and rows scored)."""
    import threading

    from serving import oip

    counts = {"success": 0, "rows": 0}
    counting = threading.Lock()

    inputs = oip.model_inputs(bundle.spec.features)
    metadata = {
        "name": name,
        "versions": [version],
        "platform": "pytorch",
        "inputs": inputs,
        "outputs": oip.OUTPUTS,
    }

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        status, body, raw = "404 Not Found", {"error": "not found"}, b""
        extra: list[tuple[str, str]] = []
        if path in ("/v2/health/live", "/v2/health/ready"):
            status, body = "200 OK", {"live": True, "ready": True}
        elif path in ("/v2", "/v2/") and method == "GET":
            status, body = "200 OK", oip.SERVER
        elif path in (f"/v2/models/{name}", f"/v2/models/{name}/versions/{version}"):
            status, body = "200 OK", metadata
        elif path == f"/v2/models/{name}/stats" and method == "GET":
            with counting:
                stats = {"success": {"count": counts["success"]}, "rows": counts["rows"]}
            status = "200 OK"
            body = {
                "model_stats": [
                    {
                        "name": name,
                        "version": version,
                        "inference_count": stats["rows"],
                        "execution_count": stats["success"]["count"],
                        "inference_stats": stats,
                    }
                ]
            }
        elif path in (f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/{version}/infer"):
            try:
                size = int(environ.get("CONTENT_LENGTH") or 0)
                header, binary = oip.split_binary(
                    environ["wsgi.input"].read(size),
                    environ.get("HTTP_INFERENCE_HEADER_CONTENT_LENGTH"),
                )
                payload = json.loads(header or b"{}")
                columns, n, request_id = oip.decode_inputs(payload, binary)
                oip.check_outputs(payload)
                columns = oip.check_against(columns, n, inputs)
                scores = bundle.predict(columns, n)
                with counting:
                    counts["success"] += 1
                    counts["rows"] += n
                body, raw = oip.encode_outputs(
                    name, version, request_id, scores, binary=oip.wants_binary(payload)
                )
                status = "200 OK"
            except ValueError as exc:
                status, body = "400 Bad Request", {"error": str(exc)}
        data = json.dumps(body).encode()
        if raw:
            extra.append(("Inference-Header-Content-Length", str(len(data))))
            data += raw
        content_type = "application/octet-stream" if raw else "application/json"
        start_response(
            status,
            [("Content-Type", content_type), ("Content-Length", str(len(data))), *extra],
        )
        return [data]

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serving.model_server")
    parser.add_argument("command", choices=["sandbox", "serve", "score"])
    parser.add_argument("--path", required=True)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--port", type=int, default=8801)
    # The loopback for a replica of the local backend; a pod binds every address (--host
    # 0.0.0.0) so that its probes and its Service reach it.
    parser.add_argument("--host", default="127.0.0.1")
    # "cuda": a torch model's weights on the GPU when the machine has one (a GPU deployment's
    # pod, which requests nvidia.com/gpu); the CPU otherwise, and always for other models.
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--name", default="model")
    parser.add_argument("--version", default="1")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    import serving.flavors  # noqa: F401  (registers the imported-model templates)
    from training.bundle import load_bundle

    bundle = load_bundle(args.path)
    if args.command == "serve":
        bundle.to(args.device)
    if args.command == "sandbox":
        print(json.dumps(sandbox(bundle, candidates=args.candidates, seconds=args.seconds)))
        return 0
    if args.command == "score":
        # One request from stdin: {"columns": {column or ref: [values]}, "n": rows}.
        request = json.loads(sys.stdin.read())
        print(json.dumps(score(bundle, request["columns"], int(request["n"]))))
        return 0
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, *a):
            pass

    server = make_server(
        args.host, args.port, oip_app(bundle, args.name, args.version), handler_class=Quiet
    )
    print(json.dumps({"ready": True, "port": args.port, "device": bundle.device}), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
