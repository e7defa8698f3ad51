"""Pages of benchmark sets (``serving.benchmarks``): the list with its create form, and one
set's leaderboard of scored model versions."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from serving import benchmarks
from serving.forms import BenchmarkSetForm
from serving.models import BenchmarkKind, BenchmarkScore, BenchmarkSet
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page


@workspace_page()
def benchmark_list(request: WorkspaceRequest, workspace, form=None) -> HttpResponse:
    sets = benchmarks.latest_sets(workspace)
    counts: dict[int, int] = {}
    for benchmark_id in (
        BenchmarkScore.objects.for_workspace(workspace)
        .filter(benchmark__in=sets, state="done")
        .values_list("benchmark_id", flat=True)
    ):
        counts[benchmark_id] = counts.get(benchmark_id, 0) + 1
    return render(
        request,
        "serving/benchmark_list.html",
        page_context(
            request,
            section="serving",
            sets=[(b, counts.get(b.pk, 0)) for b in sets],
            form=form or BenchmarkSetForm(workspace=workspace),
            can_create=role_at_least(request.workspace_role, Role.DEVELOPER),
        ),
        status=400 if form is not None and form.errors else 200,
    )


@require_POST
@workspace_page(Role.DEVELOPER)
def benchmark_create(request: WorkspaceRequest, workspace) -> HttpResponse:
    from curation.models import RecordSet
    from features.models import Dataset

    form = BenchmarkSetForm(request.POST, workspace=workspace)
    if form.is_valid():
        data = form.cleaned_data
        kind, _, pk = data["source"].partition(":")
        dataset = record_set = None
        if kind == "dataset":
            dataset = Dataset.objects.for_workspace(workspace).get(pk=int(pk))
        else:
            record_set = RecordSet.objects.for_workspace(workspace).get(pk=int(pk))
        try:
            created = benchmarks.benchmark_set_create(
                actor=request.user,
                workspace=workspace,
                name=data["name"],
                dataset=dataset,
                record_set=record_set,
                label_column=data["label_column"],
                group_column=data["group_column"],
                ndcg_k=data["ndcg_k"],
                max_new_tokens=data["max_new_tokens"],
                description=data["description"],
            )
        except (ValidationError, ConflictError) as exc:
            if isinstance(exc, ValidationError) and hasattr(exc, "error_dict"):
                for key, errors in exc.message_dict.items():
                    target = key if key in form.fields else "source"
                    for message in errors:
                        form.add_error(target, message)
            else:
                form.add_error(getattr(exc, "attr", None) or None, str(exc))
        else:
            messages.success(
                request,
                f"Created benchmark set {created}: the models' latest and production versions "
                "are being scored on it.",
            )
            return redirect("serving-benchmark", ws=workspace.slug, name=created.name)
    return benchmark_list(request, workspace.slug, form=form)


@workspace_page()
def benchmark_detail(request: WorkspaceRequest, workspace, name: str) -> HttpResponse:
    versions = list(BenchmarkSet.objects.for_workspace(workspace).filter(name=name))
    if not versions:
        raise Http404("no such benchmark set")
    wanted = request.GET.get("v")
    chosen = next((b for b in versions if str(b.version) == wanted), versions[0])
    scores = list(
        BenchmarkScore.objects.for_workspace(workspace)
        .filter(benchmark=chosen)
        .select_related("version", "version__model")
    )
    metrics = (
        benchmarks.LANGUAGE_METRICS
        if chosen.kind == BenchmarkKind.LANGUAGE
        else benchmarks.RANKING_METRICS
    )
    lead = metrics[0]
    done = sorted(
        (s for s in scores if s.state == "done"),
        key=lambda s: -((s.metrics or {}).get(lead) or float("-inf")),
    )
    others = [s for s in scores if s.state != "done"]
    rows = [(s, [(s.metrics or {}).get(m) for m in metrics]) for s in [*done, *others]]
    return render(
        request,
        "serving/benchmark_detail.html",
        page_context(
            request,
            section="serving",
            benchmark=chosen,
            versions=versions,
            metrics=metrics,
            rows=rows,
            pending=any(s.state in ("queued", "running") for s in scores),
        ),
    )
