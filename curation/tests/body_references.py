"""Body references of data building: the write routes name no other object in their bodies."""

from __future__ import annotations

WS = "/api/v1/workspaces/{ws}"

REFERENCES: list = []

NO_REFERENCES = {
    "POST " + WS + "/record-sets/": "a new record set's name and file",
    # the source is the record set in the URL; name is the output, created in this workspace
    "POST " + WS + "/record-sets/{pk}/pipeline/": "the output's name and the stages",
}
