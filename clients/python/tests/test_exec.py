"""Executions against the real mesh: sync runs, live output, async jobs, both encodings and the
asyncio API."""

from __future__ import annotations

import asyncio
import threading
from typing import List, Tuple

import pytest

import sandmesh
from sandmesh import AsyncSandmesh, Sandmesh

from conftest import RUN_TIMEOUT, Mesh


def test_python_prints_42(sm: Sandmesh) -> None:
    r = sm.run("print(6*7)")
    assert (r.status, r.exit_code, r.stdout, r.stderr) == ("ok", 0, "42\n", "")
    assert r.ok and r.ran and r.execution_id
    assert r.risk.level == "safe" and r.confirmation.decision == "not_required"
    assert r.tier in ("ephemeral", "session")


def test_javascript_shell_env_files_and_stdin(sm: Sandmesh) -> None:
    js = sm.run("console.log([1, 2, 3].length)", language="javascript")
    assert (js.status, js.stdout) == ("ok", "3\n")
    sh = sm.run(
        'echo "$GREETING"; cat data/in.txt; read line; echo "stdin:$line"',
        language="shell",
        env={"GREETING": "hello"},
        files={"data/in.txt": "from a file\n"},
        stdin="typed\n",
    )
    assert (sh.status, sh.stdout) == ("ok", "hello\nfrom a file\nstdin:typed\n"), sh


def test_a_failing_program_is_a_result_not_an_error(sm: Sandmesh) -> None:
    code = "echo partial; exit 3"
    assert not sm.assess(code, "shell").requires_confirmation, "this test needs code no person must approve"
    r = sm.run(code, language="shell")
    assert (r.status, r.exit_code, r.stdout, r.ok) == ("error", 3, "partial\n", False)
    slow = sm.run("import time\ntime.sleep(30)", timeout=1)
    assert slow.status == "timeout" and slow.ran


def test_output_streams_in_order_before_the_result(sm: Sandmesh) -> None:
    # Shell, because strict mode asks a person about Python that imports sys.
    code = "for i in 0 1 2 3; do echo out-$i; echo err-$i >&2; sleep 0.3; done"
    events: List[Tuple[str, str]] = []
    r = sm.run(
        code,
        language="shell",
        on_stdout=lambda text: events.append(("stdout", text)),
        on_stderr=lambda text: events.append(("stderr", text)),
    )
    assert r.status == "ok", r
    # Every piece arrived before run() returned, in the program's order on each stream.
    out = "".join(t for s, t in events if s == "stdout")
    err = "".join(t for s, t in events if s == "stderr")
    assert (out, err) == (r.stdout, r.stderr) == (
        "".join(f"out-{i}\n" for i in range(4)),
        "".join(f"err-{i}\n" for i in range(4)),
    )
    assert len(events) >= 4, f"the output came in {len(events)} pieces, not as it was written: {events}"


def test_python_output_streams_too(sm: Sandmesh) -> None:
    pieces: List[str] = []
    code = "import time\nfor i in range(3):\n    print(f'line-{i}', flush=True)\n    time.sleep(0.3)\n"
    r = sm.run(code, on_stdout=pieces.append)
    assert "".join(pieces) == r.stdout == "line-0\nline-1\nline-2\n"
    assert len(pieces) >= 2, pieces


def test_async_jobs_give_their_result_and_a_repeated_submit_runs_once(sm: Sandmesh) -> None:
    job = sm.submit("echo async-$((40+2))", language="shell")
    assert not job.duplicate
    again = sm.submit("echo async-$((40+2))", language="shell", execution_id=job.execution_id)
    assert again.duplicate and again.execution_id == job.execution_id
    r = job.result(timeout=120)
    assert (r.status, r.stdout, r.execution_id) == ("ok", "async-42\n", job.execution_id)
    assert job.poll() == r
    assert sm.job(job.execution_id).result(timeout=30).stdout == "async-42\n"


def test_json_encoding_works_the_same(mesh: Mesh) -> None:
    with Sandmesh(mesh.agent_url, encoding="json", run_timeout=RUN_TIMEOUT) as sm_json:
        assert sm_json.run("print(6*7)").stdout == "42\n"
        with sm_json.session() as s:
            s.files.write("data/j.bin", bytes(range(256)) * 4000)  # 1 MB: chunked as base64
            assert s.files.read("data/j.bin") == bytes(range(256)) * 4000


def test_the_sync_client_serves_several_threads(sm: Sandmesh) -> None:
    results: List[str] = []
    threads = [threading.Thread(target=lambda i=i: results.append(sm.run(f"print({i})").stdout)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == ["0\n", "1\n"]


def test_the_asyncio_api_has_the_same_shape(mesh: Mesh) -> None:
    async def scenario() -> None:
        async with AsyncSandmesh(mesh.agent_url, run_timeout=RUN_TIMEOUT) as sm:
            chunks: List[str] = []

            async def collect(text: str) -> None:
                chunks.append(text)

            r = await sm.run("print('a', flush=True)\nprint('b')", on_stdout=collect)
            assert r.stdout == "a\nb\n" == "".join(chunks)
            async with sm.session() as s:
                await s.files.write("data/async.txt", "async file")
                assert await s.files.read("data/async.txt") == b"async file"
                assert (await s.run("cat data/async.txt", language="shell")).stdout == "async file"
            job = await sm.submit("print(7)")
            assert (await job.result(timeout=120)).stdout == "7\n"
            risk = await sm.assess("print(1)")
            assert risk.level == "safe"
            try:
                await sm.run("x", language="cobol")
            except sandmesh.BadRequest as e:
                assert e.code == 400
            else:
                raise AssertionError("an unknown language must be refused")

    asyncio.run(scenario())


def test_tests_run_against_code_and_report_each_test(sm: Sandmesh) -> None:
    code = "def add(a, b):\n    return a + b\n"
    tests = (
        "import pytest\nfrom solution import add\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('no fixture')\n\n"
        "def test_one():\n    assert add(1, 1) == 2\n\n"
        "def test_two():\n    assert add(1, 1) == 3\n\n"
        "def test_three(broken):\n    pass\n"
    )
    report = sm.run_tests(code, tests, timeout=60, request_timeout=RUN_TIMEOUT)
    assert report.status == "failed", report
    assert [(t.name, t.status) for t in report.tests] == [
        ("test_one", "passed"),
        ("test_two", "failed"),
        ("test_three", "error"),
    ], report
    assert "assert 2 == 3" in (report.tests[1].message or ""), report
    assert report.totals == {"passed": 1, "failed": 1, "errors": 1, "skipped": 0}
    with pytest.raises(sandmesh.BadRequest):
        sm.run_tests(code, tests, "shell")

