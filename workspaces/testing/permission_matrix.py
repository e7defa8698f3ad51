"""The reusable API permission matrix.

Every API route declares, in its app's ``tests/matrix.py``, an ``ENDPOINTS`` list of ``Endpoint``
rows: the method, the path template, the least role that may call it and how to build a valid
request. ``workspaces/tests/test_permission_matrix.py`` runs each row through every principal
(anonymous, outsider, each role, a member of another workspace, a token narrowed to another
workspace, an object of another workspace) and fails when a route under ``/api/v1/`` has no row.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver

from workspaces.models import Role, Workspace
from workspaces.testing.factories import UserFactory, make_member

API_PREFIX = "/api/v1/"
# The apps whose tests/matrix.py declares endpoints, left to right in the dependency order.
MATRIX_APPS = [
    "workspaces",
    "features",
    "curation",
    "training",
    "training.scheduler",
    "serving",
    "experiments",
    "lineage",
]


@dataclass
class MatrixContext:
    """What a row's ``setup`` and ``body`` callables get: the actor and the target workspace."""

    actor: Any
    workspace: Workspace
    extra: dict[str, Any] = field(default_factory=dict)

    def new_user(self):
        return UserFactory()

    def new_member(self, role: str = Role.VIEWER):
        return make_member(self.workspace, role)


PathKwargs = dict[str, Any]


@dataclass
class Endpoint:
    """One API route and method, with what it takes to call it successfully."""

    method: str
    path: str  # e.g. "/api/v1/workspaces/{ws}/members/{username}/"
    role: str | None = Role.VIEWER  # least workspace role; None = any authenticated user
    success: int = 200
    setup: Callable[[MatrixContext], PathKwargs] | None = None
    body: Callable[[MatrixContext], Any] | None = None
    public: bool = False  # callable without credentials (the token endpoint)
    # Whether the path names an object that setup() makes inside the workspace, so that
    # the same object in another workspace can be tried (must answer 404).
    has_object: bool = False
    format: str = "json"

    @property
    def workspace_scoped(self) -> bool:
        return "{ws}" in self.path

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"

    def build(
        self, ctx: MatrixContext, *, url_workspace: Workspace | None = None
    ) -> tuple[str, Any]:
        """The URL and body for a call in ``ctx.workspace`` (or, for the path, another one)."""
        kwargs = dict(self.setup(ctx)) if self.setup else {}
        kwargs["ws"] = (url_workspace or ctx.workspace).slug
        return self.path.format(**kwargs), (self.body(ctx) if self.body else None)


def load_endpoints() -> list[Endpoint]:
    endpoints: list[Endpoint] = []
    for app in MATRIX_APPS:
        try:
            module = importlib.import_module(f"{app}.tests.matrix")
        except ModuleNotFoundError as exc:
            if exc.name != f"{app}.tests.matrix":
                raise
            continue
        endpoints.extend(module.ENDPOINTS)
    return endpoints


_GROUP = re.compile(r"\(\?P<(?P<name>\w+)>[^)]*\)")


def _route_text(pattern: Any) -> str:
    text = str(pattern)
    text = text.removeprefix("^").removesuffix("$").removesuffix("\\Z")
    text = _GROUP.sub(lambda m: "{" + m.group("name") + "}", text)
    text = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", text)  # path() converters
    return text.replace("\\.", ".")


