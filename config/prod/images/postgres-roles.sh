#!/bin/sh
# The platform's login roles, made by the superuser over the local socket: the database owner may not make roles.
# (CREATEROLE on PostgreSQL 15 is nearly a superuser: its holder may grant itself pg_execute_server_program and run
# programs as the server. No role the platform logs in as has it.) The entrypoint runs this at every start; the
# owner then grants each role its tables (`manage.py db_roles`, in the migrate service). From the environment
# (each also as NAME_FILE, a file holding the value, as the official image reads POSTGRES_PASSWORD_FILE):
#   POSTGRES_USER, POSTGRES_DB   the owner (left without CREATEROLE here, also where an older image gave it; a
#                                superuser owner, as development and tests have, is left as it is) and the
#                                platform's database
#   DB_ROLES_PREFIX              (gpucloud) <prefix>_web, the group <prefix>_node, <prefix>_node_<name> per host
#   DB_WEB_PASSWORD              the web tier's role's (WEB_DATABASE_URL)
#   DB_NODE_ROLES                "NAME=PASSWORD NAME=PASSWORD ..." one per GPU server; a host's role no longer listed
#                                may no longer log in, and its sessions are ended
#   NODE_DB_IDLE_TX_S            (30) a host's session idle inside a transaction this long is ended: a host cut off
#                                mid-transaction holds its work's rows no longer than that
# PSQL (a psql command line for the superuser: runuser -u postgres -- psql by default) and PGDATABASE-style
# variables let it run against another server: the tests' `roles` fixture and `make cluster` make their roles with
# it too (one way to make a role; `db_roles` only grants).
set -eu
file_env() {  # NAME: the value of NAME, or the contents of the file NAME_FILE names (one trailing newline dropped)
  eval "file=\${$1_FILE:-}"
  if [ -n "$file" ]; then
    eval "$1=\$(cat \"\$file\")"
    export "${1?}"
  fi
}
for name in POSTGRES_USER POSTGRES_DB DB_WEB_PASSWORD DB_NODE_ROLES; do file_env "$name"; done
: "${POSTGRES_USER:=gpucloud}" "${POSTGRES_DB:=gpucloud}" "${DB_ROLES_PREFIX:=gpucloud}" "${NODE_DB_IDLE_TX_S:=30}"
: "${DB_WEB_PASSWORD:?set DB_WEB_PASSWORD (the password in WEB_DATABASE_URL)}"
DB_NODE_ROLES=${DB_NODE_ROLES:-}
case $DB_ROLES_PREFIX in *[!a-z0-9_]* | "") echo "DB_ROLES_PREFIX: only a-z, 0-9 and _" >&2; exit 1 ;; esac
case $NODE_DB_IDLE_TX_S in *[!0-9]* | "") echo "NODE_DB_IDLE_TX_S: a whole number of seconds" >&2; exit 1 ;; esac

# The SQL names the roles and reads every password from the environment (psql's \getenv): no password in the
# SQL text or on a command line.
sql=$(mktemp)
trap 'rm -f "$sql"' EXIT
web=${DB_ROLES_PREFIX}_web group=${DB_ROLES_PREFIX}_node
export GPUCLOUD_ROLE_PW_web="$DB_WEB_PASSWORD"
cat >"$sql" <<SQL
\set ON_ERROR_STOP on
SET client_min_messages = warning;
\getenv owner POSTGRES_USER
\getenv db POSTGRES_DB
SELECT NOT rolsuper AS limited FROM pg_roles WHERE rolname = :'owner' \gset
\if :limited
ALTER ROLE :"owner" NOCREATEROLE;
\endif
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$group') AS missing \gset
\if :missing
CREATE ROLE "$group" NOLOGIN;
\endif
SQL
login_role() {  # ROLE KEY: create or update ROLE, logging in with the password in GPUCLOUD_ROLE_PW_KEY
  cat >>"$sql" <<SQL
\getenv password GPUCLOUD_ROLE_PW_$2
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$1') AS missing \gset
\if :missing
CREATE ROLE "$1" LOGIN PASSWORD :'password';
\else
ALTER ROLE "$1" LOGIN PASSWORD :'password';
\endif
SQL
}
login_role "$web" web
listed=""
i=0
for item in $DB_NODE_ROLES; do
  name=${item%%=*} password=${item#*=}
  case $item in *=*) ;; *) echo "DB_NODE_ROLES: NAME=PASSWORD, not '$name'" >&2; exit 1 ;; esac
  case $name in
    "" | *[!A-Za-z0-9_-]*) echo "DB_NODE_ROLES: '$name' is not a host name (letters, digits, _ and -)" >&2; exit 1 ;;
  esac
  [ -n "$password" ] || { echo "DB_NODE_ROLES: $name has no password" >&2; exit 1; }
  i=$((i + 1))
  role=${group}_$name
  [ ${#role} -le 63 ] || { echo "DB_NODE_ROLES: role $role is longer than 63 bytes: a shorter name" >&2; exit 1; }
  export "GPUCLOUD_ROLE_PW_$i=$password"
  login_role "$role" "$i"
  cat >>"$sql" <<SQL
GRANT "$group" TO "$role";
ALTER ROLE "$role" IN DATABASE :"db" SET idle_in_transaction_session_timeout = '${NODE_DB_IDLE_TX_S}s';
SQL
  listed="$listed${listed:+,}'$role'"
done
# A host taken off the list: its role may no longer log in, and what it has open now is ended.
cat >>"$sql" <<SQL
SELECT string_agg(format('ALTER ROLE %I NOLOGIN', r.rolname), ';') AS unlisted FROM pg_roles r
  JOIN pg_auth_members m ON m.member = r.oid JOIN pg_roles g ON g.oid = m.roleid
  WHERE g.rolname = '$group' AND r.rolcanlogin AND r.rolname NOT IN (${listed:-''}) \\gset
\\if :{?unlisted}
:unlisted;
SELECT count(pg_terminate_backend(a.pid)) AS ended FROM pg_stat_activity a JOIN pg_roles r ON r.rolname = a.usename
  WHERE NOT r.rolcanlogin AND a.usename LIKE '${group}\\_%' \\gset
\\endif
SQL
# The SQL on standard input: the file is root's, psql runs as postgres.
# shellcheck disable=SC2086 # PSQL: a command line
${PSQL:-runuser -u postgres -- psql} -X -q -d "$POSTGRES_DB" -f - <"$sql" >/dev/null
echo "roles ready: $web; $group for $i host(s)${listed:+ ($listed)}; $POSTGRES_USER without CREATEROLE"
