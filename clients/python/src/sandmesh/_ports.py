"""A session's preview ports (``s.ports``): a TCP port a server in the session's container
listens on, made reachable through the mesh's HTTP gateway (``sandbox.v1.ports.*``).

``expose`` answers the port's path on the gateway and a token: a browser opens
``<gateway><url>?sandmesh_token=<token>``; a program may send an API key as
``Authorization: Bearer`` instead. The token is shown once (the mesh keeps only its hash) and
expires with the exposure; exposing the port again replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from ._transport import Transport

#: The query parameter (and cookie) that carries a port's token.
TOKEN_PARAM = "sandmesh_token"


@dataclass
class ExposedPort:
    """An exposed port: its ``url`` path on the gateway, its ``token`` (``expose`` only) and
    when it stops being reachable (``expires_at``, Unix milliseconds)."""

    session_id: str
    port: int
    url: str
    token: Optional[str] = None
    expires_at: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "ExposedPort":
        return cls(
            session_id=str(d.get("session_id", "")),
            port=int(d.get("port", 0)),
            url=str(d.get("url", "")),
            token=d.get("token"),
            expires_at=int(d.get("expires_at", 0)),
            raw=dict(d),
        )

    def browser_url(self, gateway: str) -> str:
        """The URL a browser opens, on the gateway at ``gateway`` (``http://host:port``)."""
        return f"{gateway.rstrip('/')}{self.url}?{TOKEN_PARAM}={self.token or ''}"


class AsyncPorts:
    """The session's preview ports (``s.ports``)."""

    def __init__(self, transport: Transport, session_id: str) -> None:
        self._t = transport
        self.session_id = session_id

    async def expose(self, port: int, *, ttl_ms: Optional[int] = None) -> ExposedPort:
        """Makes ``port`` reachable for ``ttl_ms`` (default an hour, at most a day)."""
        body = {"session_id": self.session_id, "port": port, "ttl_ms": ttl_ms}
        return ExposedPort.from_wire(await self._t.request("ports.expose", body))

    async def list(self) -> List[ExposedPort]:
        """The ports exposed now (without tokens)."""
        reply = await self._t.request("ports.list", {"session_id": self.session_id})
        return [ExposedPort.from_wire(p) for p in reply.get("ports", [])]

    async def unexpose(self, port: int) -> None:
        """Stops exposing ``port``: its token stops working."""
        await self._t.request("ports.unexpose", {"session_id": self.session_id, "port": port})


class Ports:
    """A session's preview ports (``s.ports``); mirrors :class:`AsyncPorts`."""

    def __init__(self, sm: Any, inner: AsyncPorts) -> None:
        self._sm = sm
        self.inner = inner

    def expose(self, port: int, *, ttl_ms: Optional[int] = None) -> ExposedPort:
        return self._sm._call(self.inner.expose(port, ttl_ms=ttl_ms))

    def list(self) -> List[ExposedPort]:
        return self._sm._call(self.inner.list())

    def unexpose(self, port: int) -> None:
        self._sm._call(self.inner.unexpose(port))
