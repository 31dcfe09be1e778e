"""The OpenAI Agents SDK's SandboxAgent on SandmeshSandboxClient, end to end with a scripted model
(no network): the Runner creates the sandbox session on the real mesh, the model's shell calls run
there, and the session closes when the run ends."""

from __future__ import annotations

import io
import json
from typing import Any, AsyncIterator, List

import pytest
from agents import Runner
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run_config import RunConfig, SandboxRunConfig
from agents.sandbox import SandboxAgent
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from sandmesh import Sandmesh
from sandmesh.integrations.openai_agents import SandmeshSandboxClient, SandmeshSandboxClientOptions

from conftest import RISKY_SHELL, Approver, assert_parked_and_approved

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


async def test_a_sandbox_agent_writes_runs_and_waits_for_a_person(sm: Sandmesh, approver: Approver) -> None:
    before = {s.session_id for s in sm.sessions()}
    model = ScriptedModel(
        [
            [shell_call(1, "printf 'from openai-agents' > notes.txt && cat notes.txt")],
            [shell_call(2, "python3 -c 'print(6 * 7)'")],
            [shell_call(3, RISKY_SHELL)],
            [say("done")],
        ]
    )
    agent = SandboxAgent(name="dev", instructions="Use the shell.", model=model)
    client = SandmeshSandboxClient(sm, on_awaiting_approval=approver)
    config = RunConfig(sandbox=SandboxRunConfig(client=client, options=SandmeshSandboxClientOptions()))
    result = await Runner.run(agent, "Write notes.txt, compute 6*7, then call os.system.", run_config=config)
    assert result.final_output == "done"
    outputs = tool_outputs(model)
    assert "from openai-agents" in outputs and "42" in outputs and "approved-run" in outputs, outputs
    assert_parked_and_approved(sm, approver)
    # The Runner made the session and ended it with the run.
    made = [s for s in sm.sessions() if s.session_id not in before]
    assert len(made) == 1 and made[0].state == "closed", made


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
