"""Blind side-by-side human review of two versions of one language model (X4 "human review").

A maintainer starts a review (``review_create``): versions A and B of one registered language
model (``lm_lora``), a record set of instruction or chat rows, ``items`` prompts sampled from it
with ``seed``, and two or more reviewers from the workspace's members. A worker
(``serving.tasks.review_generate_task``, after the commit) renders each sampled row's prompt as
training does, generates both versions' greedy responses (``serving.lm_inference.generate``),
and stores the items, each with a random side assignment (half of the items show A as
"Response 1", shuffled with the operating system's randomness, so the seed does not reveal it).
The review goes ``generating -> open -> done`` (or ``failed`` with the error).

Each reviewer judges each item once (``review_judge``): "1", "2" or "tie", the side they saw;
the server maps the side back to A or B. The review is done when every reviewer has judged every
item, or when a maintainer closes it early (``review_close``).

Results (``review_results``): B's win rate over A with ties counted as half a win, and its 95%
**Wilson score interval** (statsmodels' ``proportion_confint(method="wilson")``) on the count
``wins + ties / 2`` of all judgements. Each judgement counts as one trial: two reviewers of the
same item are not independent, so where reviewers agree closely the interval is somewhat narrower
than a bootstrap over items would give. Agreement: Cohen's kappa (scikit-learn's
``cohen_kappa_score`` on the verdicts a/b/tie) and the raw share of equal verdicts for each pair
of reviewers on the items both judged, and over all pairs (kappa averaged, agreement pooled).

Release policy (``require_review``): ``workspace.template["review_policy"]`` is

    {"required": true, "min_win_rate": 0.5}

``required`` (a boolean, false when absent) and ``min_win_rate`` (a number from 0 to 1, 0.5 when
absent). When required, a language-model version may be released only when the **latest done**
review that has it as B passes: the lower bound of its 95% interval is at least
``min_win_rate`` (with 0.5: B is better than A beyond the review's noise). A newer done review
that fails outweighs an older one that passed. Ranking versions are not reviewed (experiments
compare them) and pass. A policy of another shape fails closed (409 naming ``review_policy``).
"""

from __future__ import annotations

import logging
import math
import random
import warnings
from functools import partial
from itertools import combinations
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from curation.models import RecordSet, RecordSetStatus
from serving.models import (
    ModelVersion,
    PairwiseItem,
    PairwiseJudgement,
    PairwiseReview,
    ReviewStatus,
    ReviewVerdict,
)
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Membership, Role, Workspace
from workspaces.selectors import role_at_least

logger = logging.getLogger(__name__)

DEFAULT_ITEMS = 20
MAX_ITEMS = 200
MAX_REVIEWERS = 20
MAX_SEED = 2**31 - 1
DEFAULT_MAX_NEW_TOKENS = 64
MAX_NEW_TOKENS = 256
MAX_ERROR_CHARS = 2000
SIDES = ("1", "2", "tie")
POLICY_KEY = "review_policy"
POLICY_KEYS = ("required", "min_win_rate")
DEFAULT_MIN_WIN_RATE = 0.5
# Generation reports progress after this many prompts.
PROGRESS_EVERY = 5


# ---------------------------------------------------------------------------------------------
# Reads


def reviews_of(*, workspace: Workspace | int) -> QuerySet[PairwiseReview]:
    """The workspace's reviews, newest first, with what their pages show."""
    return PairwiseReview.objects.for_workspace(workspace).select_related(
        "model", "version_a", "version_b", "record_set", "created_by"
    )


def items_of(review: PairwiseReview) -> QuerySet[PairwiseItem]:
    return PairwiseItem.objects.for_workspace(review.workspace_id).filter(review=review)


def judgements_of(review: PairwiseReview) -> QuerySet[PairwiseJudgement]:
    return PairwiseJudgement.objects.for_workspace(review.workspace_id).filter(review=review)


