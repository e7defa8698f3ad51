"""Browser UI of serving: models, a version's page (held-out evaluation, gates, artifacts), two
versions side by side, deployments with charts (QPS, latency histogram, errors, version mix) and
a rollback button; ``/metrics``."""

from __future__ import annotations

import hmac

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from serving import benchmarks, presentation, registry
from serving.controllers import deployment_status
from serving.deployments import deployment_create, deployment_release, deployment_rollback
from serving.forms import (
    DeployForm,
    LanguageTryForm,
    MlflowImportForm,
    RankerTryForm,
    VersionRegisterForm,
)
from serving.gates import version_gates_request
from serving.metrics import exposition
from serving.models import Deployment, DeploymentChange, ModelVersion, RegisteredModel
from serving.observability import deployment_stats
from serving.routing import routing_table
from training import services as training_services
from workspaces.exceptions import ConflictError, ReferenceNotFound
from workspaces.models import Role
from workspaces.selectors import role_at_least, workspace_object
from workspaces.views import WorkspaceRequest, page_context, workspace_page


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition, summed over the server's processes under gunicorn (set
    METRICS_TOKEN to require ``Authorization: Bearer <token>``)."""
    token = getattr(settings, "METRICS_TOKEN", "")
    given = request.headers.get("Authorization", "")
    if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        response = HttpResponse(status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)


def _put_errors(form, exc: Exception, fields: dict[str, str]) -> None:
    """A service's error next to the form field it names (``fields`` maps service names)."""
    if isinstance(exc, ValidationError) and hasattr(exc, "error_dict"):
        for key, messages_of_key in exc.message_dict.items():
            target = fields.get(key, key if key in form.fields else None)
            for message in messages_of_key:
                form.add_error(target, message if target else f"{key}: {message}")
        return
    attr = getattr(exc, "attr", None)
    target = fields.get(attr or "", attr if attr in form.fields else None)
    for message in getattr(exc, "messages", [str(exc)]):
        form.add_error(target, message)


@workspace_page()
def model_list(
    request: WorkspaceRequest, workspace, register_form=None, import_form=None
) -> HttpResponse:
    models = RegisteredModel.objects.for_workspace(workspace).annotate(
        latest=Max("versions__version")
    )
    versions = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model")
        .order_by("-created_at")[:50]
    )
    numbers: dict[int, list[int]] = {}
    for model_id, number in (
        ModelVersion.objects.for_workspace(workspace)
        .order_by("model_id", "version")
        .values_list("model_id", "version")
    ):
        numbers.setdefault(model_id, []).append(number)
    models = list(models)
    for model in models:
        model.version_numbers = numbers.get(model.pk, [])
    return render(
        request,
        "serving/model_list.html",
        page_context(
            request,
            section="serving",
            models=models,
            versions=versions,
            can_register=role_at_least(request.workspace_role, Role.DEVELOPER),
            register_form=register_form or VersionRegisterForm(workspace=workspace),
            import_form=import_form or MlflowImportForm(workspace=workspace),
        ),
        status=400
        if any(f is not None and f.errors for f in (register_form, import_form))
        else 200,
    )


@require_POST
@workspace_page(Role.DEVELOPER)
def version_register(request: WorkspaceRequest, workspace) -> HttpResponse:
    """Register the next version of a model from a succeeded job (``model_version_register``)."""
    from training.models import TrainingJob

    form = VersionRegisterForm(request.POST, workspace=workspace)
    if form.is_valid():
        job = TrainingJob.objects.for_workspace(workspace).get(pk=int(form.cleaned_data["job"]))
        try:
            version = registry.model_version_register(
                actor=request.user,
                workspace=workspace,
                name=form.cleaned_data["model"],
                job=job,
                description=form.cleaned_data["description"],
            )
        except (ValidationError, ConflictError) as exc:
            _put_errors(form, exc, {"name": "model", "bundle_path": "job"})
        else:
            messages.success(request, f"Registered {version.model.name} v{version.version}.")
            return redirect(
                "serving-version",
                ws=workspace.slug,
                name=version.model.name,
                version=version.version,
            )
    return model_list(request, workspace.slug, register_form=form)


