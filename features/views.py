"""Browser UI of the feature registry: groups, one group's page (schema, versions, health chart,
batches, consumers, how to push data) and datasets; and the pages that write: a new group, a new
schema version, lifecycle moves, a file upload and a new dataset. Everything is read through the
selectors, so another workspace's objects answer 404 like missing ones; every write goes through
the service the REST API calls (``features.registry``, ``features.ingestion``, ``features.samples``)
and is refused to viewers by ``workspace_page(Role.DEVELOPER)``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from features import ingestion, registry, samples
from features.feast import feast_import
from features.forms import (
    BatchUploadForm,
    DatasetCreateForm,
    DatasetPreviewForm,
    FeastImportForm,
    FeatureGroupCreateForm,
    LifecycleForm,
    SchemaRows,
    report_service_error,
)
from features.models import (
    LIFECYCLE_MOVES,
    Dataset,
    DatasetStatus,
    Dtype,
    EntityKind,
    Feature,
    FeatureGroup,
    FeatureGroupVersion,
    HealthStatus,
    Lifecycle,
)
from features.panels import group_panels
from features.selectors import (
    batches_of,
    consumers_of,
    datasets_of,
    feature_group_detail,
    feature_group_get,
    feature_groups_of,
    health_history,
)
from workspaces.dashboard import DashboardSection
from workspaces.exceptions import ConflictError
from workspaces.middleware import body_limit_for
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

GROUPS_PER_PAGE = 50
DATASETS_PER_PAGE = 50
RECENT_BATCHES = 20
RECENT_CHECKS = 20
CHART_POINTS = 500


# Feature groups -------------------------------------------------------------------------------


def _filtered_groups(
    workspace, *, query: str, status: str, health: str, entity: str
) -> QuerySet[FeatureGroup]:
    groups = feature_groups_of(workspace=workspace)
    if query:
        groups = groups.filter(
            Q(name__icontains=query) | Q(description__icontains=query) | Q(tags__icontains=query)
        )
    if status:
        groups = groups.filter(status=status)
    if health:
        groups = groups.filter(health_status=health)
    if entity:
        groups = groups.filter(entity=entity)
    return groups


@workspace_page()
def feature_group_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    query = request.GET.get("q", "").strip()[:100]
    status = request.GET.get("status", "")
    status = status if status in Lifecycle.values else ""
    health = request.GET.get("health", "")
    health = health if health in HealthStatus.values else ""
    entity = request.GET.get("entity", "")
    entity = entity if entity in EntityKind.values else ""
    groups = _filtered_groups(workspace, query=query, status=status, health=health, entity=entity)
    page = Paginator(groups, GROUPS_PER_PAGE).get_page(request.GET.get("page"))
    filters = {"q": query, "status": status, "health": health, "entity": entity}
    return render(
        request,
        "features/group_list.html",
        page_context(
            request,
            page=page,
            query=query,
            status=status,
            health=health,
            entity=entity,
            statuses=Lifecycle.choices,
            healths=HealthStatus.choices,
            entities=EntityKind.choices,
            filter_query=urlencode({key: value for key, value in filters.items() if value}),
            can_write=role_at_least(request.workspace_role, Role.DEVELOPER),
            section="features",
        ),
    )


@workspace_page()
def feature_group_page(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    group = feature_group_detail(workspace=workspace, name=name)
    versions = list(
        FeatureGroupVersion.objects.for_workspace(workspace)
        .filter(group=group)
        .select_related("created_by")
        .order_by("-version")
    )
    current = next((v for v in versions if v.version == group.current_version), None)
    checks = list(health_history(group=group)[:CHART_POINTS])
    consumers = list(consumers_of(group=group, live_only=False))
    features = list(group.feature_set.all())
    for feature in features:
        feature.moves = feature_moves(feature=feature, role=request.workspace_role)
    batch_url = request.build_absolute_uri(
        reverse("v1:feature-batch-list", kwargs={"ws": workspace.slug, "name": group.name})
    )
    return render(
        request,
        "features/group_detail.html",
        page_context(
            request,
            group=group,
            features=features,
            versions=[{"version": v, "features": v.features} for v in versions],
            batches=list(batches_of(group=group)[:RECENT_BATCHES]),
            consumers=consumers,
            live_consumers=sum(1 for consumer in consumers if consumer.live),
            checks=[_check_row(check) for check in checks[:RECENT_CHECKS]],
            chart=_chart_series(checks) | {"sla_hours": group.freshness_sla_seconds / 3600},
            push=push_examples(group=group, version=current, batch_url=batch_url),
            panels=group_panels(request=request, workspace=workspace, group=group),
            can_write=role_at_least(request.workspace_role, Role.DEVELOPER),
            moves=lifecycle_moves(group=group, role=request.workspace_role),
            upload_form=BatchUploadForm(),
            upload_limit=body_limit_for(
                reverse("features-group-upload", args=[workspace.slug, group.name])
            ),
            section="features",
        ),
    )


# Writes: register, new schema version, lifecycle, upload ------------------------------------------

# The lifecycle moves a page offers, with the role each needs (as the API's PATCH checks it).
MOVE_LABELS = {
    Lifecycle.ACTIVE: ("Activate", Role.DEVELOPER),
    Lifecycle.DEPRECATED: ("Deprecate", Role.MAINTAINER),
    Lifecycle.RETIRED: ("Retire", Role.MAINTAINER),
}


def lifecycle_moves(*, group: FeatureGroup, role: str) -> list[dict[str, str]]:
    """The moves out of the group's status that ``role`` may make, in lifecycle order."""
    moves = []
    for status in Lifecycle.values:
        if status in LIFECYCLE_MOVES[group.status] and status in MOVE_LABELS:
            label, needs = MOVE_LABELS[status]
            if role_at_least(role, needs):
                moves.append({"status": status, "label": label})
    return moves


