"""Sessions against the real mesh: runs that share a workspace, files of any size, the browser
and the AIO sandbox."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time

import pytest

import sandmesh
from sandmesh import Sandmesh

from conftest import Mesh


def test_a_session_keeps_files_between_runs_and_closes(sm: Sandmesh) -> None:
    with sm.session("sdk-files") as s:
        assert s.session_id == "sdk-files" and s.info is not None
        entry = s.files.write("data/in.txt", "hello from python\n")
        assert (entry.path, entry.size) == ("data/in.txt", 18)
        r = s.run("cat data/in.txt; echo made | tee output/out.txt", language="shell")
        assert r.stdout == "hello from python\nmade\n" and "output/out.txt" in r.files_created, r
        assert s.files.read("output/out.txt") == b"made\n"
        second = s.run("print(open('output/out.txt').read().strip())")
        assert second.stdout == "made\n"
        # The session's use count is updated just after each reply: a bounded wait for it.
        deadline = time.monotonic() + 10
        while s.get().executions < 2:
            assert time.monotonic() < deadline, f"the session counts {s.get().executions} runs, not 2"
            time.sleep(0.1)

        binary = bytes(range(256))
        s.files.write("data/raw.bin", binary)
        assert s.files.read("data/raw.bin") == binary
        s.files.write("data/raw.bin", b"tail", append=True)
        assert s.files.read("data/raw.bin") == binary + b"tail"

        names = {e.path for e in s.files.list("data")}
        assert {"data/in.txt", "data/raw.bin"} <= names
        everything = {e.path for e in s.files.list(recursive=True)}
        assert "output/out.txt" in everything
        s.files.remove("data/raw.bin")
        assert not s.files.exists("data/raw.bin")
        with pytest.raises(sandmesh.NotFound):
            s.files.read("data/raw.bin")
    assert s.get().state == "closed"


def test_kernel_cells_keep_their_variables_and_return_typed_outputs(sm: Sandmesh) -> None:
    with sm.session("sdk-kernel") as s:
        assert s.run("x = 41", kernel=True).ok
        r = s.run("print(x + 1)\n{'a': x}", kernel=True)
        assert (r.stdout, r.state_lost) == ("42\n", False), r
        assert [(o.kind, o.mime_type, o.content) for o in r.outputs] == [
            ("result", "text/plain", "{'a': 41}")
        ], r
        failed = s.run("undefined_name", kernel=True)
        assert failed.status == "error" and failed.cell_error is not None, failed
        assert failed.cell_error.name == "NameError"


def test_closing_a_session_says_closed(sm: Sandmesh) -> None:
    s = sm.session()
    assert s.session_id, "the mesh names a session opened without an id"
    assert s.session_id in {x.session_id for x in sm.sessions()}
    assert s.close().state == "closed"


def test_a_20_mb_file_round_trips_byte_for_byte(sm: Sandmesh) -> None:
    data = os.urandom(20 * 1024 * 1024)
    with sm.session("sdk-big") as s:
        entry = s.files.write("data/big.bin", data)
        assert entry.size == len(data)
        back = s.files.read("data/big.bin")
        assert len(back) == len(data) and hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
        assert back == data
        assert s.files.stat("data/big.bin").size == len(data)
        # The sandbox sees the same bytes.
        r = s.run("import hashlib; print(hashlib.sha256(open('data/big.bin','rb').read()).hexdigest())")
        assert r.stdout.strip() == hashlib.sha256(data).hexdigest(), r


def test_the_session_browser_navigates_fills_clicks_and_reads(sm: Sandmesh, mesh: Mesh) -> None:
    with sm.session("sdk-browser") as s:
        page = s.browser.navigate(mesh.fixture_url)
        assert page.ok and page.title == "SDK fixture", page
        elements = s.browser.elements()
        tags = {(e.tag, e.input_type) for e in elements}
        assert ("input", "text") in tags and any(e.tag == "button" for e in elements), elements
        name = next(e for e in elements if e.tag == "input")
        s.browser.fill(name.index, "alice")
        button = next(e for e in elements if e.tag == "button")
        s.browser.click(button.index)
        assert "clicked alice" in s.browser.content()
        s.browser.fill("#name", "bob")
        s.browser.click("#go")
        assert "clicked bob" in s.browser.content()
        assert "<h1>Hello from the SDK fixture</h1>" in s.browser.content("html")
        shot = s.browser.screenshot()
        assert shot.screenshot is not None and shot.screenshot[:8] == b"\x89PNG\r\n\x1a\n"
        assert shot.screenshot_path and s.files.exists(shot.screenshot_path)
        assert s.browser.close().ok


def test_the_session_aio_sandbox_runs_commands(sm: Sandmesh) -> None:
    with sm.session("sdk-aio") as s:
        lease = s.aio.acquire()
        assert lease.session_id == "sdk-aio" and lease.instance_id
        assert s.aio.acquire().instance_id == lease.instance_id, "the session keeps its instance"
        ran = s.aio.exec("echo aio-$((6*7))", timeout=30)
        assert (ran.exit_code, ran.stdout.strip(), ran.instance_id) == (0, "aio-42", lease.instance_id), ran
        stats = s.aio.stats()
        assert stats.bound >= 1 and stats.max >= stats.total >= 1
        released = s.aio.release()
        assert released.instance_id == lease.instance_id


def test_acall_serves_other_event_loops_and_cancels(sm: Sandmesh) -> None:
    """A framework's own event loops (one per call or per test) await the client's calls
    through acall; the connection stays on the client's loop."""
    import asyncio

    async def one() -> str:
        return (await sm.acall(sm.async_client.run("print(6*7)"))).stdout

    assert asyncio.run(one()) == "42\n"
    assert asyncio.run(one()) == "42\n", "a second loop is served as well"

    stopped_there = threading.Event()

    async def long() -> None:  # runs on the client's loop
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped_there.set()
            raise

    async def cancelled() -> None:
        task = asyncio.ensure_future(sm.acall(long()))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert stopped_there.wait(10), "cancelling the waiter left the work running on the client's loop"
    with pytest.raises(sandmesh.BadRequest):
        asyncio.run(sm.acall(sm.async_client.run("x", language="cobol")))
