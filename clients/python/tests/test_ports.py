"""Preview ports and background processes against the real mesh: a server started with
``s.processes.start``, exposed with ``s.ports.expose`` and fetched through the gateway with the
token, as a browser would; a process's input, output and end."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import pytest

import sandmesh
from sandmesh import Sandmesh

from conftest import Mesh


def test_a_port_is_exposed_reached_with_its_token_and_unexposed(sm: Sandmesh, mesh: Mesh) -> None:
    sid = f"sdk-ports-{uuid.uuid4().hex[:8]}"
    with sm.session(sid) as s:
        s.files.write("hello.txt", "hi from the sandbox\n")
        server = s.processes.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"], tag="web")
        assert server.proc_id
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


def test_a_process_takes_input_prints_and_is_killed(sm: Sandmesh) -> None:
    with sm.session(f"sdk-procs-{uuid.uuid4().hex[:8]}") as s:
        p = s.processes.start("while read l; do echo got:$l; done", stdin=True, tag="echo")
        s.processes.send_input(p.proc_id, "one\n")
        seen = b""
        for chunk in s.processes.output(p.proc_id, follow=True):
            seen += chunk
            if b"got:one" in seen:
                break
        assert b"got:one" in seen
        assert any(q["proc_id"] == p.proc_id and q["tag"] == "echo" for q in s.processes.list())
        s.processes.kill(p.proc_id)
        assert s.processes.wait(p.proc_id, timeout_ms=20_000)["state"] == "killed"
        with pytest.raises(sandmesh.NotFound):
            s.processes.kill("no-such-process")
