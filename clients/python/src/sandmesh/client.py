"""The asyncio API: :class:`AsyncSandmesh` and :class:`AsyncSession`.

::

    async with AsyncSandmesh.from_env() as sm:
        result = await sm.run("print(6*7)")
        async with sm.session("s1") as s:
            await s.files.write("data/x.txt", "hello")
            print((await s.run("cat data/x.txt", language="shell")).stdout)
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Generator, List, Mapping, Optional

from ._audit import AsyncAudit
from ._browser import AsyncAio, AsyncBrowser
from ._exec import (
    EXEC_TIMEOUT,
    ApprovalCallback,
    AsyncJob,
    FilesArg,
    TextCallback,
    exec_request,
    notified_request,
    refused,
    run_exec,
    submit_job,
    wire_files,
)
from ._files import AsyncFiles
from ._ports import AsyncPorts
from ._processes import AsyncProcesses
from ._transport import DEFAULT_TIMEOUT, Codec, ConnectInfo, Transport, connect, connect_info, drop_none
from .types import ExecResult, RiskAssessment, SessionInfo, TestReport

__all__ = ["AsyncSandmesh", "AsyncSession"]


class AsyncSandmesh:
    """A connection to a sandmesh mesh as one tenant's agent (asyncio).

    Args:
        url: NATS URL, may carry ``user:password@`` (``sandmesh creds --url-only`` prints one);
            a comma-separated list for a cluster. Default: ``SANDMESH_NATS_URL``.
        creds: a credentials file ``sandmesh up`` wrote (``.sandmesh/creds/agent.json``).
            Default: ``SANDMESH_CREDS``, then the data directory's agent file.
        prefix: the mesh's subject prefix (``SANDMESH_PREFIX``, ``sandbox``).
        encoding: ``"msgpack"`` (when installed; the default), or ``"json"``.
        timeout: seconds to wait for calls answered at once (look-ups, file and session calls).
        run_timeout: seconds to wait for an execution's result (a person's approval included)
            when a call does not say (``request_timeout=``, ``job.result(timeout)``); 600.

    It connects on first use (or ``await sm.connect()``); close it with ``await sm.close()``
    or ``async with``.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        creds: Optional[str] = None,
        prefix: Optional[str] = None,
        encoding: str = "auto",
        timeout: float = DEFAULT_TIMEOUT,
        run_timeout: float = EXEC_TIMEOUT,
    ) -> None:
        self._info: ConnectInfo = connect_info(url=url, creds=creds, prefix=prefix)
        self._codec = Codec(encoding)
        self._timeout = timeout
        self._run_timeout = run_timeout
        self._transport: Optional[Transport] = None
        self._lock: Optional[asyncio.Lock] = None
        self.audit = AsyncAudit(self._conn)

    @classmethod
    def from_env(cls, **kwargs: Any) -> "AsyncSandmesh":
        """Connection details from ``SANDMESH_NATS_URL`` / ``SANDMESH_CREDS`` /
        ``SANDMESH_DATA_DIR`` / ``SANDMESH_PREFIX``, the way the ``sandmesh`` CLI reads them."""
        return cls(**kwargs)

    @property
    def user(self) -> Optional[str]:
        """The NATS user this client acts as (its tenant's agent)."""
        return self._info.user

    async def connect(self) -> "AsyncSandmesh":
        """Connects now (otherwise the first call does); :class:`Unavailable` if it cannot."""
        await self._conn()
        return self

    async def _conn(self) -> Transport:
        if self._transport is not None:
            return self._transport
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._transport is None:
                nc = await connect(self._info)
                self._transport = Transport(nc, self._info.prefix, self._codec, self._timeout, self._run_timeout)
        return self._transport

    async def close(self) -> None:
        """Drains and closes the connection."""
        if self._transport is not None:
            nc, self._transport = self._transport.nc, None
            try:
                await nc.drain()
            except Exception:
                await nc.close()

    async def __aenter__(self) -> "AsyncSandmesh":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # === executions ===

    async def run(
        self,
        code: str,
        language: str = "python",
        *,
        session_id: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        files: FilesArg = None,
        stdin: Optional[str] = None,
        tier: Optional[str] = None,
        limits: Optional[Mapping[str, Any]] = None,
        network: Optional[Mapping[str, Any]] = None,
        execution_id: Optional[str] = None,
        requested_by: Optional[str] = None,
        kernel: bool = False,
        on_stdout: Optional[TextCallback] = None,
        on_stderr: Optional[TextCallback] = None,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
        check: bool = True,
    ) -> ExecResult:
        """Runs code in a sandbox and returns its :class:`ExecResult`.

        Args:
            code: the program.
            language: ``python``, ``javascript`` or ``shell``.
            session_id: run in this session (its files and container); see :meth:`session`.
            template: the sandbox template (``python-data``, ``node-default``, or one an operator
                added; ``sandmesh template list``); the mesh refuses an unknown one.
            timeout: the program's own time limit in seconds (the mesh's default: 30 s).
            env: environment variables for the program.
            files: files put into the workspace first, ``{path: text or bytes}``.
            stdin: the program's standard input.
            tier: ``auto`` (default), ``ephemeral``, ``session`` or ``aio``.
            limits: ``{memory_mb, cpus, pids, max_output_bytes}``.
            network: an egress policy ``{allow_domains: [...], ...}`` (within the operator's
                ceiling).
            execution_id: the idempotency key (a ULID is made when streaming).
            requested_by: an informational label for the audit trail.
            kernel: run the code as a cell of the session's kernel for ``language``
                (``python`` or ``javascript``; needs a session): variables survive between cells, and the last expression's value,
                ``display(...)`` and matplotlib figures come back in ``result.outputs``
                (:class:`RichOutput`); ``result.cell_error`` holds an exception and
                ``result.state_lost`` says the kernel had to be restarted.
            on_stdout, on_stderr: called with each piece of output as it is produced, in
                order, all before this returns (plain functions or coroutine functions).
            on_awaiting_approval: called with a :class:`Confirmation` at once when the
                execution waits for a person; the call goes on waiting for the result.
            request_timeout: how long to wait for the result in seconds, approvals
                included (default: the client's ``run_timeout``, 600).
            check: raise for a result whose program did not run (``denied`` →
                :class:`Denied`, ``rejected`` → :class:`Denied`, ``executor_lost`` →
                :class:`Unavailable`, ``internal`` → :class:`Internal`; ``.result`` holds
                it). With ``check=False`` the result is returned whatever its status.

        Raises:
            BadRequest: unknown language, bad ids, limits out of bounds, unknown template.
            TooLarge: code, stdin or files over the mesh's ceilings.
            Overloaded: the scheduler's queue is full (retry later).
            Timeout: no result within ``request_timeout``; names the confirmation when
                the execution waits for a person.
        """
        transport = await self._conn()
        request = exec_request(
            code,
            language,
            session_id=session_id,
            template=template,
            timeout=timeout,
            env=env,
            files=files,
            stdin=stdin,
            tier=tier,
            limits=limits,
            network=network,
            execution_id=execution_id,
            requested_by=requested_by,
            stream_output=False,
            kernel=kernel,
        )
        return await run_exec(
            transport,
            request,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_awaiting_approval=on_awaiting_approval,
            request_timeout=request_timeout,
            check=check,
        )

    async def run_tests(
        self,
        code: str,
        tests: str,
        language: str = "python",
        *,
        session_id: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        code_file: Optional[str] = None,
        tests_file: Optional[str] = None,
        files: FilesArg = None,
        env: Optional[Mapping[str, str]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        execution_id: Optional[str] = None,
        requested_by: Optional[str] = None,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
        check: bool = True,
    ) -> TestReport:
        """Runs ``tests`` against ``code`` in a sandbox (``sandbox.v1.test``: pytest for
        ``python``, ``node --test`` for ``javascript``) and returns the :class:`TestReport`.

        The tests import the code as ``solution`` (``from solution import f``;
        ``require('./solution.js')``) unless ``code_file`` names it otherwise. A test run is an
        execution: risky code or tests wait for a person like :meth:`run` (then call again with
        the same ``execution_id`` for the report; nothing runs twice). ``template`` defaults to
        ``python-data`` (which has pytest) or ``node-default``; ``timeout`` (seconds) is the
        whole run's: tests still running then are stopped and those that finished reported.

        Raises:
            BadRequest, TooLarge: the request is malformed or over the mesh's ceilings.
            NotFound: ``session_id`` names no open session of this tenant.
            Denied: with ``check``, the run was rejected or denied (``.result`` holds the report).
        """
        transport = await self._conn()
        body = {
            "execution_id": execution_id,
            "session_id": session_id,
            "language": language,
            "code": code,
            "tests": tests,
            "code_file": code_file,
            "tests_file": tests_file,
            "files": wire_files(files),
            "template": template,
            "timeout_ms": None if timeout is None else int(timeout * 1000),
            "limits": dict(limits) if limits else None,
            "env": dict(env) if env else None,
            "requested_by": requested_by,
        }
        wait = transport.run_timeout if request_timeout is None else request_timeout
        reply = await notified_request(transport, "test", body, wait, on_awaiting_approval)
        report = TestReport.from_wire(reply)
        if check and report.status in ("rejected", "denied"):
            error = refused(ExecResult.from_wire(dict(reply, status=report.exec_status)))
            if error is not None:
                error.result = report
                raise error
        return report

    async def submit(
        self,
        code: str,
        language: str = "python",
        *,
        session_id: Optional[str] = None,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        files: FilesArg = None,
        stdin: Optional[str] = None,
        tier: Optional[str] = None,
        limits: Optional[Mapping[str, Any]] = None,
        network: Optional[Mapping[str, Any]] = None,
        execution_id: Optional[str] = None,
        requested_by: Optional[str] = None,
    ) -> AsyncJob:
        """Queues an execution as a JetStream job and returns at once with its :class:`AsyncJob`.

        The JetStream ack means accepted: it reaches a result even if a scheduler dies. The
        execution id (given or a new ULID) is the ``Nats-Msg-Id``, so submitting the same id
        twice runs it once (``job.duplicate``). Arguments as :meth:`run`.
        """
        transport = await self._conn()
        request = exec_request(
            code,
            language,
            session_id=session_id,
            template=template,
            timeout=timeout,
            env=env,
            files=files,
            stdin=stdin,
            tier=tier,
            limits=limits,
            network=network,
            execution_id=execution_id,
            requested_by=requested_by,
            stream_output=False,
        )
        return await submit_job(transport, request)

    def job(self, execution_id: str) -> AsyncJob:
        """A handle on an execution by id (sync or async), to look up or wait for its result."""
        return _LazyJob(self, execution_id)

    # === risk ===

    async def assess(
        self,
        code: str,
        language: str = "python",
        *,
        mode: Optional[str] = None,
        params: Optional[Mapping[str, Any]] = None,
    ) -> RiskAssessment:
        """The risk assessor's verdict on ``code`` (``language``: python, javascript, shell,
        or ``browser`` for a browser action with ``params``); ``mode``: strict or permissive."""
        transport = await self._conn()
        body = drop_none(
            {"content": code, "content_type": language, "mode": mode, "params": dict(params) if params else None}
        )
        return RiskAssessment.from_wire(await transport.request("risk.assess", body))

    # === sessions ===

    def session(
        self,
        session_id: Optional[str] = None,
        *,
        template: Optional[str] = None,
        tier: Optional[str] = None,
        language: Optional[str] = None,
        network: Optional[Mapping[str, Any]] = None,
        requested_by: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_ms: Optional[int] = None,
        ttl_ms: Optional[int] = None,
        idle_ms: Optional[int] = None,
        filesystem: Optional[Mapping[str, Any]] = None,
    ) -> "AsyncSession":
        """A session: a workspace and, in tier ``session``, a container kept between runs.

        Use ``async with sm.session("s1") as s:`` (closed at the end) or
        ``s = await sm.session("s1")`` (close it with ``await s.close()``). Opening is
        idempotent by id; without an id the mesh makes one.

        Every run in it gets ``env`` (a run's own variables win), ``timeout_ms`` when it sets
        none, and runs in ``template``. The session closes itself ``ttl_ms`` after it opens,
        or when unused for ``idle_ms`` (default: the mesh's). ``filesystem``
        (``{"deny_read": [...], "allow_write": [...], "deny_write": [...]}``, directories) is
        mounted into its container, added to its template's.
        """
        return AsyncSession(
            self,
            session_id,
            dict(
                drop_none(
                    {
                        "tier": tier,
                        "language": language,
                        "network": dict(network) if network else None,
                        "requested_by": requested_by,
                        "template": template,
                        "env": dict(env) if env else None,
                        "timeout_ms": timeout_ms,
                        "ttl_ms": ttl_ms,
                        "idle_ms": idle_ms,
                        "filesystem": dict(filesystem) if filesystem else None,
                    }
                )
            ),
        )

    async def sessions(self) -> List[SessionInfo]:
        """This tenant's sessions."""
        transport = await self._conn()
        reply = await transport.request("sessions.list", {})
        return [SessionInfo.from_wire(s) for s in reply.get("sessions") or []]


class _LazyJob(AsyncJob):
    """A job handle made without a connection at hand; it connects on first use."""

    def __init__(self, sm: AsyncSandmesh, execution_id: str) -> None:
        super().__init__(None, execution_id)  # type: ignore[arg-type]
        self._sm = sm

    async def _lookup(self, wait: Optional[float]) -> Optional[ExecResult]:
        if self._transport is None:
            self._transport = await self._sm._conn()
        return await super()._lookup(wait)


class AsyncSession:
    """One session of :class:`AsyncSandmesh` (see :meth:`AsyncSandmesh.session`).

    Attributes:
        session_id: its id (the mesh's when none was given), set once opened.
        files: its workspace files (:class:`AsyncFiles`).
        browser: its browser (:class:`AsyncBrowser`).
        aio: its AIO sandbox instance (:class:`AsyncAio`).
        ports: its preview ports (:class:`AsyncPorts`).
        processes: its background processes (:class:`AsyncProcesses`).
        info: the session record from the last open.
    """

    def __init__(self, sm: AsyncSandmesh, session_id: Optional[str], open_fields: Dict[str, Any]) -> None:
        self._sm = sm
        self._open_fields = open_fields
        self.session_id: str = session_id or ""
        self.info: Optional[SessionInfo] = None
        self.files: AsyncFiles
        self.browser: AsyncBrowser
        self.aio: AsyncAio
        self.ports: AsyncPorts
        self.processes: AsyncProcesses

    async def open(self) -> "AsyncSession":
        """Opens the session (idempotent by id)."""
        transport = await self._sm._conn()
        body = dict(self._open_fields, session_id=self.session_id or None)
        self.info = SessionInfo.from_wire(await transport.request("sessions.open", body))
        self.session_id = self.info.session_id or self.session_id
        self.files = AsyncFiles(transport, self.session_id)
        self.browser = AsyncBrowser(transport, self.session_id)
        self.aio = AsyncAio(transport, self.session_id)
        self.ports = AsyncPorts(transport, self.session_id)
        self.processes = AsyncProcesses(transport, self.session_id)
        return self

    def __await__(self) -> Generator[Any, None, "AsyncSession"]:
        return self.open().__await__()

    async def __aenter__(self) -> "AsyncSession":
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def run(self, code: str, language: str = "python", **kwargs: Any) -> ExecResult:
        """:meth:`AsyncSandmesh.run` in this session (same arguments)."""
        return await self._sm.run(code, language, session_id=self.session_id, **kwargs)

    async def run_tests(self, code: str, tests: str, language: str = "python", **kwargs: Any) -> TestReport:
        """:meth:`AsyncSandmesh.run_tests` in this session (same arguments)."""
        return await self._sm.run_tests(code, tests, language, session_id=self.session_id, **kwargs)

    async def submit(self, code: str, language: str = "python", **kwargs: Any) -> AsyncJob:
        """:meth:`AsyncSandmesh.submit` in this session (same arguments)."""
        return await self._sm.submit(code, language, session_id=self.session_id, **kwargs)

    async def get(self) -> SessionInfo:
        """The session's current record."""
        transport = await self._sm._conn()
        return SessionInfo.from_wire(await transport.request("sessions.get", {"session_id": self.session_id}))

    async def close(self) -> SessionInfo:
        """Closes the session: its container goes (its workspace stays until its TTL)."""
        transport = await self._sm._conn()
        return SessionInfo.from_wire(await transport.request("sessions.close", {"session_id": self.session_id}))
