"""Record sets (X3): versioned tables of raw or built records (text, instructions, chats) in the
workspace, uploaded or produced by a data-building pipeline from another record set."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

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
