"""OpenLineage out (RunEvents for the platform's jobs: training, tuning, pipeline runs, sample
builds, materialisation, deployments) and in (events from Spark, Airflow, dbt ... posted to
``POST /api/v1/lineage``).

Out: when ``OPENLINEAGE_URL`` is set, the ``lineage.openlineage`` consumer of the event log
(``workspaces.outbox``, its own cursor) sends one RunEvent per exported event (``EXPORTED``:
a job's states as OpenLineage knows them, running -> START, succeeded -> COMPLETE, failed ->
FAIL, cancelled -> ABORT; a sample build, a materialisation or a deployment change as a
COMPLETE run of its own), with its input and output datasets under the names intake joins on
(``dataset_identity``) and facets (job type, ownership, error message, schema, output rows).
It waits until the projection has applied the event (the outputs come from the graph), sends
in event order, and a send that fails keeps the cursor before the event, so it is sent again
later: at least once, with the same run id, event type and time on a repeat (a receiver such
as Marquez upserts on them).
Our namespace is ``<OPENLINEAGE_NAMESPACE_PREFIX>/<workspace slug>`` (so our own events posted
back to us never map to a workspace). Unset: nothing is sent.

In: the namespace of an event's job (or else of its first output dataset) is a workspace slug.
The caller's token needs the developer role there. The event becomes a platform event
``lineage.openlineage.<event type>`` whose refs are the external job (subject), its input
datasets (input) and output datasets (output); the projection turns them into nodes and edges,
and an output dataset named ``<workspace slug>`` / ``<feature group name>`` becomes an upstream
node of that feature group.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from lineage.conf import setting
from workspaces.events import Actor, Ref, event_record
from workspaces.models import Event, Workspace

logger = logging.getLogger(__name__)

CONSUMER = "lineage.openlineage"

PRODUCER = "https://github.com/rankops/rankops/lineage"
STATE_TO_EVENT = {
    "running": "START",
    "succeeded": "COMPLETE",
    "failed": "FAIL",
    "cancelled": "ABORT",
}
EVENT_TYPES = {"START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"}


# --- out -------------------------------------------------------------------------------------


def namespace_of(workspace: Workspace) -> str:
    return f"{setting('OPENLINEAGE_NAMESPACE_PREFIX')}/{workspace.slug}"


# What is exported: a verb's prefix -> the kind of the job that ran, the OpenLineage event type
# of each last verb segment, and its job type (the ``jobType`` facet). A job that runs across
# several events (training, tuning, pipeline runs) keeps one run id from START to its end; one
# that is a single event (a sample build, a materialisation, a deployment change) is a run of
# its own.
EXPORTED: dict[str, tuple[str, dict[str, str], str, bool]] = {
    "training.job": ("training_job", STATE_TO_EVENT, "TRAINING", True),
    "training.tuning_job": ("tuning_job", STATE_TO_EVENT, "TUNING", True),
    "training.pipeline_run": (
        "pipeline_run",
        {"started": "START", "succeeded": "COMPLETE", "failed": "FAIL"},
        "PIPELINE",
        True,
    ),
    "dataset": ("dataset", {"built": "COMPLETE", "failed": "FAIL"}, "SAMPLE_BUILD", False),
    "feature_group": ("feature_group", {"materialized": "COMPLETE"}, "MATERIALIZATION", False),
    "serving.deployment": (
        "deployment",
        dict.fromkeys(("created", "released", "rolled_back", "scaled", "stopped"), "COMPLETE"),
        "DEPLOYMENT",
        False,
    ),
}
EXPORTED_VERBS = [f"{prefix}.*" for prefix in EXPORTED]
# How each kind is named as an OpenLineage dataset (a feature group: its own name, the name a
# producer's job writes it under; see ``dataset_identity``).
DATASET_PREFIXES = {"dataset": "datasets", "model_version": "models", "deployment": "deployments"}
# How a job is named, by the kind of its subject: a job kind's own name, or what the job does
# to its subject (builds a sample, materialises a group, deploys).
JOB_PREFIXES = {"dataset": "build", "feature_group": "materialize", "deployment": "deploy"}
# The event types whose run ended in an error (the ``errorMessage`` run facet).
FAILED_TYPES = {"FAIL", "ABORT"}


def dataset_identity(
    workspace: Workspace,
    kind: str,
    object_id: str,
    label: str,
    externals: Mapping[str, str] | None = None,
) -> tuple[str, str]:
    """``(namespace, name)`` of one of the platform's objects as an OpenLineage dataset, so that
    what intake heard of and what export says are one graph: a feature group fed by an external
    job's dataset (intake linked them, ``DERIVED_FROM``) is named as that dataset; any other
    feature group by its name in the workspace's namespace; samples, model versions and
    deployments under ``datasets/``, ``models/`` and ``deployments/``.

    ``externals`` (feature group id -> external dataset label, from ``external_names``) saves
    the query per feature group when many are named at once."""
    namespace = namespace_of(workspace)
    if kind == "external_dataset":
        ns, _, name = label.partition("/")
        return ns, name
    if kind == "feature_group":
        if externals is None:
            externals = external_names(workspace, [str(object_id)])
        external = externals.get(str(object_id))
        if external is not None:
            ns, _, name = external.partition("/")
            return ns, name
        return namespace, label or f"feature_group/{object_id}"
    prefix = DATASET_PREFIXES.get(kind, kind)
    return namespace, f"{prefix}/{label or object_id}"


def external_names(workspace: Workspace, group_ids: Iterable[str]) -> dict[str, str]:
    """Feature group id -> the label of the external dataset it is named as (the first linked
    one), for all of ``group_ids`` in one query."""
    from lineage.models import Edge

    names: dict[str, str] = {}
    for group_id, label in (
        Edge.objects.for_workspace(workspace)
        .filter(
            src__kind="external_dataset",
            dst__kind="feature_group",
            dst__object_id__in=[str(g) for g in group_ids],
        )
        .order_by("src_id")
        .values_list("dst__object_id", "src__label")
    ):
        names.setdefault(group_id, label)
    return names


def _schema_facet(workspace: Workspace, group_id: str) -> Any | None:
    """A feature group's columns, from the newest event that declared them."""
    from openlineage.client.facet_v2 import schema_dataset

    declared = (
        Event.objects.filter(
            workspace=workspace,
            verb__in=["feature_group.registered", "feature_group.versioned"],
            refs__kind="feature_group",
            refs__object_id=str(group_id),
        )
        .order_by("-id")
        .first()
    )
    features = (declared.payload or {}).get("features") if declared is not None else None
    if not isinstance(features, list):
        return None
    fields = [
        schema_dataset.SchemaDatasetFacetFields(
            name=str(spec.get("name")), type=str(spec.get("dtype") or "") or None
        )
        for spec in features
        if isinstance(spec, dict) and spec.get("name")
    ]
    return schema_dataset.SchemaDatasetFacet(fields=fields, producer=PRODUCER)


