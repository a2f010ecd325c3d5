#!/bin/sh
# nginx, the stack's only published port. The image registry (/v2/) answers only the addresses in
# REGISTRY_ALLOWED_CIDRS (the stack's own network, whose containers reach it through the published port, and the
# GPU servers): anyone else gets 403 before the registry hears of them. The list is written at every start
# (changing it needs a restart only). nginx sees the address that connected to it: behind a load balancer that is
# the balancer's, so put the list on the balancer instead.
set -eu
: "${REGISTRY_ALLOWED_CIDRS:?set REGISTRY_ALLOWED_CIDRS to the addresses that may use the registry (CIDRs, space-separated)}"
allow=/run/nginx-registry-allow.conf
{
  echo "# written at start from REGISTRY_ALLOWED_CIDRS"
  for cidr in $REGISTRY_ALLOWED_CIDRS; do
    case $cidr in
      */*) ;;
      *) echo "REGISTRY_ALLOWED_CIDRS: '$cidr' is not an address with its prefix length (10.0.0.0/24)" >&2; exit 1 ;;
    esac
    case $cidr in
      *[!0-9a-fA-F.:/]*) echo "REGISTRY_ALLOWED_CIDRS: '$cidr' is not an address" >&2; exit 1 ;;
    esac
    echo "allow $cidr;"
  done
  echo "deny all;"
} >"$allow"
exec nginx -g "daemon off;"
