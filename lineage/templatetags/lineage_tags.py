"""Template helpers for other apps' pages: a link into the lineage graph and a cost panel.

    {% load lineage_tags %}
    <a href="{% lineage_url workspace.slug 'model_version' version.pk %}">Lineage</a>
    {% lineage_cost_panel workspace 'feature_group' group.pk %}

(Plain ``{% url 'lineage-graph' ws=workspace.slug %}?node=<kind>:<id>`` works as well.)
"""

from __future__ import annotations

from django import template

from lineage.views import lineage_url as _lineage_url

register = template.Library()


@register.simple_tag
def lineage_url(workspace_slug: str, kind: str, object_id) -> str:
    return _lineage_url(workspace_slug, kind, object_id)


@register.inclusion_tag("lineage/_cost_panel.html")
def lineage_cost_panel(workspace, kind: str, object_id) -> dict:
    from lineage import cost
    from lineage.models import Node

    node = Node.objects.for_workspace(workspace).filter(kind=kind, object_id=str(object_id)).first()
    return {
        "node": node,
        "cost": cost.cost_of(workspace=workspace, node=node) if node is not None else None,
        "url": _lineage_url(workspace.slug, kind, object_id),
    }
