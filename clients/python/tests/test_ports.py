"""Preview ports against the real mesh: a server in a session's container, exposed with
``s.ports.expose`` and fetched through the gateway with the token, as a browser would."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

import sandmesh
from sandmesh import Sandmesh

from conftest import Mesh


def _container_of(scoped_session: str) -> str:
    out = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=sandmesh.session={scoped_session}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_port_is_exposed_reached_with_its_token_and_unexposed(sm: Sandmesh, mesh: Mesh) -> None:
    sid = f"sdk-ports-{uuid.uuid4().hex[:8]}"
    with sm.session(sid) as s:
        s.files.write("hello.txt", "hi from the sandbox\n")
        assert s.run("ls", language="shell").ok
        container = _container_of(f"default-{sid}")
        assert container, "the session has no container"
        # The harness starts the server (the run's end kills what a run starts).
        subprocess.run(
            ["docker", "exec", "-d", "-w", "/workspace", container,
             "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"],
            check=True,
            timeout=30,
        )
        exposed = s.ports.expose(8000, ttl_ms=600_000)
        assert exposed.port == 8000 and exposed.token and exposed.url.endswith("/ports/8000/")
        gateway = "http://" + mesh.env["SANDMESH_GATEWAY_ADDR"]
        url = exposed.browser_url(gateway).replace("/?", "/hello.txt?")
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    assert r.read() == b"hi from the sandbox\n"
                    break
            except urllib.error.HTTPError as e:
                assert e.code == 503 and time.monotonic() < deadline, e.read()
                time.sleep(0.2)
        assert [p.port for p in s.ports.list()] == [8000]
        s.ports.unexpose(8000)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code == 401
        with pytest.raises(sandmesh.NotFound):
            s.ports.unexpose(8000)
