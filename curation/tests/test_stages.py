"""Data-building stages: each filter rule, scrubbing, dedup and formatting on small tables whose
answers are worked out by hand, and the validation that names the offending field."""

from __future__ import annotations

import pyarrow as pa
import pytest

from curation import stages
from curation.stages import StageError, run, validate

TEXTS = [
    "The quick brown fox jumps over the lazy dog",  # 0: kept by everything below
    "short",  # 1: fewer than 3 words
    "1234 5678 9012 3456 7890",  # 2: no letters
    "buy now ### ### ### ### cheap",  # 3: symbols
    "same line\nsame line\nsame line\nother line",  # 4: repeated lines
    "Visit https://spam.example.com for a free prize today",  # 5: matches the regex
    None,  # 6: null text
]


def table(**extra) -> pa.Table:
    return pa.table({"text": pa.array(TEXTS, pa.string()), **extra})


def one(stage: dict, data: pa.Table | None = None):
    data = data if data is not None else table()
    checked = validate([stage], data.schema)
    out, reports = run(data, checked)
    return out, reports[0]


@pytest.mark.parametrize(
    ("rule", "dropped"),
    [
        ({"rule": "min_words", "value": 3}, [1, 6]),
        ({"rule": "max_words", "value": 5}, [0, 3, 4, 5]),
        ({"rule": "min_length", "value": 6}, [1, 6]),
        ({"rule": "max_length", "value": 30}, [0, 4, 5]),
        ({"rule": "alpha_ratio", "min": 0.5}, [2, 3, 6]),  # 3: 11 letters of 23
        ({"rule": "symbol_ratio", "max": 0.2}, [3]),
        ({"rule": "repeated_lines", "max": 0.3}, [4]),
        ({"rule": "regex", "pattern": r"https?://"}, [5]),
        ({"rule": "regex", "pattern": r"(?i)fox|prize", "drop": "no_match"}, [1, 2, 3, 4, 6]),
    ],
)
def test_each_text_rule_drops_the_rows_worked_out_by_hand(rule, dropped):
    out, report = one({"kind": "filter", "field": "text", "rules": [rule]})
    kept = [t for i, t in enumerate(TEXTS) if i not in dropped]
    assert out.column("text").to_pylist() == kept
    assert report.rows_in == len(TEXTS) and report.rows_out == len(kept)
    (label,) = report.removed
    assert report.removed[label] == len(dropped)
    assert [e["text"] for e in report.examples[label]] == [TEXTS[i] for i in dropped][:3]


def test_a_row_failing_several_rules_counts_against_the_first_only():
    out, report = one(
        {
            "kind": "filter",
            "field": "text",
            "rules": [{"rule": "min_words", "value": 3}, {"rule": "alpha_ratio", "min": 0.5}],
        }
    )
    # row 6 (null) fails both: counted by min_words; rows 2 and 3 fail alpha_ratio only
    assert report.removed == {"min_words 3": 2, "alpha_ratio 0.5": 2}
    assert out.num_rows == len(TEXTS) - 4


@pytest.mark.parametrize(
    ("op", "value", "kept"),
    [
        ("eq", "en", [0, 2]),
        ("ne", "en", [1]),  # null is neither equal nor not equal: dropped
        ("in", ["fr", "de"], [1]),
        ("not_in", ["fr"], [0, 2]),  # null: dropped, as by ne
        ("not_null", None, [0, 1, 2]),
    ],
)
def test_field_conditions_on_any_column(op, value, kept):
    data = pa.table({"lang": ["en", "fr", "en", None], "score": [1, 5, 9, 3]})
    rule = {"rule": "field", "column": "lang", "op": op}
    if value is not None:
        rule["value"] = value
    out, _ = one({"kind": "filter", "rules": [rule]}, data)
    assert out.column("score").to_pylist() == [[1, 5, 9, 3][i] for i in kept]
    out, report = one(
        {"kind": "filter", "rules": [{"rule": "field", "column": "score", "op": "ge", "value": 5}]},
        data,
    )
    assert out.column("score").to_pylist() == [5, 9]
    assert report.removed == {"field score ge 5": 2}


def test_scrub_replaces_each_kind_of_personal_data_and_keeps_nulls():
    data = pa.table(
        {
            "text": [
                "mail jane.doe+x@example.co.uk now",
                "call +44 20 7946 0958 or (555) 123-4567",
                "card 4111 1111 1111 1111 and ip 192.168.0.12",
                "see http://example.org/a?b=c",
                "nothing here",
                None,
            ]
        }
    )
    out, report = one({"kind": "scrub", "field": "text"}, data)
    assert out.column("text").to_pylist() == [
        "mail <EMAIL> now",
        "call <PHONE> or <PHONE>",
        "card <CARD> and ip <IP>",
        "see <URL>",
        "nothing here",
        None,
    ]
    assert report.changed["rows"] == 4
    assert report.changed["email in text"] == 1 and report.changed["phone in text"] == 2
    assert report.examples["text"][0] == {
        "before": "mail jane.doe+x@example.co.uk now",
        "after": "mail <EMAIL> now",
    }
    only_email, _ = one({"kind": "scrub", "field": "text", "patterns": ["email"]}, data)
    assert only_email.column("text")[3].as_py() == "see http://example.org/a?b=c"


