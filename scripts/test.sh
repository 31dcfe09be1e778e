#!/usr/bin/env bash
# The test command: installs what the tests need (a current nats-server into .tools/bin,
# debootstrap and bubblewrap through apt, the sandbox, browser and AIO images from Debian
# packages) and runs every test of the workspace against a real nats-server, the real Docker
# daemon and real Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tools.sh --tests
if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  echo "the Docker daemon does not answer: start it (tests use the real daemon)" >&2
  exit 1
fi
# The browser-router's tests run real Chromium in this image (content-addressed: a no-op when
# nothing changed; the first build installs Debian's chromium, a few minutes).
deploy/images/build-browser.sh >/dev/null
export SANDMESH_NATS_SERVER="$PWD/.tools/bin/nats-server"
# Every container and network the tests' meshes make carries this run's mark
# (`sandmesh.test-run`: this script's pid and start). What a run that died or a test that
# panicked left behind is removed: an earlier run's when its script is gone (a concurrent run
# on the same host keeps its own), this run's at its end. A user's own mesh is never touched.
export SANDMESH_TEST_RUN="$$-$(date +%s)"
# run_alive PID-START: that run's script still runs (the pid is there and started no later
# than the run did, so a reused pid does not count).
run_alive() {
  local age
  age=$(ps -o etimes= -p "${1%%-*}" 2>/dev/null | tr -d ' ') || return 1
  [ -n "$age" ] && [ $(( $(date +%s) - age )) -le $(( ${1#*-} + 5 )) ]
}
sweep_test_runs() { # sweep_test_runs [mine]: removes dead runs' leftovers (and, with mine, ours)
  local kind id run n=0
  for kind in container network; do
    while read -r id run; do
      [ -n "$id" ] || continue
      if [ "$run" = "$SANDMESH_TEST_RUN" ] && [ "${1:-}" != mine ]; then continue; fi
      if [ "$run" != "$SANDMESH_TEST_RUN" ] && run_alive "$run"; then continue; fi
      if [ "$kind" = container ]; then docker rm -f "$id" >/dev/null 2>&1 && n=$((n + 1)); fi
      if [ "$kind" = network ]; then docker network rm "$id" >/dev/null 2>&1 && n=$((n + 1)); fi
    done < <(docker "$kind" ls $([ "$kind" = container ] && echo -a) --filter label=sandmesh.test-run \
               --format '{{.ID}} {{.Label "sandmesh.test-run"}}')
  done
  [ "$n" = 0 ] || echo "removed $n containers and networks test runs left behind" >&2
}
sweep_test_runs
trap 'sweep_test_runs mine' EXIT
# The package index the egress test downloads a package from (issue 13): its hosts are the
# machine's own configuration, never this repository's — pip's configured index-url when there
# is one, else pip's default index as pip itself names it. A machine whose HTTPS goes through an
# intercepting gateway also names the trust store its own clients use, so pip in the sandbox
# trusts the same CA.
if [ -z "${SANDMESH_TEST_PYPI_HOSTS:-}" ]; then
  SANDMESH_TEST_PYPI_HOSTS=$(python3 scripts/pip-index-hosts.py)
fi
export SANDMESH_TEST_PYPI_HOSTS
export SANDMESH_TEST_PYPI_CA_BUNDLE="${SANDMESH_TEST_PYPI_CA_BUNDLE:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}"
# The AIO image (aio-pool's tests; Debian's chromium makes the first build take minutes, and
# unchanged inputs build nothing). Built here so a missing mirror fails early and clearly; the
# debug agent is the one the tests' image carries, so `cargo test` reuses this build.
cargo build -p sandmesh-aio-agent
AGENT_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/sandmesh-aio-agent" deploy/images/build.sh aio >/dev/null
# Every test in a process of its own, two at a time (most start a whole mesh: more would starve
# each other on a small machine); tests that look at the whole Docker host run alone, Chromium
# tests one at a time (.config/nextest.toml). cargo-nextest is installed when missing.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest (runs the tests in parallel)" >&2
  cargo install --locked cargo-nextest >&2
fi
# Every suite below runs even when one before it failed (one run shows every failure); the
# script fails at the end, naming which.
failed=()
suite() { local name=$1; shift; "$@" || failed+=("$name"); }
suite "cargo nextest" cargo nextest run --workspace --no-fail-fast "$@"
# nextest runs no doctests: the documentation's examples compile (and run) here.
suite "doctests" cargo test --workspace --doc --no-fail-fast
# The Python SDK against a real mesh started from the binaries just built (a cached venv under
# .tools/; pip installs its test extra the first time).
suite "python SDK" clients/python/run-tests.sh
# The HTTP gateway's OpenAPI document: validated, and schemathesis against a live gateway (a
# bounded number of examples per operation; no 5xx, every answer as documented).
suite "OpenAPI check" services/gateway/check-openapi.sh
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
