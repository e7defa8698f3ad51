"""Where the client finds its server and token.

In order: explicit arguments, then ``RANKOPS_URL`` / ``RANKOPS_TOKEN`` / ``RANKOPS_WORKSPACE``
(what a notebook server or CI job sets), then the profile file that ``rankops login`` writes
(``$RANKOPS_CONFIG`` or ``~/.config/rankops/profiles.json``; ``RANKOPS_PROFILE`` picks a profile,
``default`` otherwise).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rankops.errors import ConfigError


@dataclass(frozen=True)
class Settings:
    """A resolved configuration: server URL, API token, default workspace slug."""

    url: str
    token: str | None = None
    workspace: str | None = None


def profile_path() -> Path:
    """The profile file's path (``RANKOPS_CONFIG`` overrides the default)."""
    if os.environ.get("RANKOPS_CONFIG"):
        return Path(os.environ["RANKOPS_CONFIG"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "rankops" / "profiles.json"


def read_profiles() -> dict[str, dict[str, str]]:
    path = profile_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the profile file {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def write_profile(name: str, *, url: str, token: str, workspace: str | None = None) -> Path:
    """Save a profile (readable by the owner only, since it holds a token)."""
    path = profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    profiles = read_profiles()
    entry = {"url": url.rstrip("/"), "token": token}
    if workspace:
        entry["workspace"] = workspace
    profiles[name] = entry
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profiles, indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def resolve(
    url: str | None = None,
    token: str | None = None,
    workspace: str | None = None,
    profile: str | None = None,
) -> Settings:
    """The settings from arguments, the environment and the profile file, in that order."""
    name = profile or os.environ.get("RANKOPS_PROFILE") or "default"
    stored = read_profiles().get(name, {})
    if profile and not stored:
        raise ConfigError(f"no profile named {profile!r} in {profile_path()}")
    final_url = url or os.environ.get("RANKOPS_URL") or stored.get("url")
    if not final_url:
        raise ConfigError(
            "no server: set RANKOPS_URL (and RANKOPS_TOKEN) or run `rankops login URL`"
        )
    return Settings(
        url=final_url.rstrip("/"),
        token=token or os.environ.get("RANKOPS_TOKEN") or stored.get("token"),
        workspace=workspace or os.environ.get("RANKOPS_WORKSPACE") or stored.get("workspace"),
    )
