"""The ``rankops`` command line, on the same :class:`rankops.Client` scripts use.

Human tables by default, ``--json`` for scripts. Exit codes (also in ``rankops --help``):

==  ==========================================================
0   success
1   unexpected error
2   bad usage (click: unknown option, missing argument)
3   not configured or not authenticated (no URL/token, 401)
4   forbidden (403: the role does not allow it)
5   not found (404)
6   conflict (409)
7   rejected input (400, 413: the field is named)
8   the job, dataset or loop ended failed or cancelled
9   timed out waiting
10  server error or unreachable (5xx, connection)
==  ==========================================================

Shell completion is click's: ``eval "$(_RANKOPS_COMPLETE=bash_source rankops)"`` (zsh_source,
fish_source for the other shells).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from rankops import config, errors, views

EXIT_CODES = {
    "ok": 0,
    "error": 1,
    "usage": 2,
    "auth": 3,
    "forbidden": 4,
    "not_found": 5,
    "conflict": 6,
    "invalid": 7,
    "failed": 8,
    "timeout": 9,
    "server": 10,
}


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code for an exception the client raised."""
    if isinstance(exc, errors.ConfigError | errors.Unauthorized):
        return EXIT_CODES["auth"]
    if isinstance(exc, errors.Forbidden):
        return EXIT_CODES["forbidden"]
    if isinstance(exc, errors.NotFound):
        return EXIT_CODES["not_found"]
    if isinstance(exc, errors.Conflict):
        return EXIT_CODES["conflict"]
    if isinstance(exc, errors.BadRequest | errors.PayloadTooLarge):
        return EXIT_CODES["invalid"]
    if isinstance(exc, errors.JobFailed):
        return EXIT_CODES["failed"]
    if isinstance(exc, errors.TimeoutExpired):
        return EXIT_CODES["timeout"]
    if isinstance(exc, errors.ServerError | errors.TransportError):
        return EXIT_CODES["server"]
    return EXIT_CODES["error"]


class State:
    """What the global options chose, and the client built from them on first use."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.as_json: bool = options.pop("as_json")
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from rankops.client import Client

            self._client = Client(**self.options)
        return self._client


pass_state = click.make_pass_decorator(State)


def emit(state: State, value: Any, columns: list[str] | tuple[str, ...] | None = None) -> None:
    """Print ``value`` as JSON (``--json``) or as a table / key-value list for people."""
    if state.as_json:
        click.echo(json.dumps(value, indent=2, default=str))
        return
    if isinstance(value, list):
        click.echo(views.table(value, columns))
    elif isinstance(value, dict):
        click.echo(views.pairs(value))
    elif value is not None:
        click.echo(value)


def emit_answer(state: State, body: dict[str, Any], operation: str) -> None:
    """``operation``'s answer: whole with ``--json``, else the fields people read
    (``views.FIELDS``)."""
    emit(state, body if state.as_json else views.pick(body, operation))


def parse_pairs(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint=what)
        key, value = pair.split("=", 1)
        out[key] = value
    return out


def typed_params(template: dict[str, Any], raw: dict[str, str]) -> dict[str, Any]:
    """Template params from ``KEY=VALUE`` strings, typed by the template's schema (so ``lr=0.1``
    is a float and ``hidden=64,32`` an int list); an unknown name is a usage error naming the
    template's params."""
    schema = template.get("params", {})
    typed: dict[str, Any] = {}
    for name, text in raw.items():
        spec = schema.get(name)
        if spec is None:
            known = ", ".join(sorted(schema))
            raise click.BadParameter(
                f"{template['name']} has no param {name!r} (it has: {known})", param_hint="--param"
            )
        kind = spec.get("type")
        try:
            if kind == "int":
                typed[name] = int(text)
            elif kind == "float":
                typed[name] = float(text)
            elif kind == "bool":
                typed[name] = text.lower() in ("1", "true", "yes", "on")
            elif kind == "int_list":
                typed[name] = [int(x) for x in text.split(",") if x.strip()]
            elif kind == "object":
                typed[name] = json.loads(text)
            else:
                typed[name] = text
        except ValueError as exc:
            raise click.BadParameter(
                f"{name}: {spec.get('allowed') or kind} ({exc})", param_hint="--param"
            ) from exc
    return typed


