"""REST views of blind side-by-side human reviews (``serving.review``), under
``/api/v1/workspaces/{ws}/reviews/``: start one (maintainers), list and read them (results once
done, or for maintainers), take the next item blind and judge it (the review's reviewers), close
one early (maintainers)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from curation.selectors import record_sets_of
from serving import review as reviews
from serving.models import ModelVersion, PairwiseReview, RegisteredModel
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Role
from workspaces.selectors import role_from_perms


class ReviewSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.name", read_only=True)
    version_a = serializers.IntegerField(source="version_a.version", read_only=True)
    version_b = serializers.IntegerField(source="version_b.version", read_only=True)
    record_set = serializers.SerializerMethodField(help_text="The record set sampled.")
    reviewers = serializers.SerializerMethodField(help_text="Usernames of the reviewers.")
    created_by = serializers.CharField(source="created_by.username", default=None, read_only=True)

    class Meta:
        model = PairwiseReview
        fields = [
            "id",
            "model",
            "version_a",
            "version_b",
            "record_set",
            "item_count",
            "seed",
            "max_new_tokens",
            "reviewers",
            "status",
            "generated",
            "error",
            "created_by",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_record_set(self, review: PairwiseReview) -> dict[str, Any]:
        rs = review.record_set
        return {"id": rs.pk, "name": rs.name, "version": rs.version}

    def get_reviewers(self, review: PairwiseReview) -> list[str]:
        return sorted(user.username for user in review.reviewers.all())


class ReviewCreateSerializer(serializers.Serializer):
    model = serializers.CharField(max_length=63, help_text="The registered model's name.")
    version_a = serializers.IntegerField(help_text="Version number of A (the baseline).")
    version_b = serializers.IntegerField(help_text="Version number of B (the candidate).")
    record_set = serializers.IntegerField(help_text="Id of a ready record set of prompts.")
    reviewers = serializers.ListField(
        child=serializers.CharField(max_length=150),
        max_length=reviews.MAX_REVIEWERS,
        help_text="Usernames of 2 or more members.",
    )
    items = serializers.IntegerField(
        default=reviews.DEFAULT_ITEMS, min_value=1, max_value=reviews.MAX_ITEMS
    )
    seed = serializers.IntegerField(default=0, min_value=0, max_value=reviews.MAX_SEED)
    max_new_tokens = serializers.IntegerField(
        default=reviews.DEFAULT_MAX_NEW_TOKENS, min_value=1, max_value=reviews.MAX_NEW_TOKENS
    )


class JudgementSerializer(serializers.Serializer):
    position = serializers.IntegerField(min_value=0, help_text="The item's position.")
    choice = serializers.ChoiceField(
        choices=list(reviews.SIDES),
        help_text='"1": Response 1 is better, "2": Response 2 is better, "tie".',
        error_messages={
            "invalid_choice": '"{input}" is not a choice; allowed: ' + ", ".join(reviews.SIDES)
        },
    )


class BlindItemSerializer(serializers.Serializer):
    position = serializers.IntegerField()
    prompt = serializers.CharField()
    response_1 = serializers.CharField()
    response_2 = serializers.CharField()


def blind_item(item: Any) -> dict[str, Any]:
    """What a reviewer sees of an item: nothing that names a version or its side."""
    first, second = reviews.shown_responses(item)
    return {
        "position": item.position,
        "prompt": item.prompt,
        "response_1": first,
        "response_2": second,
    }


class ReviewViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet):
    """Blind side-by-side human reviews of two versions of a language model."""

    serializer_class = ReviewSerializer
    lookup_value_regex = r"\d+"
    action_roles = {
        "create": Role.MAINTAINER,
        "close": Role.MAINTAINER,
        # who judges is the review's to say; the service checks it
        "judge": Role.VIEWER,
    }

    def get_workspace_queryset(self):
        return reviews.reviews_of(workspace=self.workspace).prefetch_related("reviewers")

    @property
    def role(self) -> str | None:
        return role_from_perms(self.workspace_perms)

    def _require_reviewer(self, review: PairwiseReview) -> None:
        if not reviews.is_reviewer(review, self.request.user):
            raise PermissionDenied("you are not a reviewer of this review")

    def _body(self, review: PairwiseReview) -> dict[str, Any]:
        body = dict(ReviewSerializer(review).data)
        user = self.request.user
        body["progress"] = reviews.progress_of(review, user)
        body["is_reviewer"] = reviews.is_reviewer(review, user)
        body["results"] = (
            reviews.review_results(review)
            if reviews.may_see_results(review, user, self.role)
            else None
        )
        return body

    def retrieve(self, request: Request, ws: str, pk: str) -> Response:
        return Response(self._body(self.get_object()))

    def _version(self, model: RegisteredModel, number: int, attr: str) -> ModelVersion:
        found = (
            ModelVersion.objects.for_workspace(self.workspace)
            .select_related("model")
            .filter(model=model, version=number)
            .first()
        )
        if found is None:
            raise ReferenceNotFound(f"{model.name} has no version {number}", attr=attr)
        return found

    @extend_schema(request=ReviewCreateSerializer, responses={202: ReviewSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = ReviewCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        model = RegisteredModel.objects.for_workspace(self.workspace).filter(name=data["model"])
        found_model = model.first()
        if found_model is None:
            raise ReferenceNotFound(f"no registered model '{data['model']}'", attr="model")
        source = record_sets_of(workspace=self.workspace).filter(pk=data["record_set"]).first()
        if source is None:
            raise ReferenceNotFound(f"no record set {data['record_set']}", attr="record_set")
        review = reviews.review_create(
            actor=request.user,
            workspace=self.workspace,
            version_a=self._version(found_model, data["version_a"], "version_a"),
            version_b=self._version(found_model, data["version_b"], "version_b"),
            record_set=source,
            reviewers=data["reviewers"],
            items=data["items"],
            seed=data["seed"],
            max_new_tokens=data["max_new_tokens"],
        )
        fresh = self.get_queryset().get(pk=review.pk)
        location = reverse("v1:serving-review-detail", kwargs={"ws": ws, "pk": review.pk})
        return Response(
            self._body(fresh), status=status.HTTP_202_ACCEPTED, headers={"Location": location}
        )

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        description="The caller's next item, blind (`item` null when none is left for them): "
        "the prompt and Response 1 and 2, never which version gave which.",
    )
    @action(detail=True, methods=["get"])
    def next(self, request: Request, ws: str, pk: str) -> Response:
        review = self.get_object()
        self._require_reviewer(review)
        item = reviews.next_item(review, request.user)
        return Response(
            {
                "item": blind_item(item) if item else None,
                "status": review.status,
                "progress": reviews.progress_of(review, request.user),
            }
        )

    @extend_schema(request=JudgementSerializer, responses={201: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"], url_path="judgements")
    def judge(self, request: Request, ws: str, pk: str) -> Response:
        review = self.get_object()
        self._require_reviewer(review)
        serializer = JudgementSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        item = get_object_or_404(reviews.items_of(review), position=data["position"])
        reviews.review_judge(actor=request.user, review=review, item=item, side=data["choice"])
        fresh = self.get_queryset().get(pk=review.pk)
        return Response(
            {
                "position": item.position,
                "choice": data["choice"],
                "status": fresh.status,
                "progress": reviews.progress_of(fresh, request.user),
            },
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(request=None, responses={200: ReviewSerializer})
    @action(detail=True, methods=["post"])
    def close(self, request: Request, ws: str, pk: str) -> Response:
        review = reviews.review_close(actor=request.user, review=self.get_object())
        return Response(self._body(self.get_queryset().get(pk=review.pk)))

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"])
    def results(self, request: Request, ws: str, pk: str) -> Response:
        review = self.get_object()
        if not reviews.may_see_results(review, request.user, self.role):
            raise PermissionDenied(
                "the results show once the review is done (maintainers see them before)"
            )
        return Response(reviews.review_results(review))
