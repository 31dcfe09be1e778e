#!/usr/bin/env bash
# Runs the mesh as containers with docker-compose: builds the release binaries, the sandbox
# image (with the supervisor) and the mesh image, then starts NATS and every service.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tools.sh
cargo build --release -p sandmesh -p sandmesh-supervisor
SUPERVISOR_BIN="$PWD/target/release/sandmesh-supervisor" deploy/images/build.sh >/dev/null
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp target/release/sandmesh .tools/bin/nats-server deploy/compose/Dockerfile "$ctx/"
DOCKER_BUILDKIT=0 docker build -q -t sandmesh/mesh:latest "$ctx" >/dev/null
docker-compose up -d "$@"
echo "mesh is starting: SANDMESH_NATS_URL=nats://127.0.0.1:4222 target/release/sandmesh status" >&2
