#!/usr/bin/env bash
# E2B's official SDKs (e2b, e2b-code-interpreter) and frameworks built on them (smolagents,
# langchain-e2b), unmodified, against the gateway's E2B facade on a real mesh: installs the pinned
# requirements into a cached venv (tmp/e2b-sdk-venv in the build directory, reinstalled when
# requirements.txt changes), makes sure the binaries the mesh needs exist, and runs pytest. The
# session fixture is the Python SDK's (clients/python/tests/meshfixture.py): it starts
# `target/debug/sandmesh up` on free loopback ports, here with SANDMESH_E2B_ADDR, and stops it at
# the end.
#
#   services/gateway/e2b-tests/run.sh               # everything
#   services/gateway/e2b-tests/run.sh -k approval   # extra arguments go to pytest
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
cd "$root"

target_dir="${CARGO_TARGET_DIR:-$root/target}"
venv="$target_dir/tmp/e2b-sdk-venv"
scripts/python-venv.sh "$venv" "$(sha256sum "$here/requirements.txt" | cut -c1-64)" \
  -r "$here/requirements.txt"

missing=()
for bin in sandmesh sandmesh-supervisor sandmesh-aio-agent; do
  [ -x "$target_dir/debug/$bin" ] || missing+=("-p" "$bin")
done
if [ ${#missing[@]} -gt 0 ]; then
  # All three, as scripts/test.sh builds them: the same features, so nothing recompiles.
  echo "e2b-tests: building the mesh's binaries (${missing[*]} missing)" >&2
  cargo build -p sandmesh -p sandmesh-aio-agent -p sandmesh-supervisor
fi
export SANDMESH_BIN="${SANDMESH_BIN:-$target_dir/debug/sandmesh}"
export SANDMESH_NATS_SERVER="${SANDMESH_NATS_SERVER:-$root/.tools/bin/nats-server}"

status=0
(cd "$here" && "$venv/bin/python" -m pytest -q -rfE -p no:cacheprovider "$@") || status=$?
if [ "$status" -eq 5 ]; then
  echo "e2b-tests: no tests were collected: that is a failure" >&2
  exit 1
fi
exit "$status"