@require_POST
@workspace_page(Role.DEVELOPER)
def version_import(request: WorkspaceRequest, workspace) -> HttpResponse:
    """Import a stock-client MLflow model with its input mapping
    (``model_version_import_mlflow``); its errors land on the fields they name."""
    from features.selectors import datasets_of

    form = MlflowImportForm(request.POST, workspace=workspace)
    if form.is_valid():
        data = form.cleaned_data
        activation = data["activation"]
        try:
            # The one resolver of references (a dataset gone since the form was drawn is the
            # field's error, as an outside one is in the API).
            dataset = (
                workspace_object(
                    datasets_of(workspace=workspace), workspace=workspace,
                    ref=int(data["dataset"]), attr="dataset", noun="dataset",
                )
                if data["dataset"]
                else None
            )  # fmt: skip
            version = registry.model_version_import_mlflow(
                actor=request.user,
                workspace=workspace,
                name=data["model"],
                source=data["source"],
                inputs=data["inputs"],
                dataset=dataset,
                architecture={"kind": "mlp", "activation": activation} if activation else None,
                output=data["output"],
            )
        except (ValidationError, ConflictError, ReferenceNotFound) as exc:
            _put_errors(form, exc, {"name": "model", "architecture": "activation"})
        else:
            messages.success(request, f"Imported {version.model.name} v{version.version}.")
            return redirect(
                "serving-version",
                ws=workspace.slug,
                name=version.model.name,
                version=version.version,
            )
    return model_list(request, workspace.slug, import_form=form)


def _version_or_404(workspace, name: str, version: int) -> ModelVersion:
    found = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model", "job", "dataset")
        .filter(model__name=name, version=version)
        .first()
    )
    if found is None:
        raise Http404("No such model version.")
    return found


@require_POST
@workspace_page(Role.MAINTAINER)
def version_deploy(request: WorkspaceRequest, workspace, name: str, version: int) -> HttpResponse:
    """Release the version to an existing deployment of its model, or create a deployment
    serving it (``deployment_release`` / ``deployment_create``, as the API)."""
    found = _version_or_404(workspace, name, version)
    form = DeployForm(request.POST, workspace=workspace, version=found)
    if form.is_valid():
        target = form.cleaned_data["deployment"]
        dep = form.existing.get(target)
        try:
            if dep is not None:
                deployment_release(
                    actor=request.user,
                    workspace=workspace,
                    deployment=dep,
                    version=found,
                    reason=form.cleaned_data["reason"],
                )
            elif Deployment.objects.for_workspace(workspace).filter(name=target).exists():
                raise ValidationError(
                    {
                        "deployment": f"deployment '{target}' serves another model; use one of: "
                        f"{', '.join(sorted(form.existing)) or 'a new name'}"
                    }
                )
            else:
                dep = deployment_create(
                    actor=request.user, workspace=workspace, name=target, version=found
                )
        except (ValidationError, ConflictError) as exc:
            _put_errors(form, exc, {"name": "deployment", "version_id": "deployment"})
        else:
            messages.success(request, f"{found} now serves on deployment {dep.name}.")
            return redirect("serving-deployment", ws=workspace.slug, name=dep.name)
    return version_detail(request, workspace.slug, name, version, deploy_form=form)


@require_POST
@workspace_page(Role.MAINTAINER)
def version_gates(request: WorkspaceRequest, workspace, name: str, version: int) -> HttpResponse:
    """Ask for the release gates to run again on a worker (``version_gates_request``)."""
    found = _version_or_404(workspace, name, version)
    try:
        version_gates_request(actor=request.user, workspace=workspace, version=found)
    except ConflictError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "The release gates will run again on a worker.")
    return redirect("serving-version", ws=workspace.slug, name=name, version=version)


@require_POST
@workspace_page(Role.DEVELOPER)
def version_quantize(request: WorkspaceRequest, workspace, name: str, version: int) -> HttpResponse:
    """Register the version's int8 variant (``model_version_quantize``, as the API) and show
    it; a refusal (already quantised, not a torch model) is said on the version's page."""
    from serving.quantization import model_version_quantize

    found = _version_or_404(workspace, name, version)
    try:
        variant = model_version_quantize(actor=request.user, workspace=workspace, version=found)
    except ConflictError as exc:
        messages.error(request, str(exc))
        return redirect("serving-version", ws=workspace.slug, name=name, version=version)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("serving-version", ws=workspace.slug, name=name, version=version)
    messages.success(
        request,
        f"Registered v{variant.version}, the int8 variant of v{found.version}; its release "
        f"gates (with the quantization gate against v{found.version}) are running on a worker.",
    )
    return redirect("serving-version", ws=workspace.slug, name=name, version=variant.version)


