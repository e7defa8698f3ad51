"""Labelling schemas and agreement (X3's annotation workbench), free of the database.

A task's schema is JSON: ``{"fields": [...]}``, each field an object with a ``name`` (a lowercase
identifier), a ``kind`` and ``required`` (false by default):

- ``choice``: one of ``options`` (2 to 30 strings);
- ``multi_choice``: any of ``options``, a list (``required``: at least one);
- ``rating``: a whole number from ``min`` to ``max`` (1 and 5 by default, at most 11 steps);
- ``text``: free text of at most ``max_length`` characters (2,000 by default);
- ``spans``: text spans of the item's shown text, each ``{"start", "end", "label"}`` with
  ``label`` one of ``labels`` and ``0 <= start < end <=`` the text's length.

``validate_schema`` checks a schema (``SchemaError`` naming ``schema.fields[1].options``) and
``validate_values`` one submission against it (``SchemaError`` naming the field, ``required``
included). Shortcut keys (``shortcuts``): the options of a task's choice and multi-choice fields
and the steps of its ratings get the keys ``1``-``9`` then ``a``-``z``, in order across the
fields (the first 35); the labelling page shows them and acts on them, and Enter submits.

Agreement (``agreement``) is computed on the single-valued fields (``choice`` and ``rating``) over
the items with at least two labels: Cohen's kappa (scikit-learn's ``cohen_kappa_score``) for
each pair of annotators on the items both labelled, averaged over the pairs; Fleiss' kappa
(statsmodels' ``fleiss_kappa``) over the items with exactly ``k`` labels; Krippendorff's alpha
(the ``krippendorff`` package: nominal for a choice, interval for a rating), which takes every
label, missing ones included. Per annotator: the share of their labels equal to the item's final
value (agreed or adjudicated) and Cohen's kappa against the final values.
"""

from __future__ import annotations

import re
import string
import warnings
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np

KINDS = ("choice", "multi_choice", "rating", "text", "spans")
SINGLE_VALUED = ("choice", "rating")
MAX_FIELDS = 20
MAX_OPTIONS = 30
MAX_TEXT = 2000
MAX_SPANS = 200
NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
KEYS = [str(d) for d in range(1, 10)] + list(string.ascii_lowercase)


class SchemaError(ValueError):
    """A schema or a submission that does not fit: ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _strings(value: Any, path: str, *, low: int = 2, high: int = MAX_OPTIONS) -> list[str]:
    if (
        not isinstance(value, list)
        or not low <= len(value) <= high
        or not all(isinstance(v, str) and 0 < len(v) <= 100 for v in value)
    ):
        raise SchemaError(path, f"must be a list of {low} to {high} names of 1-100 characters")
    if len(set(value)) != len(value):
        raise SchemaError(path, "names must differ")
    return list(value)


def validate_schema(schema: Any) -> dict[str, Any]:
    """The schema checked and completed with its defaults."""
    if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list):
        raise SchemaError("schema", 'must be an object with a "fields" list')
    extra = sorted(set(schema) - {"fields"})
    if extra:
        raise SchemaError(f"schema.{extra[0]}", "is not a schema key; allowed: fields")
    fields = schema["fields"]
    if not 1 <= len(fields) <= MAX_FIELDS:
        raise SchemaError("schema.fields", f"must hold 1 to {MAX_FIELDS} fields")
    out, seen = [], set()
    for index, spec in enumerate(fields):
        path = f"schema.fields[{index}]"
        if not isinstance(spec, dict):
            raise SchemaError(path, "must be an object with a name and a kind")
        name, kind = spec.get("name"), spec.get("kind")
        if not isinstance(name, str) or not NAME.match(name):
            raise SchemaError(
                f"{path}.name", "must be a lowercase letter, then letters, digits or _"
            )
        if name in seen:
            raise SchemaError(f"{path}.name", f"'{name}' is used twice")
        seen.add(name)
        if kind not in KINDS:
            raise SchemaError(f"{path}.kind", f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
        allowed = {"name", "kind", "required", "help"} | {
            "choice": {"options"},
            "multi_choice": {"options"},
            "rating": {"min", "max"},
            "text": {"max_length"},
            "spans": {"labels"},
        }[kind]
        extra = sorted(set(spec) - allowed)
        if extra:
            raise SchemaError(
                f"{path}.{extra[0]}",
                f"is not a key of a {kind}; allowed: {', '.join(sorted(allowed))}",
            )
        required = spec.get("required", False)
        if not isinstance(required, bool):
            raise SchemaError(f"{path}.required", "must be true or false")
        field: dict[str, Any] = {"name": name, "kind": kind, "required": required}
        if isinstance(spec.get("help"), str):
            field["help"] = spec["help"][:300]
        if kind in ("choice", "multi_choice"):
            field["options"] = _strings(spec.get("options"), f"{path}.options")
        elif kind == "spans":
            field["labels"] = _strings(spec.get("labels"), f"{path}.labels", low=1)
        elif kind == "rating":
            low, high = spec.get("min", 1), spec.get("max", 5)
            for key, value in (("min", low), ("max", high)):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise SchemaError(f"{path}.{key}", "must be a whole number")
            if not 1 <= high - low <= 10:
                raise SchemaError(f"{path}.max", "must be 1 to 10 above min")
            field.update(min=low, max=high)
        else:
            length = spec.get("max_length", MAX_TEXT)
            if (
                isinstance(length, bool)
                or not isinstance(length, int)
                or not 1 <= length <= MAX_TEXT
            ):
                raise SchemaError(
                    f"{path}.max_length", f"must be a whole number from 1 to {MAX_TEXT}"
                )
            field["max_length"] = length
        out.append(field)
    return {"fields": out}


def values_of(field: dict[str, Any]) -> list[Any]:
    """A field's options or rating steps; empty for the others."""
    if field["kind"] in ("choice", "multi_choice"):
        return list(field["options"])
    if field["kind"] == "rating":
        return list(range(field["min"], field["max"] + 1))
    return []


