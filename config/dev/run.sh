#!/usr/bin/env bash
# Start the whole platform on this machine: web (gunicorn workers for HTTP,
# daphne processes for WebSockets on the next port: config/websocket_server.py), the scheduler worker with beat, and
# one node agent with simulated GPUs. With REGISTRY set (e.g. 127.0.0.1:5000, and
# REGISTRY_USERNAME / REGISTRY_PASSWORD) images go through that registry, started
# here in var/registry unless one answers there already; without it (the default)
# images stay on this host's engine.
# Ctrl-C stops them all. Logs, the demo users' tokens and beat's schedule go under RUN_DIR (default var/;
# config/dev/run_smoke.sh points it elsewhere to run a second stack beside a developer's own).
set -euo pipefail
PY=.venv/bin/python
PORT=${PORT:-8000}
WS_PORT=${WS_PORT:-$((PORT + 1))}
RUN_DIR=${RUN_DIR:-var}
LOG_DIR=$RUN_DIR/log
export WEBSOCKET_URL=${WEBSOCKET_URL:-ws://127.0.0.1:$WS_PORT}
export GPU_BACKEND=${GPU_BACKEND:-auto} DEBUG=${DEBUG:-true}
# With simulated cards (no NVIDIA GPU here) the node offers the cores such cards come with, more than a small
# machine has, so that the demo can fill its cards; it says so in its first line (agent/actions.py).
export NODE_OVERCOMMIT_SIMULATED=${NODE_OVERCOMMIT_SIMULATED:-true}
mkdir -p "$LOG_DIR"

# A port something already listens on (a make run still going?) would stop the stack seconds after it started.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$PORT" "$WS_PORT"; do
  if listening "$port"; then
    echo "make run: port $port is in use (another make run?): stop what listens there, or start with PORT=<another port> make run (WebSockets take the next port)" >&2
    exit 1
  fi
done

# Commands typed in this checkout (manage.py shell, node drain, ...) run as this stack does: settings.py reads
# var/run.env where a command sets neither SECRET_KEY nor DEBUG. Written once the settings below are known.
write_run_env() {
  local file=$RUN_DIR/run.env name
  (umask 077 && : >"$file")
  for name in DEBUG SECRET_KEY DATABASE_URL REDIS_URL DEPLOYMENT_ID GPU_BACKEND WEBSOCKET_URL KEYS_DIR NODE_CPUS \
    NODE_OVERCOMMIT_SIMULATED \
    AGENT_STATE_DIR VOLUMES_DIR STATIC_ROOT RELAY_PORT LXCFS_DIR REGISTRY REGISTRY_USERNAME REGISTRY_PASSWORD \
    SHARED_FS_META SHARED_FS_BUCKET SHARED_FS_MOUNT SHARED_FS_CACHE_DIR; do
    [ -z "${!name+set}" ] || printf "%s='%s'\n" "$name" "${!name}" >>"$file"
  done
}

pids=()
cleanup() {
  trap - INT TERM EXIT; kill "${pids[@]}" ${builder:-} 2>/dev/null || true; wait 2>/dev/null || true
  # The agent's JuiceFS mount outlives it (running containers use it): let go of it unless one still does.
  local mnt=${SHARED_FS_MOUNT:-var/sharedfs/mnt}
  if mountpoint -q "$mnt" 2>/dev/null && ! .venv/bin/juicefs umount "$mnt" 2>/dev/null; then
    echo "$mnt stays mounted (instances still use it): .venv/bin/juicefs umount $mnt"
  fi
  echo "stopped"
}
trap cleanup INT TERM EXIT

registry_answers() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$REGISTRY/v2/")" != 000 ]; }
if [ -n "${REGISTRY:-}" ] && ! registry_answers; then
  bash config/dev/registry.sh write var/registry "$REGISTRY"
  bash config/dev/registry.sh serve var/registry >"$LOG_DIR/registry.log" 2>&1 & pids+=($!)
  for _ in $(seq 40); do registry_answers && break; sleep 0.25; done
  registry_answers || { echo "ERROR: the registry did not start; see $LOG_DIR/registry.log" >&2; exit 1; }
fi

# Shared file storage (/root/autodl-fs in every instance): an embedded JuiceFS volume (SQLite
# metadata, files under var/sharedfs/data) unless SHARED_FS_META points elsewhere; the node agent
# mounts it at var/sharedfs/mnt. Off, saying why, where FUSE or root is missing.
if [ -z "${SHARED_FS_META+set}" ]; then
  if [ -e /dev/fuse ] && [ "$(id -u)" = 0 ]; then
    export SHARED_FS_META="sqlite3://$PWD/var/sharedfs/meta.db"
  else
    why=$([ -e /dev/fuse ] && echo "mounting it needs root" || echo "this machine has no FUSE (/dev/fuse)")
    echo "note: shared storage (/root/autodl-fs) is off: $why" >&2
    export SHARED_FS_META=""
  fi