def run_event_for(event: Event, refs: list) -> Any | None:
    """The OpenLineage RunEvent of one exported event (``EXPORTED``; None for other verbs and
    states): the job, its input and output datasets named as ``dataset_identity`` says, and
    facets: the job's type and owner, the run's error on FAIL or ABORT, and on datasets the
    columns (feature groups) and the rows written (outputs)."""
    from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent
    from openlineage.client.facet_v2 import (
        error_message_run,
        job_type_job,
        output_statistics_output_dataset,
        ownership_job,
    )

    from lineage.models import Node

    prefix, _, state = event.verb.rpartition(".")
    spec = EXPORTED.get(prefix)
    if spec is None:
        return None
    kind, types, job_type, lasting = spec
    event_type = types.get(state)
    if event_type is None:
        return None
    subject = next((r for r in refs if r.kind == kind and r.role == "subject"), None)
    subject = subject or next((r for r in refs if r.kind == kind), None)
    if subject is None:
        return None
    workspace = event.workspace
    if workspace is None:
        return None
    namespace = namespace_of(workspace)
    payload = event.payload or {}

    def dataset(ref, cls, **extra):
        ns, name = dataset_identity(workspace, ref.kind, ref.object_id, ref.label)
        facets = {}
        if ref.kind == "feature_group":
            schema = _schema_facet(workspace, ref.object_id)
            if schema is not None:
                facets["schema"] = schema
        return cls(namespace=ns, name=name, facets=facets, **extra)

    inputs = [dataset(r, InputDataset) for r in refs if r.role == "input"]
    read = payload.get("group_versions")  # a sample build: every group it joined, by name
    if isinstance(read, dict):
        named = {i.name for i in inputs}
        for node in Node.objects.for_workspace(event.workspace_id).filter(
            kind="feature_group", label__in=[str(n) for n in read]
        ):
            candidate = dataset(node, InputDataset)
            if candidate.name not in named:
                inputs.append(candidate)
                named.add(candidate.name)
    rows = payload.get("rows", payload.get("rows_written"))
    statistics = (
        {
            "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=int(rows), size=payload.get("bytes"), producer=PRODUCER
            )
        }
        if isinstance(rows, int) and not isinstance(rows, bool)
        else {}
    )
    outputs = [
        dataset(r, OutputDataset, outputFacets=statistics) for r in refs if r.role == "output"
    ]
    if lasting:  # what the job produced, as the graph knows it (a training job's versions)
        node = (
            Node.objects.for_workspace(event.workspace_id)
            .filter(kind=kind, object_id=subject.object_id)
            .first()
        )
        if node is not None:
            seen = {(o.namespace, o.name) for o in outputs}
            for made in Node.objects.for_workspace(event.workspace_id).filter(
                in_edges__src=node, kind="model_version"
            ):
                out = dataset(made, OutputDataset)
                if (out.namespace, out.name) not in seen:
                    outputs.append(out)
    job_name = f"{JOB_PREFIXES.get(kind, kind)}/{subject.label or subject.object_id}"
    run_key = f"{kind}/{subject.object_id}" if lasting else f"event/{event.pk}"
    run_facets: dict[str, Any] = {}
    error = payload.get("error") or payload.get("reason")
    if event_type in FAILED_TYPES and error:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=str(error)[:2000], programmingLanguage="python", producer=PRODUCER
        )
    owner = event.actor.get_username() if event.actor is not None else "the platform"
    job_facets = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="RANKOPS", jobType=job_type, producer=PRODUCER
        ),
        "ownership": ownership_job.OwnershipJobFacet(
            owners=[
                ownership_job.Owner(name=f"workspace:{workspace.slug}", type="TEAM"),
                ownership_job.Owner(name=f"user:{owner}", type="USER"),
            ],
            producer=PRODUCER,
        ),
    }
    return RunEvent(
        eventType=event_type,
        eventTime=event.created_at.isoformat(),
        run=Run(
            runId=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{run_key}")), facets=run_facets
        ),
        job=Job(namespace=namespace, name=job_name, facets=job_facets),
        producer=PRODUCER,
        inputs=inputs,
        outputs=outputs,
    )


