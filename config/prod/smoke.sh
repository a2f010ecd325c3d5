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

# What it runs, from Debian (installed when missing, as root): compose v1 1.29, mmdebstrap, the engine.
for need in docker-compose:docker-compose mmdebstrap:mmdebstrap dockerd:docker.io openssl:openssl curl:curl; do
  command -v "${need%%:*}" >/dev/null && continue
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || { echo "ERROR: apt-get install ${need#*:}" >&2; exit 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need#*:}" >/dev/null
done
phase "engine"
DOCKER_HOST=$(config/prod/engine.sh start)
export DOCKER_HOST
phase "images"
config/prod/build_images.sh

# --- this bring-up's configuration: secrets made once and kept in CACHE --------------------------
# Every secret a file of SECRETS_DIR (the control plane's) or NODE_SECRETS_DIR (the GPU server's), as the README's
# deployment steps make them (config/prod/make_secrets.sh); prod.env holds addresses only. An env file from before
# SECRETS_DIR existed is made again.
ENV_FILE=$CACHE/prod.env
grep -q '^SECRETS_DIR=' "$ENV_FILE" 2>/dev/null || rm -f "$ENV_FILE"
SECRETS=$CACHE/secrets NODE_SECRETS=$CACHE/node-secrets
config/prod/make_secrets.sh control "$SECRETS" gpu1 >&2
mkdir -p "$NODE_SECRETS"
for name in database_password redis_password registry_password; do
  [ -s "$NODE_SECRETS/$name" ] || install -m 400 "$SECRETS/hosts/gpu1/$name" "$NODE_SECRETS/$name"
done
config/prod/make_secrets.sh node "$NODE_SECRETS" >&2
if [ ! -s "$ENV_FILE" ]; then
  cat >"$ENV_FILE" <<ENV
SECRETS_DIR=$SECRETS
DEPLOYMENT_ID=gpprod
ALLOWED_HOSTS=$SERVER,localhost
CSRF_TRUSTED_ORIGINS=https://$SERVER
KEYS_DIR=$CACHE/keys
TLS_DIR=$CACHE/tls
HTTPS_BIND=0.0.0.0
HTTPS_PORT=443
DATA_BIND=127.0.0.1
OWNER_DATABASE_URL=postgres://gpucloud@postgres:5432/gpucloud
WEB_DATABASE_URL=postgres://gpucloud_web@postgres:5432/gpucloud
REDIS_URL=redis://redis:6379/0
REGISTRY=$SERVER
REGISTRY_USERNAME=gpucloud
REGISTRY_CA_FILE=$CACHE/tls/cert.pem
WEB_WORKERS=2
NODE_NAME=gpu1
NODE_ADDRESS=$SERVER
GPU_BACKEND=sim:2xRTX3090
NODE_RUNTIME=runc
DOCKER_SOCKET=${DOCKER_HOST#unix://}
VOLUMES_DIR=$CACHE/volumes
SHARED_FS_MOUNT=$CACHE/sharedfs
LXCFS_DIR=$CACHE/lxcfs
SHARED_FS_CACHE_DIR=$CACHE/juicefs-cache
INSTANCE_SUBNET=$NET.64.0/20
ENV
fi
# The GPU servers' addresses (TLS only, pg_hba): this server's, and a network the smoke plays a GPU server from.
GPU_NET=172.31.78.0/24
sed -i '/^GPU_SERVER_CIDRS=/d' "$ENV_FILE"
echo "GPU_SERVER_CIDRS=$SERVER/32 $GPU_NET" >>"$ENV_FILE"
# The GPU server reaches PostgreSQL and Redis over TLS, checking their certificate (issued for localhost here), as
# its own database role and its own Redis user (core.redis_acl); their passwords are NODE_SECRETS_DIR's.
sed -i '/^NODE_DATABASE_URL=/d;/^NODE_REDIS_URL=/d;/^DATA_CA_FILE=/d;/^DATA_TLS_DIR=/d' "$ENV_FILE"
cat >>"$ENV_FILE" <<ENV
DATA_TLS_DIR=$CACHE/tls
NODE_DATABASE_URL=postgres://gpucloud_node_gpu1@localhost:5432/gpucloud?sslmode=verify-full&sslrootcert=/etc/gpucloud/data-ca.pem
NODE_REDIS_URL=rediss://node-gpu1@localhost:6379/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/gpucloud/data-ca.pem
DATA_CA_FILE=$CACHE/tls/cert.pem
ENV
# The registry in token mode: the GPU server logs in as itself (registry_host_user, below).
grep -q '^REGISTRY_TOKEN_REALM=' "$ENV_FILE" || cat >>"$ENV_FILE" <<ENV
REGISTRY_TOKEN_REALM=https://$SERVER/registry/token/
REGISTRY_TOKEN_ISSUER_CERT=$CACHE/keys/registry-token.pem
ENV
config/prod/make_tls.sh "$CACHE/tls" "$SERVER" localhost
docker run --rm --network none -v "$CACHE/keys:/keys" -e KEYS_DIR=/keys -e SECRET_KEY="$(printf 'k%.0s' {1..40})" \
  gpucloud/app:latest python manage.py make_signing_keys >/dev/null
# The GPU server's own keys folder and SECRET_KEY, as the README's deployment steps make them: its own Celery pair
# (the control plane's store gets its certificate), the control plane's certificate and the relay's public key —
# never relay.key (a host checks relay tickets, it cannot make one) nor the control plane's Celery key. The smoke's
# launches, terminal and files then prove that a host runs on these alone.
rm -rf "$CACHE/node-keys" && mkdir -m 700 "$CACHE/node-keys"
docker run --rm --network none -v "$CACHE/keys:/keys" -v "$CACHE/node-keys:/node-keys" -e KEYS_DIR=/keys \
  -e SECRET_KEY="$(printf 'k%.0s' {1..40})" gpucloud/app:latest \
  python manage.py make_signing_keys --host "$(sed -n 's/^NODE_NAME=//p' "$ENV_FILE")" --into /node-keys >/dev/null
chown -R 10001:10001 "$CACHE/keys"  # the control plane's processes run as the image's gpucloud user
# The server's data-disk, shared-storage and LXCFS folders are shared mounts, as the agent's rshared and
# rslave binds need (a systemd host's / already is; this machine's is private). No LXCFS runs here: "auto".
for dir in "$CACHE/volumes" "$CACHE/sharedfs" "$CACHE/lxcfs"; do
  mkdir -p "$dir"
  findmnt -n "$dir" >/dev/null || mount --bind "$dir" "$dir"
  mount --make-rshared "$dir"
done

# The server's engine trusts the registry's certificate (the proxy's, self-signed here).
CERTS_D=/etc/docker/certs.d/$SERVER
install -D -m 644 "$CACHE/tls/cert.pem" "$CERTS_D/ca.crt"

compose=(docker-compose --env-file "$ENV_FILE" -p gpprod -f docker-compose.yml)
# The GPU server's own: keys folder, secrets and registry login (its node.env would hold them; the shell's values
# win over the env file's).
node_compose=(env KEYS_DIR="$CACHE/node-keys" NODE_SECRETS_DIR="$NODE_SECRETS" REGISTRY_USERNAME=node-gpu1
  docker-compose --env-file "$ENV_FILE" -p gpprod-node -f docker-compose.node.yml)
finish() {
  status=$?
  { "${compose[@]}" logs --no-color --timestamps; "${node_compose[@]}" logs --no-color --timestamps; } \
    >"$CACHE/log/compose.log" 2>&1 || true
  if [ "${KEEP:-}" != 1 ]; then
    "${node_compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    # The agent's tenants' containers and volumes, made on this engine outside compose.
    docker ps -aq --filter label=gpucloud.node | xargs -r docker rm -f >/dev/null 2>&1 || true
    docker volume ls -q --filter label=gpucloud.node | xargs -r docker volume rm -f >/dev/null 2>&1 || true
    umount -R "$CACHE/volumes" "$CACHE/sharedfs" "$CACHE/lxcfs" 2>/dev/null || true
    rm -rf "$CERTS_D"
    config/prod/engine.sh stop
  fi
  phase "done (exit $status); logs: $CACHE/log/compose.log"
}
trap finish EXIT

phase "compose up (control plane)"
# A fresh database each run.
"${node_compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
"${compose[@]}" up -d 2>&1 | grep -v '^Creating\|^Starting' >&2 || true
"${compose[@]}" ps
migrate=$("${compose[@]}" ps -q migrate)
[ "$(docker wait "$migrate")" = 0 ] || { docker logs --tail 40 "$migrate" >&2; exit 1; }
docker logs "$migrate" 2>&1 | tail -1 >&2
for _ in $(seq 120); do
  curl -fsS -o /dev/null --cacert "$CACHE/tls/cert.pem" "https://$SERVER/login/" 2>/dev/null && break
  sleep 1
done
# The demo catalog and user, on the web tier's role, with the BusyBox stand-in the smoke runs. The stand-in: built
# on the server's engine and pushed to the registry through the proxy (build_images, where the Docker socket is).
# The catalog's framework images stay "building" here: they are built on a host with mmdebstrap
# (python -m agent.framework_images; README "Images"), which the node agent's container is not.
"${compose[@]}" run --rm --no-deps web python manage.py load_demo --stand-in | sed 's/API token .*//' >&2
# The GPU server's Redis user, as the README's deployment steps make it (the password on standard input).
"${compose[@]}" run --rm -T --no-deps web python manage.py redis_host_user --host gpu1 \
  --password-file - <"$SECRETS/hosts/gpu1/redis_password" >&2
# Its own registry login, the same way: it pulls the catalog and what its work runs, pushes only what it saves.
"${compose[@]}" run --rm -T --no-deps web python manage.py registry_host_user \
  --host gpu1 --password-file - <"$SECRETS/hosts/gpu1/registry_password" >&2
# The catalog is pushed with the control plane's registry login (a GPU server's may not push it).
# (The smoke's shortcut, as the web tier on the server: its role and its registry login, their files mounted.)
"${node_compose[@]}" run --rm -e DATABASE_URL=postgres://gpucloud_web@127.0.0.1:5432/gpucloud \
  -v "$SECRETS/db_web_password:/run/control/database_password:ro" -e DATABASE_PASSWORD_FILE=/run/control/database_password \
  -v "$SECRETS/registry_password:/run/control/registry_password:ro" -e REGISTRY_PASSWORD_FILE=/run/control/registry_password \
  -e REGISTRY_USERNAME=gpucloud node-agent python manage.py build_images --only gpucloud/busybox-standin:latest |
  tail -2 >&2
docker images --format '{{.Repository}}:{{.Tag}}' | grep "^$SERVER/" | xargs -r docker rmi >/dev/null  # pulled back on use
phase "compose up (node agent)"
"${node_compose[@]}" up -d 2>&1 | grep -v '^Creating\|^Starting' >&2 || true
agent=$("${node_compose[@]}" ps -q node-agent)
for _ in $(seq 120); do docker logs "$agent" 2>&1 | grep -q "^node gpu1: " && break; sleep 1; done
docker logs "$agent" 2>&1 | grep "^node gpu1: " >&2 || { docker logs --tail 40 "$agent" >&2; exit 1; }

phase "smoke"
# The control plane runs as the image's unprivileged user; only the node agent (Docker, iptables, mounts) is root.
for service in web websocket worker beat; do
  uid=$("${compose[@]}" exec -T "$service" id -u)
  [ "$uid" = 10001 ] || { echo "ERROR: $service runs as uid $uid, not 10001" >&2; exit 1; }
done
echo "web, websocket, worker, beat: uid 10001" >&2
# No secret in any container's configuration (`docker inspect`: its environment, command and labels): each is a
# file of SECRETS_DIR or NODE_SECRETS_DIR, mounted where it is needed.
inspected=$(docker inspect $("${compose[@]}" ps -q) $("${node_compose[@]}" ps -q))
leaked=$(find "$SECRETS" "$NODE_SECRETS" -type f -size +0 ! -name db_node_roles | while read -r file; do
  value=$(cat "$file")
  case $inspected in *"$value"*) echo "$file" ;; esac
done)
[ -z "$leaked" ] || { echo "ERROR: docker inspect shows the secrets of: $leaked" >&2; exit 1; }
echo "no secret in docker inspect ($(find "$SECRETS" "$NODE_SECRETS" -type f -size +0 | wc -l) files checked)" >&2
# No role the platform logs in as may make roles (the owner included: the server's superuser made them at start).
as_superuser() { "${compose[@]}" exec -T postgres runuser -u postgres -- psql -XAtq -d postgres -c "$1"; }
login_roles() {  # the login roles but the superuser's, whose names match $1 (LIKE)
  as_superuser "SELECT string_agg(rolname, ' ' ORDER BY rolname) FROM pg_roles
                WHERE rolcanlogin AND rolname <> 'postgres' AND rolname LIKE '$1'"
}
makers=$(as_superuser "SELECT string_agg(rolname, ' ') FROM pg_roles
                       WHERE rolcanlogin AND rolname <> 'postgres' AND (rolcreaterole OR rolsuper)")
[ -z "$makers" ] || { echo "ERROR: these login roles may make roles: $makers" >&2; exit 1; }
echo "PostgreSQL login roles ($(login_roles %)): none may make roles" >&2
# A GPU server added and taken off as the README says (make_secrets.sh, then gpucloud-roles): no restart.
started=$(docker inspect -f '{{.State.StartedAt}}' "$("${compose[@]}" ps -q postgres)")
config/prod/make_secrets.sh control "$SECRETS" gpu9 >/dev/null
"${compose[@]}" exec -T postgres gpucloud-roles >/dev/null
added=$(login_roles 'gpucloud\_node\_%')
rm -r "$SECRETS/hosts/gpu9" && config/prod/make_secrets.sh control "$SECRETS" >/dev/null
"${compose[@]}" exec -T postgres gpucloud-roles >/dev/null
removed=$(login_roles 'gpucloud\_node\_%')
[ "$added|$removed" = "gpucloud_node_gpu1 gpucloud_node_gpu9|gpucloud_node_gpu1" ] &&
  [ "$(docker inspect -f '{{.State.StartedAt}}' "$("${compose[@]}" ps -q postgres)")" = "$started" ] ||
  { echo "ERROR: a host added then taken off: logins '$added', then '$removed'" >&2; exit 1; }
echo "a GPU server's role added and taken off without a restart (gpucloud-roles)" >&2
# PostgreSQL refuses an address outside POSTGRES_ALLOWED_CIDRS before any password: a container on a network of
# its own, given a way to the database (the database joins that network too), is turned away by pg_hba.
docker network create --subnet 172.31.77.0/24 gpprod-outsider >/dev/null
postgres=$("${compose[@]}" ps -q postgres)
docker network connect gpprod-outsider "$postgres"
db_ip=$(docker inspect -f '{{(index .NetworkSettings.Networks "gpprod-outsider").IPAddress}}' "$postgres")
refused=$(docker run --rm --network gpprod-outsider --entrypoint psql gpucloud/postgres:15 \
  "postgresql://nobody:x@$db_ip:5432/gpucloud?connect_timeout=10" -c 'select 1' 2>&1 || true)
docker network disconnect gpprod-outsider "$postgres" && docker network rm gpprod-outsider >/dev/null
case $refused in
  *"no pg_hba.conf entry for host"*) echo "PostgreSQL from outside its allowed addresses: refused (pg_hba)" >&2 ;;
  *) echo "ERROR: PostgreSQL answered an address it should refuse: $refused" >&2; exit 1 ;;