class RankOpsGroup(click.Group):
    """Turns the client's exceptions into a message on stderr and the documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except errors.RankOpsError as exc:
            message = str(exc)
            if isinstance(exc, errors.ApiError) and isinstance(exc.body, dict):
                extra = {k: v for k, v in exc.body.items() if k not in ("type", "detail")}
                if extra.get("errors") or len(extra) > 2:
                    message += "\n" + json.dumps(extra, default=str)[:2000]
            click.echo(f"error: {message}", err=True)
            ctx.exit(exit_code_for(exc))


EPILOG = """\b
Exit codes: 0 ok, 1 unexpected error, 2 bad usage, 3 not configured or
not authenticated (401), 4 forbidden (403), 5 not found (404), 6 conflict
(409), 7 rejected input (400, 413), 8 a job/dataset/loop failed, 9 timed
out waiting, 10 server error or unreachable.
\b
Completion: eval "$(_RANKOPS_COMPLETE=bash_source rankops)"
"""


@click.group(cls=RankOpsGroup, epilog=EPILOG)
@click.option("--url", envvar="RANKOPS_URL", help="Server URL (RANKOPS_URL).")
@click.option("--token", envvar="RANKOPS_TOKEN", help="API token (RANKOPS_TOKEN).")
@click.option("-w", "--workspace", envvar="RANKOPS_WORKSPACE", help="Workspace slug.")
@click.option("--profile", envvar="RANKOPS_PROFILE", help="Profile in the profile file.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.version_option("0.1.0", prog_name="rankops")
@click.pass_context
def main(ctx: click.Context, **options: Any) -> None:
    """rankops: features, datasets, training, models, deployments, experiments and the loop."""
    ctx.obj = State(**options)


@main.command()
@click.argument("url")
@click.option("--username", prompt=True)
@click.option("--password", prompt=True, hide_input=True)
@click.option("-w", "--workspace", "default_ws", help="Default workspace for this profile.")
@click.option("--name", "profile_name", default=None, help="Profile name (default: default).")
@pass_state
def login(state: State, url: str, username: str, password: str, default_ws, profile_name) -> None:
    """Get a token for URL and save it in the profile file."""
    from rankops.client import Client

    client = Client(url=url, token="", retries=1)
    token = client.login(username, password)
    name = profile_name or state.options.get("profile") or "default"
    path = config.write_profile(name, url=url, token=token, workspace=default_ws)
    emit(state, {"profile": name, "url": url.rstrip("/"), "file": str(path)})


@main.command()
@pass_state
def workspaces(state: State) -> None:
    """The workspaces you can see."""
    emit(state, state.client.workspaces(), views.FIELDS["v1_workspaces_list"])


@main.command("call")
@click.argument("operation", required=False)
@click.argument("path_params", nargs=-1)
@click.option("--body", help="JSON request body.")
@click.option("-q", "--query", multiple=True, help="KEY=VALUE query parameter.")
@pass_state
def call_operation(state: State, operation, path_params, body, query) -> None:
    """Call any API operation by its operationId (no OPERATION: list them all)."""
    from rankops.operations import OPERATIONS

    if not operation:
        rows = [
            {"operation": k, "method": v["method"], "path": v["path"]}
            for k, v in OPERATIONS.items()
        ]
        emit(state, rows, ["operation", "method", "path"])
        return
    answer = state.client.call(
        operation,
        json=json.loads(body) if body else None,
        params=parse_pairs(query, "--query"),
        **parse_pairs(path_params, "PATH_PARAMS"),
    )
    emit(state, answer)


# ------------------------------------------------------------------------------ features


@main.group()
def features() -> None:
    """Feature groups: list, register, push, look up."""


@features.command("list")
@pass_state
def features_list(state: State) -> None:
    emit(state, state.client.feature_groups(), views.FIELDS["v1_workspaces_feature_groups_list"])


@features.command("register")
@click.argument("name")
@click.option("--entity", required=True, help="user, item, context, label, ...")
@click.option("--key", "keys", multiple=True, required=True, help="Entity key column(s).")
@click.option("--feature", "feature_specs", multiple=True, help="NAME:DTYPE (repeat).")
@click.option(
    "--from-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take the features from a Parquet/CSV file's columns.",
)
@click.option("--offline/--no-offline", default=True)
@click.option("--online/--no-online", default=True)
@click.option("--description", default="")
@pass_state
def features_register(
    state: State, name, entity, keys, feature_specs, from_file, offline, online, description
) -> None:
    """Register a feature group."""
    specs: Any = []
    for spec in feature_specs:
        fname, _, dtype = spec.partition(":")
        specs.append({"name": fname, "dtype": dtype or "float"})
    if from_file is not None:
        specs = _read_frame(from_file)
    if not len(specs):
        raise click.UsageError("give --feature NAME:DTYPE or --from-file")
    group = state.client.register_feature_group(
        name,
        entity=entity,
        entity_keys=list(keys),
        features=specs,
        online=online,
        offline=offline,
        description=description,
    )
    emit(
        state, group if state.as_json else {k: group.get(k) for k in ("name", "version", "status")}
    )


@features.command("push")
@click.argument("group")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--idempotency-key", help="Same key and body: stored once (default: fresh).")
@pass_state
def features_push(state: State, group, file: Path, idempotency_key) -> None:
    """Push a Parquet or CSV FILE of rows to GROUP."""
    emit(state, state.client.push(group, file, idempotency_key=idempotency_key))


@features.command("lookup")
@click.argument("entities", nargs=-1, required=True)
@click.option("-f", "--feature", "refs", multiple=True, required=True, help="group:feature")
@pass_state
def features_lookup(state: State, entities, refs) -> None:
    """Online values of the features for ENTITIES."""
    frame = state.client.lookup(list(entities), list(refs))
    if state.as_json:
        click.echo(frame.to_json(orient="records"))
    else:
        click.echo(frame.to_string(index=False))


# ------------------------------------------------------------------------------ datasets


@main.group()
def datasets() -> None:
    """Training samples (point-in-time joins)."""


@datasets.command("list")
@pass_state
def datasets_list(state: State) -> None:
    rows = list(state.client.iterate("v1_workspaces_datasets_list"))
    emit(state, rows, views.FIELDS["v1_workspaces_datasets_list"])


@datasets.command("build")
@click.argument("name")
@click.option("--labels", "label_source", required=True, help="The label feature group.")
@click.option("--label-column", "label_columns", multiple=True, required=True)
@click.option("-f", "--feature", "refs", multiple=True, required=True, help="group:feature")
@click.option("--wait/--no-wait", default=True)
@pass_state
def datasets_build(state: State, name, label_source, label_columns, refs, wait) -> None:
    """Build dataset NAME (waits until it is ready unless --no-wait)."""
    dataset = state.client.build_dataset(
        name,
        label_source=label_source,
        label_columns=list(label_columns),
        features=list(refs),
        wait=wait,
    )
    emit_answer(state, dataset, "v1_workspaces_datasets_retrieve")


# ------------------------------------------------------------------------------ training


@main.command()
@click.argument("name")
@click.option("--dataset", type=int, required=True, help="Dataset id.")
@click.option("--template", default="logreg", show_default=True)
@click.option("-p", "--param", "params", multiple=True, help="KEY=VALUE, typed by the template.")
@click.option("--wait", is_flag=True, help="Wait for the job, with a progress bar and its log.")
@click.option("--timeout", type=float, default=3600, show_default=True)
@pass_state
def train(state: State, name, dataset, template, params, wait, timeout) -> None:
    """Submit training job NAME from a template (see `rankops templates`)."""
    client = state.client
    typed = typed_params(client.template(template), parse_pairs(params, "--param"))
    job = client.train(name, dataset=dataset, template=template, params=typed)
    if wait:
        # The log and the progress bar go to stderr, so that stdout stays the result alone.
        job = client.wait_job(
            job["id"], timeout=timeout, on_log=lambda line: click.echo(line, err=True)
        )
    emit_answer(state, job, "v1_workspaces_training_jobs_retrieve")


@main.command()
@click.argument("name", required=False)
@pass_state
def templates(state: State, name) -> None:
    """Training templates, or one template's typed params."""
    if name:
        template = state.client.template(name)
        if state.as_json:
            emit(state, template)
            return
        rows = [{"param": k, **v} for k, v in template["params"].items()]
        emit(state, rows, ["param", "type", "default", "allowed"])
        return
    emit(state, state.client.templates(), views.FIELDS["v1_workspaces_training_templates_list"])


