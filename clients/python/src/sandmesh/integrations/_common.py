"""What every adapter shares: the workspace's place in the sandbox, paths mapped onto the
session's files, shell commands as sandmesh runs, background processes, and what a run waiting
for a person does by default."""

from __future__ import annotations

import asyncio
import logging
import posixpath
import shlex
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

from .._exec import call_back
from .._processes import Process
from ..client import AsyncSession
from ..errors import NotFound
from ..sync import Sandmesh
from ..types import AuditEvent, Confirmation, ExecResult

__all__ = [
    "WORKSPACE_ROOT",
    "ApprovalNotice",
    "log_approval_notice",
    "workspace_relative",
    "shell_command",
    "MeshSession",
]

#: Where a session's workspace is mounted in its sandbox (and the directory runs start in): the
#: files API's paths are relative to it.
WORKSPACE_ROOT = "/workspace"

#: Called with the :class:`~sandmesh.Confirmation` when a run waits for a person's approval.
ApprovalNotice = Callable[[Confirmation], Any]

logger = logging.getLogger("sandmesh.integrations")


def log_approval_notice(confirmation: Confirmation) -> None:
    """The default notice: a warning naming the confirmation and how to decide it, so a
    framework's run that waits for a person never looks hung."""
    logger.warning(
        "sandmesh: execution %s waits for a person's approval (confirmation %s): "
        "`sandmesh confirm approve %s` or the console decides it",
        confirmation.execution_id,
        confirmation.confirmation_id,
        confirmation.confirmation_id,
    )


def workspace_relative(path: str, root: str = WORKSPACE_ROOT) -> Optional[str]:
    """``path`` (absolute, or relative to ``root``) as a path of the session's files: ``""``
    for the root itself, ``None`` outside it. ``..`` segments are resolved as text first, so a
    path cannot climb out of the workspace through them."""
    joined = posixpath.normpath(posixpath.join(root, path))
    if joined == root:
        return ""
    if joined.startswith(root.rstrip("/") + "/"):
        return joined[len(root.rstrip("/")) + 1 :]
    return None


def shell_command(command: Union[str, Sequence[str]], *, shell: bool) -> str:
    """The shell script a sandmesh ``shell`` run executes for an argv (each item quoted, so it
    stays literal) or for a shell string. A mismatch of the command's form and ``shell`` is a
    ``TypeError``, as in ``subprocess``."""
    if shell:
        if not isinstance(command, str):
            raise TypeError("shell=True takes the command as one string")
        return command
    if isinstance(command, (str, bytes)):
        raise TypeError("an argv sequence is needed unless shell=True")
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("the argv is empty")
    return shlex.join(argv)


