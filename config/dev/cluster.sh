#!/usr/bin/env bash
# Several GPU hosts on this one machine, each reaching the control plane over a network like
# a real server over a LAN (DESIGN.md "Many hosts"):
#
#   cluster.sh up [N]              control plane + N GPU hosts (default 3); cleans leftovers first
#   cluster.sh add-host I [CARDS]  one more host, e.g. add-host 4 sim:2xH100 (it registers)
#   cluster.sh status              what runs, each host's node status and where its connections come from
#   cluster.sh down [--purge]      stop everything it started; --purge also deletes the state
#                                  (database, Docker data), keeping the logs
#   cluster.sh env [I]             the environment of the control plane, or of host I's agent
#
# The control-plane side lives in the root network namespace on a bridge, ${PREFIX}br0 at
# 10.<NET>.0.1/24: PostgreSQL (its own instance, 5432), Redis with a password (6379), web
# (gunicorn, 8000) and WebSockets (daphne, 8001) — the last two also on loopback for the
# browser (CLUSTER_WEB_PORT, default 8100, and the next port) — and the scheduler worker + beat.
# GPU host I is network namespace ${PREFIX}h<I> at 10.<NET>.0.(10+I) with its own Docker
# engine (bridge 10.<NET+1>.<I>.1/24, Docker's iptables on) and its own node agent (tenants'
# fenced network 10.<NET+2>.<I>.0/24, routed from every other host via host I's address, as an operator's
# network routes each GPU server's container subnet to it: a gang's members reach each other there, README
# "Deploying on real GPU servers"). Defaults: PREFIX=gc, NET=231; the tests use another
# instance of the plan (CLUSTER_PREFIX=gct CLUSTER_NET=234) so both can run at once.
#
# Settings (environment): CLUSTER_PREFIX, CLUSTER_NET, CLUSTER_DIR (state and logs, default
# var/cluster), CLUSTER_WEB_PORT, CLUSTER_CARDS_<I> (host I's cards), CLUSTER_NODE_CPUS and
# CLUSTER_NODE_MEMORY_MB (what each simulated host advertises: they share this machine's),
# CLUSTER_AGENT_CONCURRENCY (tasks each agent runs at once, default 2), CLUSTER_DOCKER_DISK_GB (each
# host's Docker data root: a btrfs filesystem with quotas in a sparse loop file of this size, default 64,
# so containers' system disks have a size; 0: a plain directory), N, PYTHON. Any other setting of the platform (NODE_HEARTBEAT_S, ...) the caller sets reaches
# every process.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

PREFIX=${CLUSTER_PREFIX:-gc}
NET=${CLUSTER_NET:-231}
DIR=$(realpath -m "${CLUSTER_DIR:-var/cluster}")
LOG=$DIR/log
RUN=/run/gpucloud-$PREFIX # short paths: Docker's and containerd's sockets live here
BRIDGE=${PREFIX}br0
CP=10.$NET.0.1
LAN=10.$NET.0.0/24
# The loopback port a running cluster was started with wins over the default (status, env, add-host).
WEB_PORT=${CLUSTER_WEB_PORT:-$(cat "$DIR/web-port" 2>/dev/null || echo 8100)}
WS_PORT=$((WEB_PORT + 1))
PY=${PYTHON:-$ROOT/.venv/bin/python}
DB_NAME=gpucloud
DB_OWNER=gpucloud

die() { echo "ERROR: $*" >&2; exit 1; }
say() { echo "[cluster $PREFIX] $*"; }

[[ $PREFIX =~ ^[a-z]{1,4}$ ]] || die "CLUSTER_PREFIX must be 1-4 lowercase letters (interface names are short)"
in_range() { [[ $1 =~ ^[0-9]+$ ]] && (($1 >= $2 && $1 <= $3)); } # in_range <value> <min> <max>
in_range "$NET" 1 252 || die "CLUSTER_NET must be 1-252 (it uses 10.NET, 10.NET+1 and 10.NET+2)"

host_ns() { echo "${PREFIX}h$1"; }
host_addr() { echo "10.$NET.0.$((10 + $1))"; }
host_sock() { echo "$RUN/h$1.sock"; }
tenant_subnet() { echo "10.$((NET + 2)).$1.0/24"; }
default_cards() { if (($1 % 2)); then echo "sim:4xRTX3090"; else echo "sim:4xA100-80GB"; fi; }

# --- processes: each in its own session (a process group to signal), recorded in $RUN/<name>.pid ---