@workspace_page(Role.DEVELOPER)
def version_try(request: WorkspaceRequest, workspace, name: str, version: int) -> HttpResponse:
    """The playground: a request form for a ranking version (scored by a sandbox replica), a
    prompt box for a language model (``serving.playground``, as the API's ``try``)."""
    import json

    from serving import playground

    found = _version_or_404(workspace, name, version)
    language = playground.is_language(found)
    result = None
    form: forms.Form
    if request.method == "POST":
        form = LanguageTryForm(request.POST) if language else RankerTryForm(request.POST)
        if form.is_valid():
            try:
                if language:
                    result = playground.try_language(
                        actor=request.user,
                        workspace=workspace,
                        version=found,
                        prompt=form.cleaned_data["prompt"],
                        max_new_tokens=form.cleaned_data["max_new_tokens"],
                    )
                else:
                    result = playground.try_ranker(
                        actor=request.user,
                        workspace=workspace,
                        version=found,
                        rows=form.cleaned_data["rows"],
                    )
            except ValidationError as exc:
                _put_errors(form, exc, {})
    elif language:
        form = LanguageTryForm(
            initial={"prompt": "### Instruction:\n\n\n### Response:\n", "max_new_tokens": 64}
        )
    else:
        rows = playground.example_rows(found)
        form = RankerTryForm(initial={"rows": json.dumps(rows, indent=1, default=str)})
    features = [str(f.get("ref")) for f in (found.spec or {}).get("features") or []]
    scored = []
    if result and result["kind"] == "ranking":
        scored = [
            {"n": i + 1, "score": score, "cells": [row.get(ref) for ref in features]}
            for i, (score, row) in enumerate(zip(result["scores"], result["rows"], strict=True))
        ]
    return render(
        request,
        "serving/version_try.html",
        page_context(
            request,
            section="serving",
            version=found,
            language=language,
            form=form,
            result=result,
            scored=scored,
            features=features,
        ),
        status=400 if form.errors else 200,
    )


@workspace_page()
def version_detail(
    request: WorkspaceRequest, workspace, name: str, version: int, deploy_form=None
) -> HttpResponse:
    found = _version_or_404(workspace, name, version)
    evaluation = presentation.version_evaluation(found)
    metrics_rows = sorted(
        (k, v)
        for k, v in (found.metrics or {}).items()
        if isinstance(v, (int, float)) and k != "auc_delta_vs_production"
    )
    others = list(
        ModelVersion.objects.for_workspace(workspace)
        .filter(model=found.model)
        .exclude(pk=found.pk)
        .order_by("-version")
        .values_list("version", flat=True)[:50]
    )
    importance = sorted(
        ((k, v) for k, v in (found.importance or {}).items() if isinstance(v, (int, float))),
        key=lambda kv: -abs(kv[1]),
    )[:30]
    return render(
        request,
        "serving/version_detail.html",
        page_context(
            request,
            section="serving",
            version=found,
            evaluation=evaluation,
            holdout_rows=presentation.holdout_table(
                evaluation["holdout"], evaluation["production"]
            ),
            roc_chart=presentation.roc_chart(
                [(f"v{found.version} TPR", evaluation["roc"], presentation.COMPARE_COLOURS[0])]
            ),
            calibration_chart=presentation.calibration_chart(
                [
                    (
                        f"v{found.version} observed",
                        evaluation["calibration"],
                        presentation.COMPARE_COLOURS[0],
                    )
                ]
            ),
            other_versions=others,
            mlflow_run_url=training_services.mlflow_run_url(workspace.slug, found.mlflow_run_id),
            metrics_rows=metrics_rows,
            importance=importance,
            gates=sorted((k, v) for k, v in (found.gates or {}).items() if k != "run"),
            gates_run=(found.gates or {}).get("run"),
            can_deploy=role_at_least(request.workspace_role, Role.MAINTAINER),
            deploy_form=deploy_form or DeployForm(workspace=workspace, version=found),
            quantization=presentation.version_quantization(found),
            can_quantize=role_at_least(request.workspace_role, Role.DEVELOPER),
            can_try=role_at_least(request.workspace_role, Role.DEVELOPER),
            benchmark_view=benchmarks.version_benchmarks(found),
            benchmark_kind=benchmarks.version_kind(found),
        ),
        status=400 if deploy_form is not None and deploy_form.errors else 200,
    )


@workspace_page()
def deployment_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    deployments = list(
        Deployment.objects.for_workspace(workspace).select_related(
            "model", "version", "previous_version", "observed"
        )
    )
    for dep in deployments:
        dep.status_view = deployment_status(dep)
    return render(
        request,
        "serving/deployment_list.html",
        page_context(request, section="serving", deployments=deployments),
    )


