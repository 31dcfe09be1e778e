"""The OpenAI Agents SDK's sandbox provider on sandmesh sessions: ``SandmeshSandboxClient``.

::

    from agents import Runner
    from agents.run_config import RunConfig, SandboxRunConfig
    from agents.sandbox import SandboxAgent
    from sandmesh import Sandmesh
    from sandmesh.integrations.openai_agents import SandmeshSandboxClient

    sm = Sandmesh.from_env()
    run_config = RunConfig(sandbox=SandboxRunConfig(client=SandmeshSandboxClient(sm)))
    result = await Runner.run(SandboxAgent(name="dev", model=...), "…", run_config=run_config)

A sandbox session is a sandmesh session: ``exec`` is a ``shell`` run in its container (assessed,
audited, and waiting for a person when the policy asks: ``on_awaiting_approval`` hears of it at
once), ``read``/``write`` use its workspace API (paths outside ``/workspace`` go through a
run), ``persist_workspace``/``hydrate_workspace`` move the workspace as a tar archive, and
``shutdown`` (the SDK's end of the session, ``client.delete``) closes it. ``resume`` attaches to
the session a saved state names, or opens a new one that the SDK hydrates from the snapshot.

Not supported yet: PTY sessions (``write_stdin``; sandmesh keeps no process between runs) and
exposed ports.
"""

from __future__ import annotations

import base64
import io
import shlex
import uuid
from pathlib import Path
from typing import Any, Dict, Literal, Optional

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes

from ..errors import Denied, NotFound, SandmeshError, Timeout
from ..sync import Sandmesh
from ._common import WORKSPACE_ROOT, ApprovalNotice, MeshSession, workspace_relative

__all__ = [
    "SandmeshSandboxClient",
    "SandmeshSandboxClientOptions",
    "SandmeshSandboxSession",
    "SandmeshSandboxSessionState",
]

#: The archive persist/hydrate pass through the workspace (excluded from itself).
_ARCHIVE = ".sandmesh-workspace.tar"


class SandmeshSandboxClientOptions(BaseSandboxClientOptions):
    """Options of a new sandmesh session (``sm.session(...)``)."""

    type: Literal["sandmesh"] = "sandmesh"
    template: Optional[str] = None
    env: Optional[Dict[str, str]] = None
    network: Optional[Dict[str, Any]] = None
    ttl_ms: Optional[int] = None
    idle_ms: Optional[int] = None

    def session_fields(self) -> Dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k != "type" and v is not None}


class SandmeshSandboxSessionState(SandboxSessionState):
    """What a saved run keeps of its sandbox: the sandmesh session's id and how it was opened."""

    type: Literal["sandmesh"] = "sandmesh"
    mesh_session_id: Optional[str] = None
    options: SandmeshSandboxClientOptions = SandmeshSandboxClientOptions()