def test_dedup_drops_exact_and_near_copies_and_shows_what_they_copied():
    base = "the cat sat on the mat while the dog slept by the warm fire all night long"
    data = pa.table(
        {
            "text": [
                base,
                base.upper() + "!!",  # exact once normalised
                base.replace("warm", "cold"),  # near: 3 of 16 shingles differ
                "an entirely different sentence about ranking models and their features",
            ],
            "id": [1, 2, 3, 4],
        }
    )
    out, report = one({"kind": "dedup", "field": "text", "threshold": 0.6}, data)
    assert out.column("id").to_pylist() == [1, 4]
    assert report.removed == {"exact duplicate": 1, "near duplicate": 1}
    near = report.examples["near duplicate"][0]
    assert near["duplicate_of"] == base and 0.6 <= near["similarity"] < 1
    exact_only, report = one({"kind": "dedup", "field": "text", "near": False}, data)
    assert exact_only.column("id").to_pylist() == [1, 3, 4]


def test_format_to_instructions_and_to_chats_as_the_lm_templates_read_them():
    data = pa.table(
        {"q": ["What is 2+2?", "Name a colour"], "a": ["4", None], "sys": ["Be brief", "Be kind"]}
    )
    out, _ = one({"kind": "format", "to": "instruction", "instruction": "q", "output": "a"}, data)
    assert out.to_pylist() == [
        {"instruction": "What is 2+2?", "input": "", "output": "4"},
        {"instruction": "Name a colour", "input": "", "output": ""},
    ]
    out, report = one(
        {"kind": "format", "to": "chat", "system": "sys", "user": "q", "assistant": "a"}, data
    )
    assert out.column_names == ["messages"]
    assert out.column("messages")[0].as_py() == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert report.rows_out == 2 and len(report.examples["formatted"]) == 2


def test_a_pipeline_reports_every_stage_in_order_and_each_sees_the_previous_output():
    checked = validate(
        [
            {"kind": "filter", "field": "text", "rules": [{"rule": "min_words", "value": 3}]},
            {"kind": "scrub", "field": "text", "patterns": ["url"]},
            {"kind": "format", "to": "instruction", "instruction": "text", "output": "text"},
        ],
        table().schema,
    )
    seen = []
    out, reports = run(table(), checked, on_stage=lambda i, r: seen.append((i, r.kind)))
    assert seen == [(0, "filter"), (1, "scrub"), (2, "format")]
    assert [r.rows_out for r in reports] == [5, 5, 5]
    assert "Visit <URL> for a free prize today" in out.column("instruction").to_pylist()


@pytest.mark.parametrize(
    ("pipeline", "path", "words"),
    [
        ([], "stages", "non-empty"),
        ([{"kind": "shuffle"}], "stages[0].kind", "allowed: filter, scrub, dedup, format"),
        (
            [{"kind": "filter", "field": "text", "rules": [{"rule": "nope"}]}],
            "stages[0].rules[0].rule",
            "allowed: min_length",
        ),
        (
            [{"kind": "filter", "field": "body", "rules": [{"rule": "min_words", "value": 1}]}],
            "stages[0].field",
            "the columns are text, n",
        ),
        (
            [{"kind": "filter", "field": "n", "rules": [{"rule": "min_words", "value": 1}]}],
            "stages[0].field",
            "not text",
        ),
        (
            [{"kind": "filter", "field": "text", "rules": [{"rule": "min_words", "value": "3"}]}],
            "stages[0].rules[0].value",
            "number",
        ),
        (
            [
                {
                    "kind": "filter",
                    "field": "text",
                    "rules": [{"rule": "regex", "pattern": "(unclosed"}],
                }
            ],
            "stages[0].rules[0].pattern",
            "RE2",
        ),
        (
            [{"kind": "filter", "field": "text", "rules": [{"rule": "alpha_ratio", "min": 2}]}],
            "stages[0].rules[0].min",
            "between 0",
        ),
        (
            [
                {
                    "kind": "filter",
                    "rules": [{"rule": "field", "column": "n", "op": "gt", "value": "x"}],
                }
            ],
            "stages[0].rules[0].value",
            "cannot compare",
        ),
        (
            [
                {
                    "kind": "filter",
                    "rules": [{"rule": "field", "column": "n", "op": "like", "value": 1}],
                }
            ],
            "stages[0].rules[0].op",
            "allowed: eq",
        ),
        (
            [{"kind": "scrub", "field": "text", "patterns": ["ssn"]}],
            "stages[0].patterns[0]",
            "allowed: email",
        ),
        (
            [{"kind": "dedup", "field": "text", "threshold": 0}],
            "stages[0].threshold",
            "between 0.05",
        ),
        ([{"kind": "dedup", "field": "text", "bands": 4}], "stages[0].bands", "allowed: exact"),
        ([{"kind": "format", "to": "yaml"}], "stages[0].to", "allowed: instruction, chat"),
        ([{"kind": "format", "to": "chat", "user": "text"}], "stages[0].assistant", "required"),
        # the second stage meets the first one's output columns, not the source's
        (
            [
                {"kind": "format", "to": "instruction", "instruction": "text", "output": "text"},
                {"kind": "dedup", "field": "text"},
            ],
            "stages[1].field",
            "the columns are instruction, input, output",
        ),
    ],
)
def test_a_bad_pipeline_is_refused_naming_the_field_and_the_allowed_values(pipeline, path, words):
    with pytest.raises(StageError) as caught:
        validate(pipeline, table(n=pa.array(range(len(TEXTS)))).schema)
    assert caught.value.path == path
    assert words in caught.value.message


def test_examples_are_clipped():
    long = "word " * 200
    out, report = one(
        {"kind": "filter", "field": "text", "rules": [{"rule": "max_length", "value": 10}]},
        pa.table({"text": [long]}),
    )
    assert out.num_rows == 0
    shown = report.examples["max_length 10"][0]["text"]
    assert len(shown) == stages.EXAMPLE_CHARS + 1 and shown.endswith("…")