def feature_moves(*, feature: Feature, role: str) -> list[dict[str, str]]:
    """The moves of one feature (never back to draft) that ``role`` may make (retire: maintainer,
    as the API's feature PATCH checks it)."""
    moves = []
    for status in Lifecycle.values:
        if status in LIFECYCLE_MOVES[feature.status] and status != Lifecycle.DRAFT:
            label, _ = MOVE_LABELS[status]
            needs = Role.MAINTAINER if status == Lifecycle.RETIRED else Role.DEVELOPER
            if role_at_least(role, needs):
                moves.append({"status": status, "label": label})
    return moves


def _dtype_choices() -> list[tuple[str, str]]:
    return list(Dtype.choices)


@workspace_page(Role.DEVELOPER)
def feature_group_create(request: WorkspaceRequest, workspace) -> HttpResponse:
    if request.method == "POST":
        form = FeatureGroupCreateForm(request.POST)
        schema = SchemaRows(request.POST)
        specs = schema.specs()
        if form.is_valid() and specs is not None:
            try:
                group = registry.feature_group_register(
                    actor=request.user,
                    workspace=workspace,
                    features=specs,
                    **form.service_arguments(),
                )
            except (ValidationError, ConflictError) as exc:
                report_service_error(form, schema, exc)
            else:
                messages.success(request, f"Feature group '{group.name}' registered (v1).")
                return redirect("features-group", ws=workspace.slug, name=group.name)
        status = 400
    else:
        form = FeatureGroupCreateForm()
        schema = SchemaRows()
        status = 200
    return render(
        request,
        "features/group_form.html",
        page_context(
            request,
            form=form,
            schema=schema,
            dtypes=_dtype_choices(),
            section="features",
        ),
        status=status,
    )


