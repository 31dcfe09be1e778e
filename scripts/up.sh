#!/usr/bin/env bash
# Brings the whole mesh up on this machine and runs a sample execution: installs a current
# nats-server into .tools/bin, builds sandmesh, builds the sandbox image from Debian packages
# when missing, starts NATS (data in .sandmesh/) and every service in one process.
# Extra arguments go to `sandmesh up` (e.g. --once to stop after the sample).
# SANDMESH_BUILD_PROFILE=dev uses the debug build (CI, right after the tests built it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tools.sh
if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  echo "the Docker daemon does not answer: start it (sandboxes are Docker containers)" >&2
  exit 1
fi
profile=${SANDMESH_BUILD_PROFILE:-release}
# The sandbox image's layers below the supervisor (a Debian root filesystem, then Python and
# Node) need no binary of ours: on a fresh machine they build (downloads, disk) while cargo
# compiles (CPU), and `up` then adds the supervisor in seconds.
mkdir -p .sandmesh
RUNTIME_ONLY=1 deploy/images/build.sh sandbox >/dev/null 2>.sandmesh/sandbox-image.log &
runtime_image=$!
# The AIO agent goes into the AIO image `up` builds; found beside `sandmesh`, it needs no
# build of its own. (The same packages as the tests build: the same features.)
cargo build --profile "$profile" -p sandmesh -p sandmesh-aio-agent -p sandmesh-supervisor
if kill -0 "$runtime_image" 2>/dev/null; then
  echo "waiting for the sandbox image's Debian layers (log: .sandmesh/sandbox-image.log)" >&2
fi
if ! wait "$runtime_image"; then
  # `up` builds the image itself and reports what fails; the log says what went wrong here.
  echo "building the sandbox image's Debian layers failed (see .sandmesh/sandbox-image.log)" >&2
fi
dir=$profile
[ "$profile" = dev ] && dir=debug
exec "${CARGO_TARGET_DIR:-target}/$dir/sandmesh" up --demo "$@"
