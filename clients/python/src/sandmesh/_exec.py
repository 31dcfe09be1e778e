"""Executions: the request, the live output, the approval notice, the result, and async jobs.

A sync execution is one request on ``<prefix>.v1.exec`` whose reply subject is an inbox of
this call. With the request header ``Sandmesh-Notify: 1`` the scheduler sends a first message
there when the execution is parked for a person (header ``Sandmesh-Status:
awaiting-confirmation``, JSON body ``{execution_id, confirmation_id, expires_at}``), then the
result. Output chunks (``OutputChunk {seq, stream, data, eof}``) are published on
``<prefix>.v1.output.<tenant>.<execution_id>``; a tenant sees only its own, so this client
subscribes to ``output.*.<execution_id>`` before the request goes out and hands chunks to the
callbacks in ``seq`` order.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import inspect
import json
import time
from typing import Any, Awaitable, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Union

import nats.errors

from ._transport import (
    NOTIFY_HEADER,
    STATUS_AWAITING_CONFIRMATION,
    STATUS_HEADER,
    Transport,
    decode_reply,
    drop_none,
    new_id,
    translate,
)
from .errors import Internal, NotFound, SandmeshError, Timeout, Unavailable, error_from_body
from .types import RAN_STATUSES, Confirmation, ExecResult, OutputChunk

#: How long a sync execution may take by default: a container, a person's approval and the run.
EXEC_TIMEOUT = 600.0
#: The longest one ``exec.result`` long poll may wait (the scheduler's MAX_RESULT_WAIT_MS).
MAX_RESULT_WAIT = 30.0
#: After the result, how long the last output chunks (sent before it, on another path) may lag.
OUTPUT_GRACE = 2.0

TextCallback = Callable[[str], Union[None, Awaitable[None]]]
ApprovalCallback = Callable[[Confirmation], Union[None, Awaitable[None]]]
FilesArg = Union[Mapping[str, Union[str, bytes]], Sequence[Mapping[str, Any]], None]


async def call_back(callback: Optional[Callable[[Any], Any]], value: Any) -> None:
    """Calls a user callback, awaiting it when it is a coroutine function."""
    if callback is None:
        return
    outcome = callback(value)
    if inspect.isawaitable(outcome):
        await outcome


def wire_files(files: FilesArg) -> Optional[List[Dict[str, Any]]]:
    """``{path: text | bytes}`` (or ready ``FileSpec`` dicts) as the request's ``files``."""
    if not files:
        return None
    if isinstance(files, Mapping):
        out = []
        for path, content in files.items():
            if isinstance(content, bytes):
                out.append({"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"})
            else:
                out.append({"path": path, "content": str(content), "encoding": "utf8"})
        return out
    return [dict(f) for f in files]


def exec_request(
    code: str,
    language: str,
    *,
    session_id: Optional[str],
    template: Optional[str],
    timeout: Optional[float],
    env: Optional[Mapping[str, str]],
    files: FilesArg,
    stdin: Optional[str],
    tier: Optional[str],
    limits: Optional[Mapping[str, Any]],
    network: Optional[Mapping[str, Any]],
    execution_id: Optional[str],
    requested_by: Optional[str],
    stream_output: bool,
    kernel: bool = False,
) -> Dict[str, Any]:
    """An ``ExecRequest`` (unset fields left out)."""
    return drop_none(
        {
            "execution_id": execution_id,
            "session_id": session_id,
            "language": language,
            "code": code,
            "stdin": stdin,
            "timeout_ms": None if timeout is None else int(timeout * 1000),
            "tier": tier,
            "limits": dict(limits) if limits else None,
            "env": dict(env) if env else None,
            "files": wire_files(files),
            "stream_output": True if stream_output else None,
            "requested_by": requested_by,
            "network": dict(network) if network else None,
            "template": template,
            "kernel": True if kernel else None,
        }
    )


