"""One real mesh for the session, started by the Python SDK's own fixture
(``clients/python/tests/meshfixture.py``: ``target/debug/sandmesh up`` on free loopback ports in a
temporary data directory, two tenants) with the E2B facade on a port of its own, and an
E2B-spelled key of each tenant. E2B's SDKs reach it through ``E2B_API_URL`` / ``E2B_SANDBOX_URL``
exactly as a user's code would: nothing here patches or wraps them.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "clients" / "python" / "tests"))
from meshfixture import UP_TIMEOUT, Mesh as SdkMesh, free_port, require, start_mesh  # noqa: E402


@dataclass
class Mesh:
    """The running mesh: the facade's URL, a key of each tenant, the CLI beside it."""

    url: str
    key: str
    other_key: str
    sdk: SdkMesh

    def cli(self, *args: str, timeout: float = 60):
        return self.sdk.cli(*args, timeout=timeout)


def _facade_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status == 204
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def mesh() -> Iterator[Mesh]:
    addr = f"127.0.0.1:{free_port()}"
    running = start_mesh({"SANDMESH_E2B_ADDR": addr})
    sdk = next(running)
    try:
        url = f"http://{addr}"
        deadline = time.monotonic() + UP_TIMEOUT
        while not _facade_answers(url):
            require(time.monotonic() < deadline, f"the E2B facade did not answer on {url}:\n{sdk.log_tail()}")
            time.sleep(0.5)
        keys = []
        for tenant in ("default", "other"):
            made = sdk.cli("tenant", "key", "create", tenant, "--e2b")
            require(made.returncode == 0, f"`sandmesh tenant key create {tenant} --e2b`: {made.stderr}")
            keys.append(made.stdout.strip().splitlines()[-1])
        # What a user exports: the SDKs read these and nothing else.
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=keys[0])
        yield Mesh(url=url, key=keys[0], other_key=keys[1], sdk=sdk)
    finally:
        running.close()
