"""The edge to NATS: where to connect, the codec, and one checked request.

Everything above this module speaks dicts and dataclasses; everything NATS-specific (headers,
encodings, nats-py's exceptions) is translated here into :mod:`sandmesh.errors`.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple
from urllib.parse import unquote, urlsplit

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from .errors import BadRequest, Internal, SandmeshError, Timeout, Unavailable, error_from_reply

try:  # MessagePack is optional: smaller and faster, and binary chunks travel without base64.
    import msgpack as _msgpack
except ImportError:  # pragma: no cover - exercised only without the extra
    _msgpack = None

JSON = "application/json"
MSGPACK = "application/msgpack"
CONTENT_TYPE = "Content-Type"
SERVICE_ERROR_CODE = "Nats-Service-Error-Code"
#: Ask the scheduler to say at once when an execution waits for a person.
NOTIFY_HEADER = "Sandmesh-Notify"
STATUS_HEADER = "Sandmesh-Status"
STATUS_AWAITING_CONFIRMATION = "awaiting-confirmation"
DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_PREFIX = "sandbox"
#: Look-ups, small writes, decisions: answered at once (the Rust client's DEFAULT_TIMEOUT).
DEFAULT_TIMEOUT = 30.0

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id() -> str:
    """A new ULID (26 characters, sortable by time), the mesh's id format."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


# === where to connect ===


@dataclass
class ConnectInfo:
    """Servers and credentials of one mesh, as :func:`connect_info` finds them."""

    servers: List[str]
    user: Optional[str] = None
    password: Optional[str] = None
    prefix: str = DEFAULT_PREFIX


def _split(url: str) -> Tuple[List[str], Optional[str], Optional[str]]:
    """``nats://user:pass@host:port[,nats://…]`` → plain servers and the first credentials."""
    servers: List[str] = []
    user = password = None
    for one in (u.strip() for u in url.split(",")):
        if not one:
            continue
        if "://" not in one:
            one = "nats://" + one
        parts = urlsplit(one)
        if parts.username is not None and user is None:
            user = unquote(parts.username)
            password = unquote(parts.password or "")
        host = parts.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        servers.append(f"{parts.scheme}://{host}{port}")
    return servers or [DEFAULT_URL], user, password


def _creds_file(path: Path) -> Tuple[List[str], str, str]:
    try:
        data = json.loads(path.read_text())
        servers, _, _ = _split(str(data["url"]))
        return servers, str(data["user"]), str(data["password"])
    except (OSError, ValueError, KeyError) as e:
        raise BadRequest(f"{path} is not a sandmesh credentials file: {e}") from None


