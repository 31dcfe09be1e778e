"""The real mesh the SDK's tests (and the framework adapters' suites beside them) run against:
``target/debug/sandmesh up`` on free loopback ports in a temporary data directory, with the
credentials it generates. ``start_mesh`` is shared; each suite's conftest.py makes it a session
fixture.

Nothing is mocked: the SDK talks to the real scheduler, risk assessor, confirmation service,
workspace store, docker executor, aio-pool and browser-router, through a real nats-server with
authentication on, and the real Docker daemon. A missing piece fails the session with what to
do about it. ``SANDMESH_BIN`` picks another binary; ``SANDMESH_SDK_UP_TIMEOUT`` (seconds, 240)
bounds the wait for the mesh.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional

import pytest


REPO = Path(__file__).resolve().parents[3]
SANDMESH = Path(os.environ.get("SANDMESH_BIN") or REPO / "target" / "debug" / "sandmesh")
UP_TIMEOUT = float(os.environ.get("SANDMESH_SDK_UP_TIMEOUT", "240"))
#: The browser fixture site listens here: loopback, but not 127.0.0.1, so the browser-router's
#: policy can allow exactly it (its tests do the same).
FIXTURE_HOST = "127.0.0.2"
#: Executions the scheduler admits at once, small so that a test can fill the queue.
MAX_QUEUE = 2
#: No test waits for a result longer than this (a run parked for a person unexpectedly
#: fails as a Timeout naming its confirmation instead of hanging the suite).
RUN_TIMEOUT = 120.0

FIXTURE_PAGE = b"""<!doctype html>
<html><head><title>SDK fixture</title></head>
<body>
<h1>Hello from the SDK fixture</h1>
<label for="name">Name</label><input id="name" name="name" type="text">
<button id="go" onclick="document.getElementById('out').textContent = 'clicked ' + document.getElementById('name').value">Go</button>
<p id="out">not clicked</p>
<label for="pw">Password</label><input id="pw" name="pw" type="password">
</body></html>
"""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def require(ok: bool, message: str) -> None:
    if not ok:
        pytest.fail(message, pytrace=False)


def docker_answers() -> bool:
    try:
        out = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def image_present(repository: str) -> bool:
    out = subprocess.run(["docker", "images", "-q", repository], capture_output=True, text=True, timeout=30)
    return bool(out.stdout.strip())


class _Fixture(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(FIXTURE_PAGE)))
        self.end_headers()
        self.wfile.write(FIXTURE_PAGE)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Mesh:
    """The running mesh: how to reach it as agents of two tenants, and the CLI against it."""

    nats_url: str
    agent_url: str
    other_url: str
    data_dir: Path
    env: Dict[str, str]
    fixture_url: str
    log: Path

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``sandmesh <args>`` as a person runs it next to this mesh (roles from its data dir)."""
        return subprocess.run([str(SANDMESH), *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _wait_ready(proc: subprocess.Popen, mesh: Mesh) -> None:
    """Until ``sandmesh status`` lists the scheduler and the docker-executor and ``up`` says
    the mesh is up (its own probe of the endpoints), bounded by UP_TIMEOUT."""
    deadline = time.monotonic() + UP_TIMEOUT
    listed = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"`sandmesh up` exited with {proc.returncode} before the mesh was up; its log "
                f"({mesh.log}):\n{mesh.log_tail()}",
                pytrace=False,
            )
        status = mesh.cli("status", timeout=30)
        listed = status.stdout
        said_up = "mesh is up" in mesh.log.read_text(errors="replace")
        if "scheduler" in listed and "docker-executor" in listed and said_up:
            return
        time.sleep(1)
    pytest.fail(
        f"the mesh was not up within {UP_TIMEOUT:.0f} s (waited for `sandmesh status` to list "
        f"scheduler and docker-executor, and for `up` to say 'mesh is up'). Last status:\n"
        f"{listed}\nLog ({mesh.log}):\n{mesh.log_tail()}\nThe first start builds missing images "
        "(minutes): raise SANDMESH_SDK_UP_TIMEOUT or build them first (deploy/images/).",
        pytrace=False,
    )


def start_mesh(extra_env: Optional[Mapping[str, str]] = None) -> Iterator[Mesh]:
    """Starts a mesh (``extra_env`` added to the environment of `up`: a policy a suite needs),
    yields it, and stops it at the end; a generator for a session fixture to ``yield from``."""
    require(
        SANDMESH.is_file(),
        f"{SANDMESH} is missing: build it with `cargo build -p sandmesh` (or set SANDMESH_BIN)",
    )
    require(docker_answers(), "the Docker daemon does not answer `docker version`: start it (the mesh runs code in it)")
    nats_server = Path(os.environ.get("SANDMESH_NATS_SERVER") or REPO / ".tools" / "bin" / "nats-server")
    require(
        nats_server.is_file(),
        f"no nats-server at {nats_server}: run scripts/install-tools.sh (or set SANDMESH_NATS_SERVER)",
    )
    missing: List[str] = [
        hint
        for repository, hint in (
            ("sandmesh/sandbox-runtime", "deploy/images/build.sh"),
            ("sandmesh/browser", "deploy/images/build-browser.sh"),
            ("sandmesh/aio-runtime", "deploy/images/build.sh aio"),
        )
        if not image_present(repository)
    ]
    require(
        not missing,
        "images missing (each build installs Debian packages; the browser and AIO ones take "
        f"minutes): run {' && '.join(missing)}",
    )

    fixture = http.server.ThreadingHTTPServer((FIXTURE_HOST, 0), _Fixture)
    threading.Thread(target=fixture.serve_forever, daemon=True).start()
    fixture_port = fixture.server_address[1]

    tmp = Path(tempfile.mkdtemp(prefix="sandmesh-sdk-"))
    data_dir = tmp / "data"
    nats_port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("SANDMESH_NATS_URL", "SANDMESH_CREDS")}
    env.update(
        SANDMESH_DATA_DIR=str(data_dir),
        SANDMESH_NATS_SERVER=str(nats_server),
        SANDMESH_CONSOLE_ADDR=f"127.0.0.1:{free_port()}",
        SANDMESH_GATEWAY_ADDR=f"127.0.0.1:{free_port()}",
        SANDMESH_SCHED_MAX_QUEUE=str(MAX_QUEUE),
        # One tenant fills the queue in the Overloaded test: its share is the whole queue.
        SANDMESH_SCHED_TENANT_MAX=str(MAX_QUEUE),
        SANDMESH_BROWSER_NETWORK_POLICY=json.dumps(
            {"allow_cidrs": [f"{FIXTURE_HOST}/32"], "ports": [fixture_port]}
        ),
    )
    env.update(extra_env or {})
    # The CLI next to the mesh: roles from the data directory, the server without credentials.
    cli_env = dict(env, SANDMESH_NATS_URL=f"nats://127.0.0.1:{nats_port}")
    # A second tenant, made before the server starts, so both are there from the first moment.
    for args in (["tenant", "init", "--url", cli_env["SANDMESH_NATS_URL"]], ["tenant", "add", "other"]):
        made = subprocess.run([str(SANDMESH), *args], env=cli_env, capture_output=True, text=True, timeout=60)
        require(made.returncode == 0, f"`sandmesh {' '.join(args)}` failed: {made.stderr}")
    log = tmp / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(SANDMESH), "up", "--nats-port", str(nats_port), "--data-dir", str(data_dir)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    mesh = Mesh(
        nats_url=cli_env["SANDMESH_NATS_URL"],
        agent_url="",
        other_url="",
        data_dir=data_dir,
        env=cli_env,
        fixture_url=f"http://{FIXTURE_HOST}:{fixture_port}/",
        log=log,
    )
    try:
        _wait_ready(proc, mesh)
        creds = mesh.cli("creds", "--url-only")
        require(creds.returncode == 0, f"`sandmesh creds --url-only` failed: {creds.stderr}")
        mesh.agent_url = creds.stdout.strip()
        other = mesh.cli("creds", "--url-only", "--tenant", "other")
        require(other.returncode == 0, f"`sandmesh creds --tenant other` failed: {other.stderr}")
        mesh.other_url = other.stdout.strip()
        yield mesh
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        fixture.shutdown()
        if os.environ.get("SANDMESH_SDK_KEEP_LOG"):
            print(f"\nsandmesh up log: {log}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
