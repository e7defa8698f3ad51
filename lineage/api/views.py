"""The lineage API: traversals, impact, consumers, unused features, cost, OpenLineage intake."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from lineage import cost, queries
from lineage.api import answers
from lineage.models import Node
from lineage.openlineage import (
    MARQUEZ_MAX_DEPTH,
    marquez_graph,
    namespace_slug,
    namespace_workspace_slug,
    openlineage_event_record,
    openlineage_scope_check,
    parse_event,
    parse_marquez_node_id,
)
from lineage.projection import catch_up
from workspaces.api.schema import SingleAnswerSchema
from workspaces.api.viewsets import ROLE_PERMISSION, WorkspaceScopedViewSet, request_token
from workspaces.models import Role
from workspaces.selectors import workspace_access

NODE = OpenApiParameter("node", str, required=True, description="The node as <kind>:<id>.")
DEPTH = OpenApiParameter("depth", int, description="Steps to walk (1-10).")


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: "Give a whole number."}) from None
    if not low <= value <= high:
        raise ValidationError({name: f"Give a number between {low} and {high}."})
    return value


class LineageViewSet(WorkspaceScopedViewSet):
    """The workspace's lineage graph (a projection of its event log)."""

    queryset = Node.objects.none()
    schema = SingleAnswerSchema()

    def get_workspace_queryset(self):
        return Node.objects.for_workspace(self.workspace)

    def _node(self, request: Request) -> Node:
        catch_up()
        return queries.node_get(workspace=self.workspace, key=request.query_params.get("node", ""))

    @extend_schema(
        parameters=[
            NODE,
            OpenApiParameter("direction", str, enum=["upstream", "downstream", "both"]),
            DEPTH,
            OpenApiParameter("ended", bool, description="Include uses that ended."),
        ],
        responses={200: answers.GRAPH},
    )
    def list(self, request: Request, ws: str) -> Response:
        """Nodes and edges within ``depth`` steps of ``node``, upstream or downstream."""
        node = self._node(request)
        return Response(
            queries.traverse(
                workspace=self.workspace,
                node=node,
                direction=request.query_params.get("direction", "downstream"),
                depth=_int(request, "depth", 3, 1, 10),
                with_ended=request.query_params.get("ended") in ("1", "true"),
            )
        )

    @extend_schema(parameters=[NODE, DEPTH], responses={200: answers.IMPACT})
    @action(detail=False)
    def impact(self, request: Request, ws: str) -> Response:
        """What breaks if the node is retired: live downstream jobs, models, deployments and
        experiments, with their owners."""
        node = self._node(request)
        depth = _int(request, "depth", 6, 1, 10)
        return Response(queries.impact(workspace=self.workspace, node=node, depth=depth))

    @extend_schema(parameters=[NODE], responses={200: answers.CONSUMERS})
    @action(detail=False)
    def consumers(self, request: Request, ws: str) -> Response:
        """Objects that use the node now."""
        node = self._node(request)
        found = queries.consumers_of(workspace=self.workspace, node=node)
        return Response({"root": node.key, "consumers": [queries.node_dict(n) for n in found]})

    @extend_schema(parameters=[NODE], responses={200: answers.FEATURES})
    @action(detail=False)
    def features(self, request: Request, ws: str) -> Response:
        """The feature groups and features upstream of a node (e.g. a model version)."""
        node = self._node(request)
        found = queries.features_of_model(workspace=self.workspace, node=node)
        return Response({"root": node.key, "features": [queries.node_dict(n) for n in found]})

    @extend_schema(parameters=[NODE], responses={200: answers.MODELS})
    @action(detail=False)
    def models(self, request: Request, ws: str) -> Response:
        """The model versions downstream of a node (e.g. a feature)."""
        node = self._node(request)
        found = queries.models_of_feature(workspace=self.workspace, node=node)
        return Response({"root": node.key, "models": [queries.node_dict(n) for n in found]})

    @extend_schema(
        parameters=[OpenApiParameter("days", int, description="Idle for at least (default 30).")],
        responses={200: answers.UNUSED},
    )
    @action(detail=False, url_path="unused-features")
    def unused_features(self, request: Request, ws: str) -> Response:
        """Live feature groups and features nothing has consumed for ``days`` days."""
        catch_up()
        days = _int(request, "days", 30, 0, 3650)
        found = queries.unused_features(workspace=self.workspace, days=days)
        return Response({"days": days, "unused": found})

    @extend_schema(
        parameters=[
            OpenApiParameter("node", str, description="A node's roll-up; else the workspace's."),
            OpenApiParameter("days", int, description="Window of the workspace series."),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=False)
    def cost(self, request: Request, ws: str) -> Response:
        """Cost roll-ups: of one node, or of the workspace per day with its costliest objects."""
        if request.query_params.get("node"):
            node = self._node(request)
            return Response(cost.cost_of(workspace=self.workspace, node=node))
        catch_up()
        days = _int(request, "days", 30, 1, 3650)
        summary = cost.workspace_cost(workspace=self.workspace, days=days)
        summary["top"] = cost.top_costs(
            workspace=self.workspace, kinds=("training_job", "deployment", "experiment")
        )
        summary["runs"] = cost.pipeline_runs(workspace=self.workspace, limit=50)
        return Response(summary)


def _event_body(request: Request):
    """The event, inflated first when sent gzip-compressed (``Content-Encoding: gzip``, what
    openlineage-python's HTTP transport sends with ``compression: gzip``); an inflated body
    over ``OPENLINEAGE_MAX_INFLATED_BYTES`` is a 413, bytes that are not gzip or JSON a 400."""
    import gzip
    import io
    import json
    import zlib

    from rest_framework.exceptions import ParseError

    from lineage.conf import setting

    if request.headers.get("Content-Encoding", "").lower() != "gzip":
        return request.data
    limit = int(setting("OPENLINEAGE_MAX_INFLATED_BYTES"))
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(request.body)) as stream:
            raw = stream.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise ParseError("The body is not gzip data.") from exc
    if len(raw) > limit:
        from django.core.exceptions import RequestDataTooBig

        raise RequestDataTooBig(f"The event inflates to over {limit} bytes.")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ParseError("The inflated body is not JSON.") from exc


