"""The OpenAI Agents SDK's SandboxAgent on SandmeshSandboxClient, end to end with a scripted model
(no network): the Runner creates the sandbox session on the real mesh, the model's shell calls run
there (as the session's background processes: the provider supports the SDK's PTY API), and the
session closes when the run ends. Then the session API as the SDK's tools call it: files, the
workspace as an archive, a terminal driven line by line, and a server reached through its
exposed port on the mesh's HTTP gateway."""

from __future__ import annotations

import asyncio
import http.client
import io
import json
import time
import urllib.parse
import uuid
from typing import Any, AsyncIterator, List, Optional, Tuple

import pytest
from agents import Runner
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run_config import RunConfig, SandboxRunConfig
from agents.sandbox import SandboxAgent
from agents.sandbox.errors import ExposedPortUnavailableError, PtySessionNotFoundError
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.pty_types import PtyExecUpdate
from agents.sandbox.snapshot import resolve_snapshot
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from sandmesh import Sandmesh
from sandmesh.integrations.openai_agents import (
    SandmeshSandboxClient,
    SandmeshSandboxClientOptions,
    SandmeshSandboxSessionState,
)

from conftest import RISKY_SHELL, Approver, Mesh

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def shell_call(n: int, cmd: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", id=f"fc_{n}", call_id=f"call_{n}", name="exec_command", arguments=json.dumps({"cmd": cmd})
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_final",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Answers each turn with the next scripted output (what a model would have said) and keeps
    what it was sent (the tools' outputs come back as input)."""

    def __init__(self, turns: List[list]) -> None:
        self.turns = iter(turns)
        self.inputs: List[Any] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kw):  # type: ignore[no-untyped-def]
        self.inputs.append(input)
        return ModelResponse(output=next(self.turns), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def tool_outputs(model: ScriptedModel) -> str:
    return "\n".join(
        str(item.get("output"))
        for turn in model.inputs
        if isinstance(turn, list)
        for item in turn
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    )


class RecordingClient(SandmeshSandboxClient):
    """The provider, keeping the sessions the Runner makes with it (other tests make theirs on
    the same mesh meanwhile)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made: List[Any] = []

    async def create(self, **kwargs: Any) -> Any:
        session = await super().create(**kwargs)
        self.made.append(session)
        return session


async def test_a_sandbox_agent_writes_runs_and_waits_for_a_person(sm: Sandmesh, approver: Approver) -> None:
    model = ScriptedModel(
        [
            [shell_call(1, "printf 'from openai-agents' > notes.txt && cat notes.txt")],
            [shell_call(2, "python3 -c 'print(6 * 7)'")],
            [shell_call(3, RISKY_SHELL)],
            [say("done")],
        ]
    )
    agent = SandboxAgent(name="dev", instructions="Use the shell.", model=model)
    client = RecordingClient(sm, on_awaiting_approval=approver)
    config = RunConfig(sandbox=SandboxRunConfig(client=client, options=SandmeshSandboxClientOptions()))
    result = await Runner.run(agent, "Write notes.txt, compute 6*7, then call os.system.", run_config=config)
    assert result.final_output == "done"
    outputs = tool_outputs(model)
    assert "from openai-agents" in outputs and "42" in outputs and "approved-run" in outputs, outputs
    # The shell tool's commands are processes: a start that waits for a person is told to the
    # callback at once (from the confirmation's audit event), and the approval let it run.
    assert approver.noticed.is_set(), "no command waited for a person"
    assert approver.decisions() == ["approved"] * len(approver.notices), approver.notices
    # The Runner made the session and ended it with the run.
    assert len(client.made) == 1, client.made
    made = client.made[0]._inner.state.mesh_session_id
    assert [s.state for s in sm.sessions() if s.session_id == made] == ["closed"], made


async def test_the_session_api_reads_writes_persists_and_hydrates(sm: Sandmesh) -> None:
    client = SandmeshSandboxClient(sm)
    session = await client.create(options=SandmeshSandboxClientOptions(env={"GREETING": "hi"}))
    async with session:
        await session.write("data/in.txt", io.BytesIO(b"payload"))
        result = await session.exec("cat data/in.txt; printf ' %s' \"$GREETING\"", shell=True)
        assert (result.exit_code, result.stdout) == (0, b"payload hi"), result
        assert (await session.read("data/in.txt")).read() == b"payload"
        archive = await session.persist_workspace()
        tar = archive.read()
        assert tar[257:262] == b"ustar", "persist_workspace returns a tar archive"
        assert await session.running()
    other = await client.create(options=SandmeshSandboxClientOptions())
    async with other:
        await other.hydrate_workspace(io.BytesIO(tar))
        assert (await other.read("data/in.txt")).read() == b"payload"
        missing = other.read("absent.txt")
        with pytest.raises(Exception) as caught:
            await missing
        assert type(caught.value).__name__ == "WorkspaceReadNotFoundError", caught.value
    await client.delete(session)
    await client.delete(other)
    assert not await session._inner.running()


async def settle(session: Any, update: PtyExecUpdate, until: Optional[bytes] = None) -> Tuple[bytes, PtyExecUpdate]:
    """Polls a process (``write_stdin`` with nothing) until its output holds ``until`` (without
    one, until it ended); what it printed meanwhile and the last update."""
    seen = update.output
    deadline = time.monotonic() + 60
    while (until is None or until not in seen) and update.process_id is not None and time.monotonic() < deadline:
        update = await session.pty_write_stdin(session_id=update.process_id, chars="", yield_time_s=1)
        seen += update.output
    return seen, update


async def test_a_terminal_echoes_a_line_and_ends_with_its_exit_status(sm: Sandmesh, approver: Approver) -> None:
    client = SandmeshSandboxClient(sm, on_awaiting_approval=approver)
    session = await client.create(options=SandmeshSandboxClientOptions())
    async with session:
        assert session.supports_pty()
        shell = await session.pty_exec_start("sh", tty=True, yield_time_s=1)
        assert shell.process_id is not None and shell.exit_code is None, shell
        typed = await session.pty_write_stdin(session_id=shell.process_id, chars="echo sum-$((6 * 7))\n", yield_time_s=1)
        seen, typed = await settle(session, typed, b"sum-42")
        # The terminal echoes the line as typed, then the shell's answer.
        assert b"echo sum-$((6 * 7))" in seen and b"sum-42" in seen, seen
        ended = await session.pty_write_stdin(session_id=shell.process_id, chars="exit 3\n", yield_time_s=1)
        _, ended = await settle(session, ended)
        assert (ended.process_id, ended.exit_code) == (None, 3), ended
        with pytest.raises(PtySessionNotFoundError):
            await session.pty_write_stdin(session_id=shell.process_id, chars="")

        # Without a tty: both streams, the exit status in the first update of a quick command.
        quick = await session.pty_exec_start("printf out; printf err >&2; exit 4", yield_time_s=5)
        assert (quick.process_id, quick.exit_code) == (None, 4), quick
        assert b"out" in quick.output and b"err" in quick.output, quick
        # A command still running when its yield time ends goes on; it takes no input.
        slow = await session.pty_exec_start("sleep 1; echo slept", yield_time_s=0.25)
        assert slow.process_id is not None and slow.exit_code is None, slow
        with pytest.raises(RuntimeError, match="stdin is not available"):
            await session.pty_write_stdin(session_id=slow.process_id, chars="x")
        seen, slow = await settle(session, slow)
        assert b"slept" in seen and (slow.process_id, slow.exit_code) == (None, 0), (seen, slow)
    await client.delete(session)


def get_through_gateway(url: str, path: str) -> Tuple[int, bytes]:
    """GET ``path`` of an endpoint's URL as a browser would: ``*.localhost`` names loopback (a
    browser resolves it so by itself), the host name goes in ``Host``, the query as given."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname and parts.hostname.endswith(".localhost") and parts.port, url
    conn = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=30)
    try:
        conn.request("GET", f"{path}?{parts.query}", headers={"Host": parts.netloc})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


