"""LangChain's standard sandbox suite (``SandboxIntegrationTests``) against SandmeshSandbox on
the real mesh. Rules that cannot pass today are marked xfail with the reason, each listed in
src/sandmesh/integrations/README.md."""

from __future__ import annotations

from typing import Iterator

import pytest
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_tests.integration_tests import SandboxIntegrationTests

from sandmesh import Sandmesh
from sandmesh.integrations.deepagents import SandmeshSandbox

from conftest import Approver

# The suite's async rules are plain coroutines: anyio runs them.
pytestmark = pytest.mark.anyio

#: The rules sandmesh does not meet yet, and why (the README's list, word for word).
NO_PYTHON = "the sandbox images name the interpreter python3: there is no `python` on their PATH"
GLOB_PATHS = (
    "deepagents 0.7.32's own BaseSandbox.glob answers absolute paths; langchain-tests 1.1.9 "
    "expects them relative to the search root (the two pinned releases disagree)"
)
NOT_YET = {
    "test_execute_large_stdout_payload": NO_PYTHON,
    "test_aexecute_large_stdout_payload": NO_PYTHON,
    "test_glob": GLOB_PATHS,
    "test_glob_basic_pattern": GLOB_PATHS,
    "test_glob_with_directories": GLOB_PATHS,
    "test_glob_hidden_files_explicitly": GLOB_PATHS,
    "test_glob_with_character_class": GLOB_PATHS,
    "test_glob_with_question_mark": GLOB_PATHS,
    "test_write_existing_file_fails": (
        "deepagents 0.7.32's own BaseSandbox.write overwrites an existing file (its documented "
        "behaviour); langchain-tests 1.1.9 expects a refusal"
    ),
}


class TestSandmeshSandbox(SandboxIntegrationTests):
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @property
    def sandbox_root_dir(self) -> str:
        # The session's workspace, which the files API serves (the suite's default, /tmp,
        # is reached only through runs).
        return "/workspace/test_sandbox_ops/"

    @pytest.fixture(scope="class")
    def sandbox(self, sm: Sandmesh, operator: Approver) -> Iterator[SandboxBackendProtocol]:
        with SandmeshSandbox(sm, on_awaiting_approval=operator) as sandbox:
            yield sandbox
