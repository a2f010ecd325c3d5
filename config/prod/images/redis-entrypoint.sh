#!/bin/sh
# Redis 7 from Debian's packages: append-only file in /data, every client logs in. Its users are kept in
# /data/users.acl: the administrator (Redis's "default" user: the control plane) with REDIS_PASSWORD, rewritten at
# every start, and each GPU server's own user (`manage.py redis_host_user`, which saves the file: core.redis_acl).
# Only the password's SHA-256 is written, and never on a command line (where `ps` shows it to anyone on the host).
# (With an ACL file Redis ignores `requirepass`: the default user's line here is what protects it.)
# TLS: with the certificate and key mounted at /tls (DATA_TLS_DIR's cert.pem, key.pem), Redis also listens on 6380
# over TLS, the port the stack publishes to the GPU servers; 6379, without TLS, stays on the stack's own network.
set -eu
# The password, or the file REDIS_PASSWORD_FILE names (the stack's SECRETS_DIR).
if [ -n "${REDIS_PASSWORD_FILE:-}" ]; then REDIS_PASSWORD=$(cat "$REDIS_PASSWORD_FILE"); fi
: "${REDIS_PASSWORD:?set REDIS_PASSWORD or REDIS_PASSWORD_FILE}"
mkdir -p /data /run/redis && chown redis:redis /data /run/redis
umask 077
acl=/data/users.acl
touch "$acl"
hash=$(printf %s "$REDIS_PASSWORD" | sha256sum | cut -d' ' -f1)
unset REDIS_PASSWORD
{
  echo "user default on #$hash ~* &* +@all"
  grep -v '^user default ' "$acl" || true
} >"$acl.new"
mv "$acl.new" "$acl"
chown redis:redis "$acl"
if [ -s /tls/cert.pem ] && [ -s /tls/key.pem ]; then
  install -o redis -g redis -m 644 /tls/cert.pem /run/redis/tls.crt
  install -o redis -g redis -m 600 /tls/key.pem /run/redis/tls.key
  set -- --tls-port 6380 --tls-cert-file /run/redis/tls.crt --tls-key-file /run/redis/tls.key --tls-auth-clients no "$@"
fi
exec runuser -u redis -- redis-server --aclfile "$acl" --bind 0.0.0.0 --port 6379 --protected-mode no \
  --dir /data --appendonly yes "$@"