def _walk(patterns: list, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + _route_text(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + _route_text(entry.pattern), entry


def _methods_of(pattern: URLPattern) -> set[str]:
    callback = pattern.callback
    actions = getattr(callback, "actions", None)
    if actions:
        return {method.upper() for method in actions if method not in ("options", "head")}
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is None:
        return set()
    return {
        method.upper()
        for method in view_class.http_method_names
        if method not in ("options", "head") and hasattr(view_class, method)
    }


def api_routes() -> set[tuple[str, str]]:
    """Every (method, path template) served under /api/v1/, as declared by the URLconf."""
    routes = set()
    for route, pattern in _walk(get_resolver(settings.ROOT_URLCONF).url_patterns):
        path = "/" + route
        if not path.startswith(API_PREFIX):
            continue
        for method in _methods_of(pattern):
            routes.add((method, path))
    return routes


# ---------------------------------------------------------------------------------------------
# Body references: every id, name or MLflow source a request body names is resolved inside the
# URL's workspace. Each app's ``tests/body_references.py`` declares ``REFERENCES`` (one row per
# body field that names another object) and ``NO_REFERENCES`` (write routes whose bodies name
# nothing, with the reason); ``workspaces/tests/test_permission_matrix_body_references.py`` runs
# each row with the object made in another workspace and fails when a write route has neither.


@dataclass
class BodyReference:
    """One body field that names another object: made in another workspace, the call answers
    exactly like a call naming a missing object (404 naming the field in ``attr``), and writes
    nothing. A reference of the wrong type or shape is bad input (400), tested with its route.
    """

    method: str
    path: str
    field: str
    # Makes the referenced object in ctx.workspace; returns how a body names it (id, name, URI).
    # In the other workspace, ctx.extra["home"] is the extra of the caller's (what setup left).
    make: Callable[[MatrixContext], Any]
    # A body for a call in ctx.workspace that is valid except for naming ``ref``.
    body: Callable[[MatrixContext, Any], Any]
    missing: Any  # how a body names an object that exists nowhere
    setup: Callable[[MatrixContext], PathKwargs] | None = None
    success: int = 201  # what the same call answers naming an object of its own workspace
    status: int = 404  # what it answers naming a missing object (and another workspace's)
    attr: str | None = None  # the field the 404 names; the field itself when not given
    format: str = "json"

    @property
    def endpoint_id(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def id(self) -> str:
        return f"{self.endpoint_id} {self.field}"

    def url(self, ctx: MatrixContext) -> str:
        kwargs = dict(self.setup(ctx)) if self.setup else {}
        kwargs["ws"] = ctx.workspace.slug
        return self.path.format(**kwargs)


def load_body_references() -> tuple[list[BodyReference], dict[str, str]]:
    """Every app's body-reference rows, and the write routes declared to name nothing."""
    references: list[BodyReference] = []
    exempt: dict[str, str] = {}
    for app in MATRIX_APPS:
        try:
            module = importlib.import_module(f"{app}.tests.body_references")
        except ModuleNotFoundError as exc:
            if exc.name != f"{app}.tests.body_references":
                raise
            continue
        references.extend(module.REFERENCES)
        exempt.update(getattr(module, "NO_REFERENCES", {}))
    return references, exempt


def reference_masked(body: Any, reference: Any) -> str:
    """An answer as JSON with the reference the request named replaced by a placeholder: what an
    answer may differ by between another workspace's object and a missing one (a message may
    quote the reference the caller sent, nothing else)."""
    text = json.dumps(body, sort_keys=True)
    # A feature reference's message may quote its group alone ("no feature group 'users'").
    for value in (str(reference), *str(reference).split(":")):
        text = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", "<ref>", text)
    return text


# ---------------------------------------------------------------------------------------------
# Query references: every query-string parameter that names another object (an id, a name,
# ``kind:id``) is resolved inside the URL's workspace. Each app's ``tests/query_references.py``
# declares ``QUERY_REFERENCES``; ``workspaces/tests/test_permission_matrix_query_references.py``
# runs each row with the object made in another workspace.


@dataclass
class QueryReference:
    """One query parameter that names another object: made in another workspace, the call
    answers exactly like one naming a missing object, an empty page where the parameter filters
    a list and 404 naming the parameter where it looks one object up, and shows nothing of it.
    """

    path: str
    param: str
    # Makes the referenced object in ctx.workspace; returns how a query names it.
    make: Callable[[MatrixContext], Any]
    missing: Any  # how a query names an object that exists nowhere
    # The whole query for a call in ctx.workspace naming ``ref``; {param: ref} when not given.
    query: Callable[[MatrixContext, Any], dict[str, Any]] | None = None
    setup: Callable[[MatrixContext], PathKwargs] | None = None
    status: int = 200  # 200: a filter (an empty page); 404: a lookup (attr names the parameter)

    @property
    def id(self) -> str:
        return f"GET {self.path} ?{self.param}"

    def url(self, ctx: MatrixContext) -> str:
        kwargs = dict(self.setup(ctx)) if self.setup else {}
        kwargs["ws"] = ctx.workspace.slug
        return self.path.format(**kwargs)

    def params(self, ctx: MatrixContext, ref: Any) -> dict[str, Any]:
        return self.query(ctx, ref) if self.query else {self.param: ref}


def load_query_references() -> list[QueryReference]:
    """Every app's query-reference rows."""
    references: list[QueryReference] = []
    for app in MATRIX_APPS:
        try:
            module = importlib.import_module(f"{app}.tests.query_references")
        except ModuleNotFoundError as exc:
            if exc.name != f"{app}.tests.query_references":
                raise
            continue
        references.extend(module.QUERY_REFERENCES)
    return references
