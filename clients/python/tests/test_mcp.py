"""``sandmesh mcp`` driven by the official MCP Python client (the ``mcp`` package), as an agent's
MCP host would: the real binary over stdio, acting as the default tenant's agent with the
credentials file `up` wrote, against the session's mesh (conftest.py).

Each test starts its own server process (``stdio_client`` spawns it, closes its stdin at the
end and reaps it), initializes a ``ClientSession`` and calls tools. Every wait is bounded:
each MCP request by ``CALL_BOUND``, each test's whole conversation by ``TEST_BOUND``.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import sys
import time
import warnings
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Tuple

import pytest

import sandmesh
from sandmesh import Sandmesh, new_id

from conftest import RUN_TIMEOUT, SANDMESH, Mesh

if sys.version_info < (3, 10):  # pragma: no cover - the mcp package needs 3.10+
    pytest.skip("the mcp package (the official MCP client) needs Python 3.10+", allow_module_level=True)

from mcp import ClientSession, StdioServerParameters, types  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

#: Every tool the server must list (the same set cli/tests/mcp.rs asserts).
TOOLS = {
    "run_code",
    "run_tests",
    "get_result",
    "read_file",
    "write_file",
    "list_files",
    "browser_navigate",
    "browser_elements",
    "browser_click",
    "browser_fill",
    "browser_screenshot",
    "browser_content",
    "start_process",
    "process_output",
    "kill_process",
    "expose_port",
}
#: Strict mode (the default `up` runs) asks a person for code the assessor rates high
#: (the same call test_approval.py asserts is rated so).
RISKY = "import os\nos.system('echo approved-via-mcp')"
#: One MCP request: a session's first run starts its container, a browser's first action
#: starts Chromium.
CALL_BOUND = RUN_TIMEOUT
#: One test's whole conversation with the server, start and shutdown included.
TEST_BOUND = 2 * RUN_TIMEOUT + 60
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

Scenario = Callable[[ClientSession, types.InitializeResult], Awaitable[None]]


def agent_creds(mesh: Mesh) -> Path:
    """The default tenant's agent credentials file, which `sandmesh up` wrote."""
    path = mesh.data_dir / "creds" / "agent.json"
    assert path.is_file(), f"`sandmesh up` wrote no agent credentials at {path}"
    return path


@asynccontextmanager
async def connected(mesh: Mesh, log: Path) -> AsyncIterator[Tuple[ClientSession, types.InitializeResult]]:
    """`sandmesh mcp` over stdio, initialized; its stderr (its log) goes to ``log``."""
    server = StdioServerParameters(
        command=str(SANDMESH),
        args=["mcp"],
        # stdio_client passes only a few safe variables of this process on (HOME, PATH, ...):
        # the server finds the mesh through the credentials file alone.
        env={"SANDMESH_CREDS": str(agent_creds(mesh))},
    )
    with open(log, "w") as errlog:
        async with stdio_client(server, errlog=errlog) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=CALL_BOUND) as session:
                init = await session.initialize()
                yield session, init


def innermost(e: BaseException) -> BaseException:
    """anyio's task groups wrap a failure in an exception group: the failure itself."""
    while len(getattr(e, "exceptions", ())) == 1:
        e = e.exceptions[0]  # type: ignore[attr-defined]
    return e


def converse(mesh: Mesh, tmp_path: Path, scenario: Scenario) -> None:
    """Runs ``scenario`` against a fresh server, bounded by TEST_BOUND; on failure the
    server's log is printed (pytest shows it with the failure)."""
    log = tmp_path / "mcp.log"

    async def main() -> None:
        async with connected(mesh, log) as (session, init):
            await scenario(session, init)

    async def bounded() -> None:
        try:
            await asyncio.wait_for(main(), TEST_BOUND)
        except asyncio.TimeoutError:
            raise AssertionError(f"the conversation with sandmesh mcp took longer than {TEST_BOUND:.0f} s") from None

    try:
        asyncio.run(bounded())
    except BaseException as e:
        shown = log.read_text(errors="replace") if log.exists() else "(none)"
        print(f"sandmesh mcp's log ({log}):\n{shown[-6000:]}")
        cause = innermost(e)
        if cause is e:
            raise
        raise cause from e


def text_of(result: types.CallToolResult) -> str:
    """The text blocks of a tool result, joined."""
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def ok(tool: str, result: types.CallToolResult) -> Dict[str, Any]:
    """The result must be a success; returns its structured content."""
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    assert isinstance(result.structured_content, dict), f"{tool}: no structured content: {result}"
    return result.structured_content


