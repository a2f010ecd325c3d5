#!/bin/sh
# The CNCF distribution registry (Debian's docker-registry): images on /var/lib/docker-registry. TLS is the
# proxy's: it serves /v2/ on the platform's HTTPS address. Who may do what:
# - token mode (REGISTRY_TOKEN_REALM set, the web tier's /registry/token/): the token server grants each caller
#   its own (every GPU server logs in there as itself: manage.py registry_host_user); the registry trusts the
#   certificate of the control plane's token key, mounted at /etc/docker/registry/token-issuer.pem, from the
#   issuer REGISTRY_TOKEN_ISSUER (gpucloud-<DEPLOYMENT_ID>);
# - else one user (REGISTRY_USERNAME / REGISTRY_PASSWORD, bcrypt in an htpasswd file made at start).
set -eu
config=/etc/docker/registry/config.yml
if [ -n "${REGISTRY_TOKEN_REALM:-}" ]; then
  : "${REGISTRY_TOKEN_ISSUER:?set REGISTRY_TOKEN_ISSUER (the control plane's: gpucloud-<DEPLOYMENT_ID>)}"
  issuer_cert=/etc/docker/registry/token-issuer.pem
  if [ ! -s "$issuer_cert" ]; then
    echo "token mode: mount the control plane's registry-token.pem (make_signing_keys) at $issuer_cert" >&2
    exit 1
  fi
  config=/tmp/config.yml
  sed '/^auth:/,$d' /etc/docker/registry/config.yml >"$config"
  printf 'auth:\n  token:\n    realm: %s\n    service: %s\n    issuer: %s\n    rootcertbundle: %s\n' \
    "$REGISTRY_TOKEN_REALM" "${REGISTRY_TOKEN_SERVICE:-gpucloud-registry}" "$REGISTRY_TOKEN_ISSUER" "$issuer_cert" \
    >>"$config"
  chmod 644 "$config"
else
  # The password, or the file REGISTRY_PASSWORD_FILE names (the stack's SECRETS_DIR).
  if [ -n "${REGISTRY_PASSWORD_FILE:-}" ]; then REGISTRY_PASSWORD=$(cat "$REGISTRY_PASSWORD_FILE"); fi
  : "${REGISTRY_USERNAME:?set REGISTRY_USERNAME}" "${REGISTRY_PASSWORD:?set REGISTRY_PASSWORD or REGISTRY_PASSWORD_FILE}"
  mkdir -p /etc/docker/registry/auth
  # The password on htpasswd's standard input (-i), never on its command line, where `ps` shows it.
  printf %s "$REGISTRY_PASSWORD" | htpasswd -iBn "$REGISTRY_USERNAME" >/etc/docker/registry/auth/htpasswd
fi
chown -R docker-registry /var/lib/docker-registry
exec runuser -u docker-registry -- docker-registry serve "$config"