def language_versions_of(*, workspace: Workspace | int) -> list[ModelVersion]:
    """The workspace's language-model versions (newest first, at most 500)."""
    from training.bundle import is_language_model

    found = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model")
        .order_by("model__name", "-version")[:500]
    )
    return [v for v in found if is_language_model(str((v.spec or {}).get("template") or ""))]


def is_reviewer(review: PairwiseReview, user: Any) -> bool:
    return bool(user and user.is_authenticated) and review.reviewers.filter(pk=user.pk).exists()


def progress_of(review: PairwiseReview, user: Any = None) -> dict[str, Any]:
    """Judgements given and wanted, and (with ``user``) how many of the items they judged."""
    reviewers = review.reviewers.count()
    judged = judgements_of(review).count()
    out: dict[str, Any] = {
        "items": review.item_count,
        "reviewers": reviewers,
        "judgements": judged,
        "judgements_wanted": review.item_count * reviewers,
        "generated": review.generated,
        "generated_wanted": 2 * review.item_count,
    }
    if user is not None and getattr(user, "is_authenticated", False):
        out["mine"] = judgements_of(review).filter(reviewer=user).count()
    return out


def next_item(review: PairwiseReview, user: Any) -> PairwiseItem | None:
    """The first item ``user`` has not judged yet (None when none is left or the review is not
    open)."""
    if review.status != ReviewStatus.OPEN:
        return None
    return items_of(review).exclude(judgements__reviewer=user).order_by("position").first()


def shown_responses(item: PairwiseItem) -> tuple[str, str]:
    """("Response 1", "Response 2") as the reviewer sees them."""
    return (item.output_a, item.output_b) if item.a_on_left else (item.output_b, item.output_a)


def may_see_results(review: PairwiseReview, user: Any, role: str | None) -> bool:
    """Everybody in the workspace once the review is done; before that, its maintainers (and
    admins), unless they are reviewers with items still to judge (the figures would bias them)."""
    if review.status == ReviewStatus.DONE:
        return True
    if not role_at_least(role, Role.MAINTAINER):
        return False
    if is_reviewer(review, user) and review.status == ReviewStatus.OPEN:
        return next_item(review, user) is None
    return True


# ---------------------------------------------------------------------------------------------
# Writes


def _reviewers(workspace: Workspace, usernames: Any) -> list[Any]:
    if not isinstance(usernames, (list, tuple)) or not all(isinstance(u, str) for u in usernames):
        raise ValidationError({"reviewers": "must be a list of usernames"})
    wanted = list(dict.fromkeys(u.strip() for u in usernames if u.strip()))
    if len(wanted) < 2:
        raise ValidationError({"reviewers": "name at least 2 different members of the workspace"})
    if len(wanted) > MAX_REVIEWERS:
        raise ValidationError({"reviewers": f"at most {MAX_REVIEWERS} reviewers"})
    members = Membership.objects.for_workspace(workspace).select_related("user")
    found = {m.user.username: m.user for m in members.filter(user__username__in=wanted)}
    missing = [u for u in wanted if u not in found]
    if missing:
        names = list(members.order_by("user__username").values_list("user__username", flat=True))
        shown = ", ".join(names[:30]) + (", ..." if len(names) > 30 else "")
        raise ValidationError(
            {
                "reviewers": f"not members of this workspace: {', '.join(missing)}; "
                f"the members are: {shown}"
            }
        )
    return [found[u] for u in wanted]


