"""The NVIDIA Container Toolkit of a host with real cards: at least MINIMUM, or its node agent does not start.

Why 1.17.8. CVE-2025-23266 ("NVIDIAScape", CVSS 9.0): some of the hooks the toolkit runs to set up a
container ran with the container's environment, as root on the host, so an ``LD_PRELOAD`` in an image's
ENV loaded the image's own library into them: a container escape from one Dockerfile line.
CVE-2025-23267 (CVSS 8.5): the update-ldcache hook followed links planted in a crafted image. Both affect
every toolkit up to and including 1.17.7 and are fixed in 1.17.8 (NVIDIA security bulletin 5659; the CVE
records; upstream, v1.17.8 gives every hook an environment of its own instead of the container's, commit
d6f61079). A tenant's environment is refused those names at submission (``scheduler.envnames``), but an
image's ENV never passes through the portal: only a fixed toolkit stands against it.

How the version is read: ``<NVIDIA_CTK> --version`` (setting NVIDIA_CTK, default ``nvidia-ctk``). Each
binary of the toolkit prints its own first line (their sources at v1.17.8):

- ``nvidia-ctk``: ``NVIDIA Container Toolkit CLI version 1.17.8`` then ``commit: <sha>``
  (urfave/cli's version printer over internal/info);
- ``nvidia-container-runtime-hook``, also installed as ``nvidia-container-toolkit``:
  ``NVIDIA Container Runtime Hook version 1.17.8`` then ``commit: <sha>``;
- ``nvidia-container-runtime``: ``NVIDIA Container Runtime version 1.17.8``, ``commit:``, ``spec:``, then
  runc's own version lines;
- ``nvidia-container-cli`` (libnvidia-container): ``cli-version: 1.17.8``, ``lib-version: 1.17.8``, build lines.

The first such line counts, so NVIDIA_CTK may name any of them. A pre-release (``1.17.8-rc.1``; the
toolkit's Makefile joins a tag with "-", its packages with "~") comes before its release, as in semver.

Why the agent refuses to start rather than register and fail each launch: a registered node is placed
on, and every GPU launch there would fail some user's work; a node that does not come up is one the control
plane already handles (nothing is placed on it, its work is dealt with as a silent node's), and the reason
is in the agent's exit, at the host, in front of the operator who can upgrade the toolkit.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from django.conf import settings

from core.errors import ServiceError

MINIMUM = "1.17.8"
ADVISORY = "CVE-2025-23266, CVE-2025-23267"
VERSION_LINE = re.compile(r"^(?:.*\bversion|cli-version:)\s+v?(\d+)\.(\d+)\.(\d+)(\S*)", re.MULTILINE)


class ToolkitError(ServiceError):
    """This host's NVIDIA Container Toolkit is older than MINIMUM, or its version cannot be read."""


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int
    patch: int
    released: bool  # False for a pre-release (1.17.8-rc.1), which sorts before 1.17.8
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.text or f"{self.major}.{self.minor}.{self.patch}"


def version_parse(said: str) -> Version | None:
    """The version in a toolkit binary's ``--version`` output (None when it names none)."""
    found = VERSION_LINE.search(said)
    if found is None:
        return None
    major, minor, patch, tail = int(found[1]), int(found[2]), int(found[3]), found[4]
    text = f"{major}.{minor}.{patch}{tail}"
    return Version(major, minor, patch, released=not tail.startswith(("-", "~")), text=text)


NEEDED = version_parse(f"version {MINIMUM}")


def toolkit_require() -> Version:
    """The host's toolkit version, if at least MINIMUM; else ToolkitError saying what was found and what
    is needed. Call where the cards are real (NVML), before the node registers."""
    tool = settings.NVIDIA_CTK
    command = f"{tool} --version"
    try:
        result = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolkitError(_refusal(f"its version is unknown: `{command}` did not run ({exc})")) from exc
    said = (result.stdout + result.stderr).strip()
    found = version_parse(said) if result.returncode == 0 else None
    if found is None:
        first = (said.splitlines() or [f"exit status {result.returncode}"])[0][:160]
        raise ToolkitError(_refusal(f"its version is unknown: `{command}` said {first!r}"))
    if found < NEEDED:
        raise ToolkitError(_refusal(f"it is {found} (`{command}`)"))
    return found


def _refusal(what: str) -> str:
    return (
        f"the NVIDIA Container Toolkit on this host cannot run tenants' GPU work: {what}; at least {MINIMUM} "
        f"is needed ({ADVISORY}: an image's LD_PRELOAD reaches the toolkit's hooks as root on older ones). "
        "Upgrade the toolkit's packages (nvidia-container-toolkit, nvidia-container-toolkit-base, "
        "libnvidia-container-tools), or point NVIDIA_CTK at its nvidia-ctk, then start the agent again."
    )