def connect_info(
    url: Optional[str] = None,
    creds: Optional[str] = None,
    prefix: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> ConnectInfo:
    """Where and as whom to connect, the way the ``sandmesh`` CLI decides it.

    In order: ``creds`` (a credentials file ``sandmesh up`` wrote, e.g.
    ``.sandmesh/creds/agent.json``, or ``SANDMESH_CREDS``); a ``url`` (or
    ``SANDMESH_NATS_URL``) carrying ``user:password@``; the default tenant's agent file in the
    data directory (``SANDMESH_DATA_DIR``, ``.sandmesh``); else the URL as it is.
    """
    env = os.environ if env is None else env
    prefix = prefix or env.get("SANDMESH_PREFIX") or DEFAULT_PREFIX
    creds = creds or env.get("SANDMESH_CREDS") or None
    if creds:
        servers, file_user, file_password = _creds_file(Path(creds))
        if url:  # an address given here wins; the file gives the identity
            servers = _split(url)[0]
        return ConnectInfo(servers, file_user, file_password, prefix)
    url = url or env.get("SANDMESH_NATS_URL") or None
    servers, user, password = _split(url or DEFAULT_URL)
    if user is None:
        agent = Path(env.get("SANDMESH_DATA_DIR") or ".sandmesh") / "creds" / "agent.json"
        if agent.is_file():
            file_servers, user, password = _creds_file(agent)
            if not url:
                servers = file_servers
    return ConnectInfo(servers, user, password, prefix)


async def connect(info: ConnectInfo, name: str = "sandmesh-python") -> NatsClient:
    """A nats-py connection to the mesh, or :class:`Unavailable` saying why not.

    The first connection is tried a bounded number of times (nats-py would otherwise retry a
    refused or unauthorised connect forever); once connected, it reconnects without limit.
    """
    options: Dict[str, Any] = dict(
        servers=info.servers,
        name=name,
        connect_timeout=5,
        allow_reconnect=True,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.5,
    )
    if info.user is not None:
        options.update(user=info.user, password=info.password or "")
    errors: List[Exception] = []

    async def remember(e: Exception) -> None:  # nats-py logs every failed attempt otherwise
        errors.append(e)

    try:
        nc = await nats.connect(error_cb=remember, **options)
    except Exception as e:  # nats-py raises several unrelated types here
        shown = ", ".join(info.servers)
        # An authorisation failure is the most useful thing to say; the server then resets.
        said = [x for x in errors if "authoriz" in repr(x).lower()]
        cause = said[-1] if said else errors[-1] if errors else e
        raise Unavailable(
            f"cannot connect to NATS at {shown} as {info.user or 'nobody'} ({cause!r}); is the "
            "mesh up (`sandmesh up`), and do SANDMESH_NATS_URL / SANDMESH_CREDS name it and its "
            "credentials (`sandmesh creds --url-only`)?"
        ) from e
    nc.options["max_reconnect_attempts"] = -1
    nc.options["reconnect_time_wait"] = 2

    async def quiet(_e: Exception) -> None:
        return None

    nc._error_cb = quiet
    return nc


# === the codec ===


class Codec:
    """JSON or MessagePack with named fields, chosen by ``Content-Type`` (absent: JSON)."""

    def __init__(self, encoding: str = "auto") -> None:
        if encoding == "auto":
            encoding = "msgpack" if _msgpack is not None else "json"
        if encoding not in ("json", "msgpack"):
            raise BadRequest(f"encoding={encoding!r}: json or msgpack")
        if encoding == "msgpack" and _msgpack is None:
            raise BadRequest("encoding='msgpack' needs the msgpack package: pip install msgpack")
        self.name = encoding
        self.content_type = MSGPACK if encoding == "msgpack" else JSON

    @property
    def binary(self) -> bool:
        """Bytes travel as bytes (msgpack ``bin``), not as base64 text."""
        return self.name == "msgpack"

    def encode(self, value: Any) -> bytes:
        if self.name == "msgpack":
            packed: bytes = _msgpack.packb(value, use_bin_type=True)
            return packed
        return json.dumps(value, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes, headers: Optional[Mapping[str, str]]) -> Any:
        kind = (headers or {}).get(CONTENT_TYPE, JSON).split(";")[0].strip().lower()
        if kind in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
            if _msgpack is None:
                raise Internal("a MessagePack reply, and msgpack is not installed")
            # The mesh keys some maps by number (a session's exposed ports): integer keys are
            # valid MessagePack, which msgpack refuses unless told.
            return _msgpack.unpackb(data, raw=False, strict_map_key=False)
        return json.loads(data) if data else None


def drop_none(value: Mapping[str, Any]) -> Dict[str, Any]:
    """The request without its unset optional fields (the wire omits them)."""
    return {k: v for k, v in value.items() if v is not None}


def decode_reply(codec: Codec, subject: str, headers: Optional[Mapping[str, str]], data: bytes) -> Any:
    """A reply's body, or the typed error its micro error headers stand for."""
    try:
        body = codec.decode(data, headers)
    except Exception as e:
        body = None
        if not (headers and SERVICE_ERROR_CODE in headers):
            raise Internal(f"an undecodable reply ({e})", subject=subject) from e
    error = error_from_reply(headers, body, subject=subject)
    if error is not None:
        raise error
    return body


def translate(e: BaseException, subject: str, timeout: float) -> SandmeshError:
    """nats-py's failure of a request to ``subject`` as a typed error."""
    if isinstance(e, nats.errors.NoRespondersError):
        return Unavailable(f"no service answers on {subject} (is the mesh up?)", subject=subject)
    if isinstance(e, (nats.errors.TimeoutError, TimeoutError)):
        return Timeout(f"no answer within {timeout:g} s", subject=subject)
    if isinstance(e, nats.errors.MaxPayloadError):
        from .errors import TooLarge

        return TooLarge(f"the request is larger than the server's max payload ({e})", subject=subject)
    return Unavailable(f"the NATS connection failed: {e!r}", subject=subject)


class Transport:
    """One connection, the mesh's subjects and the codec: what every part of the SDK shares."""

    def __init__(self, nc: NatsClient, prefix: str, codec: Codec, timeout: float, run_timeout: float = 600.0) -> None:
        self.nc = nc
        self.prefix = prefix
        self.codec = codec
        self.timeout = timeout
        #: How long an execution's result is waited for unless a call says otherwise.
        self.run_timeout = run_timeout
        self._mux_prefix: Optional[str] = None
        self._mux_lock: Optional[asyncio.Lock] = None
        self._waiters: Dict[str, Callable[[Any], None]] = {}

    async def reply_inbox(self, deliver: Callable[[Any], None]) -> Tuple[str, Callable[[], None]]:
        """A reply subject of this connection whose messages go to ``deliver``, and the function
        that forgets it. One wildcard subscription serves every call (as nats-py's own
        ``request`` does), so a call costs no SUB/UNSUB of its own; unlike ``request`` it
        delivers every message, for replies preceded by a notice."""
        if self._mux_prefix is None:
            if self._mux_lock is None:
                self._mux_lock = asyncio.Lock()
            async with self._mux_lock:
                if self._mux_prefix is None:
                    prefix = self.nc.new_inbox()

                    async def route(msg: Any) -> None:
                        handler = self._waiters.get(msg.subject.rsplit(".", 1)[-1])
                        if handler is not None:
                            handler(msg)

                    await self.nc.subscribe(prefix + ".*", cb=route)
                    self._mux_prefix = prefix
        token = new_id()
        self._waiters[token] = deliver

        def forget() -> None:
            self._waiters.pop(token, None)

        return f"{self._mux_prefix}.{token}", forget

    def subject(self, rest: str) -> str:
        """``<prefix>.v1.<rest>``."""
        return f"{self.prefix}.v1.{rest}"

    def headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        headers = {CONTENT_TYPE: self.codec.content_type}
        if extra:
            headers.update(extra)
        return headers

    async def request(self, rest: str, body: Mapping[str, Any], timeout: Optional[float] = None) -> Any:
        """A checked request on ``<prefix>.v1.<rest>``: the decoded reply, or a typed error."""
        subject = self.subject(rest)
        wait = self.timeout if timeout is None else timeout
        payload = self.codec.encode(drop_none(body))
        try:
            msg = await self.nc.request(subject, payload, timeout=wait, headers=self.headers())
        except Exception as e:
            raise translate(e, subject, wait) from e
        return decode_reply(self.codec, subject, msg.headers, msg.data)
