"""Permission-matrix rows for the workspaces app's API routes."""

from __future__ import annotations

from workspaces.models import Role
from workspaces.services import api_token_create
from workspaces.testing.factories import TEST_PASSWORD
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"


def _credentials(ctx: MatrixContext) -> dict:
    user = ctx.new_user()
    return {"username": user.username, "password": TEST_PASSWORD}


def _own_token(ctx: MatrixContext) -> dict:
    owner = ctx.actor or ctx.new_user()
    token, _key = api_token_create(actor=None, user=owner, name="matrix")
    return {"pk": token.pk}


def _member(ctx: MatrixContext) -> dict:
    return {"username": ctx.new_member(Role.VIEWER).username}


def _new_member_body(ctx: MatrixContext) -> dict:
    return {"username": ctx.new_user().username, "role": Role.DEVELOPER}


_accounts = iter(range(1, 1_000_000))

ENDPOINTS = [
    Endpoint("POST", "/api/v1/auth/token/", public=True, success=201, body=_credentials),
    Endpoint("GET", "/api/v1/auth/tokens/", role=None),
    Endpoint(
        "POST", "/api/v1/auth/tokens/", role=None, success=201, body=lambda ctx: {"name": "ci"}
    ),
    Endpoint("DELETE", "/api/v1/auth/tokens/{pk}/", role=None, success=204, setup=_own_token),
    Endpoint("GET", "/api/v1/workspaces/", role=None),
    Endpoint("GET", WS + "/", role=Role.VIEWER),
    Endpoint(
        "PATCH",
        WS + "/",
        role=Role.ADMIN,
        body=lambda ctx: {"description": "Ads in the feed, <b>bold</b> claims escaped."},
    ),
    Endpoint("GET", WS + "/members/", role=Role.VIEWER),
    Endpoint("POST", WS + "/members/", role=Role.ADMIN, success=201, body=_new_member_body),
    Endpoint("GET", WS + "/members/{username}/", role=Role.VIEWER, setup=_member, has_object=True),
    Endpoint(
        "PATCH",
        WS + "/members/{username}/",
        role=Role.ADMIN,
        setup=_member,
        has_object=True,
        body=lambda ctx: {"role": Role.MAINTAINER},
    ),
    Endpoint(
        "DELETE",
        WS + "/members/{username}/",
        role=Role.ADMIN,
        success=204,
        setup=_member,
        has_object=True,
    ),
    Endpoint("GET", WS + "/activity/", role=Role.VIEWER),
    Endpoint("GET", WS + "/service-accounts/", role=Role.ADMIN),
    Endpoint(
        "POST",
        WS + "/service-accounts/",
        role=Role.ADMIN,
        success=201,
        body=lambda ctx: {"username": f"producer-{next(_accounts)}", "role": Role.DEVELOPER},
    ),
]


# --- notifications: webhooks of a workspace (admins) and each user's own inbox -----------------

PUBLIC_HOOK = "https://93.184.216.34/rankops-hook"  # a literal public address: no DNS needed


def _webhook(ctx: MatrixContext) -> dict:
    from workspaces.notifications import webhook_create

    webhook, _secret = webhook_create(actor=None, workspace=ctx.workspace, url=PUBLIC_HOOK)
    return {"pk": webhook.pk}


def _own_notification(ctx: MatrixContext) -> dict:
    from workspaces.models import Notification

    owner = ctx.actor or ctx.new_user()
    notification = Notification.objects.create(
        workspace=ctx.workspace, recipient=owner, verb="matrix.test", title="Matrix"
    )
    return {"pk": notification.pk}


ENDPOINTS += [
    Endpoint("GET", WS + "/webhooks/", role=Role.ADMIN),
    Endpoint(
        "POST",
        WS + "/webhooks/",
        role=Role.ADMIN,
        success=201,
        body=lambda ctx: {"url": PUBLIC_HOOK},
    ),
    Endpoint(
        "DELETE",
        WS + "/webhooks/{pk}/",
        role=Role.ADMIN,
        success=204,
        setup=_webhook,
        has_object=True,
    ),
    Endpoint(
        "GET",
        WS + "/webhooks/{pk}/deliveries/",
        role=Role.ADMIN,
        setup=_webhook,
        has_object=True,
    ),
    Endpoint("GET", "/api/v1/notifications/", role=None),
    Endpoint("POST", "/api/v1/notifications/{pk}/read/", role=None, setup=_own_notification),
    Endpoint("POST", "/api/v1/notifications/read-all/", role=None, setup=_own_notification),
]
