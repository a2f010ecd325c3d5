#!/bin/sh
# Redis 7 from Debian's packages: append-only file in /data, a password for every client. The password goes in a
# configuration file only the redis user reads, never on a command line (where `ps` shows it to anyone on the host).
set -eu
: "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
mkdir -p /data /run/redis && chown redis:redis /data /run/redis
umask 077
printf 'requirepass "%s"\n' "$(printf %s "$REDIS_PASSWORD" | sed 's/[\\"]/\\&/g')" >/run/redis/secret.conf
chown redis:redis /run/redis/secret.conf
unset REDIS_PASSWORD
exec runuser -u redis -- redis-server /run/redis/secret.conf --bind 0.0.0.0 --port 6379 --protected-mode no \
  --dir /data --appendonly yes "$@"