@require_GET
@workspace_page()
def deployment_status_fragment(request: HttpRequest, workspace, name: str) -> HttpResponse:
    """The controller's status of a deployment, polled by the deployment page (htmx) while
    the backend is Pending or Progressing."""
    dep = (
        Deployment.objects.for_workspace(workspace)
        .select_related("observed")
        .filter(name=name)
        .first()
    )
    if dep is None:
        raise Http404("No such deployment.")
    return render(
        request,
        "serving/_deployment_status.html",
        {"dep": dep, "status": deployment_status(dep), "workspace": workspace},
    )


@workspace_page()
def deployment_detail(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    dep = (
        Deployment.objects.for_workspace(workspace)
        .select_related("model", "version", "previous_version", "observed")
        .filter(name=name)
        .first()
    )
    if dep is None:
        raise Http404("No such deployment.")
    can_release = role_at_least(request.workspace_role, Role.MAINTAINER)
    if request.method == "POST":
        if not can_release:
            raise Http404("No such deployment.")
        try:
            deployment_rollback(
                actor=request.user,
                workspace=workspace,
                deployment=dep,
                reason=request.POST.get("reason", "").strip()[:500],
            )
            messages.success(request, "Rolled back: traffic moves to the previous version.")
        except (ValidationError, ConflictError) as exc:
            messages.error(request, " ".join(getattr(exc, "messages", [str(exc)])))
        return redirect("serving-deployment", ws=workspace.slug, name=dep.name)
    changes = (
        DeploymentChange.objects.for_workspace(workspace)
        .filter(deployment=dep)
        .select_related("actor", "from_version", "to_version")[:30]
    )
    stats = deployment_stats(dep)
    observed = getattr(dep, "observed", None)
    return render(
        request,
        "serving/deployment_detail.html",
        page_context(
            request,
            section="serving",
            dep=dep,
            stats=stats,
            charts=presentation.deployment_charts(stats, timezone.now()),
            scaling=presentation.scaling_text(dep.scaling, dep.replicas),
            status=deployment_status(dep),
            status_rows=presentation.detail_rows(observed.detail if observed else {}),
            routes=presentation.routing_rows(routing_table(workspace, dep)),
            changes=[(c, presentation.change_detail(c)) for c in changes],
            can_release=can_release,
        ),
    )


class _CompareError(Exception):
    """A compare query naming something that is not a version of the model (a 400)."""


def _compare_pick(workspace, model, raw: str, side: str, numbers: list[int]) -> ModelVersion:
    allowed = ", ".join(f"v{n}" for n in numbers) or "none"
    text = (raw or "").strip().lstrip("vV")
    if not text.isdigit():
        raise _CompareError(f"{side}: '{raw}' is not a version number; {model.name} has {allowed}.")
    found = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model", "job", "job__dataset", "dataset")
        .filter(model=model, version=int(text))
        .first()
    )
    if found is None:
        raise _CompareError(f"{side}: v{text} is not a version of {model.name}; it has {allowed}.")
    return found


@workspace_page()
def version_compare(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    """Two versions of one model side by side (``?a=<v>&b=<v>``): held-out metrics on the same
    rows, ROC and calibration curves overlaid, and the training parameters' diff."""
    model = RegisteredModel.objects.for_workspace(workspace).filter(name=name).first()
    if model is None:
        raise Http404("No such model.")
    numbers = list(
        ModelVersion.objects.for_workspace(workspace)
        .filter(model=model)
        .order_by("version")
        .values_list("version", flat=True)
    )
    raw_a, raw_b = request.GET.get("a", ""), request.GET.get("b", "")
    if not raw_a and not raw_b and len(numbers) >= 2:
        raw_a, raw_b = str(numbers[-2]), str(numbers[-1])
    error, a, b, result = "", None, None, None
    if raw_a or raw_b:
        try:
            a = _compare_pick(workspace, model, raw_a, "a", numbers)
            b = _compare_pick(workspace, model, raw_b, "b", numbers)
        except _CompareError as exc:
            error = str(exc)
        else:
            result = presentation.comparison(a, b)
    elif numbers:
        error = f"{model.name} has only v{numbers[0]}: register another version to compare."
    return render(
        request,
        "serving/version_compare.html",
        page_context(
            request,
            section="serving",
            model=model,
            numbers=numbers,
            picked=(raw_a.strip().lstrip("vV"), raw_b.strip().lstrip("vV")),
            error=error,
            a=a,
            b=b,
            result=result,
        ),
        status=400 if error and (raw_a or raw_b) else 200,
    )
