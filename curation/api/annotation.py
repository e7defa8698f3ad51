"""REST views of annotation tasks: create one over a record set, take the next item, label it,
adjudicate disagreements, read agreement and export the settled labels as a record set."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from curation import services
from curation.api.views import RecordSetSerializer
from curation.models import AnnotationItem, AnnotationTask, ItemStatus
from curation.selectors import annotation_tasks_of, items_of, record_sets_of, task_progress
from workspaces.api.viewsets import WorkspaceScopedViewSet
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Role
from workspaces.selectors import role_from_perms


class TaskSerializer(serializers.ModelSerializer):
    record_set = serializers.SerializerMethodField(help_text="The record set labelled.")
    annotators = serializers.SerializerMethodField(help_text="Usernames; empty: developers up.")
    reviewers = serializers.SerializerMethodField(help_text="Usernames; empty: maintainers up.")

    class Meta:
        model = AnnotationTask
        fields = [
            "id",
            "name",
            "record_set",
            "text_field",
            "schema",
            "instructions",
            "annotators_per_item",
            "annotators",
            "reviewers",
            "status",
            "item_count",
            "created_at",
        ]
        read_only_fields = fields

    def get_record_set(self, task: AnnotationTask) -> dict[str, Any]:
        return {"id": task.source_id, "name": task.source.name, "version": task.source.version}

    def get_annotators(self, task: AnnotationTask) -> list[str]:
        return [user.username for user in task.annotators.all()]

    def get_reviewers(self, task: AnnotationTask) -> list[str]:
        return [user.username for user in task.reviewers.all()]


class TaskCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    record_set = serializers.IntegerField(
        help_text="The id of a ready record set of this workspace."
    )
    text_field = serializers.CharField(max_length=200, help_text="The column annotators read.")
    schema = serializers.JSONField(help_text="The labelling schema: {fields: [...]}.")
    annotators_per_item = serializers.IntegerField(default=2, min_value=1, max_value=10)
    annotators = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    reviewers = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    instructions = serializers.CharField(required=False, allow_blank=True, default="")


class ItemSerializer(serializers.ModelSerializer):
    class Meta:
        model = AnnotationItem
        fields = ["position", "data", "status", "label_count", "final"]
        read_only_fields = fields


class ValuesSerializer(serializers.Serializer):
    values = serializers.DictField(help_text="Field name -> value, as the task's schema says.")


class ExportSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, help_text="The record set to add a version to.")


class AnnotationTaskViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, WorkspaceScopedViewSet
):
    """Annotation tasks: labelling schemas over record sets, labels, review and agreement."""

    serializer_class = TaskSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z][a-z0-9_]{0,62}"
    action_roles = {
        "create": Role.DEVELOPER,
        "export": Role.DEVELOPER,
        # who labels and who reviews is the task's to say; the services check it
        "label": Role.VIEWER,
        "adjudicate": Role.VIEWER,
    }

    def get_workspace_queryset(self) -> QuerySet:
        return annotation_tasks_of(workspace=self.workspace)

    @property
    def role(self) -> str | None:
        return role_from_perms(self.workspace_perms)

    def _item(self, task: AnnotationTask, position: str) -> AnnotationItem:
        return get_object_or_404(items_of(task=task), position=int(position))

    def retrieve(self, request: Request, ws: str, name: str) -> Response:
        task = self.get_object()
        body = dict(TaskSerializer(task).data)
        body["progress"] = task_progress(task)
        body["may_annotate"] = services.may_annotate(task, request.user, self.role)
        body["may_review"] = services.may_review(task, request.user, self.role)
        return Response(body)

    @extend_schema(request=TaskCreateSerializer, responses={201: TaskSerializer})
    def create(self, request: Request, ws: str) -> Response:
        serializer = TaskCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        source = record_sets_of(workspace=self.workspace).filter(pk=data["record_set"]).first()
        if source is None:
            raise ReferenceNotFound(f"no record set {data['record_set']}", attr="record_set")
        task = services.annotation_task_create(
            actor=request.user,
            workspace=self.workspace,
            name=data["name"],
            source=source,
            text_field=data["text_field"],
            schema=data["schema"],
            annotators_per_item=data["annotators_per_item"],
            annotators=data["annotators"],
            reviewers=data["reviewers"],
            instructions=data["instructions"],
        )
        location = reverse(
            "v1:annotation-task-detail", kwargs={"ws": self.workspace.slug, "name": task.name}
        )
        return Response(
            TaskSerializer(task).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": location},
        )

    @extend_schema(
        responses={200: ItemSerializer},
        description="The next item for the caller to label (`item` null when none is left for "
        "them): one still short of labels that they have not labelled.",
    )
    @action(detail=True, methods=["get"])
    def next(self, request: Request, ws: str, name: str) -> Response:
        task = self.get_object()
        item = services.next_item(task, request.user)
        return Response(
            {
                "item": ItemSerializer(item).data if item else None,
                "may_annotate": services.may_annotate(task, request.user, self.role),
                "progress": task_progress(task),
            }
        )

    @extend_schema(
        parameters=[OpenApiParameter("status", str, enum=ItemStatus.values)],
        responses={200: ItemSerializer(many=True)},
        description="The task's items; a reviewer also sees each item's labels.",
    )
    @action(detail=True, methods=["get"])
    def items(self, request: Request, ws: str, name: str) -> Response:
        task = self.get_object()
        found = items_of(task=task)
        wanted = request.query_params.get("status")
        if wanted:
            if wanted not in ItemStatus.values:
                raise serializers.ValidationError(
                    {"status": f"unknown status; allowed: {', '.join(ItemStatus.values)}"}
                )
            found = found.filter(status=wanted)
        page = self.paginate_queryset(found.prefetch_related("labels__annotator"))
        reviewer = services.may_review(task, request.user, self.role)
        rows = []
        for item in page if page is not None else found:
            row = dict(ItemSerializer(item).data)
            if reviewer:
                row["labels"] = [
                    {"annotator": a.annotator.username, "values": a.values}
                    for a in item.labels.all()
                ]
            rows.append(row)
        return self.get_paginated_response(rows) if page is not None else Response(rows)

    @extend_schema(request=ValuesSerializer, responses={201: ItemSerializer})
    @action(detail=True, methods=["post"], url_path=r"items/(?P<position>\d+)/labels")
    def label(self, request: Request, ws: str, name: str, position: str) -> Response:
        task = self.get_object()
        serializer = ValuesSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        item = services.annotation_submit(
            actor=request.user,
            task=task,
            item=self._item(task, position),
            values=serializer.validated_data["values"],
            role=self.role,
        )
        return Response(ItemSerializer(item).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ValuesSerializer, responses={200: ItemSerializer})
    @action(detail=True, methods=["post"], url_path=r"items/(?P<position>\d+)/adjudicate")
    def adjudicate(self, request: Request, ws: str, name: str, position: str) -> Response:
        task = self.get_object()
        serializer = ValuesSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        item = services.annotation_adjudicate(
            actor=request.user,
            task=task,
            item=self._item(task, position),
            values=serializer.validated_data["values"],
            role=self.role,
        )
        return Response(ItemSerializer(item).data)

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        description="Agreement per single-valued field (Cohen's kappa averaged over annotator "
        "pairs, Fleiss' kappa, Krippendorff's alpha) and per annotator (matches with the final "
        "values).",
    )
    @action(detail=True, methods=["get"])
    def agreement(self, request: Request, ws: str, name: str) -> Response:
        return Response(services.annotation_agreement(self.get_object()))

    @extend_schema(request=ExportSerializer, responses={201: RecordSetSerializer})
    @action(detail=True, methods=["post"])
    def export(self, request: Request, ws: str, name: str) -> Response:
        task = self.get_object()
        serializer = ExportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        record_set = services.annotation_export(
            actor=request.user, task=task, name=serializer.validated_data["name"]
        )
        fresh = record_sets_of(workspace=self.workspace).get(pk=record_set.pk)
        location = reverse(
            "v1:record-set-detail", kwargs={"ws": self.workspace.slug, "pk": record_set.pk}
        )
        return Response(
            RecordSetSerializer(fresh).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": location},
        )