def finished(result: types.CallToolResult) -> Dict[str, Any]:
    """run_code's answer must be a finished, successful run (not one parked for a person);
    returns the run's result."""
    facts = ok("run_code", result)
    assert "status" in facts, f"the run did not finish: {text_of(result)}"
    return facts


def plain(sm: Sandmesh, code: str, language: str = "python") -> str:
    """``code``, checked to be code no person must approve (else the test would park)."""
    risk = sm.assess(code, language)
    assert not risk.requires_confirmation, f"this test needs code no person must approve: {risk}"
    return code


def failed(tool: str, result: types.CallToolResult, kind: str) -> str:
    """The result must be a tool error of ``kind``; returns its text."""
    assert result.is_error, f"{tool} should have failed with {kind}: {text_of(result)}"
    error = (result.structured_content or {}).get("error", {})
    assert error.get("kind") == kind, f"{tool}: {result}"
    shown = text_of(result)
    assert shown.startswith(f"{kind}: "), shown
    return shown


def close_session(sm: Sandmesh, session_id: str) -> None:
    """Closes a session the tools started (MCP has no tool for it), so that its container and
    browser go now rather than at the end of the suite. A failure here is a warning: it must
    not hide the test's own outcome."""
    try:
        s = sm.session(session_id)
        try:
            s.browser.close()
        except sandmesh.NotFound:
            pass  # the session has no browser
        s.close()
    except Exception as e:  # noqa: BLE001 - cleanup only
        warnings.warn(f"closing session {session_id} after the test: {e!r}", stacklevel=2)


# === Tests ===


def test_initialize_names_the_server_and_list_tools_shows_run_code(mesh: Mesh, tmp_path: Path) -> None:
    async def scenario(session: ClientSession, init: types.InitializeResult) -> None:
        assert init.server_info.name == "sandmesh", init
        assert init.capabilities.tools is not None, "the server offers tools"
        assert init.instructions and "get_result" in init.instructions, init.instructions

        listed = await session.list_tools()
        tools = {t.name: t for t in listed.tools}
        assert "run_code" in tools, sorted(tools)
        assert set(tools) == TOOLS, sorted(tools)
        for name, tool in tools.items():
            assert tool.description and len(tool.description) > 20, f"{name} is described: {tool}"
            assert tool.input_schema.get("type") == "object", f"{name}: {tool.input_schema}"
            # An argument a tool does not have is refused, and the schema says so.
            assert tool.input_schema.get("additionalProperties") is False, f"{name}: {tool.input_schema}"
        run = tools["run_code"].input_schema
        assert run.get("required") == ["code"], run
        assert run["properties"]["language"].get("enum") == ["python", "javascript", "shell"], run
        for name in ("read_file", "write_file", "list_files", "browser_screenshot"):
            assert "session_id" in tools[name].input_schema.get("required", []), tools[name].input_schema

    converse(mesh, tmp_path, scenario)


def test_run_code_prints_42(mesh: Mesh, sm: Sandmesh, tmp_path: Path) -> None:
    exits_3 = plain(sm, "echo partial; exit 3", "shell")

    async def scenario(session: ClientSession, init: types.InitializeResult) -> None:
        ran = await session.call_tool("run_code", {"code": "print(6*7)"})
        assert "42" in text_of(ran), text_of(ran)
        result = finished(ran)
        assert "stdout:\n42\n" in text_of(ran), text_of(ran)
        assert (result["status"], result["exit_code"], result["stdout"]) == ("ok", 0, "42\n"), result
        # The result is kept: get_result finds it by the id the run answered with.
        again = await session.call_tool("get_result", {"execution_id": result["execution_id"], "wait_ms": 0})
        assert ok("get_result", again)["stdout"] == "42\n", text_of(again)
        unknown_id = await session.call_tool("get_result", {"execution_id": new_id(), "wait_ms": 0})
        failed("get_result", unknown_id, "not_found")

        # A failing program is a tool error the model can read, not a protocol failure.
        crashed = await session.call_tool("run_code", {"code": exits_3, "language": "shell"})
        assert crashed.is_error, text_of(crashed)
        facts = crashed.structured_content or {}
        assert (facts.get("status"), facts.get("exit_code"), facts.get("stdout")) == ("error", 3, "partial\n"), facts
        assert "status: error (exit code 3)" in text_of(crashed), text_of(crashed)
        unknown = await session.call_tool("run_code", {"code": "DISPLAY 1", "language": "cobol"})
        assert "python" in failed("run_code", unknown, "bad_request"), "the choices are named"
        # A misspelt argument is a tool error naming it, not ignored (the code would run
        # outside the session it names); the same call spelt right ran above.
        misspelt = await session.call_tool("run_code", {"code": "print(6*7)", "sesion_id": "s1"})
        assert misspelt.is_error, text_of(misspelt)
        assert "unknown field `sesion_id`" in text_of(misspelt), text_of(misspelt)

    converse(mesh, tmp_path, scenario)


