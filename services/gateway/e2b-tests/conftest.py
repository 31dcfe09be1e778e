"""One real mesh for the session: ``target/debug/sandmesh up`` on free loopback ports in a
temporary data directory, its E2B facade on a port of its own, and two tenants with an E2B-spelled
key each. E2B's SDKs reach it through ``E2B_API_URL`` / ``E2B_SANDBOX_URL`` exactly as a user's
code would: nothing here patches or wraps them.

``SANDMESH_BIN`` picks another binary; ``SANDMESH_E2B_UP_TIMEOUT`` (seconds, 240) bounds the wait
for the mesh.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
SANDMESH = Path(os.environ.get("SANDMESH_BIN") or REPO / "target" / "debug" / "sandmesh")
UP_TIMEOUT = float(os.environ.get("SANDMESH_E2B_UP_TIMEOUT", "240"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require(ok: bool, message: str) -> None:
    if not ok:
        pytest.fail(message, pytrace=False)


@dataclass
class Mesh:
    """The running mesh: the facade's URL, a key of each tenant, the CLI beside it."""

    url: str
    key: str
    other_key: str
    env: Dict[str, str]
    log: Path

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(SANDMESH), *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@pytest.fixture(scope="session")
def mesh() -> Iterator[Mesh]:
    require(SANDMESH.is_file(), f"{SANDMESH} is missing: build it with `cargo build -p sandmesh` (or set SANDMESH_BIN)")
    nats_server = Path(os.environ.get("SANDMESH_NATS_SERVER") or REPO / ".tools" / "bin" / "nats-server")
    require(nats_server.is_file(), f"no nats-server at {nats_server}: run scripts/install-tools.sh (or set SANDMESH_NATS_SERVER)")
    images = subprocess.run(["docker", "images", "-q", "sandmesh/sandbox-runtime"], capture_output=True, text=True, timeout=30)
    require(
        images.returncode == 0 and images.stdout.strip() != "",
        "the sandbox image is missing (or Docker does not answer): run deploy/images/build.sh",
    )
    tmp = Path(tempfile.mkdtemp(prefix="sandmesh-e2b-"))
    data_dir = tmp / "data"
    nats_port = free_port()
    e2b_addr = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_") and k not in ("SANDMESH_NATS_URL", "SANDMESH_CREDS")}
    env.update(
        SANDMESH_DATA_DIR=str(data_dir),
        SANDMESH_NATS_SERVER=str(nats_server),
        SANDMESH_CONSOLE_ADDR=f"127.0.0.1:{free_port()}",
        SANDMESH_GATEWAY_ADDR=f"127.0.0.1:{free_port()}",
        SANDMESH_E2B_ADDR=e2b_addr,
    )
    cli_env = dict(env, SANDMESH_NATS_URL=f"nats://127.0.0.1:{nats_port}")
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
    mesh = Mesh(url=f"http://{e2b_addr}", key="", other_key="", env=cli_env, log=log)
    try:
        deadline = time.monotonic() + UP_TIMEOUT
        # `up` says the mesh is up, then prints the exports for E2B's SDKs.
        while "E2B_API_URL" not in log.read_text(errors="replace"):
            require(proc.poll() is None, f"`sandmesh up` exited with {proc.returncode}:\n{mesh.log_tail()}")
            require(
                time.monotonic() < deadline,
                f"the mesh was not up with its E2B facade within {UP_TIMEOUT:.0f} s:\n{mesh.log_tail()}",
            )
            time.sleep(0.5)
        keys = []
        for tenant in ("default", "other"):
            made = mesh.cli("tenant", "key", "create", tenant, "--e2b")
            require(made.returncode == 0, f"`sandmesh tenant key create {tenant} --e2b`: {made.stderr}")
            keys.append(made.stdout.strip().splitlines()[-1])
        mesh.key, mesh.other_key = keys
        # What a user exports: the SDKs read these and nothing else.
        os.environ.update(E2B_API_URL=mesh.url, E2B_SANDBOX_URL=mesh.url, E2B_API_KEY=mesh.key)
        yield mesh
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if os.environ.get("SANDMESH_E2B_KEEP_LOG"):
            print(f"\nsandmesh up log: {log}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
