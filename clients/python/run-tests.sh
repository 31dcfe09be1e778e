#!/usr/bin/env bash
# The Python SDK's tests (clients/python/tests) against a real mesh: installs the package with
# its test extra into a cached venv (tmp/python-sdk-venv in the build directory, kept with the
# build), makes sure the binaries the mesh needs exist, and runs pytest. The session fixture
# starts `target/debug/sandmesh up` on free loopback ports in a temporary directory and stops it
# at the end.
#
#   clients/python/run-tests.sh               # everything
#   clients/python/run-tests.sh -k approval   # extra arguments go to pytest
#
# SANDMESH_PY_SUITE=integrations runs the framework adapters' suites instead
# (tests-integrations/, their own venv with the frameworks pinned in
# requirements-integrations.txt): run-conformance.sh does.
#
# Exits non-zero when a test fails and when no test was collected.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

suite=${SANDMESH_PY_SUITE:-sdk}
case "$suite" in
  sdk) tests=tests; extras="test"; requirements=() ;;
  integrations) tests=tests-integrations; extras="test"; requirements=(requirements-integrations.txt) ;;
  *) echo "run-tests.sh: SANDMESH_PY_SUITE=$suite: expected sdk or integrations" >&2; exit 2 ;;
esac
venv="${CARGO_TARGET_DIR:-$root/target}/tmp/python-$suite-venv"
# Reinstalled only when the package's sources or the pinned requirements change (not what
# building the package leaves in src/, its egg-info).
stamp=$(cd "$here" && find pyproject.toml README.md src "${requirements[@]}" -type f ! -name '*.pyc' ! -path '*.egg-info/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64)
scripts/python-venv.sh "$venv" "$stamp" "$here[$extras]" "${requirements[@]/#/-r$here/}"

# The mesh's binaries: the CLI, and the two programs `up` puts into the sandbox and AIO images
# (found next to it; without them `up` would compile release builds of its own).
target="${CARGO_TARGET_DIR:-$root/target}/debug"
missing=()
for bin in sandmesh sandmesh-supervisor sandmesh-aio-agent; do
  [ -x "$target/$bin" ] || missing+=("-p" "$bin")
done
if [ ${#missing[@]} -gt 0 ]; then
  # All three, as scripts/test.sh builds them: the same features, so nothing recompiles.
  echo "run-tests.sh: building the mesh's binaries (${missing[*]} missing)" >&2
  cargo build -p sandmesh -p sandmesh-aio-agent -p sandmesh-supervisor
fi
export SANDMESH_BIN="${SANDMESH_BIN:-$target/sandmesh}"
export SANDMESH_NATS_SERVER="${SANDMESH_NATS_SERVER:-$root/.tools/bin/nats-server}"

report="${CARGO_TARGET_DIR:-$root/target}/python-$suite-junit.xml"
mkdir -p "$(dirname "$report")"
status=0
(cd "$here" && "$venv/bin/python" -m pytest -q -rfEX --junitxml="$report" "$tests" "$@") || status=$?
if [ "$status" -eq 5 ]; then
  echo "run-tests.sh: no tests were collected: that is a failure" >&2
  exit 1
fi
if [ -f "$report" ]; then
  "$venv/bin/python" - "$report" "$suite" <<'PY'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
count = lambda key: sum(int(s.get(key, 0)) for s in suites)
seconds = sum(float(s.get("time", 0)) for s in suites)
# junit reports an expected failure (a rule listed as not passing yet, with its reason) as
# skipped: counted apart, so a skip of any other kind stays visible.
xfailed = sum(1 for s in root.iter("skipped") if s.get("type") == "pytest.xfail")
print(f"python-{sys.argv[2]}: {count('tests')} tests, {count('failures')} failures, {count('errors')} errors, "
      f"{count('skipped') - xfailed} skipped, {xfailed} expected failures in {seconds:.1f} s "
      f"(junit: {sys.argv[1]})")
PY
fi
exit "$status"
