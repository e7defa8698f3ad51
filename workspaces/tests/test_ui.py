"""The browser UI shell through Django's test client: login, dashboard, members, tokens, activity.

Isolation in the UI works like the API: another workspace answers 404, exactly like a missing one.
"""

from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser

import pytest
from django.test import Client
from django.urls import reverse

from workspaces import services
from workspaces.events import Ref, event_record
from workspaces.models import ApiToken, Event, Membership, Role
from workspaces.testing.factories import TEST_PASSWORD, UserFactory, make_member, make_workspace

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
JS_LINK = "javascript:alert(2)"


class _SelectOptions(HTMLParser):
    """Collects (value, text) of the <option>s inside one <select id=...>."""

    def __init__(self, select_id: str) -> None:
        super().__init__()
        self.select_id = select_id
        self.inside = False
        self.current: str | None = None
        self.options: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "select" and attrs.get("id") == self.select_id:
            self.inside = True
        elif tag == "option" and self.inside:
            self.current = attrs.get("value", "")
            self.options.append((self.current, ""))

    def handle_endtag(self, tag):
        if tag == "select":
            self.inside = False
        if tag == "option":
            self.current = None

    def handle_data(self, data):
        if self.inside and self.current is not None:
            value, text = self.options[-1]
            self.options[-1] = (value, text + data)


def select_options(html: str, select_id: str) -> list[tuple[str, str]]:
    parser = _SelectOptions(select_id)
    parser.feed(html)
    return parser.options


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def dashboard_url(workspace) -> str:
    return reverse("workspace-dashboard", kwargs={"ws": workspace.slug})


def members_url(workspace) -> str:
    return reverse("workspace-members", kwargs={"ws": workspace.slug})


def activity_url(workspace) -> str:
    return reverse("workspace-activity", kwargs={"ws": workspace.slug})


def grant_url(workspace) -> str:
    return reverse("workspace-member-grant", kwargs={"ws": workspace.slug})


def change_url(workspace, user) -> str:
    return reverse(
        "workspace-member-change", kwargs={"ws": workspace.slug, "username": user.username}
    )


def remove_url(workspace, user) -> str:
    return reverse(
        "workspace-member-remove", kwargs={"ws": workspace.slug, "username": user.username}
    )


def membership_count() -> int:
    return Membership.objects.unscoped().count()


def event_count() -> int:
    return Event.objects.unscoped().count()


def events_with(workspace, verb: str) -> list[Event]:
    return list(Event.objects.for_workspace(workspace).filter(verb=verb).order_by("id"))