@main.group()
def jobs() -> None:
    """Training jobs."""


@jobs.command("list")
@pass_state
def jobs_list(state: State) -> None:
    rows = list(state.client.iterate("v1_workspaces_training_jobs_list"))
    emit(state, rows, views.FIELDS["v1_workspaces_training_jobs_list"])


@jobs.command("logs")
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep reading until the job ends.")
@pass_state
def jobs_logs(state: State, job_id, follow) -> None:
    """The job's log (states and metrics); exit 8 if a followed job did not succeed."""
    for line in state.client.job_log(job_id, follow=follow):
        click.echo(line)
    if follow:
        job = state.client.job(job_id)
        if job["state"] != "succeeded":
            raise errors.JobFailed(f"job {job_id} {job['state']}", state=job["state"], body=job)


@main.command()
@click.argument("name")
@click.option("--dataset", type=int, required=True)
@click.option("--template", default="logreg", show_default=True)
@click.option("--space", required=True, help='JSON, e.g. {"lr": {"low": 1e-4, "high": 0.1}}')
@click.option("--trials", type=int, default=10, show_default=True)
@click.option(
    "--refit-cv-folds",
    type=int,
    default=0,
    show_default=True,
    help="k >= 2: train the best trial's params again with cv_folds = k and register that.",
)
@pass_state
def tune(state: State, name, dataset, template, space, trials, refit_cv_folds) -> None:
    """Start a hyper-parameter search."""
    extra = {"refit_cv_folds": refit_cv_folds} if refit_cv_folds else {}
    tuning = state.client.tune(
        name, dataset=dataset, template=template, space=json.loads(space), n_trials=trials,
        **extra,
    )  # fmt: skip
    emit_answer(state, tuning, "v1_workspaces_tuning_jobs_create")


