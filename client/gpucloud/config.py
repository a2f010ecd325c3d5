"""Where the CLI keeps its URL and API token: ``$XDG_CONFIG_HOME/gpucloud/config.toml`` (~/.config by default).

    default_profile = "default"

    [profiles.default]
    url = "https://gpu.example.com"
    token = "..."
    ws_url = ""        # where its WebSockets are, when not at the same address (the server says at login)

The file is written with mode 600 (it holds a token). GPUCLOUD_URL, GPUCLOUD_TOKEN and
GPUCLOUD_PROFILE (and GPUCLOUD_WS_URL) override it; ``--profile`` picks a profile.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from gpucloud.errors import ConfigError

DEFAULT_PROFILE = "default"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpucloud" / "config.toml"


@dataclass(frozen=True)
class Profile:
    name: str
    url: str
    token: str
    ws_url: str = ""


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, OSError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def profile_load(name: str | None = None) -> Profile:
    """The profile to use: ``name``, else GPUCLOUD_PROFILE, else the file's default; env vars override its fields."""
    data = _read(config_path())
    name = name or os.environ.get("GPUCLOUD_PROFILE") or data.get("default_profile") or DEFAULT_PROFILE
    saved = (data.get("profiles") or {}).get(name) or {}
    url = os.environ.get("GPUCLOUD_URL") or saved.get("url") or ""
    token = os.environ.get("GPUCLOUD_TOKEN") or saved.get("token") or ""
    if not url:
        raise ConfigError(f"no server URL for profile {name!r}: run `gpucloud login --url URL` or set GPUCLOUD_URL")
    ws_url = os.environ.get("GPUCLOUD_WS_URL") or saved.get("ws_url") or ""
    return Profile(name=name, url=url.rstrip("/"), token=token, ws_url=ws_url.rstrip("/"))


def profile_save(profile: Profile, *, make_default: bool = False) -> Path:
    """Write ``profile`` into the config file (mode 600), keeping the other profiles."""
    path = config_path()
    data = _read(path)
    profiles = dict(data.get("profiles") or {})
    profiles[profile.name] = {"url": profile.url, "token": profile.token, "ws_url": profile.ws_url}
    default = profile.name if make_default or not data.get("default_profile") else data["default_profile"]
    lines = [f"default_profile = {json.dumps(default)}", ""]
    for name, fields in sorted(profiles.items()):
        lines.append(f"[profiles.{json.dumps(name)}]")
        lines += [f"{key} = {json.dumps(str(value))}" for key, value in fields.items()]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write("\n".join(lines))
    os.chmod(path, 0o600)  # an older file may have had wider bits
    return path