def _whole(value: Any, attr: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError({attr: f"must be a whole number from {low} to {high}"})
    return value


def _check_versions(workspace: Workspace, version_a: Any, version_b: Any) -> None:
    from training.bundle import is_language_model

    for attr, version in (("version_a", version_a), ("version_b", version_b)):
        if not isinstance(version, ModelVersion) or version.workspace_id != workspace.pk:
            raise ValidationError({attr: "must be a model version of this workspace"})
        if not is_language_model(str((version.spec or {}).get("template") or "")):
            allowed = ", ".join(
                f"v{v.version}"
                for v in language_versions_of(workspace=workspace)
                if v.model_id == version.model_id
            )
            raise ValidationError(
                {
                    attr: f"{version} is not a language model (lm_lora); the language-model "
                    f"versions of {version.model.name} are: {allowed or 'none'}"
                }
            )
    if version_b.model_id != version_a.model_id:
        raise ValidationError(
            {"version_b": f"must be a version of {version_a.model.name}, as version A is"}
        )
    if version_b.pk == version_a.pk:
        raise ValidationError({"version_b": "must differ from version A"})


def _check_record_set(record_set: Any, workspace: Workspace) -> RecordSet:
    if not isinstance(record_set, RecordSet) or record_set.workspace_id != workspace.pk:
        raise ValidationError({"record_set": "must be a record set of this workspace"})
    if record_set.status != RecordSetStatus.READY:
        raise ConflictError(f"record set {record_set} is {record_set.status}, not ready",
                            attr="record_set")  # fmt: skip
    columns = {c.get("name") for c in record_set.columns or []}
    if "instruction" not in columns and "messages" not in columns:
        raise ValidationError(
            {
                "record_set": f"{record_set} holds neither instruction rows (instruction, input, "
                "output) nor chats (messages); its columns are "
                + ", ".join(sorted(str(c) for c in columns))
            }
        )
    return record_set


def review_create(
    *,
    actor: Actor,
    workspace: Workspace,
    version_a: ModelVersion,
    version_b: ModelVersion,
    record_set: RecordSet,
    reviewers: list[str],
    items: int = DEFAULT_ITEMS,
    seed: int = 0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    background: bool = True,
) -> PairwiseReview:
    """A review of ``version_b`` against ``version_a`` on ``items`` prompts of ``record_set``
    (sampled with ``seed``), ``generating`` until a worker has both versions' responses."""
    _check_versions(workspace, version_a, version_b)
    _check_record_set(record_set, workspace)
    upper = min(MAX_ITEMS, int(record_set.row_count))
    if upper < 1:
        raise ValidationError({"record_set": f"{record_set} has no rows"})
    items = _whole(items, "items", 1, upper)
    seed = _whole(seed, "seed", 0, MAX_SEED)
    max_new_tokens = _whole(max_new_tokens, "max_new_tokens", 1, MAX_NEW_TOKENS)
    people = _reviewers(workspace, reviewers)
    with transaction.atomic():
        review = PairwiseReview.objects.create(
            workspace=workspace,
            model=version_a.model,
            version_a=version_a,
            version_b=version_b,
            record_set=record_set,
            item_count=items,
            seed=seed,
            max_new_tokens=max_new_tokens,
            created_by=actor_user(actor),
        )
        review.reviewers.set(people)
        event_record(
            actor=actor,
            workspace=workspace,
            verb="serving.review.created",
            refs=[
                Ref.to(review),
                Ref.to(version_a, role="input"),
                Ref.to(version_b, role="input"),
                Ref.to(record_set, role="input"),
            ],
            payload={
                "version_a": version_a.version,
                "version_b": version_b.version,
                "items": items,
                "seed": seed,
                "reviewers": [p.username for p in people],
            },
        )
        if background:
            transaction.on_commit(partial(_enqueue, review.pk))
    if not background:
        return review_generate(review.pk) or review
    return review


def _enqueue(review_id: int) -> None:
    from serving.tasks import review_generate_task

    try:
        review_generate_task.apply_async(args=[review_id])
    except Exception as exc:  # the broker is down or refuses the message
        logger.warning("could not queue review %s", review_id, exc_info=True)
        _fail(review_id, f"the generation could not be queued ({type(exc).__name__}); start again")


def _locked(review_id: int) -> PairwiseReview | None:
    # Generation runs from the platform's own id (a task), never from a request.
    return (
        PairwiseReview.objects.unscoped()
        .select_for_update(of=("self",))
        .select_related("workspace", "version_a", "version_b", "record_set", "model")
        .filter(pk=review_id)
        .first()
    )


@transaction.atomic
def _fail(review_id: int, error: str) -> PairwiseReview | None:
    review = _locked(review_id)
    if review is None or review.status != ReviewStatus.GENERATING:
        return review
    review.status = ReviewStatus.FAILED
    review.error = error[:MAX_ERROR_CHARS]
    review.finished_at = timezone.now()
    review.save(update_fields=["status", "error", "finished_at"])
    event_record(
        actor=None,
        workspace=review.workspace,
        verb="serving.review.failed",
        refs=[Ref.to(review)],
        payload={"error": review.error[:500]},
    )
    return review


def sample_rows(record_set: RecordSet, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` rows of ``record_set`` drawn without replacement with ``seed`` (the same rows
    for the same seed)."""
    import pyarrow.parquet as pq

    from curation.services import record_set_file

    table = pq.read_table(record_set_file(record_set))
    rng = random.Random(seed)  # noqa: S311  (a reproducible sample, not a secret)
    chosen = rng.sample(range(table.num_rows), min(count, table.num_rows))
    return table.take(chosen).to_pylist()


def _generate_all(review: PairwiseReview, prompts: list[str]) -> tuple[list[str], list[str]]:
    from serving.lm_inference import generate

    outputs: dict[str, list[str]] = {"a": [], "b": []}
    done = 0
    for key, version in (("a", review.version_a), ("b", review.version_b)):
        for start in range(0, len(prompts), PROGRESS_EVERY):
            chunk = prompts[start : start + PROGRESS_EVERY]
            outputs[key].extend(generate(version, chunk, max_new_tokens=review.max_new_tokens))
            done += len(chunk)
            PairwiseReview.objects.for_workspace(review.workspace_id).filter(
                pk=review.pk, status=ReviewStatus.GENERATING
            ).update(generated=done)
    return outputs["a"], outputs["b"]


def review_generate(review_id: int) -> PairwiseReview | None:
    """Generate a ``generating`` review's responses and open it; safe to repeat (a review no
    longer generating is left as it is; the items are written with the status, at the end)."""
    from serving.lm_inference import prompt_of

    with transaction.atomic():
        review = _locked(review_id)
        if review is None or review.status != ReviewStatus.GENERATING:
            return review
    try:
        rows = sample_rows(review.record_set, review.item_count, review.seed)
        prompts = [prompt_of(row) for row in rows]
        outputs_a, outputs_b = _generate_all(review, prompts)
    except Exception as exc:  # any failure is recorded on the review
        logger.warning("review %s failed to generate", review_id, exc_info=True)
        from django.conf import settings

        text = f"{type(exc).__name__}: {exc}".replace(str(settings.ARTIFACT_ROOT), "<artifacts>")
        return _fail(review_id, text)
    sides = [True] * (len(rows) // 2) + [False] * (len(rows) - len(rows) // 2)
    random.SystemRandom().shuffle(sides)
    with transaction.atomic():
        review = _locked(review_id)
        if review is None or review.status != ReviewStatus.GENERATING:
            return review
        PairwiseItem.objects.bulk_create(
            [
                PairwiseItem(
                    workspace_id=review.workspace_id,
                    review=review,
                    position=i,
                    row=_jsonable(row),
                    prompt=prompt,
                    output_a=a,
                    output_b=b,
                    a_on_left=left,
                )
                for i, (row, prompt, a, b, left) in enumerate(
                    zip(rows, prompts, outputs_a, outputs_b, sides, strict=True)
                )
            ]
        )
        review.status = ReviewStatus.OPEN
        review.item_count = len(rows)
        review.generated = 2 * len(rows)
        review.save(update_fields=["status", "item_count", "generated"])
        event_record(
            actor=None,
            workspace=review.workspace,
            verb="serving.review.opened",
            refs=[Ref.to(review)],
            payload={"items": len(rows)},
        )
        _tell_reviewers(review)
    return review


def _tell_reviewers(review: PairwiseReview) -> None:
    from django.urls import reverse

    from workspaces.notifications import notify

    notify(
        workspace=review.workspace,
        recipients=list(review.reviewers.all()),
        verb="serving.review.opened",
        title=f"Review {review.pk} is open: {review.item_count} items to judge",
        body="A blind side-by-side review of two language-model responses waits for your "
        "judgements.",
        link=reverse("serving-review-judge", kwargs={"ws": review.workspace.slug, "pk": review.pk}),
    )


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(row, default=str))


def _finish(review: PairwiseReview) -> None:
    review.status = ReviewStatus.DONE
    review.finished_at = timezone.now()
    review.save(update_fields=["status", "finished_at"])


def review_judge(
    *, actor: Any, review: PairwiseReview, item: PairwiseItem, side: Any
) -> PairwiseJudgement:
    """``actor``'s verdict on ``item``: ``side`` is what they saw ("1", "2" or "tie"). 403 for
    someone who does not review it, 409 when the review is not open or they judged the item
    already; the last judgement of all makes the review done."""
    if side not in SIDES:
        raise ValidationError({"choice": f"{side!r} is not a choice; allowed: {', '.join(SIDES)}"})
    if not is_reviewer(review, actor):
        raise PermissionDenied("you are not a reviewer of this review")
    if item.review_id != review.pk:
        raise ValidationError({"position": "not an item of this review"})
    if side == "tie":
        verdict = ReviewVerdict.TIE
    else:
        left = side == "1"
        verdict = ReviewVerdict.A if left == item.a_on_left else ReviewVerdict.B
    with transaction.atomic():
        locked = _lock_open(review)
        conflict = ConflictError(
            f"you judged item {item.position + 1} of review {locked.pk} already", attr="position"
        )
        if judgements_of(locked).filter(item=item, reviewer=actor).exists():
            raise conflict
        try:
            with transaction.atomic():
                judgement = PairwiseJudgement.objects.create(
                    workspace_id=locked.workspace_id,
                    review=locked,
                    item=item,
                    reviewer=actor,
                    verdict=verdict,
                    side=side,
                )
        except IntegrityError as exc:  # the same judgement posted twice at once
            raise conflict from exc
        wanted = locked.item_count * locked.reviewers.count()
        if judgements_of(locked).count() >= wanted:
            _finish(locked)
        # The event names the item only: the activity log must not reveal the sides.
        event_record(
            actor=actor,
            workspace=locked.workspace,
            verb="serving.review.judged",
            refs=[Ref.to(locked)],
            payload={"item": item.position, "status": locked.status},
        )
    return judgement


def _lock_open(review: PairwiseReview) -> PairwiseReview:
    """``review`` locked for this transaction; 409 unless it is still open."""
    locked = (
        PairwiseReview.objects.for_workspace(review.workspace_id)
        .select_for_update()
        .get(pk=review.pk)
    )
    if locked.status != ReviewStatus.OPEN:
        raise ConflictError(f"review {locked.pk} is {locked.status}, not open", attr="status")
    return locked


@transaction.atomic
def review_close(*, actor: Actor, review: PairwiseReview) -> PairwiseReview:
    """End an open review early with the judgements it has (a reviewer is away)."""
    locked = _lock_open(review)
    if not judgements_of(locked).exists():
        raise ConflictError(f"review {locked.pk} has no judgements yet", attr="status")
    _finish(locked)
    event_record(
        actor=actor,
        workspace=locked.workspace,
        verb="serving.review.closed",
        refs=[Ref.to(locked)],
        payload={"judgements": judgements_of(locked).count()},
    )
    return locked


# ---------------------------------------------------------------------------------------------
# Statistics


def wilson_interval(score: float, n: int, *, alpha: float = 0.05) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion ``score / n`` (None without trials)."""
    if n <= 0:
        return None
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(score, n, alpha=alpha, method="wilson")
    return float(low), float(high)


def _kappa(x: list[str], y: list[str]) -> float | None:
    from sklearn.metrics import cohen_kappa_score

    with warnings.catch_warnings():
        # one verdict seen by both: the chance agreement is 1 and kappa undefined (None)
        warnings.simplefilter("ignore")
        value = float(cohen_kappa_score(x, y, labels=list(ReviewVerdict.values)))
    return value if math.isfinite(value) else None


def pairwise_statistics(
    judgements: list[tuple[int, str, str]], *, sides: dict[tuple[int, str], str] | None = None
) -> dict[str, Any]:
    """The figures of a set of ``(item, reviewer, verdict)`` judgements (verdicts a, b, tie):
    see the module's docstring. ``sides``: (item, reviewer) -> the side picked, for each
    reviewer's share of "Response 1" picks among their non-ties."""
    wins = sum(1 for _, _, v in judgements if v == ReviewVerdict.B)
    losses = sum(1 for _, _, v in judgements if v == ReviewVerdict.A)
    ties = sum(1 for _, _, v in judgements if v == ReviewVerdict.TIE)
    n = wins + losses + ties
    score = wins + ties / 2
    interval = wilson_interval(score, n)
    reviewers = sorted({r for _, r, _ in judgements})
    by_reviewer: dict[str, dict[int, str]] = {r: {} for r in reviewers}
    for item, reviewer, verdict in judgements:
        by_reviewer[reviewer][item] = verdict
    people = []
    for reviewer in reviewers:
        mine = by_reviewer[reviewer]
        picks = [sides.get((i, reviewer)) for i in mine] if sides else []
        sided = [p for p in picks if p in ("1", "2")]
        people.append(
            {
                "reviewer": reviewer,
                "judged": len(mine),
                "b_better": sum(1 for v in mine.values() if v == ReviewVerdict.B),
                "a_better": sum(1 for v in mine.values() if v == ReviewVerdict.A),
                "ties": sum(1 for v in mine.values() if v == ReviewVerdict.TIE),
                "first_shown_share": (sum(1 for p in sided if p == "1") / len(sided))
                if sided
                else None,
            }
        )
    pairs: list[dict[str, Any]] = []
    agreeing = compared = 0
    for first, second in combinations(reviewers, 2):
        shared = sorted(set(by_reviewer[first]) & set(by_reviewer[second]))
        x = [by_reviewer[first][i] for i in shared]
        y = [by_reviewer[second][i] for i in shared]
        same = sum(1 for a, b in zip(x, y, strict=True) if a == b)
        agreeing += same
        compared += len(shared)
        pairs.append(
            {
                "reviewers": [first, second],
                "items": len(shared),
                "cohen_kappa": _kappa(x, y) if len(shared) >= 2 else None,
                "percent_agreement": 100.0 * same / len(shared) if shared else None,
            }
        )
    kappas: list[float] = [p["cohen_kappa"] for p in pairs if p["cohen_kappa"] is not None]
    return {
        "judgements": n,
        "b_wins": wins,
        "a_wins": losses,
        "ties": ties,
        "win_rate": score / n if n else None,
        "ci_low": interval[0] if interval else None,
        "ci_high": interval[1] if interval else None,
        "interval": "wilson 95%",
        "reviewers": people,
        "agreement": {
            "pairs": pairs,
            "cohen_kappa": sum(kappas) / len(kappas) if kappas else None,
            "percent_agreement": 100.0 * agreeing / compared if compared else None,
            "items_compared": compared,
        },
    }


def review_results(review: PairwiseReview) -> dict[str, Any]:
    """The review's figures (see ``pairwise_statistics``) and whether it passes the workspace's
    policy."""
    rows = list(
        judgements_of(review).values_list("item__position", "reviewer__username", "verdict", "side")
    )
    figures = pairwise_statistics(
        [(i, r, v) for i, r, v, _ in rows], sides={(i, r): s for i, r, _, s in rows}
    )
    try:
        policy = review_policy(review.workspace)
    except ConflictError:
        policy = None
    figures["policy"] = policy
    figures["passes_policy"] = None if policy is None else _passes(figures, policy["min_win_rate"])
    return figures


# ---------------------------------------------------------------------------------------------
# Release policy


def review_policy(workspace: Workspace) -> dict[str, Any]:
    """The workspace's review policy with its defaults; 409 naming ``review_policy`` when it is
    not of the documented shape (the release path fails closed)."""
    raw = (workspace.template or {}).get(POLICY_KEY)
    if raw is None:
        return {"required": False, "min_win_rate": DEFAULT_MIN_WIN_RATE}
    problem = ""
    if not isinstance(raw, dict):
        problem = "must be an object"
    elif sorted(set(raw) - set(POLICY_KEYS)):
        problem = f"unknown key; allowed: {', '.join(POLICY_KEYS)}"
    elif not isinstance(raw.get("required", False), bool):
        problem = "required must be true or false"
    else:
        rate = raw.get("min_win_rate", DEFAULT_MIN_WIN_RATE)
        if (
            isinstance(rate, bool)
            or not isinstance(rate, (int, float))
            or not 0 <= rate <= 1
            or not math.isfinite(rate)
        ):
            problem = "min_win_rate must be a number from 0 to 1"
    if problem:
        raise ConflictError(
            f"the workspace's review_policy is malformed ({problem}): "
            '{"required": true, "min_win_rate": 0.5}',
            attr=POLICY_KEY,
        )
    return {
        "required": bool(raw.get("required", False)),
        "min_win_rate": float(raw.get("min_win_rate", DEFAULT_MIN_WIN_RATE)),
    }


def _passes(figures: dict[str, Any], min_win_rate: float) -> bool:
    return figures["ci_low"] is not None and figures["ci_low"] >= min_win_rate


def require_review(version: ModelVersion) -> dict[str, Any] | None:
    """Raise ``ConflictError`` (409, ``attr="review"``) when the workspace's policy requires a
    passed review for a language-model ``version`` and it has none (see the module's
    docstring); the deciding review's figures otherwise (None when nothing was required)."""
    from training.bundle import is_language_model

    policy = review_policy(version.workspace)
    if not policy["required"] or not is_language_model(
        str((version.spec or {}).get("template") or "")
    ):
        return None
    mine = reviews_of(workspace=version.workspace_id).filter(version_b=version)
    done = mine.filter(status=ReviewStatus.DONE).order_by("-finished_at", "-id").first()
    threshold = policy["min_win_rate"]
    if done is None:
        latest = mine.order_by("-created_at", "-id").first()
        if latest is None:
            why = "it has no human review as version B"
        elif latest.status == ReviewStatus.FAILED:
            why = f"its review {latest.pk} failed: {latest.error[:300]}"
        else:
            progress = progress_of(latest)
            why = (
                f"its review {latest.pk} is {latest.status} ({progress['judgements']} of "
                f"{progress['judgements_wanted']} judgements)"
            )
        raise ConflictError(
            f"the workspace's review policy requires a passed human review before {version} "
            f"is released, and {why}",
            attr="review",
        )
    figures = review_results(done)
    if not _passes(figures, threshold):
        low = figures["ci_low"]
        raise ConflictError(
            f"{version} failed its human review {done.pk} against v{done.version_a.version}: "
            f"win rate {figures['win_rate'] or 0:.3f}, 95% interval lower bound "
            f"{low if low is None else round(low, 3)} under the policy's minimum {threshold}",
            attr="review",
            review=done.pk,
            win_rate=figures["win_rate"],
            ci_low=low,
        )
    return figures


def reviews_with_progress(workspace: Workspace) -> list[tuple[PairwiseReview, dict[str, Any]]]:
    """The review list's rows: each review with its judgement counts (two queries)."""
    reviews = list(
        reviews_of(workspace=workspace).annotate(
            reviewer_count=Count("reviewers", distinct=True),
            judged=Count("judgements", distinct=True),
        )[:200]
    )
    return [
        (
            r,
            {
                "judgements": r.judged,
                "judgements_wanted": r.item_count * r.reviewer_count,
            },
        )
        for r in reviews
    ]
