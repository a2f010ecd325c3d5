#!/usr/bin/env bash
# Make sure the services the platform needs are installed and running on this
# machine: Redis, the Docker engine (+ busybox for the local base image), the image
# registry's server (installed; started by whoever uses it), and PostgreSQL when
# DATABASE_URL points at it. Installs Debian packages when missing (as root);
# otherwise stops with one sentence saying what to do.
set -euo pipefail

need_pkg() {  # need_pkg <command> <debian package>
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "ERROR: $1 is missing: install the Debian package '$2' (apt-get install $2) and run this again." >&2
    exit 1
  fi
  echo "installing $2 ..."
  [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq; APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

wait_for() {  # wait_for <seconds> <what> <command...>
  local seconds=$1 what=$2; shift 2
  for _ in $(seq "$((seconds * 4))"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  echo "ERROR: $what did not come up within ${seconds}s; see the log named above." >&2
  exit 1
}

mkdir -p var/log

# Redis: broker, channel layer.
need_pkg redis-server redis-server
need_pkg redis-cli redis-tools
if ! redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then
  echo "starting redis-server (log var/log/redis.log) ..."
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --logfile "$PWD/var/log/redis.log"
  wait_for 15 "redis-server" redis-cli -h 127.0.0.1 ping
fi

# Docker engine: no bridge and no iptables here (see README: instances run with network none), and
# --live-restore: the engine's restart leaves running containers running (Docker's "Live restore"), as
# on a production GPU host. An engine already running is left as it is (other work uses it).
need_pkg dockerd docker.io
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || need_pkg busybox-static busybox-static
need_pkg mmdebstrap mmdebstrap  # the catalog's images (agent/framework_images.py) and the tests' PyTorch image
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "ERROR: the Docker engine is not running and only root can start it: run 'sudo dockerd --bridge=none --iptables=false --live-restore &'." >&2
    exit 1
  fi
  # A dockerd killed uncleanly leaves pid files that stop the next one from starting.
  for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
    if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then rm -f "$pidfile"; fi
  done
  echo "starting dockerd (log var/log/dockerd.log) ..."
  nohup dockerd --bridge=none --iptables=false --live-restore >var/log/dockerd.log 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 240); do
    docker info >/dev/null 2>&1 && break
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
      echo "ERROR: dockerd exited while starting: $(tail -1 var/log/dockerd.log)" >&2
      exit 1
    fi
    sleep 0.25
  done
  wait_for 5 "dockerd" docker info
fi

# The image registry (Debian's docker-registry; htpasswd from apache2-utils writes its users): the
# tests start one, `make run` does when REGISTRY is set, config/dev/registry.sh configures it.
need_pkg docker-registry docker-registry
need_pkg htpasswd apache2-utils
# LXCFS (a container's own /proc/meminfo, cpuinfo: agent/hostview.py; the tests run their own) and
# btrfs (each several-host test host's Docker data root, so a system disk has a size: config/dev/cluster.sh).
need_pkg lxcfs lxcfs
need_pkg mkfs.btrfs btrfs-progs

# Chromium for the browser tests (Debian's; no browser download is possible); faketime for the fault
# tests' node agent whose clock is off (tests/faults).
if [ -n "${WITH_BROWSER:-}" ]; then
  need_pkg faketime faketime
  need_pkg chromium chromium
  # A Chinese font, so the zh-hans pages render (and their screenshots show) text, not boxes.
  [ -e /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] || {
    command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] && echo "installing fonts-wqy-microhei ..." &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-wqy-microhei >/dev/null ||
      echo "note: no Chinese font (apt-get install fonts-wqy-microhei): Chinese screenshots show boxes" >&2
  }
fi

# PostgreSQL, only when the database URL asks for it.
if [[ "${DATABASE_URL:-}" == postgres* ]]; then
  need_pkg psql postgresql
  if ! pg_isready -h 127.0.0.1 -q 2>/dev/null; then
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
    if [ -z "$version" ]; then
      echo "ERROR: PostgreSQL is installed but has no cluster: run 'pg_createcluster <version> main' and run this again." >&2
      exit 1
    fi
    echo "starting PostgreSQL $version ..."
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    wait_for 30 "PostgreSQL" pg_isready -h 127.0.0.1 -q
  fi
fi
echo "services ready: redis, docker$([[ "${DATABASE_URL:-}" == postgres* ]] && echo ', postgresql')"
