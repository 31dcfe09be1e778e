#!/usr/bin/env bash
# Runs the mesh as containers with docker-compose: builds the binaries and the sandbox image
# (with the supervisor, on debootstrapped Debian: deploy/images/build.sh), puts the binaries
# into the mesh image's build context, has compose build the mesh image, then starts NATS and
# every service. Arguments go to `up -d`, e.g.
#   scripts/compose-up.sh --scale risk-assessor=2 --scale docker-executor=2
# SANDMESH_BUILD_PROFILE=dev uses the debug build; SANDMESH_NATS_PORT (4222) is where NATS is
# published on 127.0.0.1. Stop with `docker-compose down` (add -v to drop the credentials and
# the JetStream data).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tools.sh
if docker-compose version >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  echo "neither docker-compose nor the docker compose plugin is installed" >&2
  exit 1
fi
profile=${SANDMESH_BUILD_PROFILE:-release}
cargo build --profile "$profile" -p sandmesh -p sandmesh-supervisor
dir=$profile
[ "$profile" = dev ] && dir=debug
bin="${CARGO_TARGET_DIR:-$PWD/target}/$dir"
SANDMESH_EXEC_IMAGE=$(SUPERVISOR_BIN="$bin/sandmesh-supervisor" deploy/images/build.sh)
export SANDMESH_EXEC_IMAGE
# The mesh image's build context (git-ignored): its Dockerfile and the two binaries, debug
# symbols stripped (they only make the layer big).
export SANDMESH_MESH_CONTEXT=${SANDMESH_MESH_CONTEXT:-$PWD/deploy/compose/context}
mkdir -p "$SANDMESH_MESH_CONTEXT"
cp deploy/compose/Dockerfile "$SANDMESH_MESH_CONTEXT/"
install -m 0755 "$bin/sandmesh" .tools/bin/nats-server "$SANDMESH_MESH_CONTEXT/"
strip --strip-debug "$SANDMESH_MESH_CONTEXT/sandmesh" 2>/dev/null || true
# The classic builder: FROM the local-only base never contacts a registry.
DOCKER_BUILDKIT=0 "${compose[@]}" build auth
"${compose[@]}" up -d "$@"
echo "mesh is starting; a client connects as: ${compose[*]} exec nats cat /auth/creds/agent.json" >&2
