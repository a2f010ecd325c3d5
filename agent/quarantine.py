"""Containers and disks of work the database does not know at all, held back before they are removed.

A leftover is usually just that (work released while this host's agent was down and its row since deleted), but a
database restored from a backup, or an agent pointed at another deployment's, makes a newer tenant's disk look the
same. So an unknown container is stopped, not removed, and an unknown one of either kind is removed only once it has
been unknown for ORPHAN_QUARANTINE_S (3 days by default), counted from when this host first saw it so; one the
database knows again meanwhile leaves the quarantine. When it first saw each is kept on the host's state disk
(``<AGENT_STATE_DIR>/<node>/quarantine.json``), so an agent restart does not reset the clock. Above a few unknown
(``reconcile.unknown_kept``) nothing is touched at all.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from django.conf import settings


class Quarantine:
    def __init__(self, node: str, state_dir: str | Path | None = None):
        self._path = Path(state_dir or settings.AGENT_STATE_DIR) / node / "quarantine.json"

    def _read(self) -> dict[str, float]:
        try:
            return {str(uid): float(at) for uid, at in json.loads(self._path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def hold(self, unknown: set[str], now: float | None = None) -> set[str]:
        """Record ``unknown`` (this pass's unknown uids; the rest leave the quarantine); returns those of them
        unknown for ORPHAN_QUARANTINE_S or longer: to remove now."""
        now = time.time() if now is None else now
        before = self._read()
        held = {uid: before.get(uid, now) for uid in unknown}
        if held != before:  # written only when it changes (most passes find nothing unknown)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._path.with_suffix(".tmp")
            temporary.write_text(json.dumps(held))
            os.replace(temporary, self._path)
        return {uid for uid, since in held.items() if now - since >= settings.ORPHAN_QUARANTINE_S}
