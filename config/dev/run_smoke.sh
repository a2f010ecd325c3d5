#!/usr/bin/env bash
# `make run-smoke`: `make run` (config/dev/run.sh) started for real on a SQLite file of its own, used as a user
# would (create, run a minute, stop, settle, list, bill) and stopped as Ctrl-C stops it — beside anything else on
# this machine: its own Redis db (RUN_SMOKE_REDIS_URL, default db 7), ports, folders and deployment label.
# The work is config/dev/run_smoke.py's; it removes what it started, also when it fails or is stopped.
#
#   bash config/dev/run_smoke.sh [--keep] [--image-timeout SECONDS]
#
# Needs what `make run` needs (config/dev/services.sh: Redis, Docker, mmdebstrap for the catalog's images).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "run-smoke: FAILED at setup: $PY is missing (make run-smoke installs it)" >&2; exit 1; }
exec "$PY" config/dev/run_smoke.py "$@"
