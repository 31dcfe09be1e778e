"""The recipes of docs/guide/agents.md, run as written: each adapter recipe with a scripted model
in place of a real one (no network) and the operator fixture approving what waits for a person,
each MCP recipe's server entry with the official ``mcp``
client against the real ``sandmesh mcp`` (tools listed, ``run_code`` answers 42)."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sandmesh import Sandmesh

from conftest import RUN_TIMEOUT, Approver, Mesh
from meshfixture import REPO, SANDMESH

GUIDE = REPO / "docs" / "guide" / "agents.md"
SIX_BY_SEVEN = "python3 -c 'print(6*7)'"


def recipes() -> Dict[str, str]:
    text = GUIDE.read_text()
    found = dict(re.findall(r"<!-- recipe: ([^>]+?) -->\n```python\n(.*?)```", text, re.S))
    assert found, f"no recipes in {GUIDE}"
    return found


def load(name: str) -> Dict[str, Any]:
    """Runs the recipe's code as a module would; its names are returned."""
    code = recipes()[name]
    namespace: Dict[str, Any] = {"__name__": f"recipe_{name}"}
    exec(compile(code, f"{GUIDE}:{name}", "exec"), namespace)
    return namespace


MCP_RECIPES = sorted(n for n in recipes() if n.startswith("mcp "))


def test_every_framework_has_a_recipe() -> None:
    names = set(recipes())
    assert {"pydantic-ai", "deepagents", "openai-agents", "smolagents"} <= names, names
    assert {"mcp claude-agent-sdk", "mcp crewai", "mcp langchain", "mcp pydantic-ai"} <= names, names


def test_the_pydantic_ai_recipe(sm: Sandmesh, operator: Approver) -> None:
    def script(messages: List[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(str(returns[0].content))])
        return ModelResponse(parts=[ToolCallPart("shell", {"command": SIX_BY_SEVEN})])

    ask = load("pydantic-ai")["ask"]
    answer = asyncio.run(ask(sm, FunctionModel(script), "What is 6*7?", operator))
    assert answer == "exit 0\n42\n", answer


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model answering with scripted messages (tool calls, then text)."""

    replies: List[AIMessage]
    turn: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedChatModel":
        return self

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        reply = self.replies[self.turn]
        self.turn += 1
        return ChatResult(generations=[ChatGeneration(message=reply)])


def test_the_deepagents_recipe(sm: Sandmesh, operator: Approver) -> None:
    model = ScriptedChatModel(
        replies=[
            AIMessage(content="", tool_calls=[{"name": "execute", "args": {"command": SIX_BY_SEVEN}, "id": "c1"}]),
            AIMessage(content="done"),
        ]
    )
    sandbox, agent = load("deepagents")["build"](sm, model, operator)
    with sandbox:
        out = agent.invoke({"messages": [{"role": "user", "content": "What is 6*7?"}]})
    tool_said = [m.content for m in out["messages"] if type(m).__name__ == "ToolMessage"]
    assert tool_said and tool_said[0].startswith("42\n"), tool_said


def test_the_openai_agents_recipe(sm: Sandmesh, operator: Approver) -> None:
    from test_openai_agents import ScriptedModel, say, shell_call, tool_outputs

    model = ScriptedModel([[shell_call(1, SIX_BY_SEVEN)], [say("done")]])
    assert asyncio.run(load("openai-agents")["ask"](sm, model, "What is 6*7?", operator)) == "done"
    assert "42" in tool_outputs(model), tool_outputs(model)


def test_the_smolagents_recipe(sm: Sandmesh, operator: Approver) -> None:
    from test_smolagents import ScriptedModel, step

    model = ScriptedModel([step("Compute it.", "final_answer(6 * 7)")])
    assert load("smolagents")["ask"](sm, model, "What is 6*7?", operator) == 42


@pytest.mark.parametrize("name", MCP_RECIPES)
def test_an_mcp_recipe_reaches_sandmesh_mcp(name: str, mesh: Mesh) -> None:
    creds = mesh.data_dir / "creds" / "agent.json"
    assert creds.is_file(), f"`sandmesh up` wrote no agent credentials at {creds}"
    tree = ast.parse(recipes()[name])
    entries = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "sandmesh_server" for t in node.targets)
    ]
    assert len(entries) == 1, f"recipe {name} names no single sandmesh_server entry"
    entry = eval(compile(ast.Expression(entries[0]), name, "eval"), {"SANDMESH": str(SANDMESH), "CREDS": str(creds)})
    assert entry.get("type", "stdio") == "stdio" and entry.get("transport", "stdio") == "stdio", entry
    server = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])

    async def converse() -> None:
        async with stdio_client(server) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = {t.name for t in (await session.list_tools()).tools}
                assert "run_code" in tools, tools
                ran = await session.call_tool("run_code", {"code": "print(6*7)"})
                text = "\n".join(c.text for c in ran.content if isinstance(c, types.TextContent))
                assert not ran.is_error and "42" in text, text

    asyncio.run(asyncio.wait_for(converse(), RUN_TIMEOUT))
