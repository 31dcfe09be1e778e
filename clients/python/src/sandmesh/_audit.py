"""The tenant's audit events, live (``<prefix>.v1.audit.<tenant>.<kind>``).

A tenant's account imports only its own tenant's audit subjects, so subscribing to
``audit.>`` there can only ever see that tenant's events. The stored trail (stream
``SANDBOX_AUDIT``) is for operators and the deployment's admin; agents follow it live.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional

from ._transport import Transport
from .errors import Timeout
from .types import AuditEvent


class AsyncAuditFollow:
    """A live subscription to audit events, filtered; iterate it, or ask :meth:`next`.

    It is subscribed (at the server) when :meth:`AsyncAudit.follow` returns, so every event
    published afterwards is seen. Close it when done (or use ``async with``).
    """

    def __init__(self, transport: Transport, kind: Optional[str], session_id: Optional[str], execution_id: Optional[str]) -> None:
        self._t = transport
        self.kind = kind
        self.session_id = session_id
        self.execution_id = execution_id
        self._queue: "asyncio.Queue[AuditEvent]" = asyncio.Queue()
        self._sub: Any = None

    async def _start(self) -> "AsyncAuditFollow":
        subject = self._t.subject(f"audit.*.{self.kind}" if self.kind else "audit.>")

        async def on_event(msg: Any) -> None:
            try:
                event = AuditEvent.from_wire(self._t.codec.decode(msg.data, msg.headers), msg.subject)
            except Exception:  # not an audit event: nothing a reader can use
                return
            if self.session_id is not None and event.session_id != self.session_id:
                return
            if self.execution_id is not None and event.execution_id != self.execution_id:
                return
            self._queue.put_nowait(event)

        self._sub = await self._t.nc.subscribe(subject, cb=on_event)
        await self._t.nc.flush(timeout=max(1, int(self._t.timeout)))
        return self

    async def next(self, timeout: Optional[float] = None) -> AuditEvent:
        """The next event; :class:`Timeout` when none comes within ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"no audit event within {timeout:g} s") from None

    def __aiter__(self) -> AsyncIterator[AuditEvent]:
        return self

    async def __anext__(self) -> AuditEvent:
        if self._sub is None:
            raise StopAsyncIteration
        return await self._queue.get()

    async def close(self) -> None:
        """Ends the subscription."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def __aenter__(self) -> "AsyncAuditFollow":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncAudit:
    """``sm.audit``: the tenant's audit trail, live."""

    def __init__(self, transport_of: Any) -> None:
        self._transport_of = transport_of

    async def follow(
        self,
        kind: Optional[str] = None,
        *,
        session_id: Optional[str] = None,
        execution_id: Optional[str] = None,
    ) -> AsyncAuditFollow:
        """Follows events of one ``kind`` (``finished``, ``file_written``, ...; all when
        omitted), optionally of one session or execution."""
        transport = await self._transport_of()
        return await AsyncAuditFollow(transport, kind, session_id, execution_id)._start()