def _client() -> Any:
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.http import ApiKeyTokenProvider, HttpConfig, HttpTransport

    api_key = setting("OPENLINEAGE_API_KEY")
    config = HttpConfig(
        url=setting("OPENLINEAGE_URL"),
        timeout=5.0,
        retry={"total": 1},
        **({"auth": ApiKeyTokenProvider({"apiKey": api_key})} if api_key else {}),
    )
    return OpenLineageClient(transport=HttpTransport(config))


def emit_run_events(pending: list) -> int:
    """Send the RunEvents of these (event, refs) pairs now; raises when a send fails (the
    consumer then tries again). Without ``OPENLINEAGE_URL`` nothing is sent."""
    if not setting("OPENLINEAGE_URL") or not pending:
        return 0
    client = _client()
    sent = 0
    for event, refs in pending:
        run_event = run_event_for(event, refs)
        if run_event is not None:
            client.emit(run_event)
            sent += 1
    return sent


def openlineage_export(event: Event) -> None:
    """The ``lineage.openlineage`` consumer's handler for one exported event (``EXPORTED``):
    send its RunEvent once the projection has applied the event (``NotYet`` until then)."""
    from lineage.models import Cursor, CursorGap
    from lineage.projection import CURSOR, IGNORED_KINDS, R, canonical_kind
    from workspaces.outbox import NotYet

    if not setting("OPENLINEAGE_URL") or event.workspace_id is None:
        return
    projected = (
        Cursor.objects.filter(name=CURSOR, last_event_id__gte=event.pk).exists()
        and not CursorGap.objects.filter(cursor_id=CURSOR, event_id=event.pk).exists()
    )
    if not projected:
        raise NotYet(f"event {event.pk} is not projected yet")
    refs = [
        R(canonical_kind(r.kind), r.object_id, r.label, r.role)
        for r in event.refs.all()
        if canonical_kind(r.kind) not in IGNORED_KINDS
    ]
    emit_run_events([(event, refs)])