class MeshSession:
    """One sandmesh session an adapter works in, opened on first use (no I/O when built).

    ``session_id=None`` makes a new session at the first operation; a given id with
    ``attach=True`` reaches that session and never makes a replacement (:class:`NotFound` when
    it is gone or closed). Calls go through the client's private loop, so the framework may call
    from any event loop or thread: ``a*`` methods await, the others block.
    """

    def __init__(
        self,
        sm: Sandmesh,
        session_id: Optional[str] = None,
        *,
        attach: bool = False,
        on_awaiting_approval: Optional[ApprovalNotice] = None,
        open_fields: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.sm = sm
        self.session_id = session_id
        self._attach = attach and session_id is not None
        self._fields = dict(open_fields or {})
        self.on_awaiting_approval: ApprovalNotice = on_awaiting_approval or log_approval_notice
        self._inner: Optional[AsyncSession] = None
        # Made on the client's loop by the first open: every open runs there, so one lock
        # serializes concurrent first uses from any caller's loop.
        self._lock: Optional[asyncio.Lock] = None

    @property
    def opened(self) -> bool:
        return self._inner is not None

    async def _open_here(self) -> AsyncSession:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._inner is None:
                inner = self.sm.async_client.session(self.session_id, **self._fields)
                if self._attach:
                    info = await inner.get()
                    if info.state == "closed":
                        raise NotFound(f"session {self.session_id} is closed", details={"state": info.state})
                await inner.open()
                self.session_id = inner.session_id
                self._inner = inner
        return self._inner

    async def aopen(self) -> AsyncSession:
        if self._inner is not None:
            return self._inner
        return await self.sm.acall(self._open_here())

    def open(self) -> AsyncSession:
        if self._inner is not None:
            return self._inner
        return self.sm._call(self._open_here())

    async def _run_here(self, code: str, language: str, kwargs: Dict[str, Any]) -> ExecResult:
        inner = await self._open_here()
        return await inner.run(code, language, on_awaiting_approval=self.on_awaiting_approval, **kwargs)

    async def arun(self, code: str, language: str = "shell", **kwargs: Any) -> ExecResult:
        """A run in the session (arguments of :meth:`AsyncSandmesh.run`); a run waiting for a
        person calls ``on_awaiting_approval`` and goes on waiting."""
        return await self.sm.acall(self._run_here(code, language, kwargs))

    def run(self, code: str, language: str = "shell", **kwargs: Any) -> ExecResult:
        return self.sm._call(self._run_here(code, language, kwargs))

    async def _call_here(self, part: str, op: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        inner = await self._open_here()
        return await getattr(getattr(inner, part), op)(*args, **kwargs)

    async def afiles(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """``files.<op>(...)`` of the session (``read``, ``write``, ``stat``, ``list``, ``exists``,
        ``remove``), awaited."""
        return await self.sm.acall(self._call_here("files", op, args, kwargs))

    def files(self, op: str, *args: Any, **kwargs: Any) -> Any:
        return self.sm._call(self._call_here("files", op, args, kwargs))

    async def aprocesses(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """``processes.<op>(...)`` of the session (``read``, ``wait``, ``send_input``, ``kill``),
        awaited; :meth:`astart` starts one."""
        return await self.sm.acall(self._call_here("processes", op, args, kwargs))

    async def aports(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """``ports.<op>(...)`` of the session (``expose``, ``list``, ``unexpose``), awaited."""
        return await self.sm.acall(self._call_here("ports", op, args, kwargs))

    async def _start_here(self, command: Sequence[str], kwargs: Dict[str, Any]) -> Process:
        inner = await self._open_here()
        # A start that waits for a person answers only once they decided: what tells of the wait
        # at once is the confirmation service's audit event, which names the session.
        asked = await self.sm.async_client.audit.follow("confirmation_requested", session_id=inner.session_id)

        async def tell() -> None:
            async for event in asked:
                await call_back(self.on_awaiting_approval, _confirmation(event))

        telling = asyncio.ensure_future(tell())
        try:
            return await inner.processes.start(list(command), **kwargs)
        finally:
            telling.cancel()
            await asked.close()

    async def astart(self, command: Sequence[str], **kwargs: Any) -> Process:
        """Starts a background process in the session (``processes.start`` arguments). While the
        start waits for a person, each confirmation the session asks for meanwhile goes to
        ``on_awaiting_approval``, and the start goes on waiting (up to the client's
        ``run_timeout``, as a run does)."""
        return await self.sm.acall(self._start_here(command, kwargs))

    async def aclose(self) -> None:
        if self._inner is not None:
            inner, self._inner = self._inner, None
            await self.sm.acall(inner.close())

    def close(self) -> None:
        if self._inner is not None:
            inner, self._inner = self._inner, None
            self.sm._call(inner.close())


def _confirmation(event: AuditEvent) -> Confirmation:
    """A ``confirmation_requested`` audit event as the notice a parked run gives."""
    details = event.details if isinstance(event.details, dict) else {}
    return Confirmation(
        execution_id=event.execution_id or "",
        confirmation_id=str(details.get("id", "")),
        expires_at=int(details.get("expires_at", 0)),
    )