async def test_a_server_is_reached_through_its_exposed_port(sm: Sandmesh, mesh: Mesh, approver: Approver) -> None:
    gateway = "http://" + mesh.env["SANDMESH_GATEWAY_ADDR"]
    client = SandmeshSandboxClient(sm, on_awaiting_approval=approver, gateway=gateway)
    session = await client.create(options=SandmeshSandboxClientOptions(exposed_ports=(8000,)))
    async with session:
        await session.write("site/hello.txt", io.BytesIO(b"hi through the port\n"))
        server = await session.pty_exec_start(
            "python3 -m http.server 8000 --bind 127.0.0.1 --directory site", yield_time_s=0.5
        )
        assert server.process_id is not None, f"the server ended: {server}"
        endpoint = await session.resolve_exposed_port(8000)
        url = endpoint.url_for("http")
        assert endpoint.host.startswith("8000-") and endpoint.port == int(gateway.rsplit(":", 1)[1]), url
        deadline = time.monotonic() + 60
        while True:  # 503 until the server listens
            status, body = await asyncio.to_thread(get_through_gateway, url, "/hello.txt")
            if status != 503 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert (status, body) == (200, b"hi through the port\n"), (status, body)
        # Resolved again, the same exposure: its token still works.
        assert await session.resolve_exposed_port(8000) == endpoint
        # The token is what lets a request in: a forged one is refused.
        forged = url.replace("sandmesh_token=", "sandmesh_token=x")
        assert (await asyncio.to_thread(get_through_gateway, forged, "/hello.txt"))[0] == 401
        # A port the options did not name is the SDK's refusal, before the mesh is asked.
        with pytest.raises(ExposedPortUnavailableError):
            await session.resolve_exposed_port(9000)
    await client.delete(session)


async def test_a_port_the_gateway_cannot_route_is_refused(sm: Sandmesh, mesh: Mesh) -> None:
    for bad in ("127.0.0.1:4281", "ftp://127.0.0.1:4281", "http://127.0.0.1:port", "http://:4281", "http://h:0"):
        with pytest.raises(ValueError, match="the gateway is an http"):
            SandmeshSandboxClient(sm, gateway=bad)
    # A session whose id has capitals (the mesh's own ids have them; this client makes none): the
    # gateway's host route, whose host names arrive lower-cased, cannot name it.
    client = SandmeshSandboxClient(sm, gateway="http://" + mesh.env["SANDMESH_GATEWAY_ADDR"])
    with sm.session() as named:
        assert named.session_id != named.session_id.lower()
        key = uuid.uuid4()
        state = SandmeshSandboxSessionState(
            session_id=key,
            manifest=Manifest(root="/workspace"),
            snapshot=resolve_snapshot(None, str(key)),
            exposed_ports=(8000,),
            mesh_session_id=named.session_id,
        )
        session = await client.resume(state)
        with pytest.raises(ExposedPortUnavailableError) as refused:
            await session.resolve_exposed_port(8000)
        assert "has capitals" in str(refused.value.context), refused.value.context
