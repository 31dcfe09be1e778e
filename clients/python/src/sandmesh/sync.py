"""The blocking API: :class:`Sandmesh`, the same shape as :class:`AsyncSandmesh`.

Each :class:`Sandmesh` runs its :class:`AsyncSandmesh` on a private event loop in a daemon
thread and waits for each call there, so it works in any program (with or without a running
event loop of its own). Callbacks (``on_stdout``, ``on_stderr``, ``on_awaiting_approval``)
are called on that thread, in order, before the call returns::

    from sandmesh import Sandmesh
    with Sandmesh.from_env() as sm:
        print(sm.run("print(6*7)").stdout)
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Iterator, List, Mapping, Optional, TypeVar, Union

from ._audit import AsyncAuditFollow
from ._browser import AsyncAio, AsyncBrowser, Target
from ._files import AsyncFiles
from ._ports import Ports
from ._processes import Processes
from ._exec import EXEC_TIMEOUT, ApprovalCallback, AsyncJob, FilesArg, TextCallback
from ._transport import DEFAULT_TIMEOUT
from .client import AsyncSandmesh, AsyncSession
from .types import (
    AioExecResult,
    AioLease,
    AioReleased,
    AioStats,
    AuditEvent,
    BrowserElement,
    BrowserResult,
    ExecResult,
    FileEntry,
    RiskAssessment,
    SessionInfo,
    TestReport,
)

__all__ = ["Sandmesh", "Session", "Files", "Browser", "Aio", "Audit", "AuditFollow", "Job"]

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread; :meth:`call` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandmesh-loop", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking sandmesh call from one of its own callbacks would deadlock")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # KeyboardInterrupt and friends: stop the work in the loop too
            raise

    async def wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs a coroutine here and awaits it from another thread's event loop; cancelling the
        waiter cancels the work."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class Sandmesh:
    """A connection to a sandmesh mesh as one tenant's agent (blocking).

    Arguments as :class:`AsyncSandmesh`; it connects at once (:class:`Unavailable` when it
    cannot). Close it with :meth:`close` or ``with``.

    Attributes:
        audit: the tenant's audit events (:class:`Audit`).
        async_client: the :class:`AsyncSandmesh` underneath (its calls belong to the private
            loop; use this class's methods from other threads).
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
        self._loop = _Loop()
        try:
            self.async_client = AsyncSandmesh(
                url, creds=creds, prefix=prefix, encoding=encoding, timeout=timeout, run_timeout=run_timeout
            )
            self._loop.call(self.async_client.connect())
        except BaseException:
            self._loop.stop()
            raise
        self.audit = Audit(self)

    @classmethod
    def from_env(cls, **kwargs: Any) -> "Sandmesh":
        """Connection details from ``SANDMESH_NATS_URL`` (may carry ``user:password@``),
        ``SANDMESH_CREDS``, ``SANDMESH_DATA_DIR`` and ``SANDMESH_PREFIX``."""
        return cls(**kwargs)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.call(coro)

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        """Awaits a coroutine of :attr:`async_client` (or of its sessions) from any event loop.

        The connection belongs to this client's private loop; this runs ``coro`` there and
        awaits its result from the caller's loop, so one client serves frameworks that start an
        event loop per call or per test (the integrations do). Cancelling the caller cancels
        the call::

            result = await sm.acall(sm.async_client.run("print(1)"))
        """
        return await self._loop.wait(coro)

    @property
    def user(self) -> Optional[str]:
        """The NATS user this client acts as."""
        return self.async_client.user

    def close(self) -> None:
        """Closes the connection and stops the private loop."""
        try:
            self._call(self.async_client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "Sandmesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(
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
        """Runs code in a sandbox; see :meth:`AsyncSandmesh.run` for every argument."""
        return self._call(
            self.async_client.run(
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
                kernel=kernel,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                on_awaiting_approval=on_awaiting_approval,
                request_timeout=request_timeout,
                check=check,
            )
        )

    def run_tests(self, code: str, tests: str, language: str = "python", **kwargs: Any) -> TestReport:
        """Runs tests against code and returns the per-test report; see
        :meth:`AsyncSandmesh.run_tests` (same arguments)."""
        return self._call(self.async_client.run_tests(code, tests, language, **kwargs))

    def submit(
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
    ) -> "Job":
        """Queues an async job; see :meth:`AsyncSandmesh.submit`."""
        job = self._call(
            self.async_client.submit(
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
            )
        )
        return Job(self, job)

    def job(self, execution_id: str) -> "Job":
        """A handle on an execution by id, to look up or wait for its result."""
        return Job(self, self.async_client.job(execution_id))

    def assess(
        self,
        code: str,
        language: str = "python",
        *,
        mode: Optional[str] = None,
        params: Optional[Mapping[str, Any]] = None,
    ) -> RiskAssessment:
        """The risk assessor's verdict; see :meth:`AsyncSandmesh.assess`."""
        return self._call(self.async_client.assess(code, language, mode=mode, params=params))

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
    ) -> "Session":
        """Opens a session (idempotent by id); ``with sm.session("s1") as s:`` closes it at the
        end. See :meth:`AsyncSandmesh.session`."""
        inner = self.async_client.session(
            session_id,
            template=template,
            tier=tier,
            language=language,
            network=network,
            requested_by=requested_by,
            env=env,
            timeout_ms=timeout_ms,
            ttl_ms=ttl_ms,
            idle_ms=idle_ms,
            filesystem=filesystem,
        )
        self._call(inner.open())
        return Session(self, inner)

    def sessions(self) -> List[SessionInfo]:
        """This tenant's sessions."""
        return self._call(self.async_client.sessions())


class Job:
    """An async execution (see :meth:`Sandmesh.submit`); mirrors :class:`AsyncJob`."""

    def __init__(self, sm: Sandmesh, inner: AsyncJob) -> None:
        self._sm = sm
        self.inner = inner

    def __repr__(self) -> str:
        return f"Job(execution_id={self.execution_id!r}, duplicate={self.duplicate})"

    @property
    def execution_id(self) -> str:
        return self.inner.execution_id

    @property
    def duplicate(self) -> bool:
        return self.inner.duplicate

    @property
    def confirmation(self) -> Any:
        """The :class:`Confirmation` a look-up found the job waiting for, if any."""
        return self.inner.confirmation

    def poll(self, check: bool = True) -> Optional[ExecResult]:
        """The stored result, or ``None`` while queued, parked or running."""
        return self._sm._call(self.inner.poll(check=check))

    def result(self, timeout: Optional[float] = None, check: bool = True) -> ExecResult:
        """Waits for the result (``timeout`` seconds, default the client's ``run_timeout``)."""
        return self._sm._call(self.inner.result(timeout=timeout, check=check))


class Files:
    """A session's workspace files (``s.files``); mirrors :class:`AsyncFiles`."""

    def __init__(self, sm: Sandmesh, inner: AsyncFiles) -> None:
        self._sm = sm
        self.inner = inner

    def write(self, path: str, data: Union[bytes, str], *, append: bool = False) -> FileEntry:
        """Writes a file of any size (large ones in upload chunks)."""
        return self._sm._call(self.inner.write(path, data, append=append))

    def read(self, path: str) -> bytes:
        """Reads a file of any size (large ones by ranges)."""
        return self._sm._call(self.inner.read(path))

    def list(self, path: Optional[str] = None, *, recursive: bool = False) -> List[FileEntry]:
        """The entries under ``path``."""
        return self._sm._call(self.inner.list(path, recursive=recursive))

    def stat(self, path: str) -> FileEntry:
        """One entry (:class:`NotFound` when there is none)."""
        return self._sm._call(self.inner.stat(path))

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return self._sm._call(self.inner.exists(path))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a file (or a directory with ``recursive``)."""
        self._sm._call(self.inner.remove(path, recursive=recursive))


class Browser:
    """A session's browser (``s.browser``); mirrors :class:`AsyncBrowser`."""

    def __init__(self, sm: Sandmesh, inner: AsyncBrowser) -> None:
        self._sm = sm
        self.inner = inner

    def act(
        self,
        action: str,
        *,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
        **params: Any,
    ) -> BrowserResult:
        """Any browser action with its request fields (a person's approval is told to
        ``on_awaiting_approval`` at once)."""
        return self._sm._call(
            self.inner.act(
                action, on_awaiting_approval=on_awaiting_approval, request_timeout=request_timeout, **params
            )
        )

    def navigate(self, url: str, *, on_awaiting_approval: Optional[ApprovalCallback] = None) -> BrowserResult:
        """Opens ``url``."""
        return self._sm._call(self.inner.navigate(url, on_awaiting_approval=on_awaiting_approval))

    def elements(self) -> List[BrowserElement]:
        """The page's interactive elements, indexed."""
        return self._sm._call(self.inner.elements())

    def click(self, target: Target, *, on_awaiting_approval: Optional[ApprovalCallback] = None) -> BrowserResult:
        """Clicks an element (index or CSS selector)."""
        return self._sm._call(self.inner.click(target, on_awaiting_approval=on_awaiting_approval))

    def fill(
        self,
        target: Target,
        text: str,
        *,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
    ) -> BrowserResult:
        """Fills an input (index or CSS selector); a password field waits for a person."""
        return self._sm._call(
            self.inner.fill(
                target, text, on_awaiting_approval=on_awaiting_approval, request_timeout=request_timeout
            )
        )

    def screenshot(self, *, full_page: bool = False) -> BrowserResult:
        """A PNG of the page (``.screenshot`` bytes, ``.screenshot_path`` in the workspace)."""
        return self._sm._call(self.inner.screenshot(full_page=full_page))

    def content(self, format: str = "text") -> str:
        """The page's text or HTML."""
        return self._sm._call(self.inner.content(format))

    def close(self) -> BrowserResult:
        """Closes the session's browser."""
        return self._sm._call(self.inner.close())


class Aio:
    """A session's AIO sandbox instance (``s.aio``); mirrors :class:`AsyncAio`."""

    def __init__(self, sm: Sandmesh, inner: AsyncAio) -> None:
        self._sm = sm
        self.inner = inner

    def acquire(self, *, browser: bool = False) -> AioLease:
        """Binds an instance to the session (or returns the one it has)."""
        return self._sm._call(self.inner.acquire(browser=browser))

    def exec(
        self,
        command: str,
        *,
        timeout: Optional[float] = None,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
    ) -> AioExecResult:
        """Runs a shell command in the session's instance (assessed; may wait for a person)."""
        return self._sm._call(
            self.inner.exec(
                command, timeout=timeout, on_awaiting_approval=on_awaiting_approval, request_timeout=request_timeout
            )
        )

    def release(self) -> AioReleased:
        """Destroys the session's instance."""
        return self._sm._call(self.inner.release())

    def stats(self) -> AioStats:
        """The pool's instances by state."""
        return self._sm._call(self.inner.stats())


class Session:
    """A session of :class:`Sandmesh`; mirrors :class:`AsyncSession`.

    Attributes:
        session_id, info, files (:class:`Files`), browser (:class:`Browser`), aio (:class:`Aio`).
    """

    def __init__(self, sm: Sandmesh, inner: AsyncSession) -> None:
        self._sm = sm
        self.inner = inner
        self.files = Files(sm, inner.files)
        self.browser = Browser(sm, inner.browser)
        self.aio = Aio(sm, inner.aio)
        self.ports = Ports(sm, inner.ports)
        self.processes = Processes(sm, inner.processes)

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    @property
    def info(self) -> Optional[SessionInfo]:
        return self.inner.info

    def __repr__(self) -> str:
        return f"Session({self.session_id!r})"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, code: str, language: str = "python", **kwargs: Any) -> ExecResult:
        """:meth:`Sandmesh.run` in this session (same arguments)."""
        return self._sm.run(code, language, session_id=self.session_id, **kwargs)

    def run_tests(self, code: str, tests: str, language: str = "python", **kwargs: Any) -> TestReport:
        """:meth:`Sandmesh.run_tests` in this session (same arguments)."""
        return self._sm.run_tests(code, tests, language, session_id=self.session_id, **kwargs)

    def submit(self, code: str, language: str = "python", **kwargs: Any) -> Job:
        """:meth:`Sandmesh.submit` in this session (same arguments)."""
        return self._sm.submit(code, language, session_id=self.session_id, **kwargs)

    def get(self) -> SessionInfo:
        """The session's current record."""
        return self._sm._call(self.inner.get())

    def close(self) -> SessionInfo:
        """Closes the session (its container goes; its workspace stays until its TTL)."""
        return self._sm._call(self.inner.close())