esac
# A GPU server's address (GPU_NET, in GPU_SERVER_CIDRS) is refused without TLS and asked its password over TLS.
docker network create --subnet "$GPU_NET" gpprod-gpuserver >/dev/null
docker network connect gpprod-gpuserver "$postgres"
db_ip=$(docker inspect -f '{{(index .NetworkSettings.Networks "gpprod-gpuserver").IPAddress}}' "$postgres")
as_gpu_server() {
  docker run --rm --network gpprod-gpuserver -v "$CACHE/tls/cert.pem:/ca.pem:ro" --entrypoint psql gpucloud/postgres:15 \
    "postgresql://nobody:x@$db_ip:5432/gpucloud?connect_timeout=10&$1" -c 'select 1' 2>&1 || true
}
plain=$(as_gpu_server sslmode=disable)
over_tls=$(as_gpu_server "sslmode=verify-ca&sslrootcert=/ca.pem")
docker network disconnect gpprod-gpuserver "$postgres" && docker network rm gpprod-gpuserver >/dev/null
case $plain in
  *"rejects connection"*"no encryption"*) ;;
  *) echo "ERROR: PostgreSQL let a GPU server's address in without TLS: $plain" >&2; exit 1 ;;
esac
case $over_tls in
  *"password authentication failed"*) ;;
  *) echo "ERROR: PostgreSQL over TLS from a GPU server's address: $over_tls" >&2; exit 1 ;;