# --- in --------------------------------------------------------------------------------------


# How far ahead of the server's clock an eventTime may be (producers' clocks drift).
MAX_CLOCK_SKEW = timedelta(days=1)
EARLIEST_EVENT_TIME = datetime(1970, 1, 1, tzinfo=UTC)


def _event_time(raw: Any) -> str:
    """The eventTime as ISO 8601 with a time zone, between 1970 and a day from now."""
    if not isinstance(raw, str) or not raw or len(raw) > 64:
        raise ValidationError({"eventTime": "Give the event time as ISO 8601 with a time zone."})
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise ValidationError(
            {"eventTime": "Give the event time as ISO 8601 with a time zone."}
        ) from None
    if when.tzinfo is None:
        raise ValidationError({"eventTime": "The event time needs a time zone (e.g. Z)."})
    if when < EARLIEST_EVENT_TIME or when > timezone.now() + MAX_CLOCK_SKEW:
        raise ValidationError({"eventTime": "The event time must lie between 1970 and now."})
    return when.isoformat()


def _run_id(body: dict[str, Any]) -> str:
    """The run's UUID; a RunEvent (one with an eventType or a run) must have one."""
    run = body.get("run")
    if run is None and "eventType" not in body:
        return ""  # a JobEvent or DatasetEvent has no run
    if not isinstance(run, dict):
        raise ValidationError({"run": "A RunEvent needs a run object with a runId."})
    raw = run.get("runId")
    try:
        if isinstance(raw, str) and len(raw) <= 64:
            return str(uuid.UUID(raw))
    except ValueError:
        pass
    raise ValidationError({"run.runId": "The runId must be a UUID."})


def _datasets(body: dict[str, Any], key: str) -> list[tuple[str, str]]:
    found = []
    items = body.get(key)
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ValidationError({key: "Give a list of datasets."})
    for item in items:
        if not isinstance(item, dict):
            raise ValidationError({key: "Each dataset is an object with namespace and name."})
        namespace, name = item.get("namespace"), item.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
            raise ValidationError({key: "Each dataset needs a namespace and a name."})
        found.append((namespace[:100], name[:200]))
    return found


def parse_event(body: Any) -> dict[str, Any]:
    """The parts of a RunEvent, JobEvent or DatasetEvent the platform keeps."""
    if not isinstance(body, dict):
        raise ValidationError({"body": "An OpenLineage event is a JSON object."})
    job = body.get("job")
    dataset = body.get("dataset")
    if job is not None and not (
        isinstance(job, dict) and isinstance(job.get("namespace"), str) and job.get("name")
    ):
        raise ValidationError({"job": "The job needs a namespace and a name."})
    if job is None and not isinstance(dataset, dict):
        raise ValidationError({"job": "Give a job (RunEvent/JobEvent) or a dataset."})
    event_type = body.get("eventType") or "OTHER"
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise ValidationError({"eventType": f"Use one of {', '.join(sorted(EVENT_TYPES))}."})
    event_time = _event_time(body.get("eventTime"))
    run_id = _run_id(body)
    if job is not None:
        inputs, outputs = _datasets(body, "inputs"), _datasets(body, "outputs")
    else:
        # A DatasetEvent describes one dataset; it has no inputs or outputs to link.
        inputs, outputs = [], _datasets({"dataset": [dataset]}, "dataset")
    for key in ("producer", "schemaURL"):
        value = body.get(key)
        if not isinstance(value, str) or not _is_uri(value):
            raise ValidationError(
                {key: f"The spec requires {key} as a URI (e.g. https://github.com/OpenLineage)."}
            )
    problem = spec_error(body)
    if problem is not None:
        raise ValidationError({problem[0]: problem[1]})
    return {
        "event_type": event_type,
        "event_time": event_time,
        "run_id": run_id,
        "job": (str(job["namespace"])[:100], str(job["name"])[:200]) if job else None,
        "inputs": inputs,
        "outputs": outputs,
        "producer": str(body.get("producer", ""))[:300],
        "schema_url": str(body.get("schemaURL", ""))[:300],
        "facets": _facets(body, job),
    }