# ------------------------------------------------------------------------------ serving


@main.group(invoke_without_command=True)
@click.pass_context
def models(ctx: click.Context) -> None:
    """Registered models (no subcommand: list them)."""
    if ctx.invoked_subcommand is None:
        state = ctx.find_object(State)
        emit(state, state.client.models(), views.FIELDS["v1_workspaces_models_list"])


@models.command("register")
@click.argument("model")
@click.option("--job", "job_id", type=int, required=True)
@pass_state
def models_register(state: State, model, job_id) -> None:
    """Register a trained job as a new version of MODEL."""
    version = state.client.register_model(model, job_id=job_id)
    emit_answer(state, version, "v1_workspaces_model_versions_create")


@main.command()
@click.argument("name")
@click.option("--version", "version_id", type=int, required=True, help="Model version id.")
@pass_state
def deploy(state: State, name, version_id) -> None:
    """Deploy a model version as NAME."""
    dep = state.client.deploy(name, version_id=version_id)
    emit_answer(state, dep, "v1_workspaces_deployments_create")


# --------------------------------------------------------------------------- experiments


@main.group()
def experiments() -> None:
    """A/B experiments."""


@experiments.command("launch")
@click.argument("key")
@click.option("--deployment", required=True)
@click.option("--treatment", "treatments", type=int, multiple=True, required=True)
@click.option("--hypothesis", required=True)
@click.option("--min-units", type=int)
@click.option("--guardrail", "guardrails", multiple=True, help="METRIC:MAX_DROP, e.g. ctr:0.1")
@click.option("--ramp", help="Traffic steps in percent, e.g. 5,10,20.")
@pass_state
def experiments_launch(
    state: State, key, deployment, treatments, hypothesis, min_units, guardrails, ramp
) -> None:
    """Create experiment KEY and submit it for review (starts if the policy approves it)."""
    extra: dict[str, Any] = {"min_units": min_units} if min_units else {}
    if guardrails:
        extra["guardrails"] = [
            {"metric": g.partition(":")[0], "max_drop": float(g.partition(":")[2] or 0.1)}
            for g in guardrails
        ]
    if ramp:
        extra["ramp_plan"] = [int(x) for x in ramp.split(",")]
    exp = state.client.launch_experiment(
        key,
        deployment=deployment,
        treatment_versions=list(treatments),
        hypothesis=hypothesis,
        **extra,
    )
    emit_answer(state, exp, "v1_workspaces_experiments_create")


