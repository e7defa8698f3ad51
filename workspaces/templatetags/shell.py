"""The shell's template filters (``{% load shell %}``); the wording lives in workspaces.humanize."""

from django import template

from workspaces import humanize

register = template.Library()

for _name in (
    "actor_label",
    "duration",
    "from_milli",
    "key_values",
    "mib_as_gib",
    "trimmed",
    "verb_label",
):
    register.filter(_name, getattr(humanize, _name))
