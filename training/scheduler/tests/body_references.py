"""Body-reference rows of the scheduler API: its writes name no other object."""

WS = "/api/v1/workspaces/{ws}/scheduler"

REFERENCES = []

NO_REFERENCES = {
    "POST " + WS + "/quotas/": "resource amounts only",
    "POST " + WS + "/quota-requests/": "the amounts asked for and a reason",
}
