"""Browser routes of the workspace shell."""

from django.urls import path

from workspaces import views

urlpatterns = [
    path("", views.home, name="home"),
    path("account/tokens/", views.tokens, name="tokens"),
    path("account/tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/read-all/", views.inbox_mark_all_read, name="inbox-read-all"),
    path("inbox/<int:notification_id>/read/", views.inbox_mark_read, name="inbox-read"),
    path("w/<slug:ws>/", views.dashboard, name="workspace-dashboard"),
    path("w/<slug:ws>/members/", views.members, name="workspace-members"),
    path("w/<slug:ws>/members/add/", views.member_grant, name="workspace-member-grant"),
    path(
        "w/<slug:ws>/members/<str:username>/role/",
        views.member_change,
        name="workspace-member-change",
    ),
    path(
        "w/<slug:ws>/members/<str:username>/remove/",
        views.member_remove,
        name="workspace-member-remove",
    ),
    path("w/<slug:ws>/activity/", views.activity, name="workspace-activity"),
]
