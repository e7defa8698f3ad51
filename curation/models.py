"""Record sets (X3): versioned tables of raw or built records (text, instructions, chats) in the
workspace, uploaded or produced by a data-building pipeline from another record set."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from workspaces.models import CreatedRecord, WorkspaceOwned

name_validator = RegexValidator(
    r"^[a-z][a-z0-9_]{0,62}$",
    "Use a lowercase letter, then lowercase letters, digits or underscores (at most 63).",
)


class RecordSetStatus(models.TextChoices):
    BUILDING = "building", "Building"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class RecordSetSource(models.TextChoices):
    UPLOAD = "upload", "Uploaded"
    PIPELINE = "pipeline", "Built by a pipeline"
    ANNOTATION = "annotation", "Exported from an annotation task"


class RecordSet(WorkspaceOwned, CreatedRecord):
    """One version of a named table of records, stored as one Parquet file."""

    event_kind = "record_set"

    name = models.CharField(max_length=63, validators=[name_validator])
    version = models.PositiveIntegerField(default=1)
    source = models.CharField(max_length=10, choices=RecordSetSource.choices)
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="children",
        help_text="The record set a pipeline built this one from.",
    )
    stages = models.JSONField(default=list, blank=True, help_text="The pipeline's stages.")
    reports = models.JSONField(
        default=list, blank=True, help_text="Per stage: rows in and out, removed per rule."
    )
    stages_done = models.PositiveIntegerField(default=0)
    status = models.CharField(
        max_length=10, choices=RecordSetStatus.choices, default=RecordSetStatus.BUILDING
    )
    path = models.CharField(max_length=500, blank=True)
    columns = models.JSONField(default=list, blank=True, help_text="[{name, type}] in order.")
    row_count = models.PositiveBigIntegerField(default=0)
    bytes = models.PositiveBigIntegerField(default=0)
    error = models.TextField(blank=True)
    built_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name", "version"], name="record_set_unique_version"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class AnnotationTaskStatus(models.TextChoices):
    OPEN = "open", "Open"
    CLOSED = "closed", "Closed"


class AnnotationTask(WorkspaceOwned, CreatedRecord):
    """Items of a record set version labelled by ``annotators_per_item`` people each, against a
    labelling schema (``curation.annotation``); disagreements go to a reviewer."""

    event_kind = "annotation_task"

    name = models.CharField(max_length=63, validators=[name_validator])
    source = models.ForeignKey(RecordSet, on_delete=models.PROTECT, related_name="annotation_tasks")
    text_field = models.CharField(max_length=200, help_text="The column shown to annotators.")
    schema = models.JSONField(help_text="The labelling schema: {fields: [...]}.")
    instructions = models.TextField(blank=True)
    annotators_per_item = models.PositiveSmallIntegerField(default=2)
    annotators = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="+",
        help_text="Who labels; empty: every developer or higher of the workspace.",
    )
    reviewers = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="+",
        help_text="Who adjudicates disagreements; empty: every maintainer or higher.",
    )
    status = models.CharField(
        max_length=10, choices=AnnotationTaskStatus.choices, default=AnnotationTaskStatus.OPEN
    )
    item_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"], name="annotation_task_unique_name"
            )
        ]

    def __str__(self) -> str:
        return self.name


class ItemStatus(models.TextChoices):
    OPEN = "open", "Waiting for labels"
    AGREED = "agreed", "Agreed"
    DISPUTED = "disputed", "Disputed"
    RESOLVED = "resolved", "Adjudicated"


class AnnotationItem(WorkspaceOwned):
    """One row of the source, as annotators see it."""

    task = models.ForeignKey(AnnotationTask, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField(help_text="The row's place in the source.")
    data = models.JSONField(help_text="The source row.")
    status = models.CharField(max_length=10, choices=ItemStatus.choices, default=ItemStatus.OPEN)
    label_count = models.PositiveSmallIntegerField(default=0)
    final = models.JSONField(null=True, blank=True, help_text="The agreed or adjudicated values.")
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["task", "position"]
        constraints = [
            models.UniqueConstraint(fields=["task", "position"], name="annotation_item_unique_row")
        ]
        indexes = [models.Index(fields=["task", "status", "label_count"])]


class Annotation(WorkspaceOwned):
    """One annotator's labels of one item (once per item and annotator)."""

    item = models.ForeignKey(AnnotationItem, on_delete=models.CASCADE, related_name="labels")
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    values = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["item", "created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["item", "annotator"], name="annotation_once_per_annotator"
            )
        ]