@experiments.command("status")
@click.argument("key")
@pass_state
def experiments_status(state: State, key) -> None:
    """The experiment's state and its analysis: each arm's counts and rates, each treatment's
    lift on each metric with its interval and p-value, the sample-ratio check and any failed
    guardrail."""
    exp = state.client.experiment(key)
    analysis = state.client.analysis(key)
    if state.as_json:
        emit(state, {"experiment": exp, "analysis": analysis})
        return
    click.echo(views.experiment_status(exp, analysis))


@experiments.command("conclude")
@click.argument("key")
@click.option("--action", required=True, help="promote, discard, ...")
@click.option("--arm")
@click.option("--note", default="")
@pass_state
def experiments_conclude(state: State, key, action, arm, note) -> None:
    """Conclude experiment KEY."""
    exp = state.client.conclude(key, action=action, arm=arm, note=note)
    emit_answer(state, exp, "v1_workspaces_experiments_conclude_create")


# ------------------------------------------------------------------------ loop, lineage


@main.command()
@click.argument("feature_group")
@click.option("--deployment", help="The production deployment (default: the workspace's).")
@click.option("--wait/--no-wait", default=True, help="Follow the stages until the loop ends.")
@click.option("--timeout", type=float, default=1800, show_default=True)
@pass_state
def loop(state: State, feature_group, deployment, wait, timeout) -> None:
    """The one action: FEATURE_GROUP -> samples -> train -> gates -> running experiment.
    Exit 8 if a stage fails."""
    run = state.client.loop(feature_group, deployment=deployment)
    if wait:

        def show(stage: dict[str, Any]) -> None:
            click.echo(f"{stage.get('name')}: {stage.get('state')}", err=True)

        run = state.client.wait_loop(run["id"], timeout=timeout, on_stage=show)
    if state.as_json:
        emit(state, run)
    else:
        emit(state, views.pick(run, "v1_workspaces_loops_retrieve"))
        for stage in run.get("stages", []):
            made = stage.get("object") or {}
            if made:
                click.echo(f"{stage['name']}: {made.get('label', '')}  {made.get('url', '')}")


@main.command()
@click.argument("node")
@click.option(
    "--direction",
    type=click.Choice(["upstream", "downstream", "both"]),
    default="both",
    show_default=True,
)
@click.option("--depth", type=int)
@pass_state
def lineage(state: State, node, direction, depth) -> None:
    """The lineage graph around NODE (kind:id, e.g. model_version:3): its nodes (level < 0
    upstream, > 0 downstream) and edges."""
    graph = state.client.lineage(node, direction=direction, depth=depth)
    if state.as_json:
        emit(state, graph)
    else:
        click.echo(views.lineage(graph))


# ------------------------------------------------------------------------------ notebooks


@main.group()
def notebooks() -> None:
    """Your JupyterLab servers, with the client set up for the workspace."""


@notebooks.command("open")
@click.option("--wait/--no-wait", default=True, help="Wait until it runs and print its URL.")
@click.option("--timeout", type=float, default=300, show_default=True)
@pass_state
def notebooks_open(state: State, wait, timeout) -> None:
    """Open your notebook server in the workspace (the running one, or a new one); prints the
    URL to open in a browser. Exit 8 if it fails to start."""
    server = state.client.open_notebook(wait=wait, timeout=timeout)
    emit_answer(state, server, "v1_workspaces_notebooks_list")


@notebooks.command("list")
@pass_state
def notebooks_list(state: State) -> None:
    emit(state, state.client.notebooks(), views.FIELDS["v1_workspaces_notebooks_list"])


@notebooks.command("stop")
@click.argument("server_id", type=int)
@pass_state
def notebooks_stop(state: State, server_id: int) -> None:
    """Stop notebook server SERVER_ID and revoke its token."""
    server = state.client.stop_notebook(server_id)
    emit_answer(state, server, "v1_workspaces_notebooks_list")


def _read_frame(path: Path) -> Any:
    import pandas as pd

    frame = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    return frame


if __name__ == "__main__":  # python -m rankops.cli
    sys.exit(main())
