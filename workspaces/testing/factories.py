"""factory_boy factories and helpers for tests in every app.

Workspaces and memberships are made through the services, so tests exercise the same code path
(guardian permissions, quota rows, events) as the product.
"""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from workspaces import services
from workspaces.models import PredictionType, Role, Workspace

User = get_user_model()
TEST_PASSWORD = "correct-horse-battery"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", TEST_PASSWORD)

    @factory.post_generation
    def _save(self, create, extracted, **kwargs):
        if create:
            self.save()


_workspace_counter = iter(range(1, 1_000_000))


def make_workspace(*, slug: str | None = None, scene: str | None = None, **extra) -> Workspace:
    number = next(_workspace_counter)
    return services.workspace_create(
        actor=None,
        slug=slug or f"ws-{number}",
        name=extra.pop("name", f"Workspace {number}"),
        scene=scene or f"scene-{number}",
        prediction_type=extra.pop("prediction_type", PredictionType.PCTR),
        **extra,
    )


def make_member(workspace: Workspace, role: str = Role.DEVELOPER, **user_fields):
    user = UserFactory(**user_fields)
    services.membership_grant(actor=None, workspace=workspace, user=user, role=role)
    return user


def token_for(user, *, workspaces: list[Workspace] | None = None) -> str:
    _token, key = services.api_token_create(
        actor=None, user=user, name="test", workspaces=workspaces or []
    )
    return key