def refused(result: ExecResult) -> Optional[SandmeshError]:
    """The error a result stands for when its program did not run (denied, rejected, lost)."""
    if result.status in RAN_STATUSES:
        return None
    body: Dict[str, Any] = dict(result.error or {})
    if "kind" not in body:
        body["kind"] = {
            "denied": "denied",
            "rejected": "denied",
            "executor_lost": "unavailable",
            "unavailable": "unavailable",
        }.get(result.status, "internal")
        body.setdefault("message", f"execution {result.execution_id} ended {result.status}")
    return error_from_body(body, result=result)


class _Mailbox:
    """The messages of one call, in arrival order. ``get`` wakes the waiting call directly from
    the delivering callback: an ``asyncio.Queue`` read under ``asyncio.wait_for`` costs a task
    and extra turns of the event loop per message, which showed in every call's latency."""

    def __init__(self) -> None:
        self._items: Deque[Any] = collections.deque()
        self._waiter: Optional["asyncio.Future[None]"] = None

    def put(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self, timeout: float) -> Any:
        """The next message; :class:`asyncio.TimeoutError` when none comes within ``timeout``."""
        if not self._items:
            if timeout <= 0:
                raise asyncio.TimeoutError
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()

            def expire() -> None:
                if not waiter.done():
                    waiter.set_exception(asyncio.TimeoutError())

            timer = loop.call_later(timeout, expire)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self._items.popleft()


class _Output:
    """Hands chunks to the callbacks in ``seq`` order, whatever order they arrive in."""

    def __init__(self, on_stdout: Optional[TextCallback], on_stderr: Optional[TextCallback]) -> None:
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.next_seq = 0
        self.held: Dict[int, OutputChunk] = {}
        self.eof = False

    async def _deliver(self, chunk: OutputChunk) -> None:
        if chunk.eof:
            self.eof = True
        if chunk.data:
            await call_back(self.on_stderr if chunk.stream == "stderr" else self.on_stdout, chunk.data)

    async def add(self, chunk: OutputChunk) -> None:
        if chunk.seq < self.next_seq:
            return  # a duplicate
        self.held[chunk.seq] = chunk
        while self.next_seq in self.held:
            await self._deliver(self.held.pop(self.next_seq))
            self.next_seq += 1

    async def flush(self) -> None:
        """Delivers what is held past a gap (a chunk lost on the way), still in order."""
        for seq in sorted(self.held):
            await self._deliver(self.held.pop(seq))


async def run_exec(
    transport: Transport,
    request: Dict[str, Any],
    *,
    on_stdout: Optional[TextCallback] = None,
    on_stderr: Optional[TextCallback] = None,
    on_awaiting_approval: Optional[ApprovalCallback] = None,
    request_timeout: Optional[float] = None,
    check: bool = True,
) -> ExecResult:
    """Runs one ``ExecRequest`` and returns its result (see :meth:`AsyncSandmesh.run`)."""
    nc = transport.nc
    wait = transport.run_timeout if request_timeout is None else request_timeout
    subject = transport.subject("exec")
    streaming = on_stdout is not None or on_stderr is not None
    if streaming:
        request = dict(request, stream_output=True)
        request.setdefault("execution_id", new_id())
    payload = transport.codec.encode(request)
    events = _Mailbox()

    async def on_chunk(msg: Any) -> None:
        events.put(("chunk", msg))

    subs = []
    output = _Output(on_stdout, on_stderr)
    notice: Optional[Confirmation] = None
    forget: Callable[[], None] = lambda: None
    try:
        inbox, forget = await transport.reply_inbox(lambda msg: events.put(("reply", msg)))
        if streaming:
            subs.append(await nc.subscribe(transport.subject(f"output.*.{request['execution_id']}"), cb=on_chunk))
            # The output subscription must be live at the server before the run can start.
            await nc.flush(timeout=max(1, int(transport.timeout)))
        headers = transport.headers({NOTIFY_HEADER: "1"})
        await nc.publish(subject, payload, reply=inbox, headers=headers)
        deadline = time.monotonic() + wait
        result: Optional[ExecResult] = None
        while result is None:
            try:
                kind, msg = await events.get(deadline - time.monotonic())
            except asyncio.TimeoutError:
                raise _late(wait, request, notice, subject) from None
            if kind == "chunk":
                await output.add(OutputChunk.from_wire(transport.codec.decode(msg.data, msg.headers)))
                continue
            headers_in = msg.headers or {}
            if headers_in.get(STATUS_HEADER) == STATUS_AWAITING_CONFIRMATION:
                notice = Confirmation.from_wire(json.loads(msg.data))
                await call_back(on_awaiting_approval, notice)
                continue
            if headers_in.get("Status") == "503" and not msg.data:
                raise Unavailable(f"no service answers on {subject} (is the mesh up?)", subject=subject)
            result = ExecResult.from_wire(decode_reply(transport.codec, subject, msg.headers, msg.data))
        if streaming and result.ran:
            # The chunks were sent before the result, but on another path: let stragglers land.
            grace_end = time.monotonic() + OUTPUT_GRACE
            while not output.eof:
                try:
                    kind, msg = await events.get(grace_end - time.monotonic())
                except asyncio.TimeoutError:
                    break
                if kind == "chunk":
                    await output.add(OutputChunk.from_wire(transport.codec.decode(msg.data, msg.headers)))
            await output.flush()
    except (nats.errors.Error, OSError) as e:
        raise translate(e, subject, wait) from e
    finally:
        forget()
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may be gone; nothing to undo then
                pass
    if check:
        error = refused(result)
        if error is not None:
            error.subject = subject
            raise error
    return result