def test_a_file_written_is_read_back_and_seen_by_code(mesh: Mesh, sm: Sandmesh, tmp_path: Path) -> None:
    session_id = f"mcp-py-files-{new_id().lower()}"
    content = "hello from the MCP client\n"
    code = plain(sm, "tr a-z A-Z < notes/hello.txt; echo made by code | tee output/out.txt", "shell")

    async def scenario(session: ClientSession, init: types.InitializeResult) -> None:
        where = {"session_id": session_id, "path": "notes/hello.txt"}
        wrote = await session.call_tool("write_file", {**where, "content": content})
        entry = ok("write_file", wrote)
        assert (entry["path"], entry["size"]) == ("notes/hello.txt", len(content)), entry
        assert "notes/hello.txt" in text_of(wrote)

        read = await session.call_tool("read_file", where)
        assert not read.is_error, text_of(read)
        assert [c.type for c in read.content] == ["text"], read.content
        assert text_of(read) == content

        # Code in the same session sees the file, and what it writes can be read back.
        ran = await session.call_tool("run_code", {"session_id": session_id, "code": code, "language": "shell"})
        result = finished(ran)
        assert result["stdout"] == content.upper() + "made by code\n", result
        assert "output/out.txt" in result["files_created"], result
        made = await session.call_tool("read_file", {"session_id": session_id, "path": "output/out.txt"})
        assert not made.is_error and text_of(made) == "made by code\n", text_of(made)

        listing = ok("list_files", await session.call_tool("list_files", {"session_id": session_id}))
        sizes = {e["path"]: e["size"] for e in listing["entries"] if not e["is_dir"]}
        assert sizes.get("notes/hello.txt") == len(content) and sizes.get("output/out.txt") == 13, listing

        missing = await session.call_tool("read_file", {"session_id": session_id, "path": "no/such.txt"})
        failed("read_file", missing, "not_found")

    try:
        converse(mesh, tmp_path, scenario)
    finally:
        close_session(sm, session_id)


def test_a_browser_screenshot_comes_back_as_a_png_image(mesh: Mesh, sm: Sandmesh, tmp_path: Path) -> None:
    session_id = f"mcp-py-browser-{new_id().lower()}"

    async def scenario(session: ClientSession, init: types.InitializeResult) -> None:
        s = {"session_id": session_id}
        opened = await session.call_tool("browser_navigate", {**s, "url": mesh.fixture_url})
        ok("browser_navigate", opened)
        assert "title: SDK fixture" in text_of(opened), text_of(opened)

        listed = ok("browser_elements", await session.call_tool("browser_elements", s))
        elements: List[Dict[str, Any]] = listed.get("elements") or []
        field = next((e for e in elements if e.get("tag") == "input"), None)
        assert field is not None, f"no input among the elements: {elements}"
        ok("browser_fill", await session.call_tool("browser_fill", {**s, "index": field["index"], "text": "mcp"}))
        ok("browser_click", await session.call_tool("browser_click", {**s, "selector": "#go"}))
        page = await session.call_tool("browser_content", s)
        ok("browser_content", page)
        assert "clicked mcp" in text_of(page), text_of(page)

        shot = await session.call_tool("browser_screenshot", s)
        facts = ok("browser_screenshot", shot)
        # The picture travels once, as image content, not again as base64 in the facts.
        assert "screenshot_base64" not in facts, sorted(facts)
        images = [c for c in shot.content if isinstance(c, types.ImageContent)]
        assert len(images) == 1, f"one image in {[c.type for c in shot.content]}"
        assert images[0].mime_type == "image/png", images[0].mime_type
        png = base64.b64decode(images[0].data, validate=True)
        assert png[:8] == PNG_SIGNATURE, png[:16]
        # The IHDR chunk comes first: a real page's size, not an empty image.
        assert png[12:16] == b"IHDR", png[:32]
        width, height = struct.unpack(">II", png[16:24])
        assert width >= 100 and height >= 100, (width, height)

    try:
        converse(mesh, tmp_path, scenario)
    finally:
        close_session(sm, session_id)