spawn() { # spawn <name> <command...>: in the background, output to $LOG/<name>.log
  local name=$1; shift
  setsid "$@" >>"$LOG/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

pid_of() { # the recorded pid of <name> if that process still runs
  local pid
  pid=$(cat "$RUN/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

stop_process() { # stop_process <name> [seconds]: TERM its process group, KILL after the wait
  local name=$1 seconds=${2:-20} pid
  if pid=$(pid_of "$name"); then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq $((seconds * 4))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/$name.pid"
}

wait_for() { # [LOG_TAIL=<file>] wait_for <seconds> <what> <command...>: LOG_TAIL's last lines if it never does
  local seconds=$1 what=$2; shift 2
  for _ in $(seq $((seconds * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  [ -z "${LOG_TAIL:-}" ] || { echo "--- last lines of $LOG_TAIL:" >&2; tail -n 30 "$LOG_TAIL" >&2 || true; }
  die "$what did not come up within ${seconds}s (logs: $LOG/)"
}

need() { # need <command> <debian package>
  command -v "$1" >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null || die "$1 is missing: install the Debian package '$2'"
  say "installing $2 ..."
  [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq; APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

# --- secrets and the environment each part gets ---

secrets() { # random passwords and keys, made once per cluster directory (mode 600)
  local key
  umask 077
  touch "$DIR/secrets.env"
  for key in PG_PASSWORD WEB_DB_PASSWORD NODE_DB_PASSWORD REDIS_PASSWORD SECRET_KEY AGENT_SECRET_KEY \
    REGISTRY_PASSWORD FS_DB_PASSWORD; do
    grep -q "^$key=" "$DIR/secrets.env" || echo "$key=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" >>"$DIR/secrets.env"
  done
  umask 022
  # shellcheck disable=SC1091
  source "$DIR/secrets.env"
}

# The image registry (Debian's docker-registry, TLS with a CA of its own that every engine here trusts)
# and the users' file storage (JuiceFS: metadata and data in this PostgreSQL, mounted on every host).
REGISTRY=$CP:5000
# Token mode: each host logs in to the registry as itself (portal/services/registry_tokens.py: it pulls the catalog and what its work runs,
# pushes only what it saves); the engines get their tokens from the web tier on the control plane's address.
REGISTRY_TOKEN_REALM=http://$CP:8000/registry/token/
shared_env() { # what every part gets for the registry and the file storage (printed as NAME=value lines)
  cat <<ENV
REGISTRY=$REGISTRY
REGISTRY_USERNAME=gpucloud
REGISTRY_PASSWORD=$REGISTRY_PASSWORD
REGISTRY_CA_FILE=$DIR/registry/ca.crt
REGISTRY_TOKEN_REALM=$REGISTRY_TOKEN_REALM
SHARED_FS_META=postgres://gpucloud_fs@$CP:5432/gpucloud_fs_meta?sslmode=disable
META_PASSWORD=$FS_DB_PASSWORD
SHARED_FS_STORAGE=postgres
SHARED_FS_BUCKET=$CP:5432/gpucloud_fs_data?sslmode=disable
SHARED_FS_ACCESS_KEY=gpucloud_fs
SHARED_FS_SECRET_KEY=$FS_DB_PASSWORD
ENV
}

control_env() { # what every control-plane process (and manage.py run here) gets
  local line
  while IFS= read -r line; do export "${line?}"; done < <(shared_env)
  export SECRET_KEY DEPLOYMENT_ID="cluster-$PREFIX" SCHEDULER_QUEUE=scheduler
  export REDIS_URL="redis://:$REDIS_PASSWORD@$CP:6379/0"
  export DATABASE_URL="postgres://${DB_OWNER}_web:$WEB_DB_PASSWORD@$CP:5432/$DB_NAME"
  export ALLOWED_HOSTS="127.0.0.1,localhost,$CP" WHITENOISE_USE_FINDERS=true
  export WEBSOCKET_URL="ws://127.0.0.1:$WS_PORT"
  unset CACHE_KEY_PREFIX CELERY_BROKER_URL CACHE_URL
}
owner_url() { echo "postgres://$DB_OWNER:$PG_PASSWORD@$CP:5432/$DB_NAME"; }

host_env() { # host_env <i> <cards>: what host i's node agent gets (printed as NAME=value lines)
  local i=$1 cards=$2
  cat <<ENV
NODE_NAME=h$i
NODE_ADDRESS=$(host_addr "$i")
DATABASE_URL=postgres://${DB_OWNER}_node_h$i:$NODE_DB_PASSWORD@$CP:5432/$DB_NAME
REDIS_URL=redis://node-h$i:$(cat "$DIR/h$i/redis.password" 2>/dev/null)@$CP:6379/0
DOCKER_BASE_URL=unix://$(host_sock "$i")
GPU_BACKEND=$cards
NODE_CPUS=${CLUSTER_NODE_CPUS:-16}
NODE_MEMORY_MB=${CLUSTER_NODE_MEMORY_MB:-65536}
NODE_OVERCOMMIT_SIMULATED=true
INSTANCE_NETWORK_MODE=fenced
INSTANCE_NETWORK=gpucloud-tenants
INSTANCE_BRIDGE=${PREFIX}t$i
INSTANCE_SUBNET=$(tenant_subnet "$i")
FENCE_EXTRA_CIDRS=$LAN
VOLUMES_DIR=$DIR/h$i/volumes
AGENT_STATE_DIR=$DIR/h$i/agent
MPS_DIR=$DIR/h$i/mps
SECRET_KEY=$AGENT_SECRET_KEY
KEYS_DIR=$DIR/h$i/keys
DEPLOYMENT_ID=cluster-$PREFIX
SCHEDULER_QUEUE=scheduler
SHARED_FS_MOUNT=$DIR/h$i/sharedfs/mnt
SHARED_FS_CACHE_DIR=$DIR/h$i/sharedfs/cache
SHARED_FS_CACHE_MB=512
ENV
  shared_env
  # Its own registry login, after the control plane's (the last of a name wins): host_registry_login.
  echo "REGISTRY_USERNAME=node-h$i"
  echo "REGISTRY_PASSWORD=$(cat "$DIR/h$i/registry.password" 2>/dev/null)"
}

psql_admin() { # SQL as the instance's superuser, over its own unix socket
  runuser -u postgres -- "$PG_BIN/psql" -h "$RUN/pg" -p 5432 -d "${PSQL_DB:-postgres}" -v ON_ERROR_STOP=1 -Atqc "$1"
}

# --- the network ---

bridge_up() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$CP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# --- control plane ---

PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1)

# PostgreSQL runs as the postgres user, which cannot enter a checkout under /root (mode 700) or a `mktemp -d`
# folder: there its data and log live under /var/lib/gpucloud-cluster instead, in a folder named after this
# cluster's own. Sets PG_DATA and PG_LOG.
pg_paths() {
  local home=$DIR
  if ! { id postgres >/dev/null 2>&1 && mkdir -p "$DIR" && runuser -u postgres -- test -x "$DIR"; }; then
    home=/var/lib/gpucloud-cluster/$PREFIX-$(printf %s "$DIR" | sha1sum | cut -c1-12)
    mkdir -p "$home" && chmod 755 /var/lib/gpucloud-cluster "$home"
  fi
  PG_DATA=$home/pg
  if [ "$home" = "$DIR" ]; then PG_LOG=$LOG/postgres.log; else PG_LOG=$home/postgres.log; fi
}

postgres_up() {
  [ -n "$PG_BIN" ] || { need psql postgresql; PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -1); }
  install -d -o postgres -g postgres -m 700 "$RUN/pg"
  pg_paths
  [ "$PG_DATA" = "$DIR/pg" ] || say "PostgreSQL keeps its data in $PG_DATA (the postgres user cannot enter $DIR)"
  touch "$PG_LOG" && chown postgres "$PG_LOG"
  if [ ! -s "$PG_DATA/PG_VERSION" ]; then
    install -d -o postgres -g postgres -m 700 "$PG_DATA"
    printf '%s\n' "$PG_PASSWORD" >"$RUN/pg/pw" && chown postgres "$RUN/pg/pw"
    runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --pwfile="$RUN/pg/pw" \
      --auth-local=peer --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >>"$PG_LOG"
    rm -f "$RUN/pg/pw"
    echo "host all all $LAN scram-sha-256" >>"$PG_DATA/pg_hba.conf"
  fi
  # Only on the bridge (the machine's own PostgreSQL keeps 127.0.0.1:5432), its socket in $RUN.
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 start -o \
    "-c listen_addresses=$CP -c port=5432 -c unix_socket_directories=$RUN/pg -c max_connections=300" >/dev/null
  if [ -z "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname = '$DB_OWNER'")" ]; then
    psql_admin "CREATE ROLE $DB_OWNER LOGIN PASSWORD '$PG_PASSWORD'"  # it may not make roles (db_login_roles)
    psql_admin "CREATE DATABASE $DB_NAME OWNER $DB_OWNER"
    # The owner may see where every connection comes from (pg_stat_activity's client_addr).
    psql_admin "GRANT pg_read_all_stats TO $DB_OWNER"
  fi
}

redis_up() {
  need redis-server redis-server
  spawn redis redis-server --bind "$CP" --port 6379 --requirepass "$REDIS_PASSWORD" --save "" --appendonly no \
    --dir "$DIR" --protected-mode yes
  wait_for 15 "redis" redis-cli -h "$CP" -a "$REDIS_PASSWORD" --no-auth-warning ping
}

db_login_roles() { # the login roles, made as production makes them: by the server's superuser, with its script
  [ -e "$DIR/db_node_roles" ] || (umask 077 && : >"$DIR/db_node_roles")  # NAME=PASSWORD lines: root's only
  PSQL="runuser -u postgres -- $PG_BIN/psql -h $RUN/pg -p 5432" POSTGRES_USER=$DB_OWNER POSTGRES_DB=$DB_NAME \
    DB_ROLES_PREFIX=$DB_OWNER DB_WEB_PASSWORD=$WEB_DB_PASSWORD DB_NODE_ROLES_FILE=$DIR/db_node_roles \
    sh "$ROOT/config/prod/images/postgres-roles.sh" >/dev/null
}

database_ready() { # signing keys, schema, roles, demo users (as the database owner)
  # The keys first: a new user's file-storage quota is a signed message (load_demo sends two).
  "$PY" manage.py make_signing_keys
  DATABASE_URL=$(owner_url) "$PY" manage.py migrate --no-input -v0
  db_login_roles
  DATABASE_URL=$(owner_url) "$PY" manage.py db_roles --prefix "$DB_OWNER" >/dev/null
  # --stand-in: the tests' BusyBox image (sh, nc, sleep) beside the catalog's real ones.
  DATABASE_URL=$(owner_url) "$PY" manage.py load_demo --stand-in >"$DIR/demo-users.txt"
}

registry_answers() {
  [ "$(curl -s --cacert "$DIR/registry/ca.crt" -o /dev/null -w '%{http_code}' "https://$REGISTRY/v2/")" = 401 ]
}

start_registry() { # TLS: every engine here trusts its CA through /etc/docker/certs.d (shared by the namespaces)
  need docker-registry docker-registry
  REGISTRY_TLS_NAMES=$CP REGISTRY_TOKEN_REALM=$REGISTRY_TOKEN_REALM REGISTRY_TOKEN_ISSUER=gpucloud-$DEPLOYMENT_ID \
    REGISTRY_TOKEN_CERTIFICATE=$ROOT/var/keys/registry-token.pem \
    bash config/dev/registry.sh write "$DIR/registry" "$REGISTRY" >/dev/null
  install -D -m 644 "$DIR/registry/ca.crt" "/etc/docker/certs.d/$REGISTRY/ca.crt"
  spawn registry bash config/dev/registry.sh serve "$DIR/registry"
  wait_for 15 "the registry" registry_answers
}

start_sharedfs() { # its two databases in this PostgreSQL, formatted once (every user gets a directory)
  if [ -z "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname = 'gpucloud_fs'")" ]; then
    psql_admin "CREATE ROLE gpucloud_fs LOGIN PASSWORD '$FS_DB_PASSWORD'"
    psql_admin "CREATE DATABASE gpucloud_fs_meta OWNER gpucloud_fs"
    psql_admin "CREATE DATABASE gpucloud_fs_data OWNER gpucloud_fs"
  fi
  DATABASE_URL=$(owner_url) "$PY" manage.py sharedfs_format >/dev/null
}

control_plane_up() {
  redis_up
  postgres_up
  database_ready
  start_registry
  start_sharedfs
  spawn web "$PY" -m gunicorn -c config/gunicorn.py --workers "${WEB_WORKERS:-2}" \
    --bind "$CP:8000" --bind "127.0.0.1:$WEB_PORT" config.wsgi:application
  spawn websocket "$PY" -m daphne -e "tcp:port=8001:interface=$CP" -e "tcp:port=$WS_PORT:interface=127.0.0.1" \
    config.asgi:application
  wait_for 60 "the web server" curl -fs -o /dev/null "http://127.0.0.1:$WEB_PORT/login/"
}

# Started after the hosts registered and stopped before them: a whole cluster going down or
# coming up is not a host that stopped sending heartbeats.
scheduler_up() {
  spawn scheduler "$PY" -m celery -A config worker -B -Q scheduler -n "scheduler@$PREFIX" --pool threads \
    --concurrency 2 -s "$DIR/celerybeat-schedule" --without-gossip --without-mingle
}

# --- GPU hosts ---

host_net_up() {
  local i=$1 ns veth
  ns=$(host_ns "$i") veth=${PREFIX}v$i
  ip netns add "$ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via "$CP"
}

host_routes() { # host_routes <i>: host i's tenants' subnet routed via it from every other host, theirs from it
  local i=$1 j
  for j in $(host_numbers); do
    [ "$j" != "$i" ] && [ -e "/var/run/netns/$(host_ns "$j")" ] || continue
    ip -n "$(host_ns "$j")" route replace "$(tenant_subnet "$i")" via "$(host_addr "$i")"
    ip -n "$(host_ns "$i")" route replace "$(tenant_subnet "$j")" via "$(host_addr "$j")"
  done
}

host_data_root() { # host_data_root <i>: a btrfs filesystem with quotas for the engine's data (loop file, sparse)
  local i=$1 gb=${CLUSTER_DOCKER_DISK_GB:-64} root=$DIR/h$i/docker image=$DIR/h$i/docker.btrfs
  mkdir -p "$root"
  ((gb > 0)) || return 0
  mountpoint -q "$root" && return 0
  if [ ! -e "$image" ]; then
    [ -z "$(ls -A "$root")" ] || die "host h$i has a plain data root from before: cluster.sh down --purge first"
    truncate -s "${gb}G" "$image"
    mkfs.btrfs -q "$image" >/dev/null
  fi
  mount -o loop "$image" "$root"
  btrfs quota enable "$root" # the btrfs storage driver's --storage-opt size= is a quota group limit
}

host_dockerd_up() {
  local i=$1 ns driver=()
  ns=$(host_ns "$i")
  mkdir -p "$RUN/h$i"
  host_data_root "$i"
  mountpoint -q "$DIR/h$i/docker" && driver=(--storage-driver btrfs)
  # nsenter --net, not `ip netns exec`: the latter remounts /sys and dockerd then finds no devices cgroup.
  # --live-restore: a restart of this engine (an upgrade, a crash) leaves its containers running, as on a
  # production GPU host (README "Deploying on real GPU servers"; tests/agent/test_live_restore.py).
  spawn "h$i-dockerd" nsenter --net="/var/run/netns/$ns" dockerd --data-root "$DIR/h$i/docker" \
    --exec-root "$RUN/h$i" --pidfile "$RUN/h$i/dockerd.pid" -H "unix://$(host_sock "$i")" \
    --bip "10.$((NET + 1)).$i.1/24" --iptables=true --live-restore "${driver[@]}"
}

host_images() { # the catalog pushed to the registry once, through the first host's engine; the others pull
  registry_answers && [ -n "$(ls -A "$DIR/registry/storage" 2>/dev/null)" ] && return 0
  # The stand-in and the PyTorch image (built once on this machine and cached: agent/framework_images.py); the
  # catalog's other images stay "building" here. Progress in $DIR/images.log.
  # CLUSTER_IMAGES: which (a bench that runs only the stand-in skips the PyTorch image's import and push).
  local ref seed="" pytorch=""
  local -a rest=()
  for ref in ${CLUSTER_IMAGES:-gpucloud/busybox-standin:latest $PYTORCH_IMAGE}; do
    if [ "$ref" = "$PYTORCH_IMAGE" ]; then pytorch=1; else rest+=(--only "$ref"); fi
  done
  say "images: ${CLUSTER_IMAGES:-the stand-in and $PYTORCH_IMAGE} into the registry (the first time: minutes)"
  : >"$DIR/images.log"
  if [ -n "$pytorch" ]; then
    # The PyTorch image as an earlier cluster's registry stored it, where one was kept for this very recipe:
    # build_images then finds it there and neither imports it on this engine (a minute) nor pushes it (more).
    seed=$(registry_seed)
    if [ -d "$seed" ]; then
      cp -a "$seed/." "$DIR/registry/storage/" || die "could not copy the kept registry storage $seed (remove it)"
      echo "$PYTORCH_IMAGE: registry storage from $seed" >>"$DIR/images.log"
    fi
    build_images "$1" --only "$PYTORCH_IMAGE" || return 1
    [ -d "$seed" ] || registry_seed_keep "$seed" || say "could not keep the registry storage in $seed (the next cluster pushes it again)"
  fi
  [ ${#rest[@]} -eq 0 ] || build_images "$1" "${rest[@]}"
}

build_images() { # build_images <host> --only REF ...: through host <host>'s engine, appending to $DIR/images.log
  local host=$1
  shift
  DATABASE_URL=$(owner_url) DOCKER_BASE_URL="unix://$(host_sock "$host")" "$PY" manage.py build_images "$@" \
    >>"$DIR/images.log" 2>&1 ||
    { tail -40 "$DIR/images.log" >&2; return 1; }  # a traceback's calling frames too (CI keeps no files)
}

PYTORCH_IMAGE=gpucloud/pytorch:2.13.0-cpu
registry_seed() { # the folder that keeps the registry's storage of $PYTORCH_IMAGE built from its recipe of now: in
  # the image build cache (IMAGE_BUILD_CACHE, as agent/framework_images.py keys its root filesystems by recipe)
  "$PY" -c "from agent import framework_images as f
print(f.cache_dir() / 'registry' / f.recipe_key(f.RECIPES['$PYTORCH_IMAGE']))"
}

registry_seed_keep() { # registry_seed_keep <folder>: the storage as it is now (the PyTorch image alone), whole or not at all
  local seed=$1 part
  mkdir -p "$(dirname "$seed")" && part=$(mktemp -d "$seed.part.XXXXXX") || return 1
  if cp -a "$DIR/registry/storage/." "$part/" && mv -T "$part" "$seed" 2>/dev/null; then
    echo "$PYTORCH_IMAGE: registry storage kept in $seed" >>"$DIR/images.log"
  else
    rm -rf "$part" # another cluster kept it first
  fi
}

host_keys() { # host i's own keys folder: its own Celery pair (the control plane's store gets its certificate), the
  # control plane's certificate and the relay's public key — never relay.key (it cannot mint tickets) nor another
  # host's key or certificate (it cannot send tasks to another host).
  local mine=$DIR/h$1/keys
  rm -rf "$mine"
  "$PY" manage.py make_signing_keys --host "h$1" --into "$mine" >/dev/null
}

host_redis_user() { # host i's own Redis user (core.redis_acl: its own queues only); its password stays in its folder
  local file=$DIR/h$1/redis.password
  [ -s "$file" ] || (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$file")
  "$PY" manage.py redis_host_user --host "h$1" --password-file "$file" >/dev/null
}

host_registry_login() { # host i's own registry login (pull the catalog and its work's images, push what it saves); its password in its folder
  local file=$DIR/h$1/registry.password
  [ -s "$file" ] || (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$file")
  DATABASE_URL=$(owner_url) "$PY" manage.py registry_host_user --host "h$1" --password-file "$file" >/dev/null
}

host_agent_up() {
  local i=$1 cards=$2 ns
  ns=$(host_ns "$i")
  mkdir -p "$DIR/h$i/volumes"
  host_keys "$i"
  host_redis_user "$i"
  host_registry_login "$i"
  # Its addresses and secrets are its host's own (the control plane's settings are replaced).
  local -a environment
  mapfile -t environment < <(host_env "$i" "$cards")
  spawn "h$i-agent" nsenter --net="/var/run/netns/$ns" env "${environment[@]}" \
    "$PY" manage.py node_agent --name "h$i" --concurrency "${CLUSTER_AGENT_CONCURRENCY:-2}" \
    --slow-concurrency "${CLUSTER_SLOW_CONCURRENCY:-1}"
}

host_registered() { # the node is active and its agent reached the database from the host's address
  [ "$(PSQL_DB=$DB_NAME psql_admin "SELECT status || ' ' || address FROM scheduler_node WHERE name = 'h$1'")" = "active $(host_addr "$1")" ]
}

host_up() { # host_up <i> [cards]
  local i=$1 cards=${2:-}
  in_range "$i" 1 200 || die "a host number is 1-200, not '$i'"
  [ -n "$cards" ] || { local var="CLUSTER_CARDS_$i"; cards=${!var:-$(default_cards "$i")}; }
  [ -e "/var/run/netns/$(host_ns "$i")" ] && die "host $i already exists (cluster.sh down first)"
  say "host h$i: namespace $(host_ns "$i") at $(host_addr "$i"), $cards"
  host_net_up "$i"
  host_routes "$i"
  host_dockerd_up "$i"
  wait_for 60 "host h$i's Docker engine" docker -H "unix://$(host_sock "$i")" info
  host_images "$i"
  # Its role, in the node group (which db_roles granted): the list of hosts gains it, one host at a time.
  (
    flock 9
    grep -qx "h$i=.*" "$DIR/db_node_roles" 2>/dev/null || echo "h$i=$NODE_DB_PASSWORD" >>"$DIR/db_node_roles"
    db_login_roles
  ) 9>"$DIR/db_roles.lock"
  host_agent_up "$i" "$cards"
}

veth_check() { # veth_check <i>...: these agents' database and Redis connections come from their hosts' addresses
  local addrs clients i stray
  local -a all
  mapfile -t all < <(host_numbers)
  addrs=$(PSQL_DB=$DB_NAME psql_admin \
    "SELECT DISTINCT host(client_addr) FROM pg_stat_activity WHERE usename LIKE '${DB_OWNER}\_node\_%'" | sort -u)
  clients=$(redis-cli -h "$CP" -a "$REDIS_PASSWORD" --no-auth-warning CLIENT LIST | grep -o 'addr=[0-9.]*' | cut -d= -f2)
  for i in "$@"; do
    grep -qx "$(host_addr "$i")" <<<"$addrs" || die "host h$i's agent has no database connection from $(host_addr "$i")"
    grep -qx "$(host_addr "$i")" <<<"$clients" || die "host h$i's agent has no Redis connection from $(host_addr "$i")"
  done
  # ... and no node-role connection comes from anywhere else (a unix socket, loopback, the bridge).
  stray=$(grep -vxF -f <(for i in "${all[@]}"; do host_addr "$i"; done) <<<"$addrs" || true)
  [ -z "$stray" ] || die "node-role database connections from unexpected addresses: $stray"
  say "agents reach PostgreSQL and Redis over the veths from: $(tr '\n' ' ' <<<"$addrs")"
}

wait_hosts() {
  local i
  for i in "$@"; do
    LOG_TAIL="$LOG/h$i-agent.log" wait_for 90 "host h$i's node agent (registration)" host_registered "$i"
  done
  # Registration was over the database; the broker connection comes with the worker, just after.
  for _ in $(seq 60); do (veth_check "$@") >/dev/null 2>&1 && break; sleep 0.5; done
  veth_check "$@"
}

# --- stopping ---

host_numbers() { # hosts of this prefix that exist (namespaces or recorded processes)
  {
    ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^${PREFIX}h\([0-9]\+\)$/\1/p"
    find "$RUN" -maxdepth 1 -name 'h*-*.pid' 2>/dev/null | sed -n 's|.*/h\([0-9]\+\)-.*|\1|p'
  } | sort -nu
}

host_down() {
  local i=$1 sock ns
  sock=$(host_sock "$i") ns=$(host_ns "$i")
  stop_process "h$i-agent" 20
  # Its file-storage client, before the metadata service goes (a client that cannot reach it never ends).
  local mnt=$DIR/h$i/sharedfs/mnt
  if mountpoint -q "$mnt" 2>/dev/null; then
    timeout 20 nsenter --net="/var/run/netns/$ns" "$(dirname "$PY")/juicefs" umount --force "$mnt" >/dev/null 2>&1 ||
      umount -l "$mnt" 2>/dev/null || true
  fi
  pkill -KILL -f -- "--log $DIR/h$i/sharedfs/" 2>/dev/null || true # a client that lost its metadata service
  if [ -S "$sock" ] && pid_of "h$i-dockerd" >/dev/null; then
    local running
    running=$(timeout 20 docker -H "unix://$sock" ps -q 2>/dev/null || true)
    # Stopped first: with --live-restore the engine going down would leave them running.
    # shellcheck disable=SC2086  # one id per word
    [ -z "$running" ] || timeout 60 docker -H "unix://$sock" stop -t 5 $running >/dev/null 2>&1 || true
  fi
  stop_process "h$i-dockerd" 40
  # A crash may have left the engine's own processes without our record: their pid files say.
  local file pid
  for file in "$RUN/h$i/dockerd.pid" "$RUN/h$i/containerd/containerd.pid"; do
    pid=$(cat "$file" 2>/dev/null) || continue
    if grep -qF "$RUN/h$i" "/proc/$pid/cmdline" 2>/dev/null; then kill -KILL "$pid"; fi
  done
  # Whatever the engine left mounted (a crash): container root filesystems, netns files.
  grep -E " ($RUN/h$i|$DIR/h$i)[/ ]" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  ip link del "${PREFIX}v$i" 2>/dev/null || true
  rm -rf "${RUN:?}/h$i" "$sock"
}

down() {
  local i
  stop_process scheduler 30
  for i in $(host_numbers); do host_down "$i" & done
  wait
  stop_process websocket 20 &
  stop_process web 30 &
  wait
  stop_process registry 10
  rm -rf "/etc/docker/certs.d/$REGISTRY"
  stop_process redis 10
  pg_paths
  if [ -n "$PG_BIN" ] && [ -s "$PG_DATA/postmaster.pid" ]; then
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null 2>&1 || true
  fi
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$RUN"
}

status() {
  local name pid i state
  echo "control plane at $CP (bridge $BRIDGE), console http://127.0.0.1:$WEB_PORT/"
  for name in redis web websocket scheduler; do
    if pid=$(pid_of "$name"); then state="running (pid $pid)"; else state="stopped"; fi
    printf '  %-10s %s\n' "$name" "$state"
  done
  pg_paths
  if [ -n "$PG_BIN" ] && runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    printf '  %-10s %s\n' postgres "running"
  else
    printf '  %-10s %s\n' postgres "stopped"
  fi
  for i in $(host_numbers); do
    local node="" engine="stopped" agent="stopped" conns=""
    pid_of "h$i-dockerd" >/dev/null && engine="running"
    pid_of "h$i-agent" >/dev/null && agent="running"
    if [ -S "$RUN/pg/.s.PGSQL.5432" ]; then
      node=$(PSQL_DB=$DB_NAME psql_admin "SELECT status FROM scheduler_node WHERE name = 'h$i'" 2>/dev/null || true)
      conns=$(PSQL_DB=$DB_NAME psql_admin "SELECT count(*) FROM pg_stat_activity WHERE client_addr = '$(host_addr "$i")'" 2>/dev/null || true)
    fi
    printf '  h%-3s %-15s engine %-8s agent %-8s node %-8s db connections from it: %s\n' \
      "$i" "$(host_addr "$i")" "$engine" "$agent" "${node:--}" "${conns:--}"
  done
}

banner() {
  cat <<MSG

  GPU cloud on $(host_numbers | wc -l) hosts:  http://127.0.0.1:$WEB_PORT/  (also http://$CP:8000/)
  sign in as  demo / demo-pass-123   (admin: admin / admin-pass-123, at /admin/; tokens in $DIR/demo-users.txt)
  hosts:      $(for i in $(host_numbers); do printf 'h%s=%s ' "$i" "$(host_addr "$i")"; done)
  engines:    docker -H unix://$RUN/h<I>.sock ps      (a shell on host I: nsenter --net=/var/run/netns/${PREFIX}h<I>)
  logs:       $LOG/
  add a host: config/dev/cluster.sh add-host $(($(host_numbers | tail -1) + 1)) sim:4xH100      stop: make cluster-down

MSG
}

preflight() {
  [ "$(id -u)" = 0 ] || die "run as root: it creates network namespaces and Docker engines"
  [ -x "$PY" ] || die "no Python at $PY: run 'make' first (it creates .venv) or set PYTHON"
  need nsenter util-linux
  need ip iproute2
  need dockerd docker.io
  need iptables iptables
  need redis-server redis-server
  need redis-cli redis-tools
  need curl curl
  ((${CLUSTER_DOCKER_DISK_GB:-64} == 0)) || need mkfs.btrfs btrfs-progs
  [ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || need busybox busybox-static
  [ -n "$PG_BIN" ] || { need psql postgresql; PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -1); }
  mkdir -p "$DIR" "$LOG" "$RUN"
}

command=${1:-up}
shift || true
case $command in
  up)
    preflight
    count=${1:-${N:-3}}
    in_range "$count" 1 200 || die "up takes a number of hosts, not '$count'"
    say "cleaning up what a previous run left ..."
    down
    mkdir -p "$RUN"
    secrets
    control_env
    echo "$WEB_PORT" >"$DIR/web-port"
    say "control plane on $CP (logs $LOG/)"
    bridge_up
    control_plane_up
    for i in $(seq "$count"); do host_up "$i"; done
    mapfile -t hosts < <(seq "$count")
    wait_hosts "${hosts[@]}"
    scheduler_up
    banner
    ;;
  add-host)
    preflight
    [ $# -ge 1 ] || die "usage: cluster.sh add-host <number> [sim:<N>x<MODEL>]"
    pid_of web >/dev/null || die "the cluster is not running: cluster.sh up first"
    secrets
    control_env
    host_up "$1" "${2:-}"
    wait_hosts "$1"
    say "host h$1 registered"
    ;;
  down)
    [ "$(id -u)" = 0 ] || die "run as root"
    down
    if [ "${1:-}" = --purge ]; then
      [ ! -d "$DIR" ] || find "$DIR" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf {} +
      pg_paths && [ "$PG_DATA" = "$DIR/pg" ] || rm -rf "${PG_DATA:?}"
      say "stopped; state deleted (logs kept in $LOG/)"
    else
      say "stopped (state kept in $DIR; down --purge deletes it)"
    fi
    ;;
  status) status ;;
  env)
    [ -d "$DIR" ] || die "no cluster in $DIR (cluster.sh up first)"
    secrets
    if [ -n "${1:-}" ]; then
      var="CLUSTER_CARDS_$1"
      host_env "$1" "${!var:-$(default_cards "$1")}"
    else
      control_env
      echo "DATABASE_URL=$DATABASE_URL"
      echo "OWNER_DATABASE_URL=$(owner_url)"
      echo "REDIS_URL=$REDIS_URL"
      echo "WEB_URL=http://127.0.0.1:$WEB_PORT"
      echo "LAN_WEB_URL=http://$CP:8000"
      echo "WEBSOCKET_URL=$WEBSOCKET_URL"
      echo "DEPLOYMENT_ID=$DEPLOYMENT_ID"
      echo "SECRET_KEY=$SECRET_KEY"
      echo "DOCKER_SOCKETS=$RUN/h<I>.sock"
    fi
    ;;
  *) die "usage: cluster.sh up [N] | add-host I [CARDS] | status | down [--purge] | env [I]" ;;
esac
