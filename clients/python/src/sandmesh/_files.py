"""A session's workspace files, of any size, by requests only (what a tenant's agent may do).

Content up to :data:`INLINE_MAX_BYTES` travels inside one ``workspace.write`` / ``read``.
Larger content goes in as ``workspace.upload`` chunks (at most 700 KiB each, chunk 0 first, the
rest a few at a time) committed by a ``write`` naming ``upload: {upload_id, chunks, sha256}``,
and comes out by ranged ``read``s of :data:`READ_RANGE_BYTES`, checked against the file's
SHA-256 — the same numbers as ``messages::workspace`` and ``sandmesh-client``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Union

from ._transport import Transport, new_id
from .errors import Internal, NotFound
from .types import FileEntry

#: The largest content that travels inside one message (base64 must stay below 1 MiB).
INLINE_MAX_BYTES = 700 * 1024
#: The most bytes one upload chunk carries.
TRANSFER_CHUNK_MAX_BYTES = INLINE_MAX_BYTES
#: Ranges a large file is read in: one object chunk of the store, one direct get each.
READ_RANGE_BYTES = 512 * 1024
#: Chunks (or ranges) of one transfer in flight at once.
TRANSFER_WINDOW = 4
#: Calls that move whole files may take longer than the default timeout.
BULK_TIMEOUT = 300.0
#: A file overwritten while it was read in ranges is read again this often.
READ_ATTEMPTS = 3


def wire_content(data: bytes) -> Dict[str, str]:
    """UTF-8 text when it is text and JSON-escaping would not make it larger than base64."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        escaped = sum(2 if b in b'"\\\n\r\t' else 6 if b < 0x20 else 1 for b in data)
        if escaped <= -(-len(data) // 3) * 4:
            return {"content": text, "encoding": "utf8"}
    return {"content": base64.b64encode(data).decode(), "encoding": "base64"}


def decode_content(file: Mapping[str, Any]) -> bytes:
    content = file.get("content") or ""
    if file.get("encoding") == "base64":
        return base64.b64decode(content)
    return str(content).encode("utf-8")


async def _windowed(jobs: List[Callable[[], Awaitable[Any]]]) -> List[Any]:
    """Runs the jobs at most :data:`TRANSFER_WINDOW` at a time; results in job order."""
    gate = asyncio.Semaphore(TRANSFER_WINDOW)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


class AsyncFiles:
    """The files of one session's workspace (``s.files``). Paths are relative to it."""

    def __init__(self, transport: Transport, session_id: str) -> None:
        self._t = transport
        self.session_id = session_id

    async def write(self, path: str, data: Union[bytes, str], *, append: bool = False) -> FileEntry:
        """Writes (or with ``append`` extends) a file of any size; returns its entry."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        req: Dict[str, Any] = {"session_id": self.session_id, "path": path, "append": append or None}
        if len(raw) <= INLINE_MAX_BYTES:
            req.update(wire_content(raw))
            return FileEntry.from_wire(await self._t.request("workspace.write", req))
        req.update(content="", upload=await self._upload(raw))
        return FileEntry.from_wire(await self._t.request("workspace.write", req, timeout=BULK_TIMEOUT))

    async def _upload(self, raw: bytes) -> Dict[str, Any]:
        upload_id = new_id()
        size = TRANSFER_CHUNK_MAX_BYTES
        parts = [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]

        def chunk(seq: int) -> Dict[str, Any]:
            part = parts[seq]
            data: Any = part if self._t.codec.binary else base64.b64encode(part).decode()
            return {"session_id": self.session_id, "upload_id": upload_id, "seq": seq, "data": data}

        # Chunk 0 opens the upload; the rest may arrive in any order.
        await self._t.request("workspace.upload", chunk(0), timeout=BULK_TIMEOUT)
        def send(seq: int) -> Callable[[], Awaitable[Any]]:
            return lambda: self._t.request("workspace.upload", chunk(seq), timeout=BULK_TIMEOUT)

        await _windowed([send(seq) for seq in range(1, len(parts))])
        return {"upload_id": upload_id, "chunks": len(parts), "sha256": hashlib.sha256(raw).hexdigest()}

    async def read(self, path: str) -> bytes:
        """The whole content of a file of any size."""
        req = {"session_id": self.session_id, "path": path}
        for _attempt in range(READ_ATTEMPTS):
            file = await self._t.request("workspace.read", dict(req, length=INLINE_MAX_BYTES), timeout=BULK_TIMEOUT)
            first = decode_content(file)
            size = int(file.get("size") or 0)
            if len(first) == size:
                return first

            async def ranged(offset: int) -> bytes:
                if offset == 0:  # the ranges follow the store's chunks; the first is in hand
                    return first[:READ_RANGE_BYTES]
                part = await self._t.request(
                    "workspace.read", dict(req, offset=offset, length=READ_RANGE_BYTES), timeout=BULK_TIMEOUT
                )
                return decode_content(part)

            def read_at(offset: int) -> Callable[[], Awaitable[bytes]]:
                return lambda: ranged(offset)

            parts = await _windowed([read_at(offset) for offset in range(0, size, READ_RANGE_BYTES)])
            whole = b"".join(parts)
            if len(whole) == size and hashlib.sha256(whole).hexdigest() == file.get("sha256"):
                return whole
            # Overwritten between two ranges: read the new version.
        raise Internal(f"{path} kept changing while it was read", subject=self._t.subject("workspace.read"))

    async def list(self, path: Optional[str] = None, *, recursive: bool = False) -> List[FileEntry]:
        """The entries under ``path`` (the workspace's top when omitted), every page of them."""
        req: Dict[str, Any] = {"session_id": self.session_id, "prefix": path, "recursive": recursive}
        entries: List[FileEntry] = []
        while True:
            page = await self._t.request("workspace.list", req)
            entries.extend(FileEntry.from_wire(e) for e in page.get("entries") or [])
            after = page.get("next")
            if not after:
                return entries
            req["after"] = after

    async def stat(self, path: str) -> FileEntry:
        """One entry; :class:`NotFound` when there is none."""
        req = {"session_id": self.session_id, "path": path}
        return FileEntry.from_wire(await self._t.request("workspace.stat", req))

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a file (or with ``recursive`` a directory and what it holds)."""
        req = {"session_id": self.session_id, "path": path, "recursive": recursive or None}
        await self._t.request("workspace.delete", req)