def shortcuts(schema: dict[str, Any]) -> dict[str, list[tuple[str | None, Any]]]:
    """Per field, (shortcut key or None, value) of its options, keys in order across fields."""
    keys = iter(KEYS)
    return {
        f["name"]: [(next(keys, None), value) for value in values_of(f)] for f in schema["fields"]
    }


def validate_values(schema: dict[str, Any], values: Any, *, text_length: int) -> dict[str, Any]:
    """One submission checked against the schema; absent optional fields are left out."""
    if not isinstance(values, dict):
        raise SchemaError("values", "must be an object of field names to values")
    names = {f["name"] for f in schema["fields"]}
    extra = sorted(set(values) - names)
    if extra:
        raise SchemaError(
            f"values.{extra[0]}",
            f"is not a field of this task; the fields are {', '.join(sorted(names))}",
        )
    out: dict[str, Any] = {}
    for field in schema["fields"]:
        name, kind, path = field["name"], field["kind"], f"values.{field['name']}"
        value = values.get(name)
        empty = value is None or value == "" or value == []
        if empty:
            if field["required"]:
                raise SchemaError(path, "is required")
            continue
        if kind == "choice":
            if value not in field["options"]:
                raise SchemaError(
                    path, f"{value!r} is not an option; allowed: {', '.join(field['options'])}"
                )
        elif kind == "multi_choice":
            if not isinstance(value, list) or any(v not in field["options"] for v in value):
                raise SchemaError(
                    path, f"must be a list of options from: {', '.join(field['options'])}"
                )
            value = [o for o in field["options"] if o in value]  # in the schema's order, once
        elif kind == "rating":
            if isinstance(value, str) and value.lstrip("-").isdigit():
                value = int(value)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not field["min"] <= value <= field["max"]
            ):
                raise SchemaError(
                    path, f"must be a whole number from {field['min']} to {field['max']}"
                )
        elif kind == "text":
            if not isinstance(value, str) or len(value) > field["max_length"]:
                raise SchemaError(path, f"must be text of at most {field['max_length']} characters")
        else:
            value = _spans(value, field, path, text_length)
        out[name] = value
    return out


def _spans(value: Any, field: dict[str, Any], path: str, text_length: int) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_SPANS:
        raise SchemaError(path, f"must be a list of at most {MAX_SPANS} spans")
    out = []
    for i, span in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(span, dict) or set(span) != {"start", "end", "label"}:
            raise SchemaError(where, 'must be {"start", "end", "label"}')
        start, end, label = span["start"], span["end"], span["label"]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
            raise SchemaError(where, "start and end must be whole numbers")
        if not 0 <= start < end <= text_length:
            raise SchemaError(
                where, f"must lie within the text (0 to {text_length}), start before end"
            )
        if label not in field["labels"]:
            raise SchemaError(
                f"{where}.label", f"{label!r} is not a label; allowed: {', '.join(field['labels'])}"
            )
        out.append({"start": start, "end": end, "label": label})
    return sorted(out, key=lambda s: (s["start"], s["end"], s["label"]))


