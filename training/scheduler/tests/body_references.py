"""Body-reference rows of the scheduler API: its only write names no other object."""

WS = "/api/v1/workspaces/{ws}/scheduler"

REFERENCES = []

NO_REFERENCES = {"POST " + WS + "/quotas/": "resource amounts only"}