def test_a_password_fill_reports_the_pending_approval_at_once(mesh: Mesh, sm: Sandmesh, tmp_path: Path) -> None:
    session_id = f"mcp-py-fill-{new_id().lower()}"

    async def scenario(session: ClientSession, init: types.InitializeResult) -> None:
        s = {"session_id": session_id}
        ok("browser_navigate", await session.call_tool("browser_navigate", {**s, "url": mesh.fixture_url}))
        # Bounded well below the router's wait for a person (120 s): a tool that waited for
        # the decision instead of answering at once fails here.
        started = time.monotonic()
        parked = await session.call_tool(
            "browser_fill", {**s, "selector": "#pw", "text": "hunter2"}, read_timeout_seconds=60
        )
        state = ok("browser_fill", parked)
        assert state.get("state") == "awaiting_confirmation", f"{state}\n{text_of(parked)}"
        confirmation: Optional[str] = state.get("confirmation_id")
        assert confirmation and state.get("action") == "fill", state
        assert state.get("expires_at", 0) > time.time() * 1000, state
        assert time.monotonic() - started < 60
        shown = text_of(parked)
        assert "awaiting approval" in shown and f"sandmesh confirm approve {confirmation}" in shown, shown
        assert "hunter2" not in shown, shown

        listed = await asyncio.to_thread(mesh.cli, "confirm", "list")
        assert confirmation in listed.stdout, listed.stdout + listed.stderr
        approved = await asyncio.to_thread(mesh.cli, "confirm", "approve", confirmation)
        assert approved.returncode == 0, approved.stdout + approved.stderr
        # The router did the approved fill; the session's browser answers the next action.
        page = await session.call_tool("browser_content", s, read_timeout_seconds=RUN_TIMEOUT)
        ok("browser_content", page)
        assert "Hello from the SDK fixture" in text_of(page), text_of(page)

    try:
        converse(mesh, tmp_path, scenario)
    finally:
        close_session(sm, session_id)


def test_risky_run_code_reports_the_pending_approval_at_once(mesh: Mesh, tmp_path: Path) -> None:
    async def scenario(session: ClientSession, init: types.InitializeResult) -> None:
        # Bounded well below the run's own wait (the program's limit plus two minutes): a
        # server that waited for the person instead of answering at once fails here.
        parked = await session.call_tool("run_code", {"code": RISKY}, read_timeout_seconds=60)
        state = ok("run_code", parked)
        assert state.get("state") == "awaiting_confirmation", f"{state}\n{text_of(parked)}"
        confirmation: Optional[str] = state.get("confirmation_id")
        execution: Optional[str] = state.get("execution_id")
        assert confirmation and execution, state
        assert state.get("expires_at", 0) > time.time() * 1000, state
        shown = text_of(parked)
        assert "awaiting approval" in shown and f"sandmesh confirm approve {confirmation}" in shown, shown
        assert execution in shown and "get_result" in shown, shown

        # The operators see the same confirmation waiting.
        listed = await asyncio.to_thread(mesh.cli, "confirm", "list")
        assert confirmation in listed.stdout, listed.stdout + listed.stderr
        pending = ok("get_result", await session.call_tool("get_result", {"execution_id": execution, "wait_ms": 0}))
        assert (pending.get("state"), pending.get("confirmation_id")) == ("awaiting_confirmation", confirmation), pending

        approved = await asyncio.to_thread(mesh.cli, "confirm", "approve", confirmation)
        assert approved.returncode == 0, approved.stdout + approved.stderr
        # Each look-up waits up to 5 s for the result (a long poll): no sleeping between them.
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            done = await session.call_tool("get_result", {"execution_id": execution, "wait_ms": 5000})
            result = ok("get_result", done)
            if "status" in result:
                break
            assert result.get("state") in ("awaiting_confirmation", "running"), result
            assert time.monotonic() < deadline, f"no result {RUN_TIMEOUT:.0f} s after the approval: {result}"
        assert (result["status"], result["stdout"]) == ("ok", "approved-via-mcp\n"), result
        assert result["execution_id"] == execution, result
        assert result["confirmation"]["decision"] == "approved", result
        assert "confirmation: approved by" in text_of(done), text_of(done)

    converse(mesh, tmp_path, scenario)
