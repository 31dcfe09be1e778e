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
  for kind in container network volume; do
    while read -r id run; do
      [ -n "$id" ] || continue
      if [ "$run" = "$SANDMESH_TEST_RUN" ] && [ "${1:-}" != mine ]; then continue; fi
      if [ "$run" != "$SANDMESH_TEST_RUN" ] && run_alive "$run"; then continue; fi
      if [ "$kind" = container ]; then docker rm -f "$id" >/dev/null 2>&1 && n=$((n + 1)); fi
      if [ "$kind" = network ]; then docker network rm "$id" >/dev/null 2>&1 && n=$((n + 1)); fi
      if [ "$kind" = volume ]; then docker volume rm "$id" >/dev/null 2>&1 && n=$((n + 1)); fi
    done < <(docker "$kind" ls $([ "$kind" = container ] && echo -a) --filter label=sandmesh.test-run \
               --format "{{.$([ "$kind" = volume ] && echo Name || echo ID)}} {{.Label \"sandmesh.test-run\"}}")
  done
  [ "$n" = 0 ] || echo "removed $n containers, networks and volumes test runs left behind" >&2
}
sweep_test_runs
# A failing step leaves no image build running behind it.
trap 'kill $(jobs -p) 2>/dev/null || true; sweep_test_runs mine' EXIT
# The package index the egress test downloads a package from: its hosts are the
# machine's own configuration, never this repository's — pip's configured index-url when there
# is one, else pip's default index as pip itself names it. A machine whose HTTPS goes through an
# intercepting gateway also names the trust store its own clients use, so pip in the sandbox
# trusts the same CA.
if [ -z "${SANDMESH_TEST_PYPI_HOSTS:-}" ]; then
  SANDMESH_TEST_PYPI_HOSTS=$(python3 scripts/pip-index-hosts.py)
fi
export SANDMESH_TEST_PYPI_HOSTS
export SANDMESH_TEST_PYPI_CA_BUNDLE="${SANDMESH_TEST_PYPI_CA_BUNDLE:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}"
# The images the tests run build in the background while the tests compile (image builds
# wait on downloads and disk, compiling on the CPU; content-addressed, so unchanged inputs
# build nothing and a warm machine spends seconds here). Built before any test runs so a
# missing mirror fails early and clearly, and no test spends its time budget on a build.
target="${CARGO_TARGET_DIR:-$PWD/target}"
images_log="$target/test-images.log"
mkdir -p "$target"
: >"$images_log"
echo "building the images in the background (log: $images_log)" >&2
# First the browser-router's image (base, the shared Chromium layer, the browser; Debian's
# chromium makes the first build take minutes). It needs no binary of ours.
deploy/images/build-browser.sh >>"$images_log" 2>&1 &
browser_images=$!
# The three programs the images and `sandmesh up` carry (debug, as the tests' meshes use). The
# tests that build an image themselves (the executors', aio-pool's) take these too, by name,
# instead of compiling release builds of their own.
cargo build -p sandmesh -p sandmesh-aio-agent -p sandmesh-supervisor
export SANDMESH_SUPERVISOR_BIN="$target/debug/sandmesh-supervisor"
export SANDMESH_AIO_AGENT_BIN="$target/debug/sandmesh-aio-agent"
# Then the AIO image and the sandbox image with the `python-data` template on it (the template
# and kernel tests run it; its packages layer stands on the sandbox's runtime layer, so another
# supervisor adds seconds, not minutes).
(
  while kill -0 "$browser_images" 2>/dev/null; do sleep 1; done
  AGENT_BIN="$SANDMESH_AIO_AGENT_BIN" deploy/images/build.sh aio
  "$target/debug/sandmesh" template build python-data --builtin
) >>"$images_log" 2>&1 &
other_images=$!
# The tests compile meanwhile (nextest builds every test binary, runs none).
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest (runs the tests in parallel)" >&2
  cargo install --locked cargo-nextest >&2
fi
cargo nextest run --workspace --no-run
wait_images() { # wait_images PID WHAT
  if ! wait "$1"; then
    echo "building $2 failed; its log ($images_log) ends:" >&2
    tail -n 30 "$images_log" >&2
    exit 1
  fi
}
# Never a silent wait: the build's latest line every 20 s.
waited=0
while kill -0 "$browser_images" 2>/dev/null || kill -0 "$other_images" 2>/dev/null; do
  if [ $((waited % 20)) = 0 ]; then
    echo "waiting for the image builds (${waited} s): $(tail -n 1 "$images_log" | cut -c1-120)" >&2
  fi
  sleep 1
  waited=$((waited + 1))
done
wait_images "$browser_images" "the browser image"
wait_images "$other_images" "the AIO image or the python-data template"
echo "images ready: $(grep -cE 'up to date|built ' "$images_log") steps (see $images_log)" >&2
# Every suite below runs even when one before it failed (one run shows every failure); the
# script fails at the end, naming which.
failed=()
suite() { local name=$1; shift; "$@" || failed+=("$name"); }
# Suites with a mesh of their own each (free ports, own data directories, containers labelled
# with this run) start in the background and run beside the Rust tests: each mostly waits on
# its mesh, as most Rust tests do on theirs, so on two cores they share the time instead of
# adding to it. Each one's output is shown when it ends.
side_names=() side_logs=() side_pids=()
side_by_side() { # side_by_side NAME CMD [NAME CMD ...]: starts them
  while [ $# -gt 0 ]; do
    side_names+=("$1")
    side_logs+=("$(mktemp)")
    "$2" >"${side_logs[-1]}" 2>&1 &
    side_pids+=($!)
    shift 2
  done
  echo "started the ${side_names[*]} (they run beside the Rust tests; output at their end)" >&2
}
side_wait() { # waits for every suite side_by_side started, saying every 30 s what still runs
  local i waited=0
  for i in "${!side_pids[@]}"; do
    while kill -0 "${side_pids[$i]}" 2>/dev/null; do
      if [ $((waited % 30)) = 0 ] && [ "$waited" -gt 0 ]; then
        echo "the ${side_names[$i]} still runs (${waited} s after the Rust tests): $(tail -n 1 "${side_logs[$i]}" | cut -c1-120)" >&2
      fi
      sleep 1
      waited=$((waited + 1))
    done
    wait "${side_pids[$i]}" || failed+=("${side_names[$i]}")
    echo "== ${side_names[$i]}"
    cat "${side_logs[$i]}"
    rm -f "${side_logs[$i]}"
  done
}
# The suites started so: the Python SDK against a real mesh started from the binaries just built
# (a cached venv; pip installs its test extra the first time); the framework adapters' suites (the
# frameworks' own conformance suites, on pytest-xdist workers against a mesh of their own); the
# HTTP gateway's OpenAPI document — validated, then schemathesis against a live gateway (a bounded
# number of examples per operation; no 5xx, every answer as documented) — and E2B's own SDKs,
# unmodified, against the gateway's E2B facade.
side_by_side "python SDK" clients/python/run-tests.sh "framework adapters" clients/python/run-conformance.sh \
  "OpenAPI check" services/gateway/check-openapi.sh "E2B SDKs" services/gateway/e2b-tests/run.sh
# Every test in a process of its own, two at a time (most start a whole mesh: more would starve
# each other on a small machine); Chromium tests one at a time (.config/nextest.toml).
suite "cargo nextest" cargo nextest run --workspace --no-fail-fast "$@"
# nextest runs no doctests: the documentation's examples compile (and run) here.
suite "doctests" cargo test --workspace --doc --no-fail-fast
side_wait
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
