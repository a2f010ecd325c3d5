"""Code run on SQLite (``make run``'s database) from a suite that runs on PostgreSQL: a script in a
subprocess, on a fresh SQLite file, whose last line of output is JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def on_sqlite(script: str, folder: Path):
    """Run ``script`` (it sets Django up and migrates) on a SQLite file in ``folder``; its last line, parsed."""
    environment = {**os.environ, "DATABASE_URL": f"sqlite:///{folder / 'db.sqlite3'}"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
