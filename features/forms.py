"""Browser forms of the feature registry. They parse what the page posts and hand it to the same
services the REST API calls (``features.registry``, ``features.ingestion``); the rules, and the
messages naming the allowed values, stay in the services."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from features import registry as limits
from features.models import BatchFormat, Dtype, EntityKind, Lifecycle
from workspaces.exceptions import ConflictError

UPLOAD_EXTENSIONS = {
    "csv": BatchFormat.CSV,
    "parquet": BatchFormat.PARQUET,
    "json": BatchFormat.JSON,
}


class SchemaRows:
    """The schema editor's rows (feature name, dtype, dimension), read from the posted lists
    ``feature_name``, ``feature_dtype`` and ``feature_dimension``; errors are kept per row."""

    def __init__(self, data=None, *, initial: list[dict[str, Any]] | None = None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.errors: list[str] = []
        if data is None:
            for spec in initial or [{"name": "", "dtype": Dtype.FLOAT, "dimension": None}]:
                self.rows.append(self._row(spec.get("name", ""), spec.get("dtype", ""), spec))
            return
        names = data.getlist("feature_name")
        dtypes = data.getlist("feature_dtype")
        dimensions = data.getlist("feature_dimension")
        descriptions = data.getlist("feature_description")
        for index, name in enumerate(names):
            name = name.strip()
            dtype = dtypes[index] if index < len(dtypes) else ""
            dimension = dimensions[index].strip() if index < len(dimensions) else ""
            description = descriptions[index] if index < len(descriptions) else ""
            if not name and not dimension:
                continue  # an empty row the user added and left blank
            self.rows.append(
                self._row(name, dtype, {"dimension": dimension, "description": description})
            )

    @staticmethod
    def _row(name: str, dtype: str, spec: dict[str, Any]) -> dict[str, Any]:
        dimension = spec.get("dimension")
        return {
            "name": name,
            "dtype": dtype,
            "dimension": "" if dimension is None else str(dimension),
            "description": spec.get("description") or "",
            "error": "",
        }

    def specs(self) -> list[dict[str, Any]] | None:
        """The feature specs for the service, or None when a row cannot even be parsed."""
        specs = []
        ok = True
        for row in self.rows:
            spec: dict[str, Any] = {"name": row["name"], "dtype": row["dtype"]}
            if row["dimension"]:
                try:
                    spec["dimension"] = int(row["dimension"])
                except ValueError:
                    row["error"] = "dimension: a whole number"
                    ok = False
            if row["description"]:
                spec["description"] = row["description"]
            specs.append(spec)
        return specs if ok else None

    def add_error(self, index: int | None, message: str) -> None:
        if index is not None and 0 <= index < len(self.rows):
            self.rows[index]["error"] = message
        else:
            self.errors.append(message)

    @property
    def has_errors(self) -> bool:
        return bool(self.errors) or any(row["error"] for row in self.rows)


def report_service_error(
    form: forms.Form | None, schema: SchemaRows | None, exc: ValidationError | ConflictError
) -> None:
    """Put a service's ValidationError or ConflictError next to the field it names.

    Service keys look like ``name``, ``entity_keys.0`` or ``features.2.dtype``; a feature error
    goes to its schema row, anything the form has no field for goes to the form's top (with no
    form, to the schema's top)."""
    if isinstance(exc, ConflictError):
        items = [(exc.attr or "", [str(exc)])]
    elif hasattr(exc, "error_dict"):
        items = [(key, list(messages)) for key, messages in exc.message_dict.items()]
    else:
        items = [("", exc.messages)]
    for key, messages in items:
        head, _, rest = key.partition(".")
        if head == "features" and schema is not None:
            index_text, _, column = rest.partition(".")
            index = int(index_text) if index_text.isdigit() else None
            prefix = f"{column}: " if column else ""
            schema.add_error(index, prefix + " ".join(messages))
            continue
        field = {"freshness_sla_seconds": "freshness_sla_hours"}.get(head, head)
        for message in messages:
            if form is None:
                schema.add_error(None, f"{key}: {message}" if key else message)
            else:
                form.add_error(field if field in form.fields else None, message)


def _entity_keys(text: str) -> list[str]:
    return [key.strip() for key in text.replace("\n", ",").split(",") if key.strip()]


class FeatureGroupCreateForm(forms.Form):
    """A new feature group; the schema comes from the ``SchemaRows`` beside it."""

    name = forms.CharField(
        max_length=100, help_text="Lowercase letters, digits and underscores, e.g. user_profile."
    )
    entity = forms.CharField(widget=forms.Select(choices=EntityKind.choices))
    entity_keys = forms.CharField(
        max_length=500, initial="user_id", help_text="Comma-separated column names, e.g. user_id."
    )
    freshness_sla_hours = forms.FloatField(
        initial=24,
        label="Freshness SLA (hours)",
        help_text="The group is broken when its newest data is older than this (from "
        f"{limits.MIN_FRESHNESS_SLA_S // 60} minute to "
        f"{limits.MAX_FRESHNESS_SLA_S // 86400} days).",
    )
    online = forms.BooleanField(
        required=False, initial=True, label="Serve online (also stored offline)"
    )
    description = forms.CharField(
        required=False, max_length=limits.MAX_GROUP_DESCRIPTION_CHARS, widget=forms.Textarea
    )

    def service_arguments(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "name": data["name"].strip(),
            "entity": data["entity"],
            "entity_keys": _entity_keys(data["entity_keys"]),
            "freshness_sla_seconds": round(data["freshness_sla_hours"] * 3600),
            "online": data["online"],
            "description": data["description"],
        }