class AuditFollow:
    """Live audit events; iterate it, or ask :meth:`next`. Mirrors :class:`AsyncAuditFollow`."""

    def __init__(self, sm: Sandmesh, inner: AsyncAuditFollow) -> None:
        self._sm = sm
        self.inner = inner

    def next(self, timeout: Optional[float] = None) -> AuditEvent:
        """The next event; :class:`Timeout` when none comes within ``timeout`` seconds."""
        return self._sm._call(self.inner.next(timeout))

    def __iter__(self) -> Iterator[AuditEvent]:
        while self.inner._sub is not None:
            yield self.next()

    def close(self) -> None:
        """Ends the subscription."""
        self._sm._call(self.inner.close())

    def __enter__(self) -> "AuditFollow":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Audit:
    """``sm.audit``: the tenant's audit events, live."""

    def __init__(self, sm: Sandmesh) -> None:
        self._sm = sm

    def follow(
        self,
        kind: Optional[str] = None,
        *,
        session_id: Optional[str] = None,
        execution_id: Optional[str] = None,
    ) -> AuditFollow:
        """Follows events (of one ``kind``, session or execution); subscribed when it returns."""
        inner = self._sm._call(self._sm.async_client.audit.follow(kind, session_id=session_id, execution_id=execution_id))
        return AuditFollow(self._sm, inner)
