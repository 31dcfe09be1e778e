"""smolagents' CodeAgent with SandmeshExecutor, end to end with a scripted model (no network):
each code action is a cell of a real session's kernel on the real mesh."""

from __future__ import annotations

from typing import Iterator, List

import PIL.Image
import pytest
from smolagents import CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import TokenUsage
from smolagents.utils import AgentError

from sandmesh import Sandmesh
from sandmesh.integrations.smolagents import SandmeshExecutor

from conftest import RISKY_PYTHON, Approver, assert_parked_and_approved


def s_files_read(sm: Sandmesh, executor: SandmeshExecutor) -> bytes:
    assert executor.session_id
    return sm.session(executor.session_id).files.read("notes.txt")


class ScriptedModel(Model):
    """Answers each step with the next scripted message (what a model would have said)."""

    def __init__(self, steps: List[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = iter(steps)
        self.seen: List[List[ChatMessage]] = []

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):  # type: ignore[no-untyped-def]
        self.seen.append(list(messages))
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=next(self.steps), token_usage=TokenUsage(input_tokens=0, output_tokens=0)
        )


def step(thought: str, code: str) -> str:
    return f"Thought: {thought}\n<code>\n{code}\n</code>"


@pytest.fixture
def executor(sm: Sandmesh, approver: Approver) -> Iterator[SandmeshExecutor]:
    ex = SandmeshExecutor(sm, on_awaiting_approval=approver, template="python-data")
    yield ex
    ex.cleanup()


def test_a_code_agent_writes_runs_keeps_state_and_waits_for_a_person(
    sm: Sandmesh, executor: SandmeshExecutor, approver: Approver
) -> None:
    model = ScriptedModel(
        [
            step("Write a file and keep a value.", "open('notes.txt', 'w').write('from smolagents')\nkept = 41\nprint('written')"),
            step("Run a command.", "import subprocess\nprint(subprocess.run(['cat', 'notes.txt'], capture_output=True, text=True).stdout)"),
            step("This needs a person.", RISKY_PYTHON + "\nprint('ran after approval')"),
            step("Answer from the kept value.", "final_answer(kept + 1)"),
        ]
    )
    agent = CodeAgent(tools=[], model=model, executor=executor, max_steps=6)
    answer = agent.run("Write notes.txt, read it back, then answer 42.")
    assert answer == 42, answer
    # The command's output reached the model (the next step's input carries it).
    observed = "\n".join(str(m.content) for msgs in model.seen for m in msgs)
    assert "from smolagents" in observed, observed[-2000:]
    assert "ran after approval" in observed, observed[-2000:]
    assert s_files_read(sm, executor) == b"from smolagents"
    assert_parked_and_approved(sm, approver, rule="py.os_system")


def test_a_cell_error_is_an_agent_error_and_state_survives_it(executor: SandmeshExecutor) -> None:
    assert executor.run_code_raise_errors("x = 20").output is None
    with pytest.raises(AgentError) as caught:
        executor.run_code_raise_errors("1 / 0")
    assert "ZeroDivisionError" in str(caught.value)
    out = executor.run_code_raise_errors("x * 2 + 2")
    assert (out.output, out.is_final_answer) == ("42", False), out


def test_a_figure_comes_back_as_a_pil_image(executor: SandmeshExecutor) -> None:
    out = executor.run_code_raise_errors(
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "fig = plt.figure(figsize=(1, 1))\nplt.plot([0, 1], [0, 1])\nplt.show()"
    )
    assert isinstance(out.output, PIL.Image.Image), out
    assert out.output.size[0] > 0


def test_tools_and_variables_reach_the_kernel(executor: SandmeshExecutor) -> None:
    from smolagents import tool

    @tool
    def double(n: int) -> int:
        """Doubles a number.

        Args:
            n: the number.
        """
        return 2 * n

    executor.send_tools({"double": double})
    executor.send_variables({"base": 21})
    assert executor.run_code_raise_errors("double(base)").output == "42"