class LifecycleForm(forms.Form):
    """A lifecycle move; the service says which moves are allowed."""

    status = forms.CharField(max_length=20)

    def clean_status(self) -> str:
        status = self.cleaned_data["status"]
        if status not in Lifecycle.values:
            raise forms.ValidationError(f"one of {', '.join(Lifecycle.values)}")
        return status


class BatchUploadForm(forms.Form):
    """One file for ``ingestion.batch_ingest``: CSV, Parquet or JSON ``{"rows": [...]}``."""

    file = forms.FileField(help_text="A .csv, .parquet or .json file.")

    def clean_file(self):
        upload = self.cleaned_data["file"]
        extension = upload.name.rsplit(".", 1)[-1].lower() if "." in upload.name else ""
        if extension not in UPLOAD_EXTENSIONS:
            raise forms.ValidationError(
                f"'{upload.name}': the file must end in one of "
                f"{', '.join('.' + e for e in UPLOAD_EXTENSIONS)}"
            )
        self.batch_format = UPLOAD_EXTENSIONS[extension]
        return upload


class DatasetCreateForm(forms.Form):
    """A training sample for ``samples.dataset_create``: a label source group, its label columns,
    features picked from the registry and an optional event-time window (UTC)."""

    name = forms.CharField(
        max_length=63, help_text="A new name, or an existing one for its next version."
    )
    label_source = forms.CharField(
        widget=forms.Select, help_text="The feature group whose rows are the labelled events."
    )
    label_columns = forms.CharField(
        max_length=500, initial="clicked", help_text="Comma-separated columns of the label source."
    )
    features = forms.MultipleChoiceField(
        widget=forms.CheckboxSelectMultiple,
        help_text="Point-in-time values joined onto each label.",
    )
    start_time = forms.DateTimeField(
        required=False,
        label="From (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    end_time = forms.DateTimeField(
        required=False,
        label="Until (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )

    def __init__(self, *args, groups: list[str], feature_refs: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["label_source"].widget.choices = [(name, name) for name in groups]
        # a ChoiceField; form.fields[...] is typed as the base Field.
        self.fields["features"].choices = [(ref, ref) for ref in feature_refs]  # type: ignore[attr-defined]

    def _utc(self, name: str):
        moment = self.cleaned_data.get(name)
        if moment is not None and moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment

    def clean_start_time(self):
        return self._utc("start_time")

    def clean_end_time(self):
        return self._utc("end_time")

    def preview_arguments(self) -> dict[str, Any]:
        """The inputs of ``samples.dataset_preview`` (everything but the name)."""
        data = self.cleaned_data
        return {
            "label_columns": _entity_keys(data["label_columns"]),
            "feature_refs": list(data["features"]),
            "start_time": data["start_time"],
            "end_time": data["end_time"],
        }

    def service_arguments(self) -> dict[str, Any]:
        return {"name": self.cleaned_data["name"].strip(), **self.preview_arguments()}


class DatasetPreviewForm(DatasetCreateForm):
    """The dataset form as its Preview button sends it: the name may still be empty."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["name"].required = False


class FeastImportForm(forms.Form):
    """A ``feast registry-dump`` file (or its text pasted) for ``features.feast.feast_import``,
    with the entity kinds the Feast entity names do not say (``merchant=item``, one a line)."""

    file = forms.FileField(
        label="Registry dump file",
        required=False,
        help_text="The JSON that `feast registry-dump` prints, saved as a file.",
    )
    text = forms.CharField(
        label="Or the registry dump, pasted",
        required=False,
        widget=forms.Textarea(attrs={"rows": 6}),
    )
    entity_kinds = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One 'feast_entity=kind' a line, where the name does not say it (user_id is "
        f"read as user). Kinds: {', '.join(EntityKind.values)}.",
    )

    def clean(self) -> dict[str, Any]:
        import json

        data = super().clean() or {}
        upload = data.get("file")
        raw = upload.read().decode("utf-8", errors="replace") if upload else data.get("text")
        if not raw or not raw.strip():
            raise ValidationError({"file": "Attach the registry dump or paste it below."})
        try:
            data["registry"] = json.loads(raw)
        except ValueError as exc:
            raise ValidationError(
                {"file" if upload else "text": f"This is not JSON: {exc}."}
            ) from exc
        kinds: dict[str, str] = {}
        for number, line in enumerate((data.get("entity_kinds") or "").splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, kind = line.partition("=")
            if not sep or not name.strip() or not kind.strip():
                raise ValidationError(
                    {"entity_kinds": f"Line {number}: write feast_entity=kind, e.g. merchant=item."}
                )
            kinds[name.strip()] = kind.strip()
        data["kinds"] = kinds
        return data