class OpenLineageIntakeView(APIView):
    """``POST /api/v1/lineage``: the OpenLineage HTTP transport's endpoint (Marquez-compatible).

    The job's namespace (or, without a job, the first output dataset's) names the workspace by
    its slug; the token needs the developer role there. An event whose namespace is no workspace
    the caller can see is acknowledged and ignored (``200 {"status": "ignored"}``), so a
    producer that also reports unrelated jobs keeps running; a recorded event answers 201.
    A dataset in another workspace's namespace answers 404; more input and output datasets than
    the workspace's policy allows (``max_lineage_datasets``) answer 413.
    """

    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "nodeId",
                str,
                required=True,
                description="dataset:<namespace>:<name> or job:<namespace>:<name>, as exported",
            ),
            OpenApiParameter("depth", int, description=f"1-{MARQUEZ_MAX_DEPTH} (default 20)"),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        """Marquez's lineage read: the graph around ``nodeId``, each node with its edges.

        The namespace in ``nodeId`` names the workspace, as for intake (the viewer role is
        enough); the names are those the export sends."""
        node_id = str(request.query_params.get("nodeId", ""))
        _, namespace, _ = parse_marquez_node_id(node_id)
        raw_depth = request.query_params.get("depth", str(MARQUEZ_MAX_DEPTH))
        if not raw_depth.isdigit() or not 1 <= int(raw_depth) <= MARQUEZ_MAX_DEPTH:
            raise ValidationError({"depth": f"Give a whole number from 1 to {MARQUEZ_MAX_DEPTH}."})
        workspace, _ = workspace_access(
            user=request.user, slug=namespace_slug(namespace), token=request_token(request)
        )
        return Response(marquez_graph(workspace, node_id, int(raw_depth)))

    @extend_schema(request=OpenApiTypes.OBJECT, responses={201: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        parsed = parse_event(_event_body(request))
        slug = namespace_workspace_slug(parsed)
        token = request_token(request)
        try:
            workspace, perms = workspace_access(user=request.user, slug=slug, token=token)
        except Http404:
            return Response(
                {
                    "status": "ignored",
                    "detail": f"namespace '{slug}' is no workspace of yours; map an external "
                    "namespace to a workspace with OPENLINEAGE_NAMESPACES (ns=workspace-slug)",
                },
                status=status.HTTP_200_OK,
            )
        if ROLE_PERMISSION[Role.DEVELOPER] not in perms:
            from rest_framework.exceptions import PermissionDenied

            raise PermissionDenied("Recording lineage needs the developer role.")
        openlineage_scope_check(workspace=workspace, parsed=parsed)
        event = openlineage_event_record(
            actor=request.user,
            workspace=workspace,
            parsed=parsed,
            token_prefix=token.prefix if token else "",
        )
        return Response(
            {"status": "recorded", "event": event.pk, "workspace": workspace.slug},
            status=status.HTTP_201_CREATED,
        )
