"""Checks of a rendered page's markup that every page must pass: each visible form control has a
label (a ``<label>`` around it or naming its id, or an ``aria-label``/``title``), and no two
elements share an id (a label names one control; with two ``id_model`` the second form's label
points at the first form's field)."""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser

CONTROLS = {"input", "select", "textarea"}
UNLABELLED_TYPES = {"hidden", "submit", "button", "reset", "image"}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: Counter[str] = Counter()
        self.label_for: set[str] = set()
        self.label_depth = 0
        self.controls: list[tuple[dict[str, str], bool]] = []  # (attributes, inside a label)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if a.get("id"):
            self.ids[a["id"]] += 1
        if tag == "label":
            self.label_depth += 1
            if a.get("for"):
                self.label_for.add(a["for"])
        elif tag in CONTROLS:
            self.controls.append((a, self.label_depth > 0))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag == "label":
            self.label_depth -= 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "label" and self.label_depth:
            self.label_depth -= 1


def markup_problems(html: str) -> list[str]:
    """What is wrong with the page's form controls and ids (empty when nothing is)."""
    page = _Page()
    page.feed(html)
    problems = [f"duplicate id {i!r}" for i, n in page.ids.items() if n > 1]
    for attrs, in_label in page.controls:
        if attrs.get("type", "").lower() in UNLABELLED_TYPES:
            continue
        named = in_label or attrs.get("id", "") in page.label_for
        if not (named or attrs.get("aria-label") or attrs.get("title")):
            problems.append(f"unlabelled control name={attrs.get('name', '')!r}")
    return problems