fi
mkdir -p var/sharedfs
write_run_env

# LXCFS (an instance's `free` and /proc/meminfo show its own limits: agent/hostview.py). A Debian
# host with systemd runs the lxcfs service; without one it is started here, detached like the JuiceFS mount
# (running instances keep reading it after Ctrl-C), unless it is mounted already or root or FUSE is missing.
LXCFS_DIR=${LXCFS_DIR:-/var/lib/lxcfs}
if ! mountpoint -q "$LXCFS_DIR" 2>/dev/null && command -v lxcfs >/dev/null && [ "$(id -u)" = 0 ] && [ -e /dev/fuse ]; then
  mkdir -p "$LXCFS_DIR"
  (setsid lxcfs "$LXCFS_DIR" >"$LOG_DIR/lxcfs.log" 2>&1 </dev/null &)
  for _ in $(seq 40); do mountpoint -q "$LXCFS_DIR" && break; sleep 0.25; done
  mountpoint -q "$LXCFS_DIR" || echo "note: LXCFS did not start ($LOG_DIR/lxcfs.log): in instances, free shows the host's memory" >&2
fi

$PY manage.py make_signing_keys
$PY manage.py migrate --no-input -v0
$PY manage.py load_demo >"$LOG_DIR/demo-users.txt"
[ -z "$SHARED_FS_META" ] || $PY manage.py sharedfs_format
# The catalog's images (agent/framework_images.py: Debian 12 + pinned wheels) build in the background, once:
# about 2 minutes for PyTorch the first time, cached after. Until an image is there the catalog shows it
# "building" and refuses work on it, naming the image field. Progress: $LOG_DIR/images.log.
# BUILD_IMAGES (catalog references, space-separated) builds only those; the rest stay "building".
only=()
for ref in ${BUILD_IMAGES:-}; do only+=(--only "$ref"); done
$PY manage.py build_images ${only[@]+"${only[@]}"} >"$LOG_DIR/images.log" 2>&1 &
builder=$!
$PY manage.py collectstatic --no-input -v0

PYTHONUNBUFFERED=1 $PY manage.py node_agent --name "${NODE_NAME:-local-node}" >"$LOG_DIR/node-agent.log" 2>&1 &
agent=$! pids+=($!)
.venv/bin/celery -A config worker -B -Q scheduler -n "scheduler@%h" --pool threads --concurrency 2 \
  -s "$RUN_DIR/celerybeat-schedule" >"$LOG_DIR/worker.log" 2>&1 & pids+=($!)
WEB_BIND=127.0.0.1:$PORT .venv/bin/gunicorn -c config/gunicorn.py config.wsgi:application >"$LOG_DIR/web.log" 2>&1 & pids+=($!)
# WebSockets: several daphne processes on one port (WS_PROCESSES, default: the cores, at most 4).
$PY -m config.websocket_server -b 127.0.0.1 -p "$WS_PORT" config.asgi:application >"$LOG_DIR/websocket.log" 2>&1 & pids+=($!)

for _ in $(seq 60); do curl -fs -o /dev/null "http://127.0.0.1:$PORT/login/" && break; sleep 0.5; done
# The URL once the node agent has registered its cards (its "shared storage:" line comes after), so that the
# first instance a newcomer creates finds them; an agent that stopped says why in its log.
for _ in $(seq 240); do
  grep -q "^shared storage:" "$LOG_DIR/node-agent.log" 2>/dev/null && break
  kill -0 "$agent" 2>/dev/null || { echo "ERROR: the node agent stopped: tail $LOG_DIR/node-agent.log" >&2; tail -5 "$LOG_DIR/node-agent.log" >&2; break; }
  sleep 0.5
done
grep -h "GPUs\|shared storage" "$LOG_DIR/node-agent.log" || echo "note: the node agent has not registered yet (see $LOG_DIR/node-agent.log)" >&2
images_at=${REGISTRY:-"this host's Docker engine (no registry: REGISTRY is not set)"}
cat <<MSG

  GPU cloud is running:  http://127.0.0.1:$PORT/
  sign in as  demo / demo-pass-123   (admin: admin / admin-pass-123, at /admin/)
  API docs:   http://127.0.0.1:$PORT/api/docs/   (tokens in $LOG_DIR/demo-users.txt)
  logs:       $LOG_DIR/{web,websocket,worker,node-agent}.log      Ctrl-C stops everything.
  images:     $images_at
              (built in the background on first run: tail -f $LOG_DIR/images.log)

MSG
wait -n "${pids[@]}"
echo "a process exited; see $LOG_DIR/ for why" >&2
