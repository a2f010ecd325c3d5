#!/usr/bin/env bash
# A Docker engine of its own for bringing the production stack up on this machine ("the production
# server"): a network namespace, a veth to it from here, and dockerd inside with Docker's own bridge
# and iptables on, as a real server runs it. The shared root engine is never touched.
#
#   config/prod/engine.sh start   # idempotent; prints the DOCKER_HOST to use
#   config/prod/engine.sh stop    # stops dockerd, removes the namespace and the veth
#
# The data-root (images, build cache, volumes) lives under PROD_CACHE (var/prodstack/) so a second
# bring-up reuses the images the first one built. Addresses from PROD_NET (a /16 of its own).
set -euo pipefail
cd "$(dirname "$0")/../.."
NS=${PROD_NETNS:-gpprod}
NET=${PROD_NET:-10.250}                        # 10.250.0.0/16: this engine's ranges
CACHE=${PROD_CACHE:-$PWD/var/prodstack}
RUN=/run/$NS                                   # short paths: unix sockets have a length limit
HOST_SIDE=${NS}0 NS_SIDE=${NS}1
SOCK=$RUN/docker.sock

running() { [ -S "$SOCK" ] && docker -H "unix://$SOCK" version >/dev/null 2>&1; }

start() {
  command -v dockerd >/dev/null || { echo "ERROR: dockerd is missing: apt-get install docker.io" >&2; exit 1; }
  if running; then echo "unix://$SOCK"; return; fi
  mkdir -p "$RUN" "$CACHE/docker" "$CACHE/log"
  [ -e "/var/run/netns/$NS" ] || ip netns add "$NS"
  if ! ip link show "$HOST_SIDE" >/dev/null 2>&1; then
    ip link add "$HOST_SIDE" type veth peer name "$NS_SIDE"
    ip link set "$NS_SIDE" netns "$NS"
    ip addr add "$NET.0.1/24" dev "$HOST_SIDE"
    ip link set "$HOST_SIDE" up
  fi
  nsenter --net="/var/run/netns/$NS" sh -c "
    ip link set lo up
    ip addr replace $NET.0.2/24 dev $NS_SIDE
    ip link set $NS_SIDE up
    ip route replace default via $NET.0.1"
  # Its process is named dockerd-<ns>, so a tool that finds "the" machine's engine by name
  # (pidof dockerd) never takes this one for it, stops it and restarts it outside its namespace.
  ln -sf "$(command -v dockerd)" "$RUN/dockerd-$NS"
  # nsenter --net, not ip netns exec: the latter remounts /sys and dockerd dies on cgroup v1.
  nsenter --net="/var/run/netns/$NS" setsid "$RUN/dockerd-$NS" \
    --data-root "$CACHE/docker" --exec-root "$RUN/exec" --pidfile "$RUN/docker.pid" \
    -H "unix://$SOCK" --bip "$NET.1.1/24" --default-address-pool "base=$NET.16.0/20,size=24" \
    --iptables=true --ip-forward=true \
    >"$CACHE/log/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 60); do running && break; sleep 0.5; done
  running || { echo "ERROR: dockerd did not start: $CACHE/log/dockerd.log" >&2; tail -20 "$CACHE/log/dockerd.log" >&2; exit 1; }
  echo "unix://$SOCK"
}

stop() {
  if [ -f "$RUN/docker.pid" ]; then
    pid=$(cat "$RUN/docker.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  ip link del "$HOST_SIDE" 2>/dev/null || true
  [ -e "/var/run/netns/$NS" ] && ip netns del "$NS"
  # What dockerd left mounted under its exec-root (a network namespace handle, when it died uncleanly).
  findmnt -rn -o TARGET | grep "^$RUN/" | sort -r | xargs -r umount -l
  rm -rf "$RUN"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
