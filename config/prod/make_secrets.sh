#!/bin/sh
# The production stack's secrets, one file each, in a folder only root can enter (SECRETS_DIR in prod.env for the
# control plane, NODE_SECRETS_DIR in a GPU server's node.env). docker-compose mounts into each service only the
# files it needs; the programs read them through NAME_FILE (config/settings.py, the images' entrypoints). So no
# secret is in prod.env, on a command line, or in `docker inspect`.
#
#   config/prod/make_secrets.sh control DIR [HOST ...]   the control plane's, and a password for each GPU server
#   config/prod/make_secrets.sh node DIR                 a GPU server's (its passwords: from the control plane's
#                                                        folder, hosts/<name>/; see README "Deploying")
#
# A file already there is kept (run it again after adding a host: only that host's passwords are new). Values are
# random (48 hex digits; the Django key 64), but for the shared storage's (its metadata database's password, its
# data store's secret key: the operator's to write into the empty files made here, when the storage needs them). Files the control plane's unprivileged processes read (uid 10001) are
# theirs, mode 400; the others root's, mode 400.
set -eu
usage() { echo "usage: $0 control DIR [HOST ...] | node DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
kind=$1 dir=$2
shift 2
APP_UID=${APP_UID:-10001}
random() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
own() {  # FILE OWNER: FILE readable by OWNER alone
  chown "$2" "$dir/$1"
  chmod 400 "$dir/$1"
}
put() {  # FILE VALUE OWNER: write FILE unless it is there
  if [ ! -s "$dir/$1" ]; then
    (umask 077 && printf '%s\n' "$2" >"$dir/$1")
  fi
  own "$1" "$3"
}
optional() {  # FILE OWNER: a secret chosen elsewhere (the shared storage's), empty until the operator writes it
  [ -e "$dir/$1" ] || (umask 077 && : >"$dir/$1")
  own "$1" "$2"
}
umask 077
mkdir -p "$dir"
chmod 700 "$dir"
case $kind in
  control)
    put secret_key "$(random 32)" "$APP_UID:$APP_UID"
    put postgres_password "$(random 24)" "$APP_UID:$APP_UID"  # the owner's: the migrate service
    put db_web_password "$(random 24)" "$APP_UID:$APP_UID"
    put redis_password "$(random 24)" "$APP_UID:$APP_UID"
    put registry_password "$(random 24)" "$APP_UID:$APP_UID"
    optional shared_fs_meta_password "$APP_UID:$APP_UID"
    optional shared_fs_secret_key "$APP_UID:$APP_UID"
    for host in "$@"; do
      case $host in "" | *[!A-Za-z0-9_-]*) echo "$host: not a host name (letters, digits, _ and -)" >&2; exit 1 ;; esac
      mkdir -p "$dir/hosts/$host"
      for name in database_password redis_password registry_password; do
        put "hosts/$host/$name" "$(random 24)" 0:0
      done
    done
    # PostgreSQL's list of the GPU servers' roles (postgres-roles.sh reads DB_NODE_ROLES_FILE): every host here.
    # Rewritten in place (the same file, which the postgres container has mounted): `docker-compose exec -T
    # postgres gpucloud-roles` then makes a new host's role without a restart.
    roles=""
    for path in "$dir"/hosts/*/database_password; do
      [ -e "$path" ] || continue
      host=$(basename "$(dirname "$path")")
      roles="$roles$host=$(cat "$path")
"
    done
    touch "$dir/db_node_roles"
    printf '%s' "$roles" >"$dir/db_node_roles"
    own db_node_roles 0:0
    ;;
  node)
    put secret_key "$(random 32)" 0:0
    optional shared_fs_meta_password 0:0
    optional shared_fs_secret_key 0:0
    for name in database_password redis_password registry_password; do
      [ -s "$dir/$name" ] || { echo "$dir/$name: copy it from the control plane's SECRETS_DIR/hosts/<this host>/" >&2; exit 1; }
      own "$name" 0:0
    done
    ;;
  *) usage ;;
esac
echo "secrets ready in $dir: $(cd "$dir" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ')"
