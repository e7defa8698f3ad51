"""RankOps: a Python client for the RankOps MLOps platform's REST API.

import rankops
client = rankops.Client()          # RANKOPS_URL / RANKOPS_TOKEN, or `rankops login`
client.push("user_profile", frame) # a pandas DataFrame, sent as Parquet
"""

from rankops.errors import (
    ApiError,
    BadRequest,
    ConfigError,
    Conflict,
    Forbidden,
    JobFailed,
    NotFound,
    PayloadTooLarge,
    RankOpsError,
    RateLimited,
    ServerError,
    TimeoutExpired,
    TransportError,
    Unauthorized,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    # The client imports httpx; keep `rankops.operations`/`rankops.errors` importable without it.
    if name == "Client":
        from rankops.client import Client

        return Client
    raise AttributeError(name)


__all__ = [
    "ApiError",
    "BadRequest",
    "Client",
    "ConfigError",
    "Conflict",
    "Forbidden",
    "JobFailed",
    "NotFound",
    "PayloadTooLarge",
    "RankOpsError",
    "RateLimited",
    "ServerError",
    "TimeoutExpired",
    "TransportError",
    "Unauthorized",
]
