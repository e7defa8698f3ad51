"""Browser UI of the lineage app: the interactive graph page, its node-name suggestions (JSON)
and the dashboard cost card."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.db.models import Count, Subquery, Sum
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from lineage import cost, queries, search
from lineage.models import Node, Usage
from lineage.projection import catch_up
from workspaces.dashboard import DashboardSection
from workspaces.views import WorkspaceRequest, page_context, workspace_page

# With nothing asked for, the page centres on the newest of these: a model version sits in the
# middle of the chain, so three steps both ways show features to experiments.
START_KINDS = ("model_version", "deployment", "experiment", "training_job", "dataset")
PAGE_DEPTH = 3
PAGE_MAX_NODES = 300


def lineage_url(workspace_slug: str, kind: str, object_id) -> str:
    """The graph page centred on one object: for links from other apps' pages."""
    return f"{reverse('lineage-graph', kwargs={'ws': workspace_slug})}?node={kind}:{object_id}"


def graph_url(workspace_slug: str, node: Node, *, unique: bool = True) -> str:
    """The graph page centred on ``node`` in the readable form (?kind=...&q=<name>); the
    internal id only where the name does not tell the node apart."""
    base = reverse("lineage-graph", kwargs={"ws": workspace_slug})
    if unique and node.label:
        return f"{base}?{urlencode({'kind': node.kind, 'q': node.label})}"
    return f"{base}?{urlencode({'node': node.key})}"


def _graph_payload(workspace, node: Node) -> dict:
    """The neighbourhood the page draws first (the API's traversal), each node with its column
    (``rank``), its kind in words and its readable graph link."""
    graph = queries.traverse(
        workspace=workspace,
        node=node,
        direction="both",
        depth=PAGE_DEPTH,
        max_nodes=PAGE_MAX_NODES,
    )
    shared = {
        (row["kind"], row["label"])
        for row in Node.objects.for_workspace(workspace)
        .filter(label__in={n["label"] for n in graph["nodes"]})
        .values("kind", "label")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .order_by()
    }
    for item in graph["nodes"]:
        item["rank"] = search.kind_rank(item["kind"])
        item["kind_name"] = search.kind_name(item["kind"])
        unique = (item["kind"], item["label"]) not in shared
        target = Node(kind=item["kind"], object_id=item["object_id"], label=item["label"])
        item["page"] = graph_url(workspace.slug, target, unique=unique)
    graph["nodes"].sort(key=lambda n: (n["rank"], n["level"], n["label"]))
    return graph


def _name_is_unique(workspace, node: Node) -> bool:
    nodes = Node.objects.for_workspace(workspace).filter(kind=node.kind, label__iexact=node.label)
    return bool(node.label) and nodes.count() == 1


def _default_node(workspace, *, kind: str | None = None) -> Node | None:
    nodes = Node.objects.for_workspace(workspace)
    if kind:
        return nodes.filter(kind=kind).order_by("-last_event_id").first()
    for start_kind in START_KINDS:
        start = nodes.filter(kind=start_kind).order_by("-last_event_id").first()
        if start is not None:
            return start
    return nodes.order_by("-last_event_id").first()