class SandmeshSandboxSession(BaseSandboxSession):
    """One sandmesh session as an Agents SDK sandbox session."""

    state: SandmeshSandboxSessionState

    def __init__(
        self,
        *,
        state: SandmeshSandboxSessionState,
        sm: Sandmesh,
        attach: bool = False,
        on_awaiting_approval: Optional[ApprovalNotice] = None,
    ) -> None:
        self.state = state
        self._mesh = MeshSession(
            sm,
            state.mesh_session_id,
            attach=attach,
            on_awaiting_approval=on_awaiting_approval,
            open_fields=state.options.session_fields(),
        )

    @property
    def mesh_session(self) -> MeshSession:
        return self._mesh

    async def _ensure_backend_started(self) -> None:
        await self._mesh.aopen()
        self.state.mesh_session_id = self._mesh.session_id

    async def _shutdown_backend(self) -> None:
        await self._mesh.aclose()

    async def running(self) -> bool:
        if not self._mesh.opened:
            return False
        try:
            info = await self._mesh.sm.acall(self._mesh.sm.async_client.session(self._mesh.session_id).get())
        except SandmeshError:
            return False
        return info.state != "closed"

    async def _exec_internal(self, *command: str | Path, timeout: Optional[float] = None) -> ExecResult:
        script = shlex.join(str(c) for c in command)
        try:
            result = await self._mesh.arun(script, "shell", timeout=timeout)
        except Timeout as e:
            context = {"confirmation_id": e.confirmation_id} if e.confirmation_id else {}
            raise ExecTimeoutError(command=command, timeout_s=timeout, context=context, cause=e) from e
        except SandmeshError as e:
            # A person's or the policy's refusal is final; an overloaded or unreachable mesh
            # may pass.
            retryable = None if isinstance(e, Denied) else e.kind in ("overloaded", "unavailable")
            raise ExecTransportError(
                command=command,
                context={"kind": e.kind, "sandmesh": e.message},
                cause=e,
                message=f"sandmesh: {e}",
                retryable=retryable,
            ) from e
        if result.status == "timeout":
            raise ExecTimeoutError(command=command, timeout_s=timeout, context={"execution_id": result.execution_id})
        exit_code = result.exit_code if result.exit_code is not None else 137
        return ExecResult(stdout=result.stdout.encode(), stderr=result.stderr.encode(), exit_code=exit_code)

    # === files ===

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        target = self.normalize_path(path)
        rel = workspace_relative(target.as_posix())
        if rel is None or user is not None:
            return io.BytesIO(await self._read_by_run(target, user))
        try:
            return io.BytesIO(await self._mesh.afiles("read", rel))
        except NotFound as e:
            raise WorkspaceReadNotFoundError(path=Path(path), cause=e) from e
        except SandmeshError as e:
            raise WorkspaceArchiveReadError(path=Path(path), cause=e) from e

    async def _read_by_run(self, target: Path, user: str | User | None) -> bytes:
        result = await self.exec(
            "sh", "-c", '[ -f "$1" ] || exit 3; base64 < "$1"', "sh", target.as_posix(), shell=False, user=user
        )
        if result.exit_code == 3:
            raise WorkspaceReadNotFoundError(path=target)
        if not result.ok():
            raise WorkspaceArchiveReadError(path=target, context={"stderr": result.stderr.decode(errors="replace")})
        return base64.b64decode(result.stdout)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=Path(path), actual_type=type(payload).__name__)
        target = self.normalize_path(path, for_write=True)
        rel = workspace_relative(target.as_posix())
        if rel is None or rel == "" or user is not None:
            await self._write_by_run(target, bytes(payload), user)
            return
        try:
            await self._mesh.afiles("write", rel, bytes(payload))
        except SandmeshError as e:
            raise WorkspaceArchiveWriteError(path=target, cause=e) from e

    async def _write_by_run(self, target: Path, payload: bytes, user: str | User | None) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" | base64 -d > "$1"'
        encoded = base64.b64encode(payload).decode()
        result = await self.exec("sh", "-c", script, "sh", target.as_posix(), encoded, shell=False, user=user)
        if not result.ok():
            raise WorkspaceArchiveWriteError(path=target, context={"stderr": result.stderr.decode(errors="replace")})

    # === the workspace as an archive ===

    async def persist_workspace(self) -> io.IOBase:
        root = self._workspace_root_path().as_posix()
        excludes = [f"--exclude=./{_ARCHIVE}"] + [
            f"--exclude=./{p.as_posix()}" for p in sorted(self._persist_workspace_skip_relpaths())
        ]
        archive = f"{WORKSPACE_ROOT}/{_ARCHIVE}"
        tar = shlex.join(["tar", *excludes, "-C", root, "-cf", archive, "."])
        result = await self._exec_internal("sh", "-c", tar)
        try:
            if result.exit_code != 0:
                raise WorkspaceArchiveReadError(
                    path=Path(root), context={"reason": "tar_failed", "stderr": result.stderr.decode(errors="replace")}
                )
            return io.BytesIO(await self._mesh.afiles("read", _ARCHIVE))
        except SandmeshError as e:
            raise WorkspaceArchiveReadError(path=Path(root), cause=e) from e
        finally:
            await self._remove_archive()

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path().as_posix()
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=Path(root), actual_type=type(payload).__name__)
        try:
            validate_tar_bytes(bytes(payload), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"reason": "unsafe_or_invalid_tar", "member": e.member}, cause=e
            ) from e
        try:
            await self._mesh.afiles("write", _ARCHIVE, bytes(payload))
            untar = shlex.join(["tar", "-C", root, "-xf", f"{WORKSPACE_ROOT}/{_ARCHIVE}"])
            result = await self._exec_internal("sh", "-c", untar)
        except SandmeshError as e:
            raise WorkspaceArchiveWriteError(path=Path(root), cause=e) from e
        finally:
            await self._remove_archive()
        if result.exit_code != 0:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"reason": "tar_extract_failed", "stderr": result.stderr.decode(errors="replace")}
            )

    async def _remove_archive(self) -> None:
        try:
            await self._mesh.afiles("remove", _ARCHIVE)
        except NotFound:
            pass


class SandmeshSandboxClient(BaseSandboxClient[Optional[SandmeshSandboxClientOptions]]):
    """Creates, resumes and deletes sandmesh-backed sandbox sessions.

    Args:
        sm: the client (one serves every session, from any event loop).
        on_awaiting_approval: called with the :class:`~sandmesh.Confirmation` when a command
            waits for a person (default: a warning naming it); the command goes on waiting.
    """

    backend_id = "sandmesh"
    supports_default_options = True

    def __init__(
        self,
        sm: Sandmesh,
        *,
        on_awaiting_approval: Optional[ApprovalNotice] = None,
        instrumentation: Optional[Instrumentation] = None,
    ) -> None:
        self._sm = sm
        self._on_awaiting_approval = on_awaiting_approval
        self._instrumentation = instrumentation or Instrumentation()

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Optional[Manifest] = None,
        options: Optional[SandmeshSandboxClientOptions] = None,
    ) -> SandboxSession:
        manifest = self._validate_manifest_for_create(manifest or Manifest(root=WORKSPACE_ROOT))
        if manifest.root != WORKSPACE_ROOT:
            raise ValueError(f"a sandmesh session's workspace is {WORKSPACE_ROOT}; the manifest names {manifest.root}")
        session_id = uuid.uuid4()
        state = SandmeshSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            options=options or SandmeshSandboxClientOptions(),
        )
        inner = SandmeshSandboxSession(state=state, sm=self._sm, on_awaiting_approval=self._on_awaiting_approval)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, SandmeshSandboxSession):
            raise TypeError("SandmeshSandboxClient.delete expects a sandmesh session")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, SandmeshSandboxSessionState):
            raise TypeError("SandmeshSandboxClient.resume expects a SandmeshSandboxSessionState")
        inner = SandmeshSandboxSession(
            state=state, sm=self._sm, attach=True, on_awaiting_approval=self._on_awaiting_approval
        )
        try:
            await inner.mesh_session.aopen()
            inner._set_start_state_preserved(True)
        except NotFound:
            # The session is gone (closed, expired): a new one, which start() hydrates from
            # the snapshot.
            state.mesh_session_id = None
            inner = SandmeshSandboxSession(state=state, sm=self._sm, on_awaiting_approval=self._on_awaiting_approval)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: Dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SandmeshSandboxSessionState)