@workspace_page(Role.DEVELOPER)
def feast_import_page(request: WorkspaceRequest, workspace) -> HttpResponse:
    """Import a ``feast registry-dump`` (``features.feast``): preview, then import. A refusal is
    shown next to the form, naming the field of the dump it is about."""
    result = None
    status = 200
    if request.method == "POST":
        form = FeastImportForm(request.POST, request.FILES)
        status = 400
        if form.is_valid():
            try:
                result = feast_import(
                    actor=request.user,
                    workspace=workspace,
                    document=form.cleaned_data["registry"],
                    entity_kinds=form.cleaned_data["kinds"],
                    dry_run=request.POST.get("action") != "import",
                )
            except ConflictError as exc:
                form.add_error(None, f"{exc.attr}: {exc}" if exc.attr else str(exc))
            except ValidationError as exc:
                items = exc.message_dict.items() if hasattr(exc, "error_dict") else []
                for key, problems in items or [("", exc.messages)]:
                    field = "entity_kinds" if key.startswith("entity_kinds") else None
                    for problem in problems:
                        form.add_error(field, f"{key}: {problem}" if key and not field else problem)
            else:
                status = 200 if result["dry_run"] else 201
                if not result["dry_run"]:
                    messages.success(
                        request,
                        f"Imported {len(result['feature_groups'])} feature view(s) from Feast "
                        f"project '{result['project']}'.",
                    )
    else:
        form = FeastImportForm()
    feast_url = request.build_absolute_uri(f"/api/v1/workspaces/{workspace.slug}/feast")
    return render(
        request,
        "features/feast_import.html",
        page_context(request, form=form, result=result, feast_url=feast_url, section="features"),
        status=status,
    )


@workspace_page(Role.DEVELOPER)
def feature_group_schema(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    group = feature_group_get(workspace=workspace, name=name)
    if request.method == "POST":
        schema = SchemaRows(request.POST)
        specs = schema.specs()
        if specs is not None:
            try:
                version = registry.feature_group_new_version(
                    actor=request.user, group=group, features=specs
                )
            except ConflictError as exc:
                schema.add_error(None, str(exc))
            except ValidationError as exc:
                report_service_error(None, schema, exc)
            else:
                messages.success(request, f"Schema of '{group.name}' is now v{version.version}.")
                return redirect("features-group", ws=workspace.slug, name=group.name)
        status = 400
    else:
        current = group.versions.get(version=group.current_version)
        schema = SchemaRows(initial=current.features)
        status = 200
    return render(
        request,
        "features/schema_form.html",
        page_context(
            request, group=group, schema=schema, dtypes=_dtype_choices(), section="features"
        ),
        status=status,
    )


@workspace_page(Role.DEVELOPER)
def feature_group_lifecycle(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    if request.method != "POST":
        return redirect("features-group", ws=workspace.slug, name=name)
    group = feature_group_get(workspace=workspace, name=name)
    form = LifecycleForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"status: {' '.join(form.errors['status'])}")
        return redirect("features-group", ws=workspace.slug, name=group.name)
    status = form.cleaned_data["status"]
    needs = MOVE_LABELS.get(status, ("", Role.DEVELOPER))[1]
    if not role_at_least(request.workspace_role, needs):
        raise PermissionDenied(f"This needs the {needs} role.")
    try:
        registry.feature_group_set_status(actor=request.user, group=group, status=status)
    except ConflictError as exc:
        messages.error(request, f"Conflict: {exc}")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"'{group.name}' is now {status}.")
    return redirect("features-group", ws=workspace.slug, name=group.name)


