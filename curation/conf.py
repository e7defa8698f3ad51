"""Data building's settings fragment (merged by ``config.settings``): names of its enums in the
API schema."""

ENUM_NAME_OVERRIDES = {
    "RecordSetStatusEnum": "curation.models.RecordSetStatus",
    "RecordSetSourceEnum": "curation.models.RecordSetSource",
    "RecordSetUploadFormatEnum": ["jsonl", "parquet", "csv"],
    "AnnotationItemStatusEnum": "curation.models.ItemStatus",
}
