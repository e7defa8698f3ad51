"""Request ids and the 500 envelope: every response carries X-Request-ID; an unhandled exception
under /api/ answers the API's error body with that id (never an HTML page), and the server's log
line of the exception names it."""

from __future__ import annotations

import logging

import pytest
from django.conf import settings
from django.http import HttpResponse
from django.urls import include, path
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from workspaces.middleware import RequestIdLogFilter
from workspaces.tasks import worker_heartbeat


class Boom(RuntimeError):
    pass


class RaisingApiView(APIView):
    permission_classes = [AllowAny]
    authentication_classes: list = []

    def get(self, request):
        raise Boom("secret internals")


class UnrenderableApiView(APIView):
    """A body the JSON renderer cannot encode: the failure comes after the view returned."""

    permission_classes = [AllowAny]
    authentication_classes: list = []

    def get(self, request):
        return Response({"text": "\ud800"})


def raising_plain_view(request):
    raise Boom("secret internals")


def page_view(request):
    return HttpResponse("<p>ok</p>")


urlpatterns = [
    path("api/test/raises/", RaisingApiView.as_view()),
    path("api/test/unrenderable/", UnrenderableApiView.as_view()),
    path("api/test/plain-raises/", raising_plain_view),
    path("test/page-raises/", raising_plain_view),
    path("test/page/", page_view),
    path("", include("config.urls")),
]

pytestmark = pytest.mark.urls(__name__)


@pytest.fixture
def client():
    from rest_framework.test import APIClient

    # Answer like a server does instead of re-raising the view's exception into the test.
    return APIClient(raise_request_exception=False)


class _Lines(logging.Handler):
    """The server's log lines, formatted as settings.LOGGING formats them."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.addFilter(RequestIdLogFilter())
        self.setFormatter(logging.Formatter(settings.LOGGING["formatters"]["plain"]["format"]))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def server_log():
    handler = _Lines()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler.lines
    root.removeHandler(handler)


def _assert_server_error(response) -> str:
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    body = response.json()
    request_id = response["X-Request-ID"]
    assert body == {
        "type": "server_error",
        "code": "server_error",
        "detail": "Internal error; quote the request id when reporting it.",
        "attr": None,
        "request_id": request_id,
    }
    assert b"secret internals" not in response.content
    return request_id


@pytest.mark.parametrize(
    "url", ["/api/test/raises/", "/api/test/plain-raises/", "/api/test/unrenderable/"]
)
def test_an_unhandled_exception_under_api_is_the_500_envelope_with_the_request_id(
    client, url, server_log
):
    request_id = _assert_server_error(client.get(url))
    assert len(request_id) == 32
    logged = [line for line in server_log if "Internal Server Error" in line]
    assert logged and all(f"[{request_id}]" in line for line in logged)


def test_a_sane_incoming_request_id_is_kept_in_the_body_and_the_log(client, server_log):
    response = client.get("/api/test/raises/", HTTP_X_REQUEST_ID="trace-4bf92f3577b34da6.01")
    assert _assert_server_error(response) == "trace-4bf92f3577b34da6.01"
    assert any("[trace-4bf92f3577b34da6.01]" in line and "Boom" in line for line in server_log)


@pytest.mark.parametrize(
    "incoming", ["", "has space", "new\nline", "x" * 129, "-leading-dash", "<script>", "ü"]
)
def test_an_insane_incoming_request_id_is_replaced(client, incoming):
    response = client.get("/test/page/", HTTP_X_REQUEST_ID=incoming)
    assert response.status_code == 200
    replaced = response["X-Request-ID"]
    assert replaced != incoming and len(replaced) == 32 and replaced.isalnum()


def test_every_response_carries_a_request_id_probes_and_api_errors_included(client, db):
    worker_heartbeat()  # /readyz needs a recent worker heartbeat
    for url, status in (
        ("/healthz", 200),
        ("/readyz", 200),
        ("/test/page/", 200),
        ("/api/v1/workspaces/", 401),
    ):
        response = client.get(url)
        assert response.status_code == status, url
        assert len(response["X-Request-ID"]) == 32
    first, second = client.get("/healthz"), client.get("/healthz")
    assert first["X-Request-ID"] != second["X-Request-ID"]


def test_a_browser_page_keeps_the_html_error_page_without_a_traceback(client):
    assert settings.DEBUG is False
    response = client.get("/test/page-raises/")
    assert response.status_code == 500
    assert response["Content-Type"].startswith("text/html")
    assert b"secret internals" not in response.content
    assert b"Traceback" not in response.content
    assert len(response["X-Request-ID"]) == 32


@pytest.mark.django_db
def test_an_unknown_api_url_answers_the_error_body_not_an_html_page(client):
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["type"] == "not_found" and response.json()["code"] == "not_found"
    assert response["X-Request-ID"]
    page = client.get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