@workspace_page(Role.DEVELOPER)
def feature_lifecycle(
    request: WorkspaceRequest, workspace, name: str, feature: str
) -> HttpResponse:
    if request.method != "POST":
        return redirect("features-group", ws=workspace.slug, name=name)
    group = feature_group_get(workspace=workspace, name=name)
    target = Feature.objects.for_workspace(workspace).filter(group=group, name=feature).first()
    if target is None:
        raise Http404(f"No feature '{name}:{feature}'.")
    form = LifecycleForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"status: {' '.join(form.errors['status'])}")
        return redirect("features-group", ws=workspace.slug, name=group.name)
    status = form.cleaned_data["status"]
    if status == Lifecycle.RETIRED and not role_at_least(request.workspace_role, Role.MAINTAINER):
        raise PermissionDenied("Retiring needs the maintainer role.")
    try:
        registry.feature_set_status(actor=request.user, feature=target, status=status)
    except ConflictError as exc:
        messages.error(request, f"Conflict: {exc}")
    except ValidationError as exc:
        messages.error(request, "status: " + " ".join(exc.messages))
    else:
        messages.success(request, f"'{group.name}:{target.name}' is now {status}.")
    return redirect("features-group", ws=workspace.slug, name=group.name)


@workspace_page(Role.DEVELOPER)
def feature_group_upload(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    """Store one uploaded file as a batch. The page's script posts it with XMLHttpRequest (for the
    progress bar) and shows the returned fragment; without the script the result is a full page."""
    if request.method != "POST":
        return redirect("features-group", ws=workspace.slug, name=name)
    group = feature_group_get(workspace=workspace, name=name)
    form = BatchUploadForm(request.POST, request.FILES)
    result: dict[str, Any] = {"group": group}
    status = 400
    if form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            outcome = ingestion.batch_ingest(
                actor=request.user, group=group, body=upload.read(), format=form.batch_format
            )
        except ingestion.BatchRejected as exc:
            result["problems"] = exc.problems
        except (ValidationError, ConflictError) as exc:
            result["error"] = str(exc) if isinstance(exc, ConflictError) else " ".join(exc.messages)
        else:
            result["batch"] = outcome.batch
            result["filename"] = upload.name
            status = 201
    else:
        result["error"] = " ".join(form.errors.get("file", ["Attach a file."]))
    fragment = request.headers.get("X-Requested-With") == "XMLHttpRequest"
    return render(
        request,
        "features/_upload_result.html" if fragment else "features/upload_result.html",
        page_context(request, result=result, group=group, section="features"),
        status=status,
    )


def _check_row(check) -> dict[str, Any]:
    """A health check for the history table, its problems as plain sentences."""
    problems = []
    for problem in check.problems or []:
        if isinstance(problem, dict):
            detail = problem.get("detail") or problem.get("message")
            kind = problem.get("kind") or problem.get("check")
            if detail:
                problems.append(f"{kind}: {detail}" if kind else str(detail))
            else:
                problems.append(json.dumps(problem, default=str, sort_keys=True))
        else:
            problems.append(str(problem))
    return {"check": check, "problems": problems}


def _chart_series(checks: list) -> dict[str, list]:
    """Freshness lag (hours) and coverage over time, oldest first, for the chart script."""
    ordered = sorted(checks, key=lambda c: c.checked_at)
    return {
        "t": [round(c.checked_at.timestamp(), 3) for c in ordered],
        "freshness_hours": [
            None if c.freshness_lag_seconds is None else round(c.freshness_lag_seconds / 3600, 3)
            for c in ordered
        ],
        "coverage": [None if c.coverage is None else round(c.coverage, 4) for c in ordered],
    }


# Push help: the exact request a producer sends --------------------------------------------------

_EXAMPLE_VALUES: dict[str, Any] = {
    Dtype.INT: 42,
    Dtype.FLOAT: 0.25,
    Dtype.BOOL: True,
    Dtype.STRING: "text",
    Dtype.CATEGORICAL: "a",
    Dtype.CATEGORICAL_LIST: ["a", "b"],
}


def example_value(spec: dict[str, Any]) -> Any:
    """A value of the feature's dtype that the batch endpoint accepts."""
    if spec["dtype"] == Dtype.EMBEDDING:
        dimension = int(spec.get("dimension") or 1)
        return [round(0.1 * ((i % 9) + 1), 1) for i in range(dimension)]
    return _EXAMPLE_VALUES.get(spec["dtype"], "value")


def _key_example(key: str) -> str:
    stem = key[: -len("_id")] if key.endswith("_id") and len(key) > 3 else key
    return f"{stem}_1"


def example_row(*, group: FeatureGroup, version: FeatureGroupVersion | None, now: datetime) -> dict:
    row: dict[str, Any] = {key: _key_example(key) for key in group.entity_keys}
    row[group.event_time_column] = now.strftime("%Y-%m-%dT%H:00:00Z")
    for spec in version.features if version is not None else []:
        row[spec["name"]] = example_value(spec)
    return row


def push_examples(
    *, group: FeatureGroup, version: FeatureGroupVersion | None, batch_url: str
) -> dict[str, str]:
    """The curl commands (JSON rows and a Parquet file) that push one batch into ``group``."""
    row = example_row(group=group, version=version, now=timezone.now())
    body = json.dumps({"rows": [row]}, separators=(", ", ": "))
    headers = '-H "Authorization: Token $TOKEN" \\\n  -H "Idempotency-Key: $BATCH_ID" \\\n'
    json_curl = (
        "curl -X POST "
        f"{headers}"
        '  -H "Content-Type: application/json" \\\n'
        f"  -d '{body}' \\\n"
        f"  {batch_url}"
    )
    parquet_curl = (
        "curl -X POST "
        f"{headers}"
        '  -H "Content-Type: application/vnd.apache.parquet" \\\n'
        "  --data-binary @batch.parquet \\\n"
        f"  {batch_url}"
    )
    return {"json": json_curl, "parquet": parquet_curl, "url": batch_url, "row": row}


# Datasets -------------------------------------------------------------------------------------


@workspace_page()
def dataset_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    page = Paginator(datasets_of(workspace=workspace), DATASETS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    return render(
        request,
        "features/dataset_list.html",
        page_context(
            request,
            page=page,
            can_write=role_at_least(request.workspace_role, Role.DEVELOPER),
            section="features",
        ),
    )


def _dataset_choices(workspace) -> tuple[list[str], list[str]]:
    """The form's choices: live groups (label sources) and their live features."""
    groups = list(
        feature_groups_of(workspace=workspace)
        .exclude(status=Lifecycle.RETIRED)
        .order_by("name")
        .values_list("name", flat=True)
    )
    refs = [
        f"{group}:{feature}"
        for group, feature in Feature.objects.for_workspace(workspace)
        .filter(group__name__in=groups)
        .exclude(status=Lifecycle.RETIRED)
        .order_by("group__name", "name")
        .values_list("group__name", "name")
    ]
    return groups, refs


def _label_group(workspace, form, groups: list[str]) -> FeatureGroup:
    label_group = (
        feature_groups_of(workspace=workspace)
        .filter(name=form.cleaned_data["label_source"])
        .first()
    )
    if label_group is None:
        raise ValidationError({"label_source": f"one of {', '.join(groups) or '(no groups yet)'}"})
    return label_group


@workspace_page(Role.DEVELOPER)
def dataset_create(request: WorkspaceRequest, workspace) -> HttpResponse:
    """Create a training sample from the registry. The build is queued (a Celery task); the
    dataset page shows its progress until it is ready or failed."""
    groups, refs = _dataset_choices(workspace)
    form = DatasetCreateForm(
        request.POST if request.method == "POST" else None, groups=groups, feature_refs=refs
    )
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                dataset = samples.dataset_create(
                    actor=request.user,
                    workspace=workspace,
                    label_group=_label_group(workspace, form, groups),
                    background=True,
                    **form.service_arguments(),
                )
            except (ValidationError, ConflictError) as exc:
                report_service_error(form, None, exc)
            else:
                messages.success(
                    request, f"Dataset '{dataset.name}' v{dataset.version}: {dataset.status}."
                )
                return redirect(
                    "features-dataset",
                    ws=workspace.slug,
                    name=dataset.name,
                    version=dataset.version,
                )
    return render(
        request,
        "features/dataset_form.html",
        page_context(request, form=form, section="features"),
        status=status,
    )


@require_POST
@workspace_page(Role.DEVELOPER)
def dataset_preview(request: WorkspaceRequest, workspace) -> HttpResponse:
    """The form's Preview: how many label rows and what coverage per feature the dataset would
    have, rendered as a fragment; nothing is created. Bad input answers 400 with the fields."""
    groups, refs = _dataset_choices(workspace)
    form = DatasetPreviewForm(request.POST, groups=groups, feature_refs=refs)
    preview = None
    if form.is_valid():
        try:
            preview = samples.dataset_preview(
                workspace=workspace,
                label_group=_label_group(workspace, form, groups),
                **form.preview_arguments(),
            )
        except (ValidationError, ConflictError) as exc:
            report_service_error(form, None, exc)
    rows = []
    if preview is not None:
        rows = [{"ref": ref, **_coverage_bar(share)} for ref, share in preview.coverage.items()]
    return render(
        request,
        "features/_dataset_preview.html",
        {"form": form, "preview": preview, "coverage_rows": rows},
        status=200 if preview is not None else 400,
    )


def _dataset_of(workspace, name: str, version: int) -> Dataset:
    dataset = datasets_of(workspace=workspace).filter(name=name, version=version).first()
    if dataset is None:
        raise Http404(f"No dataset '{name}' v{version}.")
    return dataset


@workspace_page()
def dataset_page(request: WorkspaceRequest, workspace, name: str, version: int) -> HttpResponse:
    dataset = _dataset_of(workspace, name, version)
    coverage = dataset.coverage if isinstance(dataset.coverage, dict) else {}
    rows = []
    for ref in dataset.feature_refs or []:
        share = coverage.get(ref)
        rows.append({"ref": ref, **_coverage_bar(share)})
    for ref, share in coverage.items():
        if ref not in (dataset.feature_refs or []):
            rows.append({"ref": ref, **_coverage_bar(share)})
    return render(
        request,
        "features/dataset_detail.html",
        page_context(request, dataset=dataset, coverage_rows=rows, section="features"),
    )


@require_GET
@workspace_page()
def dataset_progress(request: WorkspaceRequest, workspace, name: str, version: int) -> HttpResponse:
    """The progress bar of a building dataset, polled by htmx every 2 s; once the build is over
    it tells htmx to reload the page (which then shows the rows and coverage, or the error)."""
    dataset = _dataset_of(workspace, name, version)
    response = render(
        request,
        "features/_dataset_progress.html",
        {"dataset": dataset, "workspace": workspace},
    )
    if dataset.status != DatasetStatus.BUILDING:
        response["HX-Refresh"] = "true"
    return response


def _coverage_bar(share: Any) -> dict[str, Any]:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or share != share:
        return {"share": None, "percent": None, "width": "0"}
    bounded = min(max(float(share), 0.0), 1.0)
    return {"share": bounded, "percent": f"{bounded * 100:.1f}", "width": f"{bounded * 100:.1f}"}


# Dashboard card -------------------------------------------------------------------------------


def dashboard_section(*, workspace, user) -> DashboardSection:
    """The "Features" card of the workspace dashboard: group counts and the broken groups, in one
    query (the dashboard's query budget is shared by every card)."""
    groups = feature_groups_of(workspace=workspace).exclude(status=Lifecycle.RETIRED)
    counts = dict.fromkeys(HealthStatus.values, 0)
    total = 0
    broken = []
    for name, health in groups.values_list("name", "health_status"):
        total += 1
        counts[health] = counts.get(health, 0) + 1
        if health == HealthStatus.BROKEN:
            broken.append(name)
    return DashboardSection(
        template="features/_dashboard_section.html",
        context={
            "workspace": workspace,
            "total": total,
            "counts": counts,
            "broken": broken[:10],
            "more_broken": max(len(broken) - 10, 0),
        },
    )
