#!/usr/bin/env bash
# The platform's image registry: Debian's docker-registry (the CNCF distribution
# server 2.8) with htpasswd authentication and deletes enabled. This writes its
# configuration, or serves it:
#
#   config/dev/registry.sh write DIR [LISTEN]   DIR/config.yml, DIR/htpasswd, DIR/storage/
#   config/dev/registry.sh serve DIR            run it in the foreground (docker-registry serve)
#   config/dev/registry.sh gc DIR               free the layers of deleted images (while it is stopped)
#
# The one user and its password come from REGISTRY_USERNAME and REGISTRY_PASSWORD, the
# same the scheduler worker and the node agents are given. LISTEN is the address:port it
# listens on (default: REGISTRY, e.g. 127.0.0.1:5000; 0.0.0.0:5000 in a container).
#
# Token mode: with REGISTRY_TOKEN_REALM (the web tier's /registry/token/ URL, as the engines reach
# it) and REGISTRY_TOKEN_CERTIFICATE (the control plane's registry-token.pem: make_signing_keys),
# the registry takes bearer tokens from that token server instead of its one user: each host logs
# in as itself there (portal/services/registry_tokens.py). REGISTRY_TOKEN_SERVICE and
# REGISTRY_TOKEN_ISSUER must be the control plane's (defaults: gpucloud-registry, gpucloud-$DEPLOYMENT_ID).
#
# TLS: with REGISTRY_TLS_NAMES="10.231.0.1 registry.example" it serves HTTPS with a
# certificate for those addresses/names, signed by a CA made here once (DIR/ca.crt, kept
# when rewritten). Docker engines trust it per registry, no daemon flag or restart:
#   install -D -m 644 DIR/ca.crt /etc/docker/certs.d/$REGISTRY/ca.crt
# and the control plane is told with REGISTRY_CA_FILE=DIR/ca.crt. Without TLS, engines
# reach it only on loopback (127.0.0.0/8 is insecure by default) or with
# `dockerd --insecure-registry $REGISTRY`.
set -euo pipefail

die() { echo "ERROR: $*" >&2; exit 1; }

write() {
  local dir=$1 listen=${2:-${REGISTRY:-}}
  [ -n "$listen" ] || die "say where to listen: registry.sh write DIR HOST:PORT (or set REGISTRY)"
  mkdir -p "$dir/storage"
  dir=$(cd "$dir" && pwd)
  local auth
  if [ -n "${REGISTRY_TOKEN_REALM:-}" ]; then
    [ -f "${REGISTRY_TOKEN_CERTIFICATE:-}" ] ||
      die "REGISTRY_TOKEN_CERTIFICATE: name the control plane's registry-token.pem (make_signing_keys makes it)"
    [ -n "${REGISTRY_TOKEN_ISSUER:-}" ] || die "set REGISTRY_TOKEN_ISSUER (the control plane's: gpucloud-\$DEPLOYMENT_ID)"
    cp "$REGISTRY_TOKEN_CERTIFICATE" "$dir/token-issuer.pem"
    auth=$(printf '  token:\n    realm: %s\n    service: %s\n    issuer: %s\n    rootcertbundle: %s\n' \
      "$REGISTRY_TOKEN_REALM" "${REGISTRY_TOKEN_SERVICE:-gpucloud-registry}" "$REGISTRY_TOKEN_ISSUER" "$dir/token-issuer.pem")
  else
    [ -n "${REGISTRY_USERNAME:-}" ] && [ -n "${REGISTRY_PASSWORD:-}" ] ||
      die "set REGISTRY_USERNAME and REGISTRY_PASSWORD (the registry's one user), or REGISTRY_TOKEN_REALM"
    command -v htpasswd >/dev/null || die "htpasswd is missing: apt-get install apache2-utils"
    # bcrypt is the only hash the registry accepts; the password goes through stdin, not argv.
    printf '%s\n' "$REGISTRY_PASSWORD" | htpasswd -iBc "$dir/htpasswd" "$REGISTRY_USERNAME" 2>/dev/null
    chmod 600 "$dir/htpasswd"
    auth=$(printf '  htpasswd:\n    realm: gpucloud-registry\n    path: %s\n' "$dir/htpasswd")
  fi
  local tls=""
  if [ -n "${REGISTRY_TLS_NAMES:-}" ]; then
    tls_files "$dir" "$REGISTRY_TLS_NAMES"
    tls=$(printf '  tls:\n    certificate: %s/server.crt\n    key: %s/server.key\n' "$dir" "$dir")
  fi
  umask 077
  cat >"$dir/config.yml" <<YAML
# Written by config/dev/registry.sh; serve with: docker-registry serve $dir/config.yml
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: $listen
  secret: $(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  headers:
    X-Content-Type-Options: [nosniff]
${tls:+$tls
}auth:
$auth
YAML
  echo "wrote $dir/config.yml (listening on $listen${tls:+, TLS for $REGISTRY_TLS_NAMES}${REGISTRY_TOKEN_REALM:+, tokens from $REGISTRY_TOKEN_REALM})"
}

tls_files() {  # tls_files DIR "NAMES": a CA (made once) and a server certificate for NAMES signed by it
  local dir=$1 names=$2 san="" name
  for name in $names; do
    if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+="IP:$name,"; else san+="DNS:$name,"; fi
  done
  if [ ! -f "$dir/ca.crt" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj "/CN=gpucloud registry CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  fi
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=${names%% *}" \
    -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' "${san%,}" >"$dir/server.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 825 \
    -extfile "$dir/server.ext" -out "$dir/server.crt" 2>/dev/null
  rm -f "$dir/server.csr" "$dir/server.ext"
  chmod 600 "$dir/ca.key" "$dir/server.key"
}

serve() {
  local dir=$1
  [ -f "$dir/config.yml" ] || die "no $dir/config.yml: run registry.sh write $dir first"
  command -v docker-registry >/dev/null || die "docker-registry is missing: apt-get install docker-registry"
  exec docker-registry serve "$dir/config.yml"
}

gc() {  # deleting an image removes its manifest; its layers stay on disk until this runs
  local dir=$1
  [ -f "$dir/config.yml" ] || die "no $dir/config.yml"
  exec docker-registry garbage-collect --delete-untagged "$dir/config.yml"
}

case "${1:-}" in
  write) [ $# -ge 2 ] || die "usage: registry.sh write DIR [LISTEN]"; write "$2" "${3:-}" ;;
  serve) [ $# -eq 2 ] || die "usage: registry.sh serve DIR"; serve "$2" ;;
  gc) [ $# -eq 2 ] || die "usage: registry.sh gc DIR"; gc "$2" ;;
  *) die "usage: registry.sh write DIR [LISTEN] | registry.sh serve DIR | registry.sh gc DIR" ;;
esac
