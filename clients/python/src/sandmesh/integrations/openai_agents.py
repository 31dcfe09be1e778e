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

The session supports the SDK's PTY API, so the shell tool's commands (``exec_command``, with or
without ``tty``) are the session's background processes (``sandbox.v1.proc.*``): a command still
running when its yield time ends goes on, and ``write_stdin`` writes to its terminal or polls
it. Ports named in ``SandmeshSandboxClientOptions(exposed_ports=...)`` resolve to the HTTP
gateway's host route for the port (``http://<port>-<session>.localhost:<gateway port>/`` with
the port's token), exposed on first use.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import shlex
import signal
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Deque, Dict, Literal, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes

from .._ports import TOKEN_PARAM, ExposedPort
from .._transport import new_id
from ..errors import Denied, NotFound, NotSupported, SandmeshError, Timeout
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
#: The terminal a ``tty`` command gets (columns, rows).
PTY_SIZE = (80, 24)
#: Where the mesh's HTTP gateway listens when neither the client nor SANDMESH_GATEWAY_ADDR says.
DEFAULT_GATEWAY = "http://127.0.0.1:4281"
#: An exposed port's token is renewed this long before it expires.
_PORT_RENEW_MS = 60_000


class SandmeshSandboxClientOptions(BaseSandboxClientOptions):
    """Options of a new sandmesh session (``sm.session(...)``)."""

    type: Literal["sandmesh"] = "sandmesh"
    template: Optional[str] = None
    env: Optional[Dict[str, str]] = None
    network: Optional[Dict[str, Any]] = None
    ttl_ms: Optional[int] = None
    idle_ms: Optional[int] = None
    #: Ports a server in the session may be reached on (``resolve_exposed_port``).
    exposed_ports: Tuple[int, ...] = ()

    def session_fields(self) -> Dict[str, Any]:
        return {
            k: v for k, v in self.model_dump().items() if k not in ("type", "exposed_ports") and v is not None
        }


class SandmeshSandboxSessionState(SandboxSessionState):
    """What a saved run keeps of its sandbox: the sandmesh session's id and how it was opened."""

    type: Literal["sandmesh"] = "sandmesh"
    mesh_session_id: Optional[str] = None
    options: SandmeshSandboxClientOptions = SandmeshSandboxClientOptions()


