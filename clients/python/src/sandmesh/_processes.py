"""A session's background processes (``s.processes``, ``sandbox.v1.proc.*``): programs that
outlive one run — a dev server, a watcher, a REPL — held by the session's container until they
exit, are killed, or the session ends.

``start`` answers a :class:`Process` (its ``proc_id``); ``output`` reads what it printed from a
sequence number on, or follows it live (``follow=True``) until it ends; ``send_input`` writes
to its stdin (start it with ``stdin=True``) or terminal (``pty=(cols, rows)``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ._transport import Transport

#: How long one step of ``output(follow=True)`` waits for the process (the mesh's bound).
FOLLOW_WAIT_MS = 10_000


@dataclass
class Process:
    """A started process: ``proc_id`` names it in every other call."""

    proc_id: str
    pid: int = 0
    started_at: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "Process":
        return cls(proc_id=str(d.get("proc_id", "")), pid=int(d.get("pid", 0)), started_at=int(d.get("started_at", 0)), raw=dict(d))


def _chunk_bytes(chunk: Mapping[str, Any]) -> bytes:
    data = chunk.get("data", "")
    if chunk.get("encoding") == "base64":
        return base64.b64decode(data)
    return str(data).encode()


class AsyncProcesses:
    """The session's background processes (``s.processes``)."""

    def __init__(self, transport: Transport, session_id: str) -> None:
        self._t = transport
        self.session_id = session_id

    async def start(
        self,
        command: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: bool = False,
        pty: Optional[Tuple[int, int]] = None,
        tag: Optional[str] = None,
        timeout_ms: int = 0,
        request_timeout: Optional[float] = None,
    ) -> Process:
        """Starts ``command``: a line for ``bash -c`` (str) or a program and its arguments
        (a list). ``pty=(cols, rows)`` runs it in a terminal. Risky commands wait for a
        person's approval first (up to ``request_timeout``; default the client's ``run_timeout``,
        as a run waits)."""
        body: Dict[str, Any] = {
            "session_id": self.session_id,
            "cwd": cwd,
            "env": dict(env) if env else None,
            "stdin": stdin,
            "pty": {"cols": pty[0], "rows": pty[1]} if pty else None,
            "tag": tag,
            "timeout_ms": timeout_ms,
        }
        if isinstance(command, str):
            body["cmd"] = command
        else:
            body["argv"] = list(command)
        wait = self._t.run_timeout if request_timeout is None else request_timeout
        reply = await self._t.request("proc.start", body, timeout=wait)
        return Process.from_wire(reply)

    async def list(self) -> List[Dict[str, Any]]:
        """Every process of the session, oldest first (``proc_id``, ``state``, ``exit_code``, …)."""
        reply = await self._t.request("proc.list", {"session_id": self.session_id, "proc_id": ""})
        return list(reply.get("procs", []))

    async def read(self, proc_id: str, from_seq: int = 0) -> Tuple[bytes, int, str]:
        """One page of kept output from ``from_seq``: its bytes, the seq to continue from, and
        the process's state."""
        reply = await self._t.request(
            "proc.output", {"session_id": self.session_id, "proc_id": proc_id, "from_seq": from_seq}
        )
        data = b"".join(_chunk_bytes(c) for c in reply.get("chunks", []))
        return data, int(reply.get("next_seq", from_seq)), str(reply.get("state", ""))

    async def output(self, proc_id: str, *, from_seq: int = 0) -> bytes:
        """Everything kept from ``from_seq`` on, now."""
        out = b""
        while True:
            data, next_seq, _ = await self.read(proc_id, from_seq)
            out += data
            if not data or next_seq == from_seq:
                return out
            from_seq = next_seq

    async def follow(self, proc_id: str, *, from_seq: int = 0) -> AsyncIterator[bytes]:
        """What the process prints, as it prints it, until it ends."""
        while True:
            data, next_seq, state = await self.read(proc_id, from_seq)
            if data:
                yield data
            from_seq = next_seq
            if state != "running" and not data:
                return
            if not data:
                await self.wait(proc_id, timeout_ms=FOLLOW_WAIT_MS // 10)

    async def send_input(self, proc_id: str, data: Union[str, bytes], *, eof: bool = False) -> None:
        """Writes to the process's stdin or terminal (``eof`` closes stdin after it)."""
        if isinstance(data, bytes):
            payload = {"data": base64.b64encode(data).decode(), "encoding": "base64"}
        else:
            payload = {"data": data}
        body = dict(payload, session_id=self.session_id, proc_id=proc_id, eof=eof)
        await self._t.request("proc.input", body)

    async def wait(self, proc_id: str, *, timeout_ms: int = 30_000) -> Dict[str, Any]:
        """Until it ends, or ``timeout_ms`` (at most 30 s) with it still running."""
        body = {"session_id": self.session_id, "proc_id": proc_id, "timeout_ms": timeout_ms}
        return dict(await self._t.request("proc.wait", body, timeout=timeout_ms / 1000 + 10))

    async def kill(self, proc_id: str) -> Dict[str, Any]:
        """Kills it and everything it started (SIGKILL to its group)."""
        body = {"session_id": self.session_id, "proc_id": proc_id, "signal": "KILL"}
        return dict(await self._t.request("proc.signal", body))


class Processes:
    """A session's background processes (``s.processes``); mirrors :class:`AsyncProcesses`.
    ``output(proc_id, follow=True)`` is an iterator of what it prints until it ends."""

    def __init__(self, sm: Any, inner: AsyncProcesses) -> None:
        self._sm = sm
        self.inner = inner

    def start(self, command: Union[str, Sequence[str]], **kwargs: Any) -> Process:
        return self._sm._call(self.inner.start(command, **kwargs))

    def list(self) -> List[Dict[str, Any]]:
        return self._sm._call(self.inner.list())

    def output(self, proc_id: str, *, from_seq: int = 0, follow: bool = False) -> Union[bytes, Iterator[bytes]]:
        if not follow:
            return self._sm._call(self.inner.output(proc_id, from_seq=from_seq))
        return self._follow(proc_id, from_seq)

    def _follow(self, proc_id: str, from_seq: int) -> Iterator[bytes]:
        while True:
            data, next_seq, state = self._sm._call(self.inner.read(proc_id, from_seq))
            if data:
                yield data
            from_seq = next_seq
            if state != "running" and not data:
                return
            if not data:
                self._sm._call(self.inner.wait(proc_id, timeout_ms=FOLLOW_WAIT_MS // 10))

    def send_input(self, proc_id: str, data: Union[str, bytes], *, eof: bool = False) -> None:
        self._sm._call(self.inner.send_input(proc_id, data, eof=eof))

    def wait(self, proc_id: str, *, timeout_ms: int = 30_000) -> Dict[str, Any]:
        return self._sm._call(self.inner.wait(proc_id, timeout_ms=timeout_ms))

    def kill(self, proc_id: str) -> Dict[str, Any]:
        return self._sm._call(self.inner.kill(proc_id))
