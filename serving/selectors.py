"""Serving's reads for the other apps: the routing table and how a unit is routed.

The names are serving's own (``serving.routing``); this module is where other apps take them
from (the public-surface contract in ``pyproject.toml``), so serving can move them freely.
"""

from __future__ import annotations

from serving.routing import BUCKETS as BUCKETS
from serving.routing import bucket as bucket
from serving.routing import route as route
from serving.routing import routing_table as routing_table
