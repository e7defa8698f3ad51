"""Browser pages of blind side-by-side human reviews (``serving.review``), under
/w/<ws>/reviews/: the reviews (with what to do when there are none), the form that starts one
(linked from a language-model version's page), a review's page (generation progress, then the
results: B's win rate with its interval drawn, counts, reviewers and their agreement) and the
reviewer's page, which shows one item at a time as "Response 1" and "Response 2" and never
anything that tells which version is which."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from curation.models import RecordSetStatus
from curation.selectors import record_sets_of
from serving import review as reviews
from serving.models import ModelVersion, PairwiseReview, ReviewStatus
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

# The results page draws the win rate's interval on a 0-1 axis this many pixels wide.
AXIS_PX = 400


def _usernames(text: str) -> list[str]:
    return [u for u in (part.strip() for part in text.replace(",", " ").split()) if u]


class ReviewForm(forms.Form):
    version_a = forms.TypedChoiceField(
        coerce=int, label="Version A", help_text="The baseline (e.g. the version in use)."
    )
    version_b = forms.TypedChoiceField(
        coerce=int, label="Version B", help_text="The candidate; the win rate is B's over A."
    )
    record_set: Any = forms.ModelChoiceField(
        queryset=None,
        empty_label=None,
        help_text="Ready record set of instruction rows (instruction, input, output) or chats "
        "(messages); its prompts are what the versions answer.",
    )
    items = forms.IntegerField(
        min_value=1,
        max_value=reviews.MAX_ITEMS,
        initial=reviews.DEFAULT_ITEMS,
        help_text=f"Prompts sampled from the record set (1 to {reviews.MAX_ITEMS}).",
    )
    seed = forms.IntegerField(
        min_value=0, max_value=reviews.MAX_SEED, initial=0, help_text="The sample's seed."
    )
    reviewers = forms.CharField(
        help_text="Usernames of 2 or more members, separated by commas or spaces; each judges "
        "every item."
    )
    max_new_tokens = forms.IntegerField(
        min_value=1,
        max_value=reviews.MAX_NEW_TOKENS,
        initial=reviews.DEFAULT_MAX_NEW_TOKENS,
        help_text=f"Longest response, in tokens (1 to {reviews.MAX_NEW_TOKENS}).",
    )

    def __init__(self, *args: Any, workspace: Any, versions: list[ModelVersion], **kwargs: Any):
        super().__init__(*args, **kwargs)
        choices = [(v.pk, f"{v.model.name} v{v.version}") for v in versions]
        allowed = ", ".join(label for _, label in choices) or "none yet"
        for name in ("version_a", "version_b"):
            field: Any = self.fields[name]
            field.choices = choices
            field.error_messages["invalid_choice"] = (
                f"not a language-model version of this workspace; allowed: {allowed}"
            )
        record_set: Any = self.fields["record_set"]
        record_set.queryset = record_sets_of(workspace=workspace).filter(
            status=RecordSetStatus.READY
        )
        names = ", ".join(str(r) for r in record_set.queryset[:30]) or "none yet"
        record_set.error_messages["invalid_choice"] = (
            f"not a ready record set of this workspace; allowed: {names}"
        )


def _review(workspace: Any, pk: int) -> PairwiseReview:
    found = reviews.reviews_of(workspace=workspace).filter(pk=pk).first()
    if found is None:
        raise Http404("No such review.")
    return found


def _put_errors(form: forms.Form, exc: ValidationError | ConflictError) -> None:
    if isinstance(exc, ConflictError):
        attr = exc.attr if exc.attr in form.fields else None
        form.add_error(attr, str(exc))
        return
    for key, problems in exc.message_dict.items():
        target = key if key in form.fields else None
        for problem in problems:
            form.add_error(target, problem if target else f"{key}: {problem}")


@workspace_page()
def review_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    return render(
        request,
        "serving/review_list.html",
        page_context(
            request,
            section="serving",
            rows=reviews.reviews_with_progress(workspace),
            can_start=role_at_least(request.workspace_role, Role.MAINTAINER),
            has_versions=bool(reviews.language_versions_of(workspace=workspace)),
        ),
    )


def _initial(versions: list[ModelVersion], wanted: str) -> dict[str, Any]:
    """B from ``?version=<id>`` (the version page's link), A the version before it."""
    if not wanted.isdigit():
        return {}
    chosen = next((v for v in versions if v.pk == int(wanted)), None)
    if chosen is None:
        return {}
    older = [v for v in versions if v.model_id == chosen.model_id and v.version < chosen.version]
    initial: dict[str, Any] = {"version_b": chosen.pk}
    if older:
        initial["version_a"] = max(older, key=lambda v: v.version).pk
    return initial


@workspace_page(Role.MAINTAINER)
def review_create(request: WorkspaceRequest, workspace) -> HttpResponse:
    versions = reviews.language_versions_of(workspace=workspace)
    by_pk = {v.pk: v for v in versions}
    status = 200
    if request.method == "POST":
        form = ReviewForm(request.POST, workspace=workspace, versions=versions)
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            try:
                review = reviews.review_create(
                    actor=request.user,
                    workspace=workspace,
                    version_a=by_pk[data["version_a"]],
                    version_b=by_pk[data["version_b"]],
                    record_set=data["record_set"],
                    reviewers=_usernames(data["reviewers"]),
                    items=data["items"],
                    seed=data["seed"],
                    max_new_tokens=data["max_new_tokens"],
                )
            except (ValidationError, ConflictError) as exc:
                _put_errors(form, exc)
                status = 409 if isinstance(exc, ConflictError) else 400
            else:
                messages.success(
                    request,
                    f"Review {review.pk} started: generating {review.item_count} responses of "
                    "each version.",
                )
                return redirect("serving-review", ws=workspace.slug, pk=review.pk)
    else:
        initial = _initial(versions, request.GET.get("version", ""))
        form = ReviewForm(workspace=workspace, versions=versions, initial=initial)
    record_sets: Any = form.fields["record_set"]
    return render(
        request,
        "serving/review_form.html",
        page_context(
            request,
            section="serving",
            form=form,
            has_versions=len(versions) >= 2,
            has_record_sets=record_sets.queryset.exists(),
        ),
        status=status,
    )


def _interval_drawing(results: dict[str, Any]) -> dict[str, float] | None:
    if results.get("win_rate") is None:
        return None
    policy = results.get("policy") or {}
    return {
        "low": results["ci_low"] * AXIS_PX,
        "high": results["ci_high"] * AXIS_PX,
        "width": (results["ci_high"] - results["ci_low"]) * AXIS_PX,
        "point": results["win_rate"] * AXIS_PX,
        "half": 0.5 * AXIS_PX,
        "threshold": policy["min_win_rate"] * AXIS_PX if policy.get("required") else None,
        "axis": AXIS_PX,
    }


@workspace_page()
def review_page(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    review = _review(workspace, pk)
    role = request.workspace_role
    visible = reviews.may_see_results(review, request.user, role)
    results = reviews.review_results(review) if visible else None
    reviewer = reviews.is_reviewer(review, request.user)
    return render(
        request,
        "serving/review_detail.html",
        page_context(
            request,
            section="serving",
            review=review,
            reviewer_names=sorted(u.username for u in review.reviewers.all()),
            progress=reviews.progress_of(review, request.user),
            results=results,
            drawing=_interval_drawing(results) if results else None,
            is_reviewer=reviewer,
            left_to_judge=reviewer and reviews.next_item(review, request.user) is not None,
            can_close=role_at_least(role, Role.MAINTAINER) and review.status == ReviewStatus.OPEN,
        ),
    )


@workspace_page()
def review_progress(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    """The generation's progress, polled by htmx; reloads the page once it is over."""
    review = _review(workspace, pk)
    response = render(
        request,
        "serving/review_progress.html",
        {"review": review, "workspace": workspace, "progress": reviews.progress_of(review)},
    )
    if review.status != ReviewStatus.GENERATING:
        response["HX-Refresh"] = "true"
    return response


@require_POST
@workspace_page(Role.MAINTAINER)
def review_close(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    review = _review(workspace, pk)
    try:
        reviews.review_close(actor=request.user, review=review)
    except ConflictError as exc:
        messages.warning(request, str(exc))
    else:
        messages.success(request, f"Review {review.pk} closed with the judgements it has.")
    return redirect("serving-review", ws=workspace.slug, pk=review.pk)


def _judge_view(
    request: WorkspaceRequest,
    workspace: Any,
    review: PairwiseReview,
    *,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    item = reviews.next_item(review, request.user)
    first, second = reviews.shown_responses(item) if item else ("", "")
    progress = reviews.progress_of(review, request.user)
    return render(
        request,
        "serving/review_judge.html",
        page_context(
            request,
            section="serving",
            review=review,
            item=item,
            response_1=first,
            response_2=second,
            number=progress["mine"] + 1,
            progress=progress,
            error=error,
        ),
        status=status,
    )


@workspace_page()
def review_judge(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    """One item at a time for a reviewer: the prompt, Response 1 and 2 and three buttons (keys
    1, 2 and t). The form posts the item's position and the side chosen, nothing else."""
    review = _review(workspace, pk)
    if not reviews.is_reviewer(review, request.user):
        raise PermissionDenied("You are not a reviewer of this review.")
    if request.method != "POST":
        return _judge_view(request, workspace, review)
    position = request.POST.get("position", "")
    item = reviews.items_of(review).filter(position=int(position)).first() if (
        position.isdigit() and len(position) < 10
    ) else None  # fmt: skip
    if item is None:
        return _judge_view(
            request, workspace, review, error="position: not an item of this review", status=400
        )
    try:
        reviews.review_judge(
            actor=request.user, review=review, item=item, side=request.POST.get("choice", "")
        )
    except ValidationError as exc:
        text = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.message_dict.items())
        return _judge_view(request, workspace, review, error=text, status=400)
    except ConflictError as exc:
        return _judge_view(request, workspace, review, error=str(exc), status=409)
    messages.success(request, f"Saved your judgement of item {item.position + 1}.")
    return redirect("serving-review-judge", ws=workspace.slug, pk=review.pk)
