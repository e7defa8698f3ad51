"""Idempotency-Key on the API's writes (workspaces.idempotency): a retried write gets the first
answer and nothing is written twice; the key with another request, or while the first still
runs, is a 409 naming the header; keys are the caller's own."""

from __future__ import annotations

import hashlib

import pytest

from features.models import FeatureGroup
from workspaces.models import IdempotentRequest, Role
from workspaces.testing.factories import make_member, token_for

pytestmark = pytest.mark.django_db


def group_body(name: str) -> dict:
    return {
        "name": name,
        "entity": "user",
        "entity_keys": ["user_id"],
        "features": [{"name": "age", "dtype": "int"}],
    }


def test_a_retried_write_gets_the_first_answer_and_writes_once(workspace, client_for):
    member = make_member(workspace, Role.DEVELOPER)
    client = client_for(member)
    url = f"/api/v1/workspaces/{workspace.slug}/feature-groups/"
    first = client.post(url, group_body("g1"), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201, first.content
    again = client.post(url, group_body("g1"), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.status_code == 201 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert FeatureGroup.objects.for_workspace(workspace).filter(name="g1").count() == 1
    # Without the key the same write is a write: the name is taken now.
    assert client.post(url, group_body("g1"), format="json").status_code == 409

    # The key with another request: 409 naming the header, nothing written.
    other = client.post(url, group_body("g2"), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 409 and other.json()["attr"] == "Idempotency-Key"
    assert "another request" in other.json()["detail"]
    assert not FeatureGroup.objects.for_workspace(workspace).filter(name="g2").exists()

    # A refusal is an answer too: replayed, not run again.
    bad = client.post(url, {"name": "Bad Name"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert bad.status_code == 400
    assert (
        client.post(url, {"name": "Bad Name"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2").json()
        == bad.json()
    )


def test_keys_are_the_caller_s_own_and_a_running_one_is_a_conflict(workspace, client_for):
    url = f"/api/v1/workspaces/{workspace.slug}/feature-groups/"
    alice = client_for(make_member(workspace, Role.DEVELOPER))
    bob = client_for(make_member(workspace, Role.DEVELOPER))
    assert (
        alice.post(url, group_body("a1"), format="json", HTTP_IDEMPOTENCY_KEY="same").status_code
        == 201
    )
    # Bob's "same" is his own key: his write runs (and is refused on its own merits).
    assert (
        bob.post(url, group_body("b1"), format="json", HTTP_IDEMPOTENCY_KEY="same").status_code
        == 201
    )
    assert FeatureGroup.objects.for_workspace(workspace).filter(name__in=["a1", "b1"]).count() == 2

    # A first request still running holds its key.
    carol = make_member(workspace, Role.DEVELOPER)
    key = token_for(carol)
    row = IdempotentRequest.objects.create(
        principal=hashlib.sha256(f"auth:Token {key}".encode()).hexdigest(),
        key="busy", method="POST", path=url, body_sha256="x",
    )  # fmt: skip
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    running = client.post(url, group_body("c1"), format="json", HTTP_IDEMPOTENCY_KEY="busy")
    assert running.status_code == 409 and running.json()["attr"] == "Idempotency-Key"
    assert "still running" in running.json()["detail"]
    row.delete()
    too_long = client.post(url, group_body("c1"), format="json", HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert too_long.status_code == 400 and too_long.json()["attr"] == "Idempotency-Key"
    # Reads and keyless writes are untouched.
    assert client.get(url, HTTP_IDEMPOTENCY_KEY="read").status_code == 200
    assert not IdempotentRequest.objects.filter(key="read").exists()


def test_kept_answers_past_the_ttl_are_forgotten(settings):
    from datetime import timedelta

    from django.utils import timezone

    from workspaces.tasks import idempotency_sweep

    old = IdempotentRequest.objects.create(
        principal="p", key="old", method="POST", path="/api/v1/x/", body_sha256="x",
        created_at=timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_TTL_S + 5),
    )  # fmt: skip
    fresh = IdempotentRequest.objects.create(
        principal="p", key="new", method="POST", path="/api/v1/x/", body_sha256="x"
    )
    assert idempotency_sweep() == 1
    assert not IdempotentRequest.objects.filter(pk=old.pk).exists()
    assert IdempotentRequest.objects.filter(pk=fresh.pk).exists()


def test_a_key_past_the_ttl_runs_again_before_the_sweep(workspace, client_for, settings):
    from datetime import timedelta

    from django.utils import timezone

    member = make_member(workspace, Role.DEVELOPER)
    client = client_for(member)
    url = f"/api/v1/workspaces/{workspace.slug}/feature-groups/"
    first = client.post(url, group_body("g1"), format="json", HTTP_IDEMPOTENCY_KEY="k-old")
    assert first.status_code == 201
    row = IdempotentRequest.objects.get(key="k-old")
    IdempotentRequest.objects.filter(pk=row.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_TTL_S + 5)
    )
    # The expired answer is not replayed: another request under the key runs and is kept.
    second = client.post(url, group_body("g2"), format="json", HTTP_IDEMPOTENCY_KEY="k-old")
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    assert FeatureGroup.objects.for_workspace(workspace).filter(name="g2").count() == 1
    kept = IdempotentRequest.objects.get(key="k-old")
    assert kept.pk != row.pk and kept.done and kept.status == 201