def compared(schema: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The part of a submission that annotators must agree on: every field but free text."""
    return {f["name"]: values.get(f["name"]) for f in schema["fields"] if f["kind"] != "text"}


def agreed_values(
    schema: dict[str, Any], labels: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    """The common values when every label agrees on the compared fields (free text from the first
    label that has it), else None: the item goes to a reviewer."""
    if not labels:
        return None
    first = compared(schema, labels[0])
    if any(compared(schema, other) != first for other in labels[1:]):
        return None
    final = {k: v for k, v in first.items() if v is not None}
    for field in schema["fields"]:
        if field["kind"] == "text":
            texts = [label[field["name"]] for label in labels if label.get(field["name"])]
            if texts:
                final[field["name"]] = texts[0]
    return final


def agreement(
    schema: dict[str, Any],
    labels: Sequence[tuple[int, str, dict[str, Any]]],
    finals: dict[int, dict[str, Any]],
    *,
    k: int,
) -> dict[str, Any]:
    """Agreement per single-valued field and per annotator (see the module's docstring).

    ``labels``: (item, annotator, values); ``finals``: item -> final values (agreed or
    adjudicated). A figure that cannot be computed (fewer than two labels of an item, a single
    category seen, so the chance agreement is 1) is None."""
    with warnings.catch_warnings():
        # undefined figures (one category seen) come back as nan and are reported as None
        warnings.simplefilter("ignore")
        return _agreement(schema, labels, finals, k=k)


def _agreement(
    schema: dict[str, Any],
    labels: Sequence[tuple[int, str, dict[str, Any]]],
    finals: dict[int, dict[str, Any]],
    *,
    k: int,
) -> dict[str, Any]:
    from krippendorff import alpha as krippendorff_alpha
    from sklearn.metrics import cohen_kappa_score
    from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

    annotators = sorted({a for _, a, _ in labels})
    items = sorted({i for i, _, _ in labels})
    fields_out = []
    for field in schema["fields"]:
        if field["kind"] not in SINGLE_VALUED:
            continue
        name = field["name"]
        categories = values_of(field)
        code = {v: n for n, v in enumerate(categories)}
        by_item: dict[int, dict[str, int]] = {}
        for item, annotator, values in labels:
            if values.get(name) in code:
                by_item.setdefault(item, {})[annotator] = code[values[name]]
        pairs = []
        for a, b in combinations(annotators, 2):
            shared = [i for i in items if a in by_item.get(i, {}) and b in by_item.get(i, {})]
            if len(shared) >= 2:
                x = [by_item[i][a] for i in shared]
                y = [by_item[i][b] for i in shared]
                pairs.append(_finite(cohen_kappa_score(x, y, labels=list(range(len(categories))))))
        scored_pairs = [p for p in pairs if p is not None]
        complete = [i for i in items if len(by_item.get(i, {})) == k]
        fleiss = None
        if k >= 2 and len(complete) >= 2:
            table = np.array([list(by_item[i].values()) for i in complete])
            counts, _ = aggregate_raters(table, n_cat=len(categories))
            fleiss = _finite(fleiss_kappa(counts, method="fleiss"))
        alpha = None
        multiply_labelled = [i for i in items if len(by_item.get(i, {})) >= 2]
        if len(multiply_labelled) >= 2:
            matrix = np.full((len(annotators), len(multiply_labelled)), np.nan)
            for column, item in enumerate(multiply_labelled):
                for annotator, value in by_item[item].items():
                    matrix[annotators.index(annotator), column] = (
                        value if field["kind"] == "choice" else categories[value]
                    )
            try:
                alpha = _finite(
                    krippendorff_alpha(
                        reliability_data=matrix,
                        level_of_measurement="nominal" if field["kind"] == "choice" else "interval",
                    )
                )
            except ValueError:  # one value seen in all: no variation to agree on
                alpha = None
        fields_out.append(
            {
                "field": name,
                "kind": field["kind"],
                "items": len(multiply_labelled),
                "cohen_kappa": float(np.mean(scored_pairs)) if scored_pairs else None,
                "cohen_pairs": len(scored_pairs),
                "fleiss_kappa": fleiss,
                "fleiss_items": len(complete),
                "krippendorff_alpha": alpha,
            }
        )
    people = []
    for annotator in annotators:
        mine = [(i, v) for i, a, v in labels if a == annotator]
        row: dict[str, Any] = {"annotator": annotator, "labels": len(mine)}
        for field in schema["fields"]:
            if field["kind"] not in SINGLE_VALUED:
                continue
            name = field["name"]
            judged = [(v.get(name), finals[i].get(name)) for i, v in mine if i in finals]
            judged = [(x, y) for x, y in judged if x is not None and y is not None]
            row[f"{name}_matches_final"] = (
                sum(x == y for x, y in judged) / len(judged) if judged else None
            )
            row[f"{name}_kappa_vs_final"] = (
                _finite(cohen_kappa_score([str(x) for x, _ in judged], [str(y) for _, y in judged]))
                if len(judged) >= 2
                else None
            )
        people.append(row)
    return {"fields": fields_out, "annotators": people}


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
