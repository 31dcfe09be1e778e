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
cargo build --profile "$profile" -p sandmesh -p sandmesh-supervisor
dir=$profile
[ "$profile" = dev ] && dir=debug
exec "${CARGO_TARGET_DIR:-target}/$dir/sandmesh" up --demo "$@"
