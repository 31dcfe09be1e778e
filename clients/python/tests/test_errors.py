"""Each error kind, reached from outside through the real mesh (or, for the one a healthy mesh
never sends, through the mapping in test_unit.py)."""

from __future__ import annotations

import threading
import time
from typing import Dict, List

import pytest

import sandmesh
from sandmesh import Sandmesh, new_id

from conftest import MAX_QUEUE, free_port


def test_bad_request_unknown_language(sm: Sandmesh) -> None:
    with pytest.raises(sandmesh.BadRequest) as caught:
        sm.run("DISPLAY 1", language="cobol")
    e = caught.value
    assert (e.code, e.kind, e.subject) == (400, "bad_request", "sandbox.v1.exec")
    assert "python" in e.message, e.message


def test_bad_request_a_path_outside_the_workspace(sm: Sandmesh) -> None:
    with sm.session("sdk-paths") as s:
        with pytest.raises(sandmesh.BadRequest):
            s.files.write("../escape.txt", "x")


def test_not_found_an_unknown_execution_id(sm: Sandmesh) -> None:
    with pytest.raises(sandmesh.NotFound) as caught:
        sm.job(new_id()).poll()
    assert caught.value.code == 404


def test_not_found_another_tenants_execution_session_and_file(sm: Sandmesh, other: Sandmesh) -> None:
    mine = sm.run("print('mine')")
    with pytest.raises(sandmesh.NotFound):
        other.job(mine.execution_id).poll()
    with sm.session("sdk-private") as s:
        s.files.write("data/secret.txt", "only for default")
        with other.session("sdk-private") as theirs:  # the same name is the other's own
            with pytest.raises(sandmesh.NotFound):
                theirs.files.read("data/secret.txt")
    assert other.run("print('theirs')").stdout == "theirs\n"


def test_too_large_oversized_code(sm: Sandmesh) -> None:
    with pytest.raises(sandmesh.TooLarge) as caught:
        sm.run("#" + "x" * (300 * 1024))
    assert caught.value.code == 413


def test_denied_code_the_risk_policy_rejects(sm: Sandmesh) -> None:
    with pytest.raises(sandmesh.Denied) as caught:
        sm.run("rm -rf /", language="shell")
    e = caught.value
    assert e.result is not None and e.result.status == "rejected" and e.result.tier == "reject"
    # Without check the refusal is a result like any other.
    r = sm.run("rm -rf /", language="shell", check=False)
    assert (r.status, r.ran) == ("rejected", False)


def test_conflict_an_upload_committed_with_a_chunk_missing(sm: Sandmesh) -> None:
    # The SDK never does this; the transport is used directly to show the 409 is mapped.
    with sm.session("sdk-conflict") as s:
        transport = s.files.inner._t
        upload_id = new_id()
        chunk = {"session_id": s.session_id, "upload_id": upload_id, "seq": 0, "data": b"part one"}
        sm._call(transport.request("workspace.upload", chunk))
        write = {
            "session_id": s.session_id,
            "path": "data/partial.bin",
            "content": "",
            "upload": {"upload_id": upload_id, "chunks": 2, "sha256": "0" * 64},
        }
        with pytest.raises(sandmesh.Conflict) as caught:
            sm._call(transport.request("workspace.write", write))
        assert caught.value.code == 409


def test_unavailable_when_no_mesh_answers() -> None:
    with pytest.raises(sandmesh.Unavailable) as caught:
        Sandmesh(f"nats://u:p@127.0.0.1:{free_port()}")
    assert "sandmesh up" in str(caught.value)


def test_timeout_of_a_call_names_its_limit_and_the_run_goes_on(sm: Sandmesh) -> None:
    execution_id = new_id()
    with pytest.raises(sandmesh.Timeout) as caught:
        sm.run("import time\ntime.sleep(4)\nprint('done anyway')", execution_id=execution_id, request_timeout=1)
    e = caught.value
    assert (e.code, e.execution_id) == (504, execution_id) and "1 s" in str(e)
    # The caller gave up, the mesh did not: the result is there to collect.
    assert sm.job(execution_id).result(timeout=60).stdout == "done anyway\n"


def test_overloaded_when_the_scheduler_queue_is_full(sm: Sandmesh) -> None:
    started = threading.Semaphore(0)
    outcomes: List[Dict[str, object]] = []

    def long_run() -> None:
        try:
            r = sm.run("import time\nprint('started', flush=True)\ntime.sleep(6)", on_stdout=lambda _: started.release())
            outcomes.append({"result": r})
        except sandmesh.SandmeshError as e:
            outcomes.append({"error": e})

    threads = [threading.Thread(target=long_run, daemon=True) for _ in range(MAX_QUEUE)]
    for t in threads:
        t.start()
    for _ in range(MAX_QUEUE):
        assert started.acquire(timeout=60), f"the long runs did not start: {outcomes}"
    with pytest.raises(sandmesh.Overloaded) as caught:
        sm.run("print('one too many')")
    e = caught.value
    assert (e.code, e.kind) == (429, "overloaded") and "retry" in e.message
    assert e.retry_after is None or e.retry_after > 0
    for t in threads:
        t.join(60)
    assert all("result" in o and o["result"].ok for o in outcomes), outcomes  # type: ignore[union-attr]
    # Capacity is back once they are done.
    deadline = time.monotonic() + 30
    while True:
        try:
            assert sm.run("print('room again')").stdout == "room again\n"
            break
        except sandmesh.Overloaded:
            assert time.monotonic() < deadline, "the queue stayed full after its runs ended"
            time.sleep(0.2)
