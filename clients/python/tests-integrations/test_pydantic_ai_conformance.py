"""pydantic-ai's own conformance suite (``WorkspaceBackendSuite``) against SandmeshWorkspace on
the real mesh. Rules that cannot pass today are marked xfail with the reason, each listed in
src/sandmesh/integrations/README.md."""

from __future__ import annotations

from typing import AsyncIterator, Awaitable, Callable, Iterator

import pytest
from pydantic_ai.workspaces import WorkspaceBackend, WorkspaceRef
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite

from sandmesh import Sandmesh
from sandmesh.integrations.pydantic_ai import SandmeshWorkspace

from conftest import Approver

RUNNING_FILES = (
    "files a running command writes reach the workspace API when the run ends, so the suite "
    "cannot see them while the command runs"
)
SYMLINKS = (
    "the workspace API holds plain files and directories only: a symlink a run makes is not "
    "in it"
)
#: The rules sandmesh does not meet yet, and why (the README's list, word for word).
NOT_YET = {
    "test_cancellation_stops_foreground_work": RUNNING_FILES,
    "test_destroying_environment_during_command_raises_unavailable": RUNNING_FILES,
    "test_a_backend_attached_by_ref_reaches_a_detached_process": (
        "a run's processes end with it, a setsid daemon included; only a session's background "
        "processes (proc.start) outlive a run, and this backend's commands are runs"
    ),
    "test_symlink_loop_does_not_break_listing": SYMLINKS,
    "test_realpath_and_entries_follow_symlinks": SYMLINKS,
    "test_writes_go_through_a_symlink": SYMLINKS,
    "test_permission_denied_uses_builtin_error": (
        "the workspace API does not see a run's chmod: the mode it keeps is the one the file "
        "was written with"
    ),
}

#: Rules that wait out one of the suite's own hang guards (30 or 60 s) here: three of the rules
#: above, which wait for what a run cannot show yet, and one whose cleanup waits for a background
#: child a run does not leave running (the rule itself passes). They start first (conftest.py).
WAITS = {
    "test_cancellation_stops_foreground_work",
    "test_destroying_environment_during_command_raises_unavailable",
    "test_a_backend_attached_by_ref_reaches_a_detached_process",
    "test_background_child_does_not_hold_up_completed_command",
}


@pytest.fixture(scope="module")
def shared(sm: Sandmesh, operator: Approver) -> Iterator[SandmeshWorkspace]:
    """One session for the suite's rules (each rule works in a scratch directory of its own)."""
    workspace = SandmeshWorkspace(sm, on_awaiting_approval=operator)
    yield workspace
    if workspace.session_id:
        sm.session(workspace.session_id).close()


class TestSandmeshWorkspace(WorkspaceBackendSuite):
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    async def backend(
        self, sm: Sandmesh, shared: SandmeshWorkspace, operator: Approver
    ) -> AsyncIterator[WorkspaceBackend]:
        await shared.working_dir()
        assert shared.ref is not None
        yield SandmeshWorkspace(sm, ref=shared.ref, on_awaiting_approval=operator)

    @pytest.fixture
    def fresh_backend(self, sm: Sandmesh, operator: Approver) -> Callable[[], WorkspaceBackend]:
        return lambda: SandmeshWorkspace(sm, on_awaiting_approval=operator)

    @pytest.fixture
    def attach_backend(self, sm: Sandmesh, operator: Approver) -> Callable[[WorkspaceRef], WorkspaceBackend]:
        return lambda ref: SandmeshWorkspace(sm, ref=ref, on_awaiting_approval=operator)

    @pytest.fixture
    def destroy_environment(self) -> Callable[[WorkspaceBackend], Awaitable[None]]:
        async def destroy(backend: WorkspaceBackend) -> None:
            assert isinstance(backend, SandmeshWorkspace)
            await backend.aclose()

        return destroy