def _late(
    wait: float, request: Mapping[str, Any], notice: Optional[Confirmation], subject: str, resumable: bool = True
) -> Timeout:
    """The timeout of a sync call, naming the confirmation it waits for, if any. ``resumable``:
    an execution stays parked and its result can be collected later; a browser action's cannot."""
    if notice is not None:
        left = max(0.0, notice.expires_at / 1000 - time.time())
        what, later = (
            ("execution", "It stays parked: collect the result later with sm.job(execution_id).result()")
            if resumable
            else ("browser action", "If it is approved later, the action runs, but its answer is lost")
        )
        return Timeout(
            f"no result for {what} {notice.execution_id} within {wait:g} s: it waits for a "
            f"person's approval of confirmation {notice.confirmation_id} (`sandmesh confirm "
            f"approve {notice.confirmation_id}`; expires in {left:.0f} s). {later}",
            subject=subject,
            confirmation_id=notice.confirmation_id,
            execution_id=notice.execution_id,
        )
    execution_id = request.get("execution_id")
    named = f" for execution {execution_id}" if execution_id else ""
    return Timeout(f"no result{named} within {wait:g} s", subject=subject, execution_id=execution_id)


async def notified_request(
    transport: Transport,
    rest: str,
    body: Mapping[str, Any],
    timeout: float,
    on_awaiting_approval: Optional[ApprovalCallback],
    resumable: bool = True,
) -> Any:
    """A request whose answer may be preceded by an awaiting-confirmation notice (``exec``,
    ``aio.exec``, ``browser.<action>``): the notice goes to the callback, the answer is
    returned (or raised). ``resumable``: see :func:`_late`."""
    nc = transport.nc
    subject = transport.subject(rest)
    replies = _Mailbox()

    notice: Optional[Confirmation] = None
    forget: Callable[[], None] = lambda: None
    try:
        inbox, forget = await transport.reply_inbox(replies.put)
        await nc.publish(
            subject, transport.codec.encode(drop_none(body)), reply=inbox, headers=transport.headers({NOTIFY_HEADER: "1"})
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = await replies.get(deadline - time.monotonic())
            except asyncio.TimeoutError:
                raise _late(timeout, {}, notice, subject, resumable) from None
            headers_in = msg.headers or {}
            if headers_in.get(STATUS_HEADER) == STATUS_AWAITING_CONFIRMATION:
                notice = Confirmation.from_wire(json.loads(msg.data))
                await call_back(on_awaiting_approval, notice)
                continue
            if headers_in.get("Status") == "503" and not msg.data:
                raise Unavailable(f"no service answers on {subject} (is the mesh up?)", subject=subject)
            return decode_reply(transport.codec, subject, msg.headers, msg.data)
    except (nats.errors.Error, OSError) as e:
        raise translate(e, subject, timeout) from e
    finally:
        forget()


# === async jobs ===


class AsyncJob:
    """An accepted async execution: JetStream holds it until a scheduler stores its result.

    Attributes:
        execution_id: the job's id (and its JetStream ``Nats-Msg-Id``).
        duplicate: JetStream had seen this id already (a retried submit): nothing new runs.
        confirmation: set when a look-up found the job parked for a person's approval.
    """

    def __init__(self, transport: Transport, execution_id: str, duplicate: bool = False) -> None:
        self._transport = transport
        self.execution_id = execution_id
        self.duplicate = duplicate
        self.confirmation: Optional[Confirmation] = None

    def __repr__(self) -> str:
        return f"AsyncJob(execution_id={self.execution_id!r}, duplicate={self.duplicate})"

    async def _lookup(self, wait: Optional[float]) -> Optional[ExecResult]:
        body: Dict[str, Any] = {"execution_id": self.execution_id}
        if wait is not None:
            body["wait_ms"] = int(wait * 1000)
        timeout = self._transport.timeout + (wait or 0.0)
        reply = await self._transport.request("exec.result", body, timeout=timeout)
        if not isinstance(reply, Mapping):
            raise Internal(f"exec.result: an unexpected reply {reply!r}")
        if reply.get("state") == "done":
            return ExecResult.from_wire(reply.get("result") or {})
        waiting = reply.get("awaiting_confirmation")
        if isinstance(waiting, Mapping):
            self.confirmation = Confirmation.from_wire(waiting)
        return None

    async def poll(self, check: bool = True) -> Optional[ExecResult]:
        """The stored result, or ``None`` while the job is queued, parked or running.

        Raises :class:`NotFound` for an id the mesh does not know (or another tenant's).
        """
        result = await self._lookup(None)
        if result is not None and check:
            error = refused(result)
            if error is not None:
                raise error
        return result

    async def result(self, timeout: Optional[float] = None, check: bool = True) -> ExecResult:
        """Waits for the result (long polls of ``exec.result``; ``timeout`` seconds, default the
        client's ``run_timeout``).

        A job just submitted may not be known yet, so ``NotFound`` counts as pending here.
        Raises :class:`Timeout` (naming the confirmation when the job waits for a person), or
        the error of a result whose program did not run unless ``check=False``.
        """
        wait = self._transport.run_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            try:
                result = await self._lookup(max(0.0, min(left, MAX_RESULT_WAIT)))
            except NotFound:
                result = None
                await asyncio.sleep(min(0.05, max(0.0, left)))
            if result is not None:
                if check:
                    error = refused(result)
                    if error is not None:
                        raise error
                return result
            if time.monotonic() >= deadline:
                raise _late(wait, {"execution_id": self.execution_id}, self.confirmation, self._transport.subject("exec.result"))


async def submit_job(transport: Transport, request: Dict[str, Any]) -> AsyncJob:
    """Publishes an ``ExecRequest`` on ``<prefix>.v1.jobs.exec`` (``Nats-Msg-Id`` = its id)."""
    request = dict(request)
    execution_id = request.setdefault("execution_id", new_id())
    subject = transport.subject("jobs.exec")
    headers = transport.headers({"Nats-Msg-Id": execution_id})
    try:
        ack = await transport.nc.jetstream().publish(
            subject, transport.codec.encode(request), timeout=transport.timeout, headers=headers
        )
    except nats.errors.NoRespondersError as e:
        raise Unavailable(f"no JetStream stream takes {subject} (is the mesh up?)", subject=subject) from e
    except nats.errors.TimeoutError as e:
        raise Timeout(f"no JetStream ack within {transport.timeout:g} s", subject=subject) from e
    except Exception as e:  # nats.js.errors.APIError and friends
        raise Unavailable(f"JetStream refused the job: {e!r}", subject=subject) from e
    return AsyncJob(transport, execution_id, bool(getattr(ack, "duplicate", False)))
