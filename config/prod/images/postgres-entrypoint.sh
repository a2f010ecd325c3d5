#!/bin/sh
# PostgreSQL 15 from Debian's packages. On first start (an empty data directory) it creates the
# cluster, and the platform's database owned by POSTGRES_USER (a login role, neither a superuser nor
# able to make roles: `manage.py db_roles` runs as it to grant each part's role its tables). The superuser
# `postgres` logs in only over the local socket inside this container: at every start, before the server
# listens, it makes the login roles (gpucloud-roles: the web tier's and each GPU server's, from
# DB_WEB_PASSWORD and DB_NODE_ROLES). Over TCP, only the addresses in
# POSTGRES_ALLOWED_CIDRS (the control plane's own network) and POSTGRES_TLS_CIDRS (the GPU servers, over TLS
# only: their passwords and rows cross the LAN) may try a password: the client authentication file is written
# from them at every start (hba_file), so changing a list needs a restart only. TLS: the certificate and key
# mounted at /tls (cert.pem, key.pem: the deployment's TLS_DIR), copied where only postgres reads the key.
set -eu
# POSTGRES_PASSWORD may come from the file POSTGRES_PASSWORD_FILE names (the stack's SECRETS_DIR), as in the
# official image; gpucloud-roles reads DB_WEB_PASSWORD_FILE and DB_NODE_ROLES_FILE so.
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
  POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
  export POSTGRES_PASSWORD
fi
: "${POSTGRES_ALLOWED_CIDRS:?set POSTGRES_ALLOWED_CIDRS to the addresses that may connect (CIDRs, space-separated)}"
POSTGRES_TLS_CIDRS=${POSTGRES_TLS_CIDRS:-}
: "${PGDATA:=/var/lib/postgresql/data}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" "${POSTGRES_USER:=gpucloud}" "${POSTGRES_DB:=gpucloud}"
  mkdir -p "$PGDATA" /run/postgresql
  chown -R postgres:postgres "$PGDATA" /run/postgresql
  chmod 700 "$PGDATA"
  runuser -u postgres -- initdb -D "$PGDATA" -U postgres -E UTF8 --locale=C.UTF-8 \
    --auth-local=peer --auth-host=scram-sha-256 >/dev/null
  {
    echo "listen_addresses = '*'"
    echo "password_encryption = 'scram-sha-256'"
  } >>"$PGDATA/postgresql.conf"
  runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  # The password from the environment (psql's \getenv), never on psql's command line.
  export POSTGRES_PASSWORD POSTGRES_USER POSTGRES_DB
  runuser -u postgres -- psql -v ON_ERROR_STOP=1 -q -d postgres <<'SQL'
\getenv user POSTGRES_USER
\getenv password POSTGRES_PASSWORD
\getenv db POSTGRES_DB
CREATE ROLE :"user" LOGIN PASSWORD :'password';
CREATE DATABASE :"db" OWNER :"user";
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
SQL
  runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "database $POSTGRES_DB created, owned by $POSTGRES_USER"
fi
mkdir -p /run/postgresql && chown postgres:postgres /run/postgresql
tls=""
if [ -s /tls/cert.pem ] && [ -s /tls/key.pem ]; then
  install -o postgres -g postgres -m 644 /tls/cert.pem /run/postgresql/server.crt
  install -o postgres -g postgres -m 600 /tls/key.pem /run/postgresql/server.key
  tls="-c ssl=on -c ssl_cert_file=/run/postgresql/server.crt -c ssl_key_file=/run/postgresql/server.key"
elif [ -n "$POSTGRES_TLS_CIDRS" ]; then
  echo "POSTGRES_TLS_CIDRS needs a certificate: mount cert.pem and key.pem at /tls" >&2
  exit 1
fi
cidr_checked() {
  case $1 in
    */*) ;;
    *) echo "$2: '$1' is not an address with its prefix length (10.0.0.0/24, 10.0.0.5/32)" >&2; exit 1 ;;
  esac
}
hba=/run/postgresql/pg_hba.conf
{
  echo "# written at start from POSTGRES_ALLOWED_CIDRS and POSTGRES_TLS_CIDRS; anything else is refused before"
  echo "# its password is asked, and a GPU server without TLS too"
  echo "local all all peer"
  for cidr in $POSTGRES_TLS_CIDRS; do
    cidr_checked "$cidr" POSTGRES_TLS_CIDRS
    echo "hostnossl all all $cidr reject"
    echo "hostssl all all $cidr scram-sha-256"
  done
  for cidr in $POSTGRES_ALLOWED_CIDRS; do
    cidr_checked "$cidr" POSTGRES_ALLOWED_CIDRS
    echo "host all all $cidr scram-sha-256"
  done
} >"$hba"
chown postgres:postgres "$hba"
# The login roles, made by the superuser on a server that listens on nothing yet (only its socket here).
runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
if ! gpucloud-roles; then
  runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  exit 1
fi
runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
# shellcheck disable=SC2086 # $tls: separate arguments
exec runuser -u postgres -- postgres -D "$PGDATA" -c hba_file="$hba" $tls "$@"
