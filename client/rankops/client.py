"""The RankOps client: every REST operation by its OpenAPI ``operationId``, plus the journeys an
algorithm engineer scripts (features in as pandas, datasets out as pandas, jobs waited on with a
progress bar).

The generic layer (:meth:`Client.call`, :meth:`Client.iterate`) dispatches through the generated
:data:`rankops.operations.OPERATIONS` table, so any operation the server's schema has is
reachable; the named methods below are thin, documented wrappers over it.
"""

from __future__ import annotations

import io
import json as jsonlib
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypedDict, Unpack
from urllib.parse import quote

import httpx

from rankops import config
from rankops.errors import (
    ApiError,
    JobFailed,
    RankOpsError,
    TimeoutExpired,
    TransportError,
    error_for,
)
from rankops.operations import OPERATIONS

RETRY_STATUSES = {429, 502, 503, 504}
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
JOB_DONE = {"succeeded", "failed", "cancelled", "canceled"}
PARQUET = "application/vnd.apache.parquet"


def _json_default(value: Any) -> Any:
    """JSON for what DataFrames hold: timestamps, numpy scalars and arrays."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class RequestBody(TypedDict, total=False):
    """What one request sends besides its method and path (``Client.request``'s keywords)."""

    json: Any  # encoded as JSON (the content type defaults to application/json)
    params: dict[str, Any] | None  # the query; None values are left out
    content: bytes | None
    content_type: str | None
    files: Any  # multipart parts, as httpx takes them
    headers: dict[str, str] | None
    idempotency_key: str | None  # a write's Idempotency-Key (a fresh one when None)


class Client:
    """A session with one RankOps server.

    ``url``/``token``/``workspace`` default to ``RANKOPS_URL``/``RANKOPS_TOKEN``/
    ``RANKOPS_WORKSPACE`` and then to the profile ``rankops login`` wrote. ``retries`` bounds
    the attempts after the first: reads and connection failures are always retried; a write
    that reached the server is retried only when its operation honours ``Idempotency-Key``
    (every write is sent with one, so the server can deduplicate it).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        workspace: str | None = None,
        profile: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        settings = config.resolve(url=url, token=token, workspace=workspace, profile=profile)
        self.url = settings.url
        self.token = settings.token
        self.workspace = settings.workspace
        self.retries = retries
        self.backoff = backoff
        headers = {"Accept": "application/json", "User-Agent": "rankops-client/0.1"}
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # ----------------------------------------------------------------- the generic layer

    @staticmethod
    def operations() -> dict[str, dict[str, Any]]:
        """Every operation the client can call, by ``operationId``."""
        return OPERATIONS

    def path_for(self, operation: str, **path_params: Any) -> str:
        """The concrete path of ``operation``; ``ws`` defaults to the client's workspace."""
        try:
            op = OPERATIONS[operation]
        except KeyError:
            raise RankOpsError(f"unknown operation {operation!r}") from None
        values = dict(path_params)
        if "ws" in op["path_params"] and values.get("ws") is None:
            if not self.workspace:
                raise RankOpsError(
                    f"{operation} needs a workspace: pass ws=, set RANKOPS_WORKSPACE "
                    "or `rankops login --workspace`"
                )
            values["ws"] = self.workspace
        missing = [p for p in op["path_params"] if values.get(p) is None]
        if missing:
            raise RankOpsError(f"{operation} needs {', '.join(missing)}")
        path = op["path"]
        for name in op["path_params"]:
            path = path.replace("{" + name + "}", quote(str(values[name]), safe=""))
        return path

    def call(
        self,
        operation: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        files: Any = None,
        headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        raw: bool = False,
        **path_params: Any,
    ) -> Any:
        """Call one operation and return its decoded JSON (or the response when ``raw``).

        Raises the :mod:`rankops.errors` exception for the answer's status, carrying the
        envelope's ``code`` and ``attr``.
        """
        op = OPERATIONS.get(operation)
        if op is None:
            raise RankOpsError(f"unknown operation {operation!r}")
        path = self.path_for(operation, **path_params)
        body = RequestBody(
            json=json,
            params=params,
            content=content,
            content_type=content_type,
            files=files,
            headers=headers,
            idempotency_key=idempotency_key,
        )
        retry = op["idempotent_key"]
        return self.request(
            op["method"], path, retry_writes=retry, raw=raw, operation=operation, **body
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        retry_writes: bool = False,
        raw: bool = False,
        operation: str = "",
        **body: Unpack[RequestBody],
    ) -> Any:
        """One HTTP exchange with retries (see the class docstring) and typed errors."""
        json, content = body.get("json"), body.get("content")
        content_type, files = body.get("content_type"), body.get("files")
        headers, idempotency_key = body.get("headers"), body.get("idempotency_key")
        params = body.get("params")
        sent_headers = dict(headers or {})
        is_write = method.upper() in WRITE_METHODS
        if is_write:
            sent_headers["Idempotency-Key"] = idempotency_key or uuid.uuid4().hex
        body: bytes | None = content
        if json is not None:
            body = jsonlib.dumps(json, default=_json_default).encode()
            content_type = content_type or "application/json"
        if content_type:
            sent_headers["Content-Type"] = content_type
        query = {k: v for k, v in (params or {}).items() if v is not None}
        attempt = 0
        while True:
            try:
                response = self.http.request(
                    method, path, params=query, content=body, files=files, headers=sent_headers
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Never reached the server: safe to try again whatever the method.
                if attempt >= self.retries:
                    raise TransportError(f"{method} {path}: {exc}") from exc
            except httpx.TransportError as exc:
                if (is_write and not retry_writes) or attempt >= self.retries:
                    raise TransportError(f"{method} {path}: {exc}") from exc
            else:
                retryable = response.status_code in RETRY_STATUSES or (
                    response.status_code >= 500 and not is_write
                )
                # A 429 was refused before anything was done: safe to resend even a write.
                safe = not is_write or retry_writes or response.status_code == 429
                if retryable and safe and attempt < self.retries:
                    attempt += 1
                    self._sleep(attempt, response)
                    continue
                if response.status_code >= 400:
                    raise error_for(response.status_code, _decode(response), operation=operation)
                if raw:
                    return response
                return _decode(response)
            attempt += 1
            self._sleep(attempt, None)

    def _sleep(self, attempt: int, response: httpx.Response | None) -> None:
        wait = self.backoff * 2 ** (attempt - 1) * (0.5 + random.random())  # noqa: S311
        if response is not None and response.headers.get("Retry-After", "").isdigit():
            wait = max(wait, float(response.headers["Retry-After"]))
        time.sleep(min(wait, 30.0))

    def iterate(
        self, operation: str, *, page_size: int = 100, params: dict[str, Any] | None = None, **kw
    ) -> Iterator[dict[str, Any]]:
        """Every row of a paginated list operation, page by page (LimitOffset) as it is read."""
        op = OPERATIONS[operation]
        query = dict(params or {})
        if not op["paginated"]:
            page = self.call(operation, params=query, **kw)
            yield from page if isinstance(page, list) else page.get("results", [page])
            return
        offset = int(query.pop("offset", 0))
        while True:
            page = self.call(
                operation, params={**query, "limit": page_size, "offset": offset}, **kw
            )
            rows = page.get("results", [])
            yield from rows
            offset += len(rows)
            if not page.get("next") or not rows:
                return

    # ------------------------------------------------------------------- auth, workspaces

    def login(self, username: str, password: str, *, name: str = "rankops-cli") -> str:
        """Exchange a username and password for a token, and use it from now on."""
        issued = self.call(
            "v1_auth_token_create", json={"username": username, "password": password, "name": name}
        )
        self.token = issued["token"]
        self.http.headers["Authorization"] = f"Token {self.token}"
        return self.token

    def workspaces(self) -> list[dict[str, Any]]:
        return list(self.iterate("v1_workspaces_list"))

    # ------------------------------------------------------------------------- features

    def register_feature_group(
        self,
        name: str,
        *,
        entity: str,
        entity_keys: list[str] | str,
        features: list[dict[str, Any]] | Any,
        ws: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Register a feature group; ``features`` is ``[{name, dtype}, ...]`` or a DataFrame
        whose non-key columns (and dtypes) become the features."""
        keys = [entity_keys] if isinstance(entity_keys, str) else list(entity_keys)
        if hasattr(features, "dtypes"):
            features = features_from_frame(features, exclude={*keys, "event_time"})
        body = {"name": name, "entity": entity, "entity_keys": keys, "features": features}
        return self.call("v1_workspaces_feature_groups_create", json={**body, **fields}, ws=ws)

    def feature_groups(self, ws: str | None = None) -> list[dict[str, Any]]:
        return list(self.iterate("v1_workspaces_feature_groups_list", ws=ws))

    def push(
        self,
        group: str,
        data: Any,
        *,
        idempotency_key: str | None = None,
        ws: str | None = None,
    ) -> dict[str, Any]:
        """Push rows to a feature group: a pandas DataFrame or pyarrow Table (sent as Parquet),
        a ``.parquet``/``.csv`` file path, or a list of row dicts (sent as JSON). The batch goes
        with an ``Idempotency-Key`` (yours, or a fresh one reused on every retry), so a retried
        push is stored once."""
        key = idempotency_key or uuid.uuid4().hex
        common = {"name": group, "ws": ws, "idempotency_key": key}
        if isinstance(data, (str, Path)):
            path = Path(data)
            kind = "text/csv" if path.suffix.lower() == ".csv" else PARQUET
            return self.call(
                "v1_workspaces_feature_groups_batches_create",
                content=path.read_bytes(),
                content_type=kind,
                **common,
            )
        if isinstance(data, list):
            return self.call(
                "v1_workspaces_feature_groups_batches_create", json={"rows": data}, **common
            )
        return self.call(
            "v1_workspaces_feature_groups_batches_create",
            content=to_parquet_bytes(data),
            content_type=PARQUET,
            **common,
        )

    def lookup(
        self, entities: Iterable[Any], features: Iterable[str], *, ws: str | None = None
    ) -> Any:
        """Online feature lookup as a DataFrame (one row per entity)."""
        import pandas as pd

        wanted = list(entities)
        answer = self.call(
            "v1_workspaces_online_features_create",
            json={"entities": wanted, "features": list(features)},
            ws=ws,
        )
        # Nullable dtypes: a missing int stays an int column with <NA>, not floats with NaN.
        frame = pd.DataFrame(answer["rows"], columns=answer["features"]).convert_dtypes()
        if wanted and not isinstance(wanted[0], dict):
            frame.insert(0, "entity", wanted)
        elif wanted:
            keys = pd.DataFrame(wanted)
            frame = pd.concat([keys, frame], axis=1)
        return frame

    # ------------------------------------------------------------------------- datasets

    def build_dataset(
        self,
        name: str,
        *,
        label_source: str,
        label_columns: list[str],
        features: list[str],
        wait: bool = True,
        timeout: float = 600,
        ws: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Build a point-in-time dataset; with ``wait`` poll it until it is ``ready``."""
        body = {
            "name": name,
            "label_source": label_source,
            "label_columns": label_columns,
            "features": features,
            **fields,
        }
        dataset = self.call("v1_workspaces_datasets_create", json=body, ws=ws)
        if not wait:
            return dataset
        return self._poll(
            lambda: self.call("v1_workspaces_datasets_retrieve", id=dataset["id"], ws=ws),
            done=lambda d: d["status"] in ("ready", "failed"),
            failed=lambda d: d["status"] == "failed",
            what=f"dataset {name}",
            timeout=timeout,
        )

    def dataset_frame(self, dataset_id: int, *, ws: str | None = None) -> Any:
        """A ready dataset's rows as a pandas DataFrame (its Parquet file, read by pyarrow)."""
        import pyarrow.parquet as pq

        response = self.call("v1_workspaces_datasets_file_retrieve", id=dataset_id, ws=ws, raw=True)
        return pq.read_table(io.BytesIO(response.content)).to_pandas()

    # ------------------------------------------------------------------------- training

    def templates(self, ws: str | None = None) -> list[dict[str, Any]]:
        return list(self.iterate("v1_workspaces_training_templates_list", ws=ws))

    def template(self, name: str, *, ws: str | None = None) -> dict[str, Any]:
        return self.call("v1_workspaces_training_templates_retrieve", name=name, ws=ws)

    def train(
        self,
        name: str,
        *,
        dataset: int,
        template: str | None = None,
        params: dict[str, Any] | None = None,
        ws: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Submit a training job (a template with its typed params, on a dataset)."""
        body: dict[str, Any] = {"name": name, "dataset": dataset, **fields}
        if template:
            body["template"] = template
        if params:
            body["params"] = params
        return self.call("v1_workspaces_training_jobs_create", json=body, ws=ws)

    def job(self, job_id: int, *, ws: str | None = None) -> dict[str, Any]:
        return self.call("v1_workspaces_training_jobs_retrieve", id=job_id, ws=ws)

    def job_log(
        self,
        job_id: int,
        *,
        follow: bool = False,
        interval: float = 1.0,
        timeout: float = 3600,
        ws: str | None = None,
    ) -> Iterator[str]:
        """The job's log: its state changes, what its node agent and training child wrote (the
        log file, read on from where the last read ended) and every metric it reports, as
        lines; with ``follow`` keep reading until the job ends (like ``tail -f``)."""
        seen_metrics = 0
        offset = 0
        last_state = None
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id, ws=ws)
            if job["state"] != last_state:
                reason = f" ({job['state_reason']})" if job.get("state_reason") else ""
                node = f" on {job['node']}" if job.get("node") else ""
                yield f"state {job['state']}{node}{reason}"
                last_state = job["state"]
            while True:
                chunk = self.call(
                    "v1_workspaces_training_jobs_log_retrieve",
                    id=job_id,
                    params={"offset": offset},
                    ws=ws,
                )
                for line in chunk["text"].splitlines():
                    if line.strip():
                        yield line
                read_to = chunk["next_offset"]
                if read_to == offset or read_to >= chunk["size"]:
                    offset = read_to
                    break
                offset = read_to
            metrics = list(
                self.iterate("v1_workspaces_training_jobs_metrics_list", id=job_id, ws=ws)
            )
            for row in metrics[seen_metrics:]:
                yield "metric " + " ".join(
                    f"{k}={row[k]}" for k in ("name", "step", "epoch", "value") if k in row
                )
            seen_metrics = max(seen_metrics, len(metrics))
            if not follow or job["state"] in JOB_DONE:
                if job["state"] == "succeeded" and job.get("metrics"):
                    yield "result " + jsonlib.dumps(job["metrics"], default=str)[:2000]
                return
            if time.monotonic() > deadline:
                raise TimeoutExpired(f"job {job_id} still {job['state']} after {timeout} s")
            time.sleep(interval)

    def wait_job(
        self,
        job_id: int,
        *,
        timeout: float = 3600,
        interval: float = 1.0,
        progress: bool = True,
        on_log: Callable[[str], None] | None = None,
        ws: str | None = None,
    ) -> dict[str, Any]:
        """Wait for a training job to end, with a tqdm progress bar (steps done of total) and
        its log lines passed to ``on_log``. Returns the job; raises :class:`JobFailed` if it did
        not succeed, :class:`TimeoutExpired` past ``timeout``."""
        from tqdm import tqdm

        bar = tqdm(total=1.0, unit="job", disable=not progress, bar_format="{l_bar}{bar}| {desc}")
        try:
            for line in self.job_log(
                job_id, follow=True, interval=interval, timeout=timeout, ws=ws
            ):
                if on_log:
                    on_log(line)
                job = self.job(job_id, ws=ws)
                share = job.get("progress") or 0.0
                bar.n = min(float(share), 1.0)
                loss = f" loss={job['loss']:.4g}" if isinstance(job.get("loss"), float) else ""
                bar.set_description_str(f"{job['state']}{loss}")
                bar.refresh()
        finally:
            bar.close()
        job = self.job(job_id, ws=ws)
        if job["state"] != "succeeded":
            raise JobFailed(
                f"job {job_id} {job['state']}: {job.get('state_reason') or ''}".strip(),
                state=job["state"],
                body=job,
            )
        return job

    def tune(
        self,
        name: str,
        *,
        dataset: int,
        template: str,
        space: dict[str, Any],
        n_trials: int = 10,
        ws: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Start a hyper-parameter search; its trials are child training jobs."""
        body = {
            "name": name,
            "dataset": dataset,
            "template": template,
            "space": space,
            "n_trials": n_trials,
            **fields,
        }
        return self.call("v1_workspaces_tuning_jobs_create", json=body, ws=ws)

    # --------------------------------------------------------------- models and serving

    def models(self, ws: str | None = None) -> list[dict[str, Any]]:
        return list(self.iterate("v1_workspaces_models_list", ws=ws))

    def register_model(
        self,
        model: str,
        *,
        job_id: int,
        run_gates: bool = True,
        ws: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Register a trained job's bundle as a new version of ``model``; with ``run_gates``
        the release gates run at once (a version deploys only once they passed)."""
        return self.call(
            "v1_workspaces_model_versions_create",
            json={"model": model, "job_id": job_id, "run_gates": run_gates, **fields},
            ws=ws,
        )

    def deploy(
        self, name: str, *, version_id: int, ws: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Create a deployment serving ``version_id``."""
        return self.call(
            "v1_workspaces_deployments_create",
            json={"name": name, "version_id": version_id, **fields},
            ws=ws,
        )

    # ---------------------------------------------------------------------- experiments

    def launch_experiment(
        self,
        key: str,
        *,
        deployment: str,
        treatment_versions: list[int],
        hypothesis: str,
        submit: bool = True,
        ws: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Create an A/B experiment on a deployment and (``submit``) send it to review, which
        starts it when the workspace's policy approves it."""
        body = {
            "key": key,
            "deployment": deployment,
            "treatment_versions": treatment_versions,
            "hypothesis": hypothesis,
            **fields,
        }
        experiment = self.call("v1_workspaces_experiments_create", json=body, ws=ws)
        if submit:
            experiment = self.call("v1_workspaces_experiments_submit_create", key=key, ws=ws)
        return experiment

    def experiment(self, key: str, *, ws: str | None = None) -> dict[str, Any]:
        return self.call("v1_workspaces_experiments_retrieve", key=key, ws=ws)

    def analysis(self, key: str, *, ws: str | None = None) -> dict[str, Any]:
        return self.call("v1_workspaces_experiments_analysis_retrieve", key=key, ws=ws)

    def conclude(
        self,
        key: str,
        *,
        action: str,
        arm: str | None = None,
        note: str = "",
        ws: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"action": action, "note": note}
        if arm:
            body["arm"] = arm
        return self.call("v1_workspaces_experiments_conclude_create", json=body, key=key, ws=ws)

    # ---------------------------------------------------------------- the loop, lineage

    def loop(
        self,
        group: str,
        *,
        deployment: str | None = None,
        features: list[str] | None = None,
        ws: str | None = None,
    ) -> dict[str, Any]:
        """The one action: a feature group to a running A/B experiment (a pipeline run)."""
        body: dict[str, Any] = {"group": group}
        if deployment:
            body["deployment"] = deployment
        if features:
            body["features"] = features
        return self.call("v1_workspaces_loops_create", json=body, ws=ws)

    def wait_loop(
        self,
        loop_id: int,
        *,
        timeout: float = 1800,
        interval: float = 1.0,
        on_stage: Callable[[dict[str, Any]], None] | None = None,
        ws: str | None = None,
    ) -> dict[str, Any]:
        """Poll a loop until it ends; ``on_stage`` sees each stage once when its state changes.
        Raises :class:`JobFailed` when the loop fails."""
        seen: dict[str, str] = {}

        def read() -> dict[str, Any]:
            run = self.call("v1_workspaces_loops_retrieve", id=loop_id, ws=ws)
            for stage in run.get("stages", []):
                if on_stage and seen.get(stage.get("name")) != stage.get("state"):
                    seen[stage.get("name")] = stage.get("state")
                    on_stage(stage)
            return run

        return self._poll(
            read,
            done=lambda r: r.get("state") in ("succeeded", "failed", "cancelled"),
            failed=lambda r: r.get("state") != "succeeded",
            what=f"loop {loop_id}",
            timeout=timeout,
            interval=interval,
        )

    def lineage(
        self,
        node: str,
        *,
        direction: str | None = None,
        depth: int | None = None,
        ws: str | None = None,
    ) -> dict[str, Any]:
        """The lineage graph around ``kind:id`` (e.g. ``model_version:12``)."""
        return self.call(
            "v1_workspaces_lineage_retrieve",
            params={"node": node, "direction": direction, "depth": depth},
            ws=ws,
        )

    # ------------------------------------------------------------------------- notebooks

    def open_notebook(
        self, *, wait: bool = False, timeout: float = 300, ws: str | None = None
    ) -> dict[str, Any]:
        """Your JupyterLab server in the workspace (the live one, or one started now); with
        ``wait``, once it runs (its ``url`` opens it). Raises ``JobFailed`` if it fails."""
        server = self.call("v1_workspaces_notebooks_create", json={}, ws=ws)
        if not wait:
            return server
        return self._poll(
            lambda: self.call("v1_workspaces_notebooks_retrieve", id=server["id"], ws=ws),
            done=lambda s: s.get("state") != "starting",
            failed=lambda s: s.get("state") != "running",
            what=f"notebook server {server['id']}",
            timeout=timeout,
        )

    def notebooks(self, *, ws: str | None = None) -> list[dict[str, Any]]:
        return list(self.iterate("v1_workspaces_notebooks_list", ws=ws))

    def stop_notebook(self, server_id: int, *, ws: str | None = None) -> dict[str, Any]:
        """Stop the server now (its kernels with it) and revoke its token."""
        return self.call("v1_workspaces_notebooks_stop_create", id=server_id, json={}, ws=ws)

    # ------------------------------------------------------------------------- helpers

    def _poll(
        self,
        read: Callable[[], dict[str, Any]],
        *,
        done: Callable[[dict[str, Any]], bool],
        failed: Callable[[dict[str, Any]], bool],
        what: str,
        timeout: float,
        interval: float = 0.5,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            value = read()
            if done(value):
                if failed(value):
                    state = str(value.get("state") or value.get("status"))
                    raise JobFailed(
                        f"{what} {state}: {value.get('error') or ''}".strip(),
                        state=state,
                        body=value,
                    )
                return value
            if time.monotonic() > deadline:
                raise TimeoutExpired(f"{what} not done after {timeout} s")
            time.sleep(interval)


def _decode(response: httpx.Response) -> Any:
    if not response.content:
        return None
    kind = response.headers.get("Content-Type", "")
    if "json" in kind:
        try:
            return response.json()
        except ValueError:
            return response.text
    return response.text if kind.startswith("text/") else response.content


_DTYPES = {"i": "int", "u": "int", "f": "float", "b": "bool", "O": "string"}


def features_from_frame(frame: Any, *, exclude: set[str]) -> list[dict[str, str]]:
    """Feature declarations ``[{name, dtype}]`` from a DataFrame's columns and dtypes."""
    return [
        {"name": str(col), "dtype": _DTYPES.get(frame[col].dtype.kind, "string")}
        for col in frame.columns
        if col not in exclude
    ]


def to_parquet_bytes(data: Any) -> bytes:
    """A DataFrame or Arrow table as Parquet bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


__all__ = ["ApiError", "Client"]
