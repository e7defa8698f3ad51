"""Body-reference rows of the workspaces API: its writes name users (global) or nothing."""

WS = "/api/v1/workspaces/{ws}"

REFERENCES = []

NO_REFERENCES = {
    "PATCH " + WS + "/": "the workspace's own settings",
    "POST " + WS + "/members/": "a username (users are global) and a role",
    "PATCH " + WS + "/members/{username}/": "a role",
    "DELETE " + WS + "/members/{username}/": "no body",
    "POST " + WS + "/service-accounts/": "a new account's name and role",
    "POST " + WS + "/webhooks/": "an outbound URL",
    "DELETE " + WS + "/webhooks/{pk}/": "no body",
}