@workspace_page()
def graph_page(request: WorkspaceRequest, workspace) -> HttpResponse:
    """The lineage graph around one object, found by name (``?q=ctr-model``, optionally
    ``&kind=model``); ``?node=<kind>:<id>`` still works. A name nothing has answers 404 with
    suggestions."""
    catch_up()
    query = (request.GET.get("q") or request.GET.get("name") or "").strip()
    kind_word = request.GET.get("kind", "").strip()
    key = request.GET.get("node", "").strip()
    kind = search.kind_parse(kind_word, workspace=workspace) if kind_word else None
    has_lineage = Node.objects.for_workspace(workspace).exists()
    lookup = None
    node = None
    status = 200
    if kind_word and kind is None:
        status = 400
    elif query or key:
        lookup = search.node_find(workspace=workspace, query=query, kind=kind, key=key)
        node = lookup.node
        if node is None:
            status = 404
        elif lookup.by_key and _name_is_unique(workspace, node):
            # Asked by internal id (an old link): the address bar shows the readable form.
            return redirect(graph_url(workspace.slug, node))
    elif has_lineage:
        node = _default_node(workspace, kind=kind)
        if node is None:
            status = 404  # ?kind=... alone, and nothing of that kind yet
    graph = _graph_payload(workspace, node) if node is not None else None
    suggestions = lookup.suggestions if lookup and node is None else []
    return render(
        request,
        "lineage/graph.html",
        page_context(
            request,
            section="lineage",
            node=node,
            node_kind_name=search.kind_name(node.kind) if node is not None else "",
            query=query or (node.label if node is not None else ""),
            kind=kind or "",
            kind_word=kind_word,
            asked_kind_name=search.kind_name(kind) if kind else "",
            bad_kind=bool(kind_word) and kind is None,
            kinds=[
                (k, search.kind_name(k))
                for k in sorted(search.KIND_PREFERENCE, key=search.kind_rank)
            ],
            asked=query or key,
            has_lineage=has_lineage,
            namesakes=[
                _link(workspace.slug, n, unique=False) for n in (lookup.namesakes if lookup else [])
            ],
            suggestions=[_link(workspace.slug, n) for n in suggestions],
            recent_names=_names(search.node_suggest(workspace=workspace, query="", limit=30)),
            graph=graph,
            kind_ranks=search.KIND_RANKS,
            node_cost=cost.cost_of(workspace=workspace, node=node) if node is not None else None,
            api_url=reverse("v1:lineage-list", kwargs={"ws": workspace.slug}),
            suggest_url=reverse("lineage-suggest", kwargs={"ws": workspace.slug}),
            workspace_cost=cost.workspace_cost(workspace=workspace, days=30),
            top=[
                {
                    **row,
                    "url": f"{reverse('lineage-graph', kwargs={'ws': workspace.slug})}?"
                    + urlencode({"node": row["key"]}),
                }
                for row in cost.top_costs(
                    workspace=workspace, kinds=("training_job", "deployment", "experiment")
                )
            ],
        ),
        status=status,
    )


def _link(workspace_slug: str, node: Node, *, unique: bool = True) -> dict:
    return {
        "node": node,
        "kind_name": search.kind_name(node.kind),
        "url": graph_url(workspace_slug, node, unique=unique),
    }


def _names(nodes: list[Node]) -> list[dict]:
    seen: set[str] = set()
    names = []
    for n in nodes:
        if n.label not in seen:
            seen.add(n.label)
            names.append({"name": n.label, "kind_name": search.kind_name(n.kind)})
    return names


@workspace_page()
def suggest(request: WorkspaceRequest, workspace) -> JsonResponse:
    """Names for the search box: ``?q=ctr`` answers the workspace's objects whose name contains
    it (or is close to it), each with its kind and graph link."""
    catch_up()
    query = request.GET.get("q", "")
    kind_word = request.GET.get("kind", "").strip()
    kind = search.kind_parse(kind_word, workspace=workspace) if kind_word else None
    found = search.node_suggest(workspace=workspace, query=query, kind=kind, limit=10)
    return JsonResponse(
        {
            "query": query,
            "results": [
                {
                    "name": n.label,
                    "kind": n.kind,
                    "kind_name": search.kind_name(n.kind),
                    "url": graph_url(workspace.slug, n),
                }
                for n in found
            ],
        }
    )


def dashboard_section(*, workspace, user) -> DashboardSection:
    """The "Lineage" card: graph size and the last 30 days' cost, in one query (the dashboard's
    query budget is shared by every card)."""
    kinds = ("feature_group", "dataset", "training_job", "model_version", "deployment")
    since = timezone.now() - timedelta(days=30)
    spent = (
        Usage.objects.filter(workspace_id=workspace.pk, created_at__gte=since)
        .values("workspace_id")
        .annotate(cost=Sum("cost"), cpu=Sum("cpu_hours"), gpu=Sum("gpu_hours"))
    )
    rows = (
        Node.objects.for_workspace(workspace)
        .filter(kind__in=kinds)
        .values("kind")
        .annotate(
            n=Count("id"),
            cost=Subquery(spent.values("cost")),
            cpu=Subquery(spent.values("cpu")),
            gpu=Subquery(spent.values("gpu")),
        )
        .order_by()
    )
    counts = dict.fromkeys(kinds, 0)
    total = {"cost": 0.0, "cpu_hours": 0.0, "gpu_hours": 0.0}
    for row in rows:
        counts[row["kind"]] = row["n"]
        total = {
            "cost": row["cost"] or 0.0,
            "cpu_hours": row["cpu"] or 0.0,
            "gpu_hours": row["gpu"] or 0.0,
        }
    return DashboardSection(
        template="lineage/_dashboard_section.html",
        context={"workspace": workspace, "counts": counts, "total": total},
    )
