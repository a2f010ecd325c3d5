#!/usr/bin/env bash
# `make prod-smoke`: build the production images (cached), bring docker-compose.yml up with Debian's
# docker-compose on a Docker engine of its own (config/prod/engine.sh: a network namespace standing
# in for the production server), with one node agent on simulated GPUs, then run
# config/prod/smoke.py against the TLS proxy from outside that server. Everything it started is
# stopped at the end (KEEP=1 leaves the stack and the engine up to look around).
#
#   make prod-smoke                  # or: bash config/prod/smoke.sh
#   SMOKE_ARGS="--allow-fail terminal" make prod-smoke
#
# Times of each phase on stderr; logs of every service in var/prodstack/log/compose.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${PROD_CACHE:-$PWD/var/prodstack}
NET=${PROD_NET:-10.250}
SERVER=$NET.0.2                                  # the server's address, as clients reach it
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PROD_CACHE=$CACHE PROD_NET=$NET PYTHON
mkdir -p "$CACHE/log"
t0=$(date +%s)
phase() { echo "== $(date +%T) +$(( $(date +%s) - t0 ))s $*" >&2; }

command -v docker-compose >/dev/null || { echo "ERROR: apt-get install docker-compose (compose v1, 1.29)" >&2; exit 1; }
phase "engine"
DOCKER_HOST=$(config/prod/engine.sh start)
export DOCKER_HOST
phase "images"
config/prod/build_images.sh

# --- this bring-up's configuration: secrets made once and kept in CACHE --------------------------
ENV_FILE=$CACHE/prod.env
if [ ! -s "$ENV_FILE" ]; then
  secret() { python3 -c 'import secrets; print(secrets.token_hex(24))'; }
  pg=$(secret) web=$(secret) node=$(secret) redis=$(secret)
  cat >"$ENV_FILE" <<ENV
SECRET_KEY=$(secret)$(secret)
DEPLOYMENT_ID=gpprod
ALLOWED_HOSTS=$SERVER,localhost
CSRF_TRUSTED_ORIGINS=https://$SERVER
KEYS_DIR=$CACHE/keys
TLS_DIR=$CACHE/tls
HTTPS_BIND=0.0.0.0
HTTPS_PORT=443
DATA_BIND=127.0.0.1
POSTGRES_PASSWORD=$pg
OWNER_DATABASE_URL=postgres://gpucloud:$pg@postgres:5432/gpucloud
DB_WEB_PASSWORD=$web
WEB_DATABASE_URL=postgres://gpucloud_web:$web@postgres:5432/gpucloud
DB_NODE_ROLES=gpu1=$node
REDIS_PASSWORD=$redis
REDIS_URL=redis://:$redis@redis:6379/0
REGISTRY_USER=gpucloud
REGISTRY_PASSWORD=$(secret)
WEB_WORKERS=2
NODE_NAME=gpu1
NODE_ADDRESS=$SERVER
NODE_DATABASE_URL=postgres://gpucloud_node_gpu1:$node@127.0.0.1:5432/gpucloud
NODE_REDIS_URL=redis://:$redis@127.0.0.1:6379/0
GPU_BACKEND=sim:2xRTX3090
NODE_RUNTIME=runc
DOCKER_SOCKET=${DOCKER_HOST#unix://}
VOLUMES_DIR=$CACHE/volumes
INSTANCE_SUBNET=$NET.64.0/20
ENV
fi
config/prod/make_tls.sh "$CACHE/tls" "$SERVER" localhost
docker run --rm --network none -v "$CACHE/keys:/keys" -e KEYS_DIR=/keys -e SECRET_KEY="$(printf 'k%.0s' {1..40})" \
  gpucloud/app:latest python manage.py make_signing_keys >/dev/null
# The server's data-disk folder is a shared mount, as the node agent's rshared bind needs.
mkdir -p "$CACHE/volumes"
if ! findmnt -n "$CACHE/volumes" >/dev/null; then mount --bind "$CACHE/volumes" "$CACHE/volumes"; fi
mount --make-rshared "$CACHE/volumes"

compose=(docker-compose --env-file "$ENV_FILE" -p gpprod -f docker-compose.yml)
finish() {
  status=$?
  "${compose[@]}" --profile node logs --no-color --timestamps >"$CACHE/log/compose.log" 2>&1 || true
  if [ "${KEEP:-}" != 1 ]; then
    "${compose[@]}" --profile node down -v --remove-orphans >/dev/null 2>&1 || true
    # The agent's tenants' containers and volumes, made on this engine outside compose.
    docker ps -aq --filter label=gpucloud.node | xargs -r docker rm -f >/dev/null 2>&1 || true
    docker volume ls -q --filter label=gpucloud.node | xargs -r docker volume rm -f >/dev/null 2>&1 || true
    umount -R "$CACHE/volumes" 2>/dev/null || true
    config/prod/engine.sh stop
  fi
  phase "done (exit $status); logs: $CACHE/log/compose.log"
}
trap finish EXIT

phase "compose up (control plane)"
"${compose[@]}" --profile node down -v --remove-orphans >/dev/null 2>&1 || true  # a fresh database each run
"${compose[@]}" up -d --quiet-pull 2>&1 | grep -v '^Creating\|^Starting' >&2 || true
"${compose[@]}" ps
migrate=$("${compose[@]}" ps -q migrate)
[ "$(docker wait "$migrate")" = 0 ] || { docker logs --tail 40 "$migrate" >&2; exit 1; }
docker logs "$migrate" 2>&1 | tail -1 >&2
# The demo catalog and user (on the web tier's role); the catalog's images on the server's engine
# (a registry holds them in a deployment: the registry work pushes them there).
"${compose[@]}" run --rm --no-deps web python manage.py load_demo | sed 's/API token .*//' >&2
web_on_server=$(sed -n 's|^WEB_DATABASE_URL=\(.*\)@postgres:5432/\(.*\)$|\1@127.0.0.1:5432/\2|p' "$ENV_FILE")
"${compose[@]}" --profile node run --rm --no-deps -e DATABASE_URL="$web_on_server" node-agent \
  python manage.py build_images | tail -1 >&2
phase "compose up (node agent)"
"${compose[@]}" --profile node up -d node-agent 2>&1 | grep -v '^Creating\|^Starting' >&2 || true

phase "smoke"
for _ in $(seq 120); do
  curl -fsS -o /dev/null --cacert "$CACHE/tls/cert.pem" "https://$SERVER/login/" 2>/dev/null && break
  sleep 1
done
# Nothing but the proxy answers from outside the server.
for port in 8000 8001 5432 6379 5000; do
  if timeout 2 bash -c "</dev/tcp/$SERVER/$port" 2>/dev/null; then echo "ERROR: $SERVER:$port answers" >&2; exit 1; fi
done
echo "published from $SERVER: 443 only (8000 8001 5432 6379 5000 closed)" >&2
# shellcheck disable=SC2086
"$PYTHON" config/prod/smoke.py --url "https://$SERVER" --ca "$CACHE/tls/cert.pem" \
  --user demo --password demo-pass-123 ${SMOKE_ARGS:-}