SPEC_DIR = Path(__file__).with_name("openlineage_spec")


@functools.cache
def spec_validator() -> Any:
    """A validator of OpenLineage.json (the vendored spec, ``openlineage_spec/NOTICE``), its
    references resolved to the vendored files only (nothing is fetched)."""
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
    from referencing import Registry, Resource

    schemas = [json.loads(path.read_text()) for path in sorted(SPEC_DIR.glob("*.json"))]
    registry = Registry().with_resources(
        (schema["$id"], Resource.from_contents(schema)) for schema in schemas
    )
    core = next(s for s in schemas if s["$id"].endswith("/OpenLineage.json"))
    return Draft202012Validator(
        core, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def spec_error(body: dict[str, Any]) -> tuple[str, str] | None:
    """Where ``body`` breaks the OpenLineage spec, as ``(field path, message)``; ``None`` when
    it is a valid event. The spec is a ``oneOf`` of three event kinds (and its facets are
    ``anyOf``s): the error named is the deepest one inside them, which is where the body comes
    closest to an event and still breaks it (``job.facets.sql``, not "matches no kind")."""
    errors = list(spec_validator().iter_errors(body))
    if not errors:
        return None
    error = max(errors, key=lambda e: len(e.absolute_path))
    while error.context:
        error = max(error.context, key=lambda e: len(e.absolute_path))
    path = ".".join(str(part) for part in error.absolute_path) or "body"
    return path, f"Not an OpenLineage event: {error.message[:300]}"


def _is_uri(value: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    return bool(parts.scheme and (parts.netloc or parts.path)) and len(value) <= 2000


MAX_FACET_BYTES = 64 * 1024


def _facets(body: dict[str, Any], job: Any) -> dict[str, Any]:
    """The event's facets as sent (run, job, and each dataset's by ``namespace/name``), kept in
    the event's payload; over 64 KiB in all, a 400 (``facets``) rather than a silent cut."""
    kept: dict[str, Any] = {}
    run = body.get("run")
    if isinstance(run, dict) and isinstance(run.get("facets"), dict) and run["facets"]:
        kept["run"] = run["facets"]
    if isinstance(job, dict) and isinstance(job.get("facets"), dict) and job["facets"]:
        kept["job"] = job["facets"]
    for key, facet_key in (("inputs", "facets"), ("outputs", "facets")):
        for item in body.get(key) or []:
            if not isinstance(item, dict):
                continue
            facets = {
                **(item.get(facet_key) or {}),
                **(item.get("inputFacets") or {}),
                **(item.get("outputFacets") or {}),
            }
            if facets:
                kept.setdefault("datasets", {})[f"{item.get('namespace')}/{item.get('name')}"] = (
                    facets
                )
    if len(json.dumps(kept, default=str)) > MAX_FACET_BYTES:
        raise ValidationError({"facets": f"Facets over {MAX_FACET_BYTES} bytes in all."})
    return kept


def mapped_namespace(namespace: str) -> str:
    """The workspace slug an external namespace lands in (``OPENLINEAGE_NAMESPACES``), else the
    namespace itself (a namespace named after a workspace)."""
    mapping = setting("OPENLINEAGE_NAMESPACES") or {}
    return str(mapping.get(namespace, namespace))


def namespace_workspace_slug(parsed: dict[str, Any]) -> str:
    """The workspace an event belongs to: its job's namespace, else its first output's, each
    through the configured mapping."""
    if parsed["job"]:
        return mapped_namespace(parsed["job"][0])
    return mapped_namespace(parsed["outputs"][0][0]) if parsed["outputs"] else ""


def namespace_slug(namespace: str) -> str:
    """The workspace slug a dataset namespace names: ``<slug>`` or our ``<prefix>/<slug>``."""
    prefix = f"{setting('OPENLINEAGE_NAMESPACE_PREFIX')}/"
    return namespace[len(prefix) :] if namespace.startswith(prefix) else mapped_namespace(namespace)


def openlineage_scope_check(*, workspace: Workspace, parsed: dict[str, Any]) -> None:
    """Refuse an event whose datasets sit in another workspace's namespace (404, as for any
    other workspace's object), and one with more datasets than the workspace's policy allows
    (413), before anything is written."""
    from workspaces.selectors import policy_check

    policy_check(
        workspace=workspace,
        limit_name="max_lineage_datasets",
        attr="inputs+outputs",
        asked=len(parsed["inputs"]) + len(parsed["outputs"]),
    )
    named = {
        namespace_slug(namespace) for key in ("inputs", "outputs") for namespace, _ in parsed[key]
    }
    named.discard(workspace.slug)
    if named and Workspace.objects.filter(slug__in=named).exists():
        raise Http404("A dataset's namespace is another workspace; send it to that workspace.")


@transaction.atomic
def openlineage_event_record(
    *, actor: Actor, workspace: Workspace, parsed: dict[str, Any], token_prefix: str = ""
) -> Event:
    """Record an accepted external OpenLineage event in the workspace's event log."""
    from lineage.projection import external_dataset_id, external_job_id

    refs: list[Ref] = []
    if parsed["job"]:
        namespace, name = parsed["job"]
        refs.append(
            Ref("external_job", external_job_id(namespace, name), f"{namespace}/{name}"[:200])
        )
    for role, key in (("input", "inputs"), ("output", "outputs")):
        for namespace, name in parsed[key]:
            refs.append(
                Ref(
                    "external_dataset",
                    external_dataset_id(namespace, name),
                    f"{namespace}/{name}"[:200],
                    role=role,
                )
            )
    return event_record(
        actor=actor,
        workspace=workspace,
        verb=f"lineage.openlineage.{parsed['event_type'].lower()}",
        refs=refs,
        token_prefix=token_prefix,
        payload={
            "run_id": parsed["run_id"],
            "event_time": parsed["event_time"],
            "producer": parsed["producer"],
            "schema_url": parsed.get("schema_url", ""),
            "facets": parsed.get("facets") or {},
            "job": "/".join(parsed["job"]) if parsed["job"] else "",
            "inputs": ["/".join(d) for d in parsed["inputs"]],
            "outputs": ["/".join(d) for d in parsed["outputs"]],
            "received_at": timezone.now(),
        },
    )


# --- read: Marquez's lineage endpoint ---------------------------------------------------------

# Our job nodes, named ``<kind>/<label>`` in the workspace's namespace, as the export names them.
JOB_KINDS = ("training_job", "tuning_job", "pipeline_run")
MARQUEZ_MAX_DEPTH = 20


def marquez_node_id(node_type: str, namespace: str, name: str) -> str:
    return f"{node_type}:{namespace}:{name}"


def parse_marquez_node_id(node_id: str) -> tuple[str, str, str]:
    """``dataset:<namespace>:<name>`` or ``job:...`` as ``(type, namespace, name)``; a namespace
    may hold colons (``postgres://host:5432``), so the name is what follows the last one."""
    node_type, _, rest = node_id.partition(":")
    namespace, _, name = rest.rpartition(":")
    if node_type not in ("dataset", "job") or not namespace or not name:
        raise ValidationError(
            {"nodeId": "Give dataset:<namespace>:<name> or job:<namespace>:<name>."}
        )
    return node_type, namespace, name


def marquez_identity(
    workspace: Workspace, node: Any, externals: Mapping[str, str] | None = None
) -> tuple[str, str, str]:
    """``(type, namespace, name)`` of a graph node under the names the export uses."""
    if node.kind in JOB_KINDS:
        return "job", namespace_of(workspace), f"{node.kind}/{node.label or node.object_id}"
    if node.kind == "external_job":
        namespace, _, name = node.label.partition("/")
        return "job", namespace, name
    return (
        "dataset",
        *dataset_identity(workspace, node.kind, node.object_id, node.label, externals),
    )


def marquez_start(workspace: Workspace, node_type: str, namespace: str, name: str) -> Any:
    """The graph node a Marquez ``nodeId`` names in ``workspace`` (404 when none)."""
    from lineage.models import Node

    nodes = Node.objects.for_workspace(workspace)
    if namespace != namespace_of(workspace):  # an external job's or dataset's own name
        kind = "external_job" if node_type == "job" else "external_dataset"
        found = nodes.filter(kind=kind, label=f"{namespace}/{name}").order_by("id").first()
    else:
        prefix, _, label = name.partition("/")
        by_prefix = (
            {**{k: k for k in JOB_KINDS}, **{v: k for k, v in JOB_PREFIXES.items()}}
            if node_type == "job"
            else {v: k for k, v in DATASET_PREFIXES.items()}
        )
        wanted = by_prefix.get(prefix)
        if wanted is None and node_type == "dataset":  # a feature group: its own name
            wanted, label = "feature_group", name
        found = nodes.filter(kind=wanted, label=label).order_by("-id").first() if wanted else None
    if found is None:
        raise Http404(f"No {node_type} {namespace}:{name} in the lineage graph.")
    return found


def marquez_graph(workspace: Workspace, node_id: str, depth: int) -> dict[str, Any]:
    """Marquez's ``GET /api/v1/lineage?nodeId=`` answer: the nodes within ``depth`` steps of
    ``node_id`` both ways, each with its ``inEdges`` and ``outEdges`` (origin -> destination),
    under the names the export sends, so a Marquez client reads our graph as it reads
    Marquez's."""
    from lineage.models import Node
    from lineage.queries import traverse

    node_type, namespace, name = parse_marquez_node_id(node_id)
    start = marquez_start(workspace, node_type, namespace, name)
    sub = traverse(
        workspace=workspace,
        node=start,
        direction="both",
        depth=max(1, min(depth, MARQUEZ_MAX_DEPTH)),
    )
    keys = [n["key"] for n in sub["nodes"]]
    by_key = {
        n.key: n
        for n in Node.objects.for_workspace(workspace).filter(
            kind__in={k.split(":", 1)[0] for k in keys},
            object_id__in={k.split(":", 1)[1] for k in keys},
        )
        if n.key in keys
    }
    externals = external_names(
        workspace, [n.object_id for n in by_key.values() if n.kind == "feature_group"]
    )
    ids = {key: marquez_identity(workspace, node, externals) for key, node in by_key.items()}
    graph: dict[str, dict[str, Any]] = {}
    for key, (kind, ns, nm) in ids.items():
        graph.setdefault(
            marquez_node_id(kind, ns, nm),
            {
                "id": marquez_node_id(kind, ns, nm),
                "type": kind.upper(),
                "data": {
                    "type": kind.upper(),
                    "id": {"namespace": ns, "name": nm},
                    "namespace": ns,
                    "name": nm,
                    "platform": {"kind": by_key[key].kind, "live": by_key[key].live},
                },
                "inEdges": [],
                "outEdges": [],
            },
        )
    for edge in sub["edges"]:
        if edge["src"] not in ids or edge["dst"] not in ids:
            continue
        origin, destination = (
            marquez_node_id(*ids[edge["src"]]),
            marquez_node_id(*ids[edge["dst"]]),
        )
        if origin == destination:  # a feature group and the external dataset it is named as
            continue
        pair = {"origin": origin, "destination": destination}
        if pair not in graph[origin]["outEdges"]:
            graph[origin]["outEdges"].append(pair)
            graph[destination]["inEdges"].append(pair)
    return {"graph": list(graph.values())}
