"""pydantic-ai's workspace backend on a sandmesh session: ``SandmeshWorkspace``.

::

    from pydantic_ai import Agent
    from sandmesh import Sandmesh
    from sandmesh.integrations.pydantic_ai import SandmeshWorkspace

    sm = Sandmesh.from_env()
    workspace = SandmeshWorkspace(sm)              # a session is opened on first use
    result = await workspace.run(["python3", "-c", "print(6*7)"])

Commands run as sandmesh ``shell`` runs in the session's container (assessed, audited, and
waiting for a person when the policy asks: ``on_awaiting_approval`` hears of it at once);
files go through the session's workspace API, which keeps the sandbox's permission bits: a
file its owner may not read or write (``chmod`` in a run) is refused with ``PermissionError``
as the sandbox user would be. The session is the environment: ``ref`` names it,
``SandmeshWorkspace(sm, ref=ref)`` attaches to it again, and nothing here closes it (whoever
holds the ref does: ``await workspace.aclose()``).
"""

from __future__ import annotations

import posixpath
import uuid
from typing import Any, Mapping, Optional, Sequence

from pydantic_ai.workspaces import (
    CommandResult,
    FileEntry,
    WorkspaceCommand,
    WorkspaceError,
    WorkspaceOutputLimitError,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)
from pydantic_ai.workspaces.protocol import validate_timeout

from ..errors import BadRequest, Conflict, Denied, NotFound, SandmeshError, Timeout, Unavailable
from ..sync import Sandmesh
from ..types import ExecResult
from ..types import FileEntry as MeshEntry
from ._common import WORKSPACE_ROOT, ApprovalNotice, MeshSession, shell_command, workspace_relative

__all__ = ["SandmeshWorkspace", "PROVIDER"]

#: ``WorkspaceRef.provider`` of a sandmesh session.
PROVIDER = "sandmesh"


