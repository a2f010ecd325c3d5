"""Paths inside a container, read through Docker's archive stat: a symbolic link never leads out of its root.

Docker's archive API resolves symbolic links in every element of a path but
the last, inside the container's own filesystem. So ``/root/autodl-tmp/etc/passwd``
with ``etc -> /etc`` would quietly read the container's /etc. ``resolve`` walks
the path an element at a time below its root (one HEAD request each, no code
run in the container) and follows a link only when its target — which Docker
reports already resolved — stays in that root; otherwise the path is refused,
naming the field. A tenant who swaps a link between this walk and the transfer
still reaches nothing but his own container's files (Docker resolves within
the container); the walk is there for a clear answer, not as the boundary.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import docker
from docker.utils import decode_json_header

from core.errors import InvalidInput
from core.relay import within

# Go's os.FileMode bits, as Docker reports a path's mode.
MODE_DIR = 1 << 31
MODE_SYMLINK = 1 << 27
MODE_TYPE = MODE_DIR | MODE_SYMLINK | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)


@dataclass(frozen=True)
class PathStat:
    path: str  # with every link resolved
    size: int
    mode: int
    link: str = ""

    @property
    def is_dir(self) -> bool:
        return bool(self.mode & MODE_DIR)

    @property
    def is_file(self) -> bool:
        return not self.mode & MODE_TYPE


def path_stat(api: docker.APIClient, container: str, path: str) -> PathStat | None:
    """What Docker reports of ``path`` (the last element not followed); None if there is nothing there."""
    response = api.head(api._url("/containers/{0}/archive", container), params={"path": path})
    if response.status_code == 404:
        return None
    api._raise_for_status(response)
    stat = decode_json_header(response.headers["X-Docker-Container-Path-Stat"])
    link = stat.get("linkTarget", "") if stat["mode"] & MODE_SYMLINK else ""
    return PathStat(path, stat["size"], stat["mode"], link)


def resolve(api: docker.APIClient, container: str, path: str, root: str, *, field: str = "path") -> PathStat:
    """``path`` (normalized, under ``root``), its links followed while they stay in ``root``; InvalidInput if not."""
    here = path_stat(api, container, root)
    if here is None or not here.is_dir:
        raise InvalidInput(f"{root} is not there in this instance", field=field)
    asked = root
    for part in posixpath.relpath(path, root).split("/") if path != root else []:
        if not here.is_dir:
            raise InvalidInput(f"{asked} is not a folder", field=field)
        asked = posixpath.join(asked, part)
        here = path_stat(api, container, posixpath.join(here.path, part))
        if here is not None and here.link:
            if not within(here.link, root):
                raise InvalidInput(
                    f"{asked} is a symbolic link to {here.link}, outside {root}: it is not followed", field=field
                )
            here = path_stat(api, container, here.link)
        if here is None:
            raise InvalidInput(f"no such file or folder: {asked}", field=field)
    return here
