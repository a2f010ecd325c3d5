#!/bin/sh
# Redis 7 from Debian's packages: append-only file in /data, a password for every client.
set -eu
: "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
mkdir -p /data && chown redis:redis /data
exec runuser -u redis -- redis-server --bind 0.0.0.0 --port 6379 --protected-mode no --dir /data \
  --appendonly yes --requirepass "$REDIS_PASSWORD" "$@"