class SandmeshWorkspace:
    """A pydantic-ai ``WorkspaceBackend`` + ``SupportsCommands`` + ``SupportsFilesystem`` +
    ``SupportsRealpath`` on one sandmesh session.

    Args:
        sm: the client (one serves any number of workspaces, from any event loop).
        ref: attach to this session instead of opening a new one.
        on_awaiting_approval: called with the :class:`~sandmesh.Confirmation` when a command
            waits for a person (default: a warning naming it); the command goes on waiting.
        session_options: ``sm.session(...)`` options for a new session (``template``, ``env``,
            ``network``, ``ttl_ms``, ...).
    """

    def __init__(
        self,
        sm: Sandmesh,
        *,
        ref: Optional[WorkspaceRef] = None,
        on_awaiting_approval: Optional[ApprovalNotice] = None,
        **session_options: Any,
    ) -> None:
        if ref is not None and ref.provider != PROVIDER:
            raise ValueError(f"a {ref.provider!r} workspace ref is not a sandmesh session")
        self._session = MeshSession(
            sm,
            ref.id if ref is not None else None,
            attach=ref is not None,
            on_awaiting_approval=on_awaiting_approval,
            open_fields=session_options,
        )
        self._ref = ref

    @property
    def ref(self) -> Optional[WorkspaceRef]:
        return self._ref

    @property
    def session_id(self) -> Optional[str]:
        return self._session.session_id

    async def _ensure(self) -> None:
        if self._session.opened:
            return
        try:
            await self._session.aopen()
        except NotFound as e:
            raise WorkspaceUnavailableError(f"sandmesh session {self._session.session_id}: {e.message}") from e
        except Conflict as e:  # a closed id that cannot be opened again
            raise WorkspaceUnavailableError(f"sandmesh session {self._session.session_id}: {e.message}") from e
        if self._ref is None:
            self._ref = WorkspaceRef(provider=PROVIDER, id=str(self._session.session_id))

    async def working_dir(self) -> str:
        await self._ensure()
        return WORKSPACE_ROOT

    async def aclose(self) -> None:
        """Closes the session (its container goes; the workspace stays until its TTL)."""
        await self._session.aclose()

    # === commands ===

    async def run(
        self,
        command: WorkspaceCommand,
        *,
        shell: bool = False,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> CommandResult:
        script = shell_command(command, shell=shell)
        validate_timeout(timeout)
        await self._ensure()
        try:
            result = await self._session.arun(script, "shell", env=dict(env) if env else None, timeout=timeout)
        except SandmeshError as e:
            raise _workspace_error(e) from e
        return _command_result(result, script)

    async def realpath(self, path: str) -> str:
        """``realpath -m`` in the session's container: symlinks resolved there, missing names
        kept as written; a loop is an ``OSError``."""
        full = posixpath.normpath(posixpath.join(WORKSPACE_ROOT, path))
        result = await self.run(["realpath", "-m", "--", full])
        if result.exit_code != 0:
            raise OSError(40, result.stderr.strip() or "cannot resolve", path)
        return result.stdout.rstrip("\n")

    # === files ===

    async def _call(self, path: str, op: str, *args: Any, **kwargs: Any) -> Any:
        await self._ensure()
        rel = _inside(path)
        try:
            return await self._session.afiles(op, rel, *args, **kwargs)
        except NotFound as e:
            raise FileNotFoundError(2, e.message, path) from e
        except (BadRequest, Conflict) as e:
            raise await self._path_error(path, rel, e) from e
        except SandmeshError as e:
            raise _workspace_error(e) from e

    async def _path_error(self, path: str, rel: str, error: SandmeshError) -> OSError:
        """What a refused path operation means in POSIX terms: the workspace store answers 400
        or 409 for a directory read or written as a file, a file in the way of a path, and the
        like."""
        parent = rel
        while parent:
            try:
                entry: MeshEntry = await self._session.afiles("stat", parent)
            except SandmeshError:
                entry = None  # type: ignore[assignment]
            if entry is not None:
                if parent == rel and entry.is_dir:
                    return IsADirectoryError(21, error.message, path)
                if parent != rel and not entry.is_dir:
                    return NotADirectoryError(20, error.message, path)
                break
            parent = posixpath.dirname(parent)
        return OSError(22, error.message, path)

    async def read_bytes(self, path: str) -> bytes:
        rel = _inside(path)
        if rel == "":
            raise IsADirectoryError(21, "the workspace is a directory", path)
        entry = await self._call(path, "stat")
        if entry.is_dir:
            raise IsADirectoryError(21, "is a directory", path)
        if not entry.mode & 0o400:
            raise PermissionError(13, "its owner may not read it", path)
        return await self._call(path, "read")

    async def write_bytes(self, path: str, data: bytes) -> None:
        rel = _inside(path)
        if rel == "":
            raise IsADirectoryError(21, "the workspace is a directory", path)
        try:
            entry: Optional[MeshEntry] = await self._call(path, "stat")
        except (FileNotFoundError, NotADirectoryError):
            entry = None
        if entry is not None and entry.is_dir:
            raise IsADirectoryError(21, "is a directory", path)
        if entry is not None and not entry.mode & 0o200:
            raise PermissionError(13, "its owner may not write it", path)
        await self._call(path, "write", bytes(data))

    async def stat(self, path: str) -> FileEntry:
        if _inside(path) == "":
            await self._ensure()
            return FileEntry(name=posixpath.basename(WORKSPACE_ROOT), path=WORKSPACE_ROOT, is_dir=True, size=None)
        return _entry(await self._call(path, "stat"))

    async def list_dir(self, path: str) -> Sequence[FileEntry]:
        rel = _inside(path)
        if rel != "":
            entry = await self._call(path, "stat")
            if not entry.is_dir:
                raise NotADirectoryError(20, "not a directory", path)
        await self._ensure()
        entries = await self._session.afiles("list", rel or None)
        return sorted((_entry(e) for e in entries), key=lambda e: e.name)

    async def make_dir(self, path: str) -> None:
        rel = _inside(path)
        await self._ensure()
        if rel == "":
            return
        try:
            entry: Optional[MeshEntry] = await self._call(path, "stat")
        except FileNotFoundError:
            entry = None
        if entry is not None:
            if not entry.is_dir:
                raise FileExistsError(17, "a file is in the way", path)
            return
        # The workspace API has no call of its own for a directory: writing a file makes its
        # parents (a file in the way is refused as NotADirectoryError), and the directory stays
        # when the file goes.
        marker = posixpath.join(path, f".sandmesh-mkdir-{uuid.uuid4().hex}")
        await self._call(marker, "write", b"")
        await self._call(marker, "remove")

    async def remove(self, path: str) -> None:
        if _is_ancestor_of_root(path) or _inside(path) == "":
            raise ValueError(f"refusing to remove the working directory or an ancestor of it: {path!r}")
        await self._call(path, "stat")
        await self._call(path, "remove", recursive=True)

    async def exists(self, path: str) -> bool:
        rel = _inside(path)
        await self._ensure()
        if rel == "":
            return True
        try:
            return bool(await self._session.afiles("exists", rel))
        except SandmeshError as e:
            raise _workspace_error(e) from e


def _inside(path: str) -> str:
    """The path as a path of the workspace's files; what lies outside the workspace is refused
    (the session's files are what this backend serves)."""
    if not isinstance(path, str):
        raise TypeError("a path is a string")
    rel = workspace_relative(path)
    if rel is None:
        raise PermissionError(13, f"outside the session's workspace ({WORKSPACE_ROOT})", path)
    return rel


def _is_ancestor_of_root(path: str) -> bool:
    full = posixpath.normpath(posixpath.join(WORKSPACE_ROOT, path))
    return full == "/" or WORKSPACE_ROOT.startswith(full.rstrip("/") + "/")


def _entry(e: MeshEntry) -> FileEntry:
    path = posixpath.join(WORKSPACE_ROOT, e.path)
    return FileEntry(name=posixpath.basename(e.path), path=path, is_dir=e.is_dir, size=None if e.is_dir else e.size)


def _command_result(result: ExecResult, script: str) -> CommandResult:
    if result.status == "timeout":
        raise WorkspaceTimeoutError(
            f"command timed out in sandmesh (execution {result.execution_id})", stdout=result.stdout, stderr=result.stderr
        )
    if result.status == "output_limit" or result.stdout_truncated or result.stderr_truncated:
        raise WorkspaceOutputLimitError(
            f"command output passed the mesh's limit (execution {result.execution_id})",
            limit=len(result.stdout.encode()) + len(result.stderr.encode()),
            stdout=result.stdout,
            stderr=result.stderr,
        )
    exit_code = result.exit_code
    if exit_code is None:  # oom, killed: the process ended by a signal
        exit_code = 137
    return CommandResult(exit_code=exit_code, stdout=result.stdout, stderr=result.stderr)


def _workspace_error(e: SandmeshError) -> Exception:
    """A mesh error as the workspace layer's: a session that is gone is unavailable, a wait out
    of time (a person not deciding included) a timeout, a person's or the policy's refusal a
    deliberate failure; an overloaded mesh propagates as it is (retryable)."""
    if isinstance(e, NotFound):
        return WorkspaceUnavailableError(f"sandmesh session gone: {e}")
    if isinstance(e, Timeout):
        return WorkspaceTimeoutError(str(e))
    if isinstance(e, Denied):
        return WorkspaceError(f"refused by sandmesh: {e}")
    if isinstance(e, Unavailable):
        return WorkspaceUnavailableError(str(e))
    return e
