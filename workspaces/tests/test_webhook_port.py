"""A webhook URL with port 0 is refused (it used to fall back silently to the scheme's port)."""

from __future__ import annotations

import socket

import pytest
from django.core.exceptions import ValidationError

from workspaces.models import Role, WebhookEndpoint
from workspaces.notifications import webhook_url_validate


def _public_resolver(host, port, *args, **kwargs):
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]


@pytest.mark.parametrize("url", ["https://hooks.example.com:0/x", "http://hooks.example.com:00/"])
def test_port_zero_is_refused(url, monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _public_resolver)
    with pytest.raises(ValidationError, match="port 0"):
        webhook_url_validate(url)


def test_an_explicit_port_is_kept(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _public_resolver)
    assert webhook_url_validate("https://hooks.example.com:8443/x").port == 8443


@pytest.mark.django_db
def test_the_api_answers_400_naming_url_for_port_zero(workspace, members, client_for, monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _public_resolver)
    client = client_for(members[Role.ADMIN])
    response = client.post(
        f"/api/v1/workspaces/{workspace.slug}/webhooks/", {"url": "https://hooks.example.com:0/"}
    )
    assert response.status_code == 400, response.content
    assert response.json()["attr"] == "url"
    assert not WebhookEndpoint.objects.for_workspace(workspace).exists()
