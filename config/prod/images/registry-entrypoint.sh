#!/bin/sh
# The CNCF distribution registry (Debian's docker-registry): images on /var/lib/docker-registry,
# one user (REGISTRY_USERNAME / REGISTRY_PASSWORD, bcrypt in an htpasswd file made at start). TLS is the
# proxy's: it serves /v2/ on the platform's HTTPS address.
set -eu
: "${REGISTRY_USERNAME:?set REGISTRY_USERNAME}" "${REGISTRY_PASSWORD:?set REGISTRY_PASSWORD}"
mkdir -p /etc/docker/registry/auth
htpasswd -Bbn "$REGISTRY_USERNAME" "$REGISTRY_PASSWORD" >/etc/docker/registry/auth/htpasswd
chown -R docker-registry /var/lib/docker-registry
exec runuser -u docker-registry -- docker-registry serve /etc/docker/registry/config.yml