def without_csrf(response) -> str:
    """The page with its per-response CSRF token blanked, so two renders can be compared."""
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", response.content.decode())


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# Login and landing -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_login_page_renders_its_form():
    response = Client().get(reverse("login"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="username"' in html
    assert 'name="password"' in html
    assert 'role="alert"' not in html


@pytest.mark.django_db
def test_wrong_password_shows_the_error_and_logs_nobody_in():
    user = UserFactory()
    client = Client()
    response = client.post(reverse("login"), {"username": user.username, "password": "wrong"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'role="alert"' in html
    assert "didn't match" in html
    assert "_auth_user_id" not in client.session
    assert client.get(reverse("home")).status_code == 302


@pytest.mark.django_db
def test_login_lands_on_the_first_visible_workspace_dashboard():
    later = make_workspace(slug="zz-later")
    first = make_workspace(slug="aa-first")
    make_workspace(slug="a-not-mine")
    user = UserFactory()
    for workspace in (later, first):
        services.membership_grant(actor=None, workspace=workspace, user=user, role=Role.VIEWER)
    client = Client()
    response = client.post(
        reverse("login"), {"username": user.username, "password": TEST_PASSWORD}, follow=True
    )
    assert response.redirect_chain[-1] == (dashboard_url(first), 302)
    assert response.status_code == 200
    assert response.context["workspace"] == first


@pytest.mark.django_db
def test_user_without_workspace_sees_the_no_workspace_page():
    response = browser(UserFactory()).get(reverse("home"))
    assert response.status_code == 200
    assert "No workspace yet" in response.content.decode()


@pytest.mark.django_db
def test_anonymous_is_sent_to_login(workspace):
    client = Client()
    for url in (
        reverse("home"),
        dashboard_url(workspace),
        members_url(workspace),
        activity_url(workspace),
        reverse("tokens"),
    ):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"] == f"{reverse('login')}?next={url}", url


@pytest.mark.django_db
def test_anonymous_post_to_add_member_changes_nothing(workspace):
    target = UserFactory()
    before = (membership_count(), event_count())
    response = Client().post(grant_url(workspace), {"username": target.username, "role": "admin"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert (membership_count(), event_count()) == before


# Dashboard and switcher --------------------------------------------------------------------------


def test_dashboard_shows_every_section_and_the_quota(workspace, members):
    from training.scheduler.services import quota_set

    quota_set(actor=None, workspace=workspace, cpu_milli=12500, gpu_milli=2000)
    response = browser(members["viewer"]).get(dashboard_url(workspace))
    assert response.status_code == 200
    html = response.content.decode()
    for section in ("features", "jobs", "models", "experiments", "lineage", "activity", "quota"):
        assert f'data-section="{section}"' in html, section
    assert '<td data-testid="quota-cpu">0 of 12.5</td>' in html
    assert '<td data-testid="quota-gpu">0 of 2</td>' in html
    assert '<td data-testid="quota-memory">0 of unlimited</td>' in html
    assert "4 members" in html
    assert 'title="quota.changed">Quota changed<' in html
    assert '<strong data-testid="role">viewer</strong>' in html


def test_switcher_lists_exactly_the_users_workspaces(workspace, other_workspace):
    third = make_workspace(name="Not Yours")
    user = make_member(workspace, Role.VIEWER)
    services.membership_grant(actor=None, workspace=other_workspace, user=user, role=Role.DEVELOPER)
    response = browser(user).get(dashboard_url(other_workspace))
    assert response.status_code == 200
    options = select_options(response.content.decode(), "ws-switch")
    mine = sorted([workspace, other_workspace], key=lambda w: w.slug)
    assert [value for value, _text in options] == [dashboard_url(w) for w in mine]
    assert all(w.name in text for w, (_value, text) in zip(mine, options, strict=True))
    assert third.name not in response.content.decode()
    assert dashboard_url(third) not in response.content.decode()


def test_dashboard_and_activity_of_another_workspace_answer_404_like_a_missing_one(
    workspace, other_workspace, members
):
    client = browser(members["admin"])
    missing = client.get("/w/no-such-workspace/")
    assert missing.status_code == 404
    for url in (
        dashboard_url(other_workspace),
        members_url(other_workspace),
        activity_url(other_workspace),
    ):
        response = client.get(url)
        assert response.status_code == 404, url
        lookalike = client.get(url.replace(other_workspace.slug, "no-such-workspace"))
        assert lookalike.status_code == 404
        assert without_csrf(response) == without_csrf(lookalike), url
    assert other_workspace.name not in missing.content.decode()


def test_admin_of_one_workspace_cannot_change_members_of_another(
    workspace, other_workspace, members
):
    stranger = make_member(other_workspace, Role.VIEWER)
    client = browser(members["admin"])
    before = (membership_count(), event_count())
    responses = [
        client.post(
            grant_url(other_workspace), {"username": members["outsider"].username, "role": "admin"}
        ),
        client.post(change_url(other_workspace, stranger), {"role": "admin"}),
        client.post(remove_url(other_workspace, stranger)),
    ]
    assert [r.status_code for r in responses] == [404, 404, 404]
    assert (membership_count(), event_count()) == before
    assert Membership.objects.for_workspace(other_workspace).get(user=stranger).role == "viewer"


# Members -----------------------------------------------------------------------------------------


def test_viewer_sees_members_without_admin_forms(workspace, members):
    response = browser(members["viewer"]).get(members_url(workspace))
    assert response.status_code == 200
    html = response.content.decode()
    for role in Role.values:
        assert f'data-username="{members[role].username}"' in html
    assert members["outsider"].username not in html
    assert grant_url(workspace) not in html
    assert remove_url(workspace, members["developer"]) not in html
    assert change_url(workspace, members["developer"]) not in html
    assert 'name="role"' not in html


def test_viewer_gets_403_on_every_member_change(workspace, members):
    client = browser(members["viewer"])
    before = (membership_count(), event_count())
    responses = [
        client.post(
            grant_url(workspace), {"username": members["outsider"].username, "role": "viewer"}
        ),
        client.post(change_url(workspace, members["developer"]), {"role": "admin"}),
        client.post(remove_url(workspace, members["developer"])),
    ]
    assert [r.status_code for r in responses] == [403, 403, 403]
    assert "Not allowed" in responses[0].content.decode()
    assert (membership_count(), event_count()) == before
    assert not Membership.objects.for_workspace(workspace).filter(user=members["outsider"]).exists()


def test_maintainer_is_not_a_workspace_admin(workspace, members):
    client = browser(members["maintainer"])
    response = client.post(
        grant_url(workspace), {"username": members["outsider"].username, "role": "viewer"}
    )
    assert response.status_code == 403
    assert not Membership.objects.for_workspace(workspace).filter(user=members["outsider"]).exists()


def test_get_on_a_member_form_action_is_not_allowed(workspace, members):
    assert browser(members["admin"]).get(grant_url(workspace)).status_code == 405


def test_admin_adds_a_member_through_the_form(workspace, members):
    admin, newcomer = members["admin"], members["outsider"]
    client = browser(admin)
    assert grant_url(workspace) in client.get(members_url(workspace)).content.decode()
    response = client.post(
        grant_url(workspace), {"username": newcomer.username, "role": "developer"}, follow=True
    )
    assert response.redirect_chain == [(members_url(workspace), 302)]
    assert f"{newcomer.username} is now developer." in messages_of(response)
    assert f'data-username="{newcomer.username}"' in response.content.decode()
    membership = Membership.objects.for_workspace(workspace).get(user=newcomer)
    assert (membership.role, membership.granted_by) == ("developer", admin)
    [event] = [e for e in events_with(workspace, "membership.granted") if e.actor == admin]
    assert event.payload == {"user": newcomer.username, "role": "developer", "previous_role": None}
    # The new member now sees the workspace.
    assert browser(newcomer).get(dashboard_url(workspace)).status_code == 200


def test_admin_adding_an_unknown_user_changes_nothing(workspace, members):
    client = browser(members["admin"])
    before = (membership_count(), event_count())
    response = client.post(
        grant_url(workspace), {"username": "nobody-here", "role": "viewer"}, follow=True
    )
    assert response.status_code == 200
    assert "No active user 'nobody-here'." in messages_of(response)
    assert (membership_count(), event_count()) == before


def test_admin_changes_a_role_through_the_form(workspace, members):
    admin, developer = members["admin"], members["developer"]
    response = browser(admin).post(
        change_url(workspace, developer), {"role": "maintainer"}, follow=True
    )
    assert response.status_code == 200
    assert f"{developer.username} is now maintainer." in messages_of(response)
    assert Membership.objects.for_workspace(workspace).get(user=developer).role == "maintainer"
    [event] = events_with(workspace, "membership.changed")
    assert event.actor == admin
    assert event.payload == {
        "user": developer.username,
        "role": "maintainer",
        "previous_role": "developer",
    }
    assert developer.has_perm("workspaces.release_in_workspace", workspace)


def test_admin_removes_a_member_through_the_form(workspace, members):
    admin, developer = members["admin"], members["developer"]
    response = browser(admin).post(remove_url(workspace, developer), follow=True)
    assert response.status_code == 200
    assert f"{developer.username} was removed." in messages_of(response)
    assert f'data-username="{developer.username}"' not in response.content.decode()
    assert not Membership.objects.for_workspace(workspace).filter(user=developer).exists()
    [event] = events_with(workspace, "membership.revoked")
    assert event.actor == admin
    assert event.payload == {"user": developer.username, "previous_role": "developer"}
    # Removed means gone: the workspace now answers 404 to them.
    assert browser(developer).get(dashboard_url(workspace)).status_code == 404


def test_removing_the_last_admin_shows_an_error_and_changes_nothing(workspace, members):
    admin = members["admin"]
    before = (membership_count(), event_count())
    response = browser(admin).post(remove_url(workspace, admin), follow=True)
    assert response.status_code == 200
    errors = [m for m in response.context["messages"] if m.level_tag == "error"]
    assert [str(m) for m in errors] == [
        f"'{admin.username}' is the last admin of '{workspace.slug}'"
    ]
    assert Membership.objects.for_workspace(workspace).get(user=admin).role == "admin"
    assert (membership_count(), event_count()) == before
    assert events_with(workspace, "membership.revoked") == []


def test_removing_a_member_of_another_workspace_by_name_is_404(workspace, other_workspace, members):
    stranger = make_member(other_workspace, Role.VIEWER)
    response = browser(members["admin"]).post(remove_url(workspace, stranger))
    assert response.status_code == 404
    assert Membership.objects.for_workspace(other_workspace).filter(user=stranger).exists()


# Tokens ------------------------------------------------------------------------------------------


def test_token_page_creates_a_token_shown_once_and_stores_only_its_hash(workspace, members):
    user = members["developer"]
    client = browser(user)
    response = client.post(reverse("tokens"), {"name": "ci script", "workspaces": [workspace.slug]})
    assert response.status_code == 200
    match = re.search(r'<pre class="key">([^<]+)</pre>', response.content.decode())
    assert match, "the new key is not shown"
    key = match.group(1)
    assert key.startswith(ApiToken.KEY_PREFIX)
    token = ApiToken.objects.get(user=user)
    assert token.name == "ci script"
    assert token.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in (token.key_hash, token.prefix, token.name)
    assert list(token.workspaces.all()) == [workspace]
    assert len(events_with(workspace, "token.created")) == 1
    # Shown once: the next visit lists the token by prefix only.
    again = client.get(reverse("tokens")).content.decode()
    assert key not in again
    assert f"{token.prefix}…" in again


def test_token_create_cannot_scope_a_workspace_the_user_is_not_in(
    workspace, other_workspace, members
):
    user = members["developer"]
    response = browser(user).post(
        reverse("tokens"), {"name": "sneaky", "workspaces": [other_workspace.slug]}
    )
    assert response.status_code == 200
    assert 'class="key"' not in response.content.decode()
    assert not ApiToken.objects.filter(user=user).exists()


def test_token_page_revokes_a_token_and_only_the_owner_can(workspace, members):
    owner = members["developer"]
    token, _key = services.api_token_create(
        actor=owner, user=owner, name="old", workspaces=[workspace]
    )
    revoke = reverse("token-revoke", kwargs={"token_id": token.pk})
    assert browser(members["admin"]).post(revoke).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None

    response = browser(owner).post(revoke, follow=True)
    assert response.redirect_chain == [(reverse("tokens"), 302)]
    assert f"Token {token.prefix}… was revoked." in messages_of(response)
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert "revoked or expired" in response.content.decode()
    [event] = events_with(workspace, "token.revoked")
    assert event.actor == owner


# Activity ----------------------------------------------------------------------------------------


def test_activity_filters_by_verb_prefix_and_paginates(workspace):
    admin = make_member(workspace, Role.ADMIN)
    for _ in range(51):
        make_member(workspace, Role.VIEWER)
    client = browser(admin)
    url = activity_url(workspace)

    # 52 membership.granted + 1 workspace.created; 50 a page, newest first.
    first = client.get(url, {"verb": "membership."}).content.decode()
    assert first.count('title="membership.granted"') == 50
    assert 'title="workspace.created"' not in first
    assert "Page 1 of 2" in first
    assert "?page=2&amp;verb=membership." in first

    second = client.get(url, {"verb": "membership.", "page": 2}).content.decode()
    assert second.count('title="membership.granted"') == 2
    assert "Page 2 of 2" in second
    assert 'title="workspace.created"' not in second

    everything = client.get(url, {"page": 2}).content.decode()
    assert everything.count('title="membership.granted"') == 2
    assert 'title="workspace.created"' in everything

    only_created = client.get(url, {"verb": "workspace."}).content.decode()
    assert only_created.count('title="workspace.created"') == 1
    assert 'title="membership.granted"' not in only_created
    assert "Page 1 of 1" in only_created


def test_activity_shows_only_its_own_workspace_events(workspace, other_workspace, members):
    make_member(other_workspace, Role.VIEWER, username="only-in-other")
    html = browser(members["viewer"]).get(activity_url(workspace)).content.decode()
    assert members["viewer"].username in html
    assert "only-in-other" not in html


# Stored markup -----------------------------------------------------------------------------------


def test_stored_markup_is_escaped_on_dashboard_and_activity(workspace, members):
    services.workspace_update(
        actor=None,
        workspace=workspace,
        name=f"Feed {XSS}",
        description=f'{XSS} <a href="{JS_LINK}">click</a>',
    )
    # Usernames are validated in every product path; this one is forced in to test the output.
    shady = make_member(workspace, Role.VIEWER, username=XSS)
    services.membership_grant(
        actor=shady, workspace=workspace, user=members["developer"], role=Role.MAINTAINER
    )
    event_record(
        actor=None,
        workspace=workspace,
        verb="test.marked",
        refs=[Ref(kind="feature_group", object_id=1, label=f"{XSS}{JS_LINK}")],
    )
    client = browser(members["viewer"])
    for url in (dashboard_url(workspace), activity_url(workspace)):
        html = client.get(url).content.decode()
        assert XSS not in html, url
        assert XSS_ESCAPED in html, url
        assert 'href="javascript:' not in html, url
    dashboard = client.get(dashboard_url(workspace)).content.decode()
    # Description, name (title, switcher, side nav, heading), ref labels and actor name.
    assert dashboard.count(XSS_ESCAPED) >= 5
    assert "&lt;a href=&quot;javascript:alert(2)&quot;&gt;click&lt;/a&gt;" in dashboard


def test_member_names_with_markup_are_escaped_on_the_members_page(workspace, members):
    label = "<img src=x onerror=alert(1)>"
    make_member(workspace, Role.VIEWER, username=label)
    html = browser(members["admin"]).get(members_url(workspace)).content.decode()
    assert label not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


# Query counts ------------------------------------------------------------------------------------


def test_dashboard_query_count_does_not_grow_with_members_and_events(
    workspace, members, django_assert_max_num_queries
):
    for number in range(30):
        make_member(workspace, Role.VIEWER)
        services.quota_set(actor=None, workspace=workspace, cpu_milli=8000 + number)
    client = browser(members["viewer"])
    # Session, user, workspace and permissions (6), the events with their refs (2), members (1),
    # and a fixed few per card: features 1, jobs 2, models 3, experiments 1, lineage 1, quota 3
    # (its rows, the holding jobs and the stored bytes).
    with django_assert_max_num_queries(21):
        response = client.get(dashboard_url(workspace))
    assert response.status_code == 200
    # The ten newest events, each with its refs from the one prefetch.
    html = response.content.decode()
    assert html.count("<time datetime=") == 10
    assert html.count('<span class="ref">') == 15


def test_members_page_query_count_does_not_grow_with_members(
    workspace, members, django_assert_max_num_queries
):
    admin = members["admin"]
    for _ in range(30):
        services.membership_grant(
            actor=admin, workspace=workspace, user=UserFactory(), role=Role.VIEWER
        )
    services.service_account_create(actor=admin, workspace=workspace, username="producer-bot")
    client = browser(admin)
    with django_assert_max_num_queries(8):
        response = client.get(members_url(workspace))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("data-username=") == 35
    # 31 "granted by" cells (30 viewers and the service account) and the admin's own name cell.
    assert html.count(f"<td>{admin.username}</td>") == 32
    assert html.count("service account</span>") == 1