esac
echo "PostgreSQL from a GPU server's address: refused without TLS, asked its password over TLS" >&2
# The node agent's database connection, made from its own environment (its URL: sslmode=verify-full), is encrypted.
ssl=$("${node_compose[@]}" exec -T node-agent python manage.py shell --no-imports -c '
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    print(cursor.fetchone()[0])
' | tail -1)
[ "$ssl" = True ] || { echo "ERROR: the node agent's database connection over TLS: '$ssl'" >&2; exit 1; }
echo "node agent's database connection: TLS (certificate verified)" >&2
# The GPU server's Redis user reaches its own queue and not the scheduler's nor any other key (core.redis_acl).
answers=$("${node_compose[@]}" exec -T node-agent python manage.py shell --no-imports -c '
import redis
from django.conf import settings
r = redis.Redis.from_url(settings.REDIS_URL)
for name, command in [("own", ["LLEN", "node.gpu1"]), ("scheduler", ["LRANGE", "scheduler", 0, -1]),
                      ("flush", ["FLUSHALL"]), ("other", ["LLEN", "node.gpu2"])]:
    try:
        r.execute_command(*command)
        print(name, "allowed")
    except redis.exceptions.NoPermissionError:
        print(name, "refused")
plain = redis.Redis(host="localhost", port=6379, username="node-gpu1", socket_timeout=10,
                    password=r.connection_pool.connection_kwargs["password"])
try:
    plain.ping()
    print("plain allowed")
except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
    print("plain refused")
')
[ "$answers" = "$(printf 'own allowed\nscheduler refused\nflush refused\nother refused\nplain refused')" ] ||
  { echo "ERROR: the GPU server's Redis user: $answers" >&2; exit 1; }
echo "GPU server's Redis user: over TLS (certificate verified; without TLS refused), its own queue only" >&2
# The GPU server's registry login (token mode): it pulls the catalog's image and cannot push over it.
answers=$("${node_compose[@]}" exec -T node-agent python manage.py shell --no-imports -c '
import docker
from django.conf import settings
repository = settings.REGISTRY + "/gpucloud/busybox-standin"
auth = {"username": settings.REGISTRY_USERNAME, "password": settings.REGISTRY_PASSWORD}
api = docker.from_env().api
api.pull(repository, tag="latest", auth_config=auth)
print("pull allowed")
pushed = api.push(repository, tag="latest", auth_config=auth, stream=True, decode=True)
print("push", "refused" if any("error" in line for line in pushed) else "allowed")
')
[ "$answers" = "$(printf 'pull allowed\npush refused')" ] ||
  { echo "ERROR: the GPU server's registry login: $answers" >&2; exit 1; }
echo "GPU server's registry login (node-gpu1): pulls the catalog, cannot push over it" >&2
# Nothing but the proxy answers from outside the server.
for port in 8000 8001 5432 6379 5000; do
  if timeout 2 bash -c "</dev/tcp/$SERVER/$port" 2>/dev/null; then echo "ERROR: $SERVER:$port answers" >&2; exit 1; fi
done
echo "published from $SERVER: 443 only (8000 8001 5432 6379 5000 closed)" >&2
# The registry behind it answers the GPU servers (the instance below pulls through the server's engine) and not
# this outside address, even with the control plane's login.
outside=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$CACHE/tls/cert.pem" \
  -u "gpucloud:$(cat "$SECRETS/registry_password")" "https://$SERVER/v2/_catalog")
[ "$outside" = 403 ] || { echo "ERROR: the registry answered an outside address: HTTP $outside" >&2; exit 1; }
echo "registry (/v2/) from outside the GPU servers' addresses: 403" >&2
# shellcheck disable=SC2086
"$PYTHON" config/prod/smoke.py --url "https://$SERVER" --ca "$CACHE/tls/cert.pem" \
  --user demo --password demo-pass-123 ${SMOKE_ARGS:-}
