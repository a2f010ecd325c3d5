#!/usr/bin/env bash
# A self-signed certificate for trying the stack (config/prod/smoke.sh): DIR/cert.pem and DIR/key.pem
# for the names and addresses given, valid 30 days; kept if present. Production puts a real
# certificate (full chain) and its key there instead, e.g. from Let's Encrypt (certbot certonly).
#   config/prod/make_tls.sh var/prodstack/tls 10.250.0.2 localhost
set -euo pipefail
dir=$1; shift
[ -s "$dir/cert.pem" ] && [ -s "$dir/key.pem" ] && exit 0
mkdir -p "$dir"
san=""
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$|: ]]; then san+="IP:$name,"; else san+="DNS:$name,"; fi
done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -subj "/CN=$1" -addext "subjectAltName=${san%,}" -addext "basicConstraints=critical,CA:TRUE" \
  -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
chmod 600 "$dir/key.pem"
echo "self-signed certificate for $*: $dir/cert.pem" >&2
