#!/usr/bin/env bash
# Builds the browser-router's Chromium image locally from Debian packages.
#
#   IMG=$(deploy/images/build-browser.sh)   # -> sandmesh/browser:<12 hex>, also :latest
#
# Progress goes to stderr; the only stdout line is the image reference. Idempotent: the tag is
# a sha256 of the Chromium layer's id and every file in browser/, and an existing tag is reused
# ("up to date"). The Chromium layer (sandmesh/chromium, shared with the AIO image, on the
# base sandmesh/debian:bookworm) comes from `build.sh chromium`, a no-op when it is up to
# date. REBUILD=1 builds without cache; BUILD_NETWORK as in build.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly REPO=sandmesh/browser
readonly REBUILD=${REBUILD:-0}

log() { printf 'build-browser.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
image_id() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

command -v docker >/dev/null || die "docker not found"
# Before this script's lock: build.sh takes the same one.
BASE_TAG=$("$here/build.sh" chromium)
readonly BASE_TAG
base_id=$(image_id "$BASE_TAG")
[ -n "$base_id" ] || die "base image $BASE_TAG not found"

# Same lock as build.sh: one image build at a time on this host.
if command -v flock >/dev/null; then
    exec 9>"${XDG_RUNTIME_DIR:-/tmp}/sandmesh-images.lock"
    flock -n 9 || { log "waiting for another image build"; flock 9; }
fi

hash=$({ printf 'sandmesh-browser\nbase %s\n' "$base_id"
         (cd "$here/browser" && find . -type f | LC_ALL=C sort | while read -r f; do
              printf '%s %s %s\n' "$f" "$(stat -c %a "$f")" "$(sha256sum <"$f" | cut -c1-64)"
          done); } | sha256sum | cut -c1-64)
ref=$REPO:${hash:0:12}

if [ "$REBUILD" != 1 ] && [ -n "$(image_id "$ref")" ]; then
    log "up to date: $ref"
else
    args=(--force-rm --build-arg "BASE_IMAGE=$BASE_TAG" --label "org.sandmesh.hash=${hash:0:12}")
    if [ "$REBUILD" = 1 ]; then args+=(--no-cache); fi
    if [ -n "${BUILD_NETWORK:-}" ]; then args+=(--network "$BUILD_NETWORK"); fi
    for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        if [ -n "${!v:-}" ]; then args+=(--build-arg "$v"); fi
    done
    log "building $ref from $BASE_TAG"
    t0=$SECONDS
    DOCKER_BUILDKIT=0 docker build "${args[@]}" -t "$ref" "$here/browser" >&2
    log "built $ref in $((SECONDS - t0))s"
fi
docker tag "$ref" "$REPO:latest"
printf '%s\n' "$ref"