@dataclass
class _Process:
    """A command the PTY API started: the session's background process and what of its output
    was collected so far."""

    proc_id: str
    tty: bool
    next_seq: int = 0
    exit_code: Optional[int] = None
    last_used: float = field(default_factory=time.monotonic)
    output_chunks: Deque[bytes] = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set once the process ended and all its output was read.
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)


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
        gateway: str = DEFAULT_GATEWAY,
    ) -> None:
        self.state = state
        self._mesh = MeshSession(
            sm,
            state.mesh_session_id,
            attach=attach,
            on_awaiting_approval=on_awaiting_approval,
            open_fields=state.options.session_fields(),
        )
        self._gateway = gateway
        # The PTY API's process ids (the SDK's small integers) → the session's processes.
        self._processes: Dict[int, _Process] = {}
        self._processes_lock = asyncio.Lock()
        # Exposing a port again replaces its token, so one exposure serves until it expires.
        self._exposed: Dict[int, ExposedPort] = {}

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
        except SandmeshError as e:
            raise _exec_error(command, timeout, e) from e
        if result.status == "timeout":
            raise ExecTimeoutError(command=command, timeout_s=timeout, context={"execution_id": result.execution_id})
        exit_code = result.exit_code if result.exit_code is not None else 137
        return ExecResult(stdout=result.stdout.encode(), stderr=result.stderr.encode(), exit_code=exit_code)

    # === the PTY API: commands as the session's background processes ===

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: Optional[float] = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        try:
            started = await self._mesh.astart(argv, pty=PTY_SIZE if tty else None, request_timeout=timeout)
        except SandmeshError as e:
            raise _exec_error(command, timeout, e) from e
        process = _Process(proc_id=started.proc_id, tty=tty)
        async with self._processes_lock:
            process_id = allocate_pty_process_id(set(self._processes))
            pruned = self._prune_processes()
            self._processes[process_id] = process
        if pruned is not None:
            await self._end(pruned)
        yield_time_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(process_id, process, clamp_pty_yield_time_ms(yield_time_ms), max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        async with self._processes_lock:
            process = self._resolve_pty_session_entry(pty_processes=self._processes, session_id=session_id)
        if chars:
            if not process.tty:
                # The SDK's words: its shell tool tells the model to start the command with a tty.
                raise RuntimeError("stdin is not available for this process")
            await self._mesh.aprocesses("send_input", process.proc_id, chars)
        yield_time_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=yield_time_ms, input_empty=chars == "")
        process.last_used = time.monotonic()
        return await self._update(session_id, process, wait_ms, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._processes_lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:
            await self._end(process)

    async def _update(
        self, process_id: int, process: _Process, yield_time_ms: int, max_output_tokens: Optional[int]
    ) -> PtyExecUpdate:
        """What the process printed within ``yield_time_ms`` (or until it ended); an ended
        process is forgotten, and its update carries its exit code instead of an id."""

        async def poll_output(_deadline: Optional[float] = None) -> None:
            await self._read_output(process)

        async def wait_for_output(remaining_s: float) -> None:
            # proc.wait answers when the process ends, so an end is seen at once; output is read
            # at the deadline, as the SDK's collector only hands it over then.
            await self._mesh.aprocesses("wait", process.proc_id, timeout_ms=max(1, min(30_000, int(remaining_s * 1000))))

        output, original_token_count, closed = await collect_pty_output(
            output_chunks=process.output_chunks,
            output_lock=process.output_lock,
            output_notify=process.output_notify,
            is_done=process.output_closed.is_set,
            yield_time_ms=yield_time_ms,
            max_output_tokens=max_output_tokens,
            poll_output=poll_output,
            settle_output=poll_output,
            wait_for_output=wait_for_output,
        )
        if not closed:
            return PtyExecUpdate(
                process_id=process_id, output=output, exit_code=None, original_token_count=original_token_count
            )
        async with self._processes_lock:
            self._processes.pop(process_id, None)
        return PtyExecUpdate(
            process_id=None, output=output, exit_code=process.exit_code, original_token_count=original_token_count
        )

    async def _read_output(self, process: _Process) -> None:
        """Reads what the process printed since the last read; once it ended and everything was
        read, takes its exit code and marks its output closed."""
        if process.output_closed.is_set():
            return
        while True:
            data, next_seq, state = await self._mesh.aprocesses("read", process.proc_id, process.next_seq)
            if data:
                async with process.output_lock:
                    process.output_chunks.append(data)
                process.output_notify.set()
            moved, process.next_seq = next_seq != process.next_seq, next_seq
            if not data or not moved:
                break
        if state != "running":
            info = await self._mesh.aprocesses("wait", process.proc_id, timeout_ms=1)
            process.exit_code = _exit_code(info)
            process.output_closed.set()
            process.output_notify.set()

    def _prune_processes(self) -> Optional[_Process]:
        """The SDK's bound on the processes it tracks: the least recently used (an ended one
        first) makes room for a new one."""
        if len(self._processes) < PTY_PROCESSES_MAX:
            return None
        meta = [(pid, p.last_used, p.output_closed.is_set()) for pid, p in self._processes.items()]
        pruned = process_id_to_prune_from_meta(meta)
        return None if pruned is None else self._processes.pop(pruned, None)

    async def _end(self, process: _Process) -> None:
        """Kills a process the SDK lets go of (one that already ended is left as it is)."""
        if process.output_closed.is_set():
            return
        try:
            await self._mesh.aprocesses("kill", process.proc_id)
        except SandmeshError:
            pass  # it ended meanwhile, or its session did: nothing is left to kill

    # === exposed ports ===

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        def unavailable(detail: str, cause: Optional[BaseException] = None) -> ExposedPortUnavailableError:
            return ExposedPortUnavailableError(
                port=port,
                exposed_ports=self.state.exposed_ports,
                reason="backend_unavailable",
                context={"backend": "sandmesh", "detail": detail},
                cause=cause,
            )

        await self._ensure_backend_started()
        session_id = str(self._mesh.session_id)
        if session_id != session_id.lower():
            # Host names arrive lower-cased: the gateway's host route cannot name this session.
            raise unavailable(f"session id {session_id} has capitals; sessions this client makes have none")
        exposed = self._exposed.get(port)
        if exposed is None or exposed.expires_at - _PORT_RENEW_MS < time.time() * 1000:
            try:
                exposed = await self._mesh.aports("expose", port)
            except SandmeshError as e:
                raise unavailable(f"sandmesh: {e}", e) from e
            self._exposed[port] = exposed
        gateway = urlsplit(self._gateway)
        tls = gateway.scheme == "https"
        return ExposedPortEndpoint(
            host=f"{port}-{session_id}.localhost",
            port=gateway.port or (443 if tls else 80),
            tls=tls,
            query=f"{TOKEN_PARAM}={exposed.token}",
        )

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
        gateway: the mesh's HTTP gateway, which exposed ports are reached through (default
            ``http://$SANDMESH_GATEWAY_ADDR``, else ``http://127.0.0.1:4281``).
    """

    backend_id = "sandmesh"
    supports_default_options = True

    def __init__(
        self,
        sm: Sandmesh,
        *,
        on_awaiting_approval: Optional[ApprovalNotice] = None,
        gateway: Optional[str] = None,
        instrumentation: Optional[Instrumentation] = None,
    ) -> None:
        self._sm = sm
        self._on_awaiting_approval = on_awaiting_approval
        addr = os.environ.get("SANDMESH_GATEWAY_ADDR")
        self._gateway = gateway or (f"http://{addr}" if addr else DEFAULT_GATEWAY)
        try:
            parts = urlsplit(self._gateway)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:  # a port that is no number, or out of range
            valid = False
        if not valid:
            raise ValueError(f"the gateway is an http(s) URL, e.g. {DEFAULT_GATEWAY}: not {self._gateway!r}")
        self._instrumentation = instrumentation or Instrumentation()

    def _session(self, state: SandmeshSandboxSessionState, *, attach: bool = False) -> SandmeshSandboxSession:
        return SandmeshSandboxSession(
            state=state, sm=self._sm, attach=attach, on_awaiting_approval=self._on_awaiting_approval, gateway=self._gateway
        )

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
        options = options or SandmeshSandboxClientOptions()
        state = SandmeshSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            options=options,
            exposed_ports=options.exposed_ports,
            # The mesh's id format, lower case: a port's host route names the session in a host
            # name, which arrives lower-cased.
            mesh_session_id=new_id().lower(),
        )
        return self._wrap_session(self._session(state), instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, SandmeshSandboxSession):
            raise TypeError("SandmeshSandboxClient.delete expects a sandmesh session")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, SandmeshSandboxSessionState):
            raise TypeError("SandmeshSandboxClient.resume expects a SandmeshSandboxSessionState")
        inner = self._session(state, attach=True)
        try:
            await inner.mesh_session.aopen()
            inner._set_start_state_preserved(True)
        except NotFound:
            # The session is gone (closed, expired): a new one, which start() hydrates from
            # the snapshot.
            state.mesh_session_id = new_id().lower()
            inner = self._session(state)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: Dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SandmeshSandboxSessionState)


def _exec_error(command: Sequence[str | Path], timeout: Optional[float], e: SandmeshError) -> Exception:
    """A mesh error of a command (a run or a process start) as the SDK's exec errors."""
    if isinstance(e, Timeout):
        context = {"confirmation_id": e.confirmation_id} if e.confirmation_id else {}
        return ExecTimeoutError(command=command, timeout_s=timeout, context=context, cause=e)
    # A person's or the policy's refusal is final; an overloaded or unreachable mesh may pass. A
    # session whose backend keeps no processes started nothing: the SDK's shell tool may run the
    # command once instead (retry_safe).
    retryable = None if isinstance(e, Denied) else e.kind in ("overloaded", "unavailable")
    context: Dict[str, object] = {"kind": e.kind, "sandmesh": e.message}
    if isinstance(e, NotSupported):
        context["retry_safe"] = True
    return ExecTransportError(command=command, context=context, cause=e, message=f"sandmesh: {e}", retryable=retryable)


def _exit_code(info: Dict[str, Any]) -> int:
    """A process's end as a shell reports it: its exit code, or 128 + the signal that ended it."""
    if info.get("exit_code") is not None:
        return int(info["exit_code"])
    return 128 + int(info.get("signal") or signal.SIGKILL)
