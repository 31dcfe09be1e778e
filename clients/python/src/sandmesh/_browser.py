"""A session's browser (browser-router): one headless Chromium per session, one action a call.

Every action is risk assessed; fills of password or payment fields and ``evaluate`` wait for a
person, so an action may take as long as that decision (the router's default is 120 s). The
router says so at once, as the scheduler does for code: ``on_awaiting_approval`` is called with
the :class:`Confirmation` to approve while the call goes on waiting.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from ._exec import ApprovalCallback, notified_request
from ._transport import Transport
from .types import AioExecResult, AioLease, AioReleased, AioStats, BrowserElement, BrowserResult

#: An action may wait for a person's decision; the router's confirmation timeout is 120 s.
BROWSER_TIMEOUT = 180.0
#: How much longer than a command's own timeout ``aio.exec`` is waited for.
AIO_EXEC_MARGIN = 15.0

Target = Union[int, str]


def _target(target: Target) -> Dict[str, Any]:
    """An element by its ``elements()`` index (int) or a CSS selector (str)."""
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise TypeError("an element is an index from elements() (int) or a CSS selector (str)")
    return {"index": target} if isinstance(target, int) else {"selector": target}


class AsyncBrowser:
    """The session's browser (``s.browser``); started by the first action."""

    def __init__(self, transport: Transport, session_id: str) -> None:
        self._t = transport
        self.session_id = session_id

    async def act(
        self,
        action: str,
        *,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
        **params: Any,
    ) -> BrowserResult:
        """Any action of ``sandbox.v1.browser.<action>`` (``back``, ``type``, ``press_key``,
        ``scroll``, ``wait_for``, ``evaluate``, ``close``, ...) with its request fields. When a
        person must approve it, ``on_awaiting_approval`` hears of it at once; a denial raises
        :class:`Denied`, no answer within ``request_timeout`` (default 180 s) :class:`Timeout`
        naming the confirmation it waits for."""
        body = dict(params, session_id=self.session_id)
        timeout = request_timeout or max(self._t.timeout, BROWSER_TIMEOUT)
        reply = await notified_request(
            self._t, f"browser.{action}", body, timeout, on_awaiting_approval, resumable=False
        )
        return BrowserResult.from_wire(reply)

    async def navigate(self, url: str, *, on_awaiting_approval: Optional[ApprovalCallback] = None) -> BrowserResult:
        """Opens ``url`` (http/https only; the network policy applies)."""
        return await self.act("navigate", url=url, on_awaiting_approval=on_awaiting_approval)

    async def elements(self) -> List[BrowserElement]:
        """The page's interactive elements, each with the index ``click``/``fill`` take."""
        return (await self.act("elements")).elements

    async def click(self, target: Target, *, on_awaiting_approval: Optional[ApprovalCallback] = None) -> BrowserResult:
        """Clicks an element: its index from :meth:`elements` or a CSS selector."""
        return await self.act("click", on_awaiting_approval=on_awaiting_approval, **_target(target))

    async def fill(
        self,
        target: Target,
        text: str,
        *,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
    ) -> BrowserResult:
        """Fills an input (index or selector) with ``text``; a password or payment field waits
        for a person (``on_awaiting_approval`` hears of it at once)."""
        return await self.act(
            "fill",
            text=text,
            on_awaiting_approval=on_awaiting_approval,
            request_timeout=request_timeout,
            **_target(target),
        )

    async def screenshot(self, *, full_page: bool = False) -> BrowserResult:
        """A PNG of the page: ``.screenshot`` holds its bytes, ``.screenshot_path`` the copy
        in the workspace (``artifacts/``)."""
        return await self.act("screenshot", full_page=full_page, inline=True)

    async def content(self, format: str = "text") -> str:
        """The page's text (``format="text"``) or HTML (``"html"``)."""
        return (await self.act("content", format=format)).content or ""

    async def close(self) -> BrowserResult:
        """Closes the session's browser (a new one starts on the next action)."""
        return await self.act("close")


class AsyncAio:
    """The session's AIO sandbox instance (``s.aio``, aio-pool): bound on acquire, destroyed on
    release, never handed to another session."""

    def __init__(self, transport: Transport, session_id: str) -> None:
        self._t = transport
        self.session_id = session_id

    async def acquire(self, *, browser: bool = False) -> AioLease:
        """The session's instance, bound now if it had none (may wait for capacity, then 429)."""
        body = {"session_id": self.session_id, "browser": browser}
        return AioLease.from_wire(await self._t.request("aio.acquire", body))

    async def exec(
        self,
        command: str,
        *,
        timeout: Optional[float] = None,
        on_awaiting_approval: Optional[ApprovalCallback] = None,
        request_timeout: Optional[float] = None,
    ) -> AioExecResult:
        """Runs a shell command in the session's instance. It is assessed as shell code and,
        when risky, waits for a person like :meth:`AsyncSandmesh.run` (the callback hears of
        it at once; a denial raises :class:`Denied`). ``timeout``: the command's own limit in
        seconds; ``request_timeout``: how long to wait in all (default: the command's limit
        plus 15 s, at least the client's timeout)."""
        body = {
            "session_id": self.session_id,
            "command": command,
            "timeout_ms": None if timeout is None else int(timeout * 1000),
        }
        wait = request_timeout or max(self._t.timeout, (timeout or 0.0) + AIO_EXEC_MARGIN)
        reply = await notified_request(self._t, "aio.exec", body, wait, on_awaiting_approval)
        return AioExecResult.from_wire(reply)

    async def release(self) -> AioReleased:
        """Destroys the session's instance."""
        return AioReleased.from_wire(await self._t.request("aio.release", {"session_id": self.session_id}))

    async def stats(self) -> AioStats:
        """The pool's instances by state."""
        return AioStats.from_wire(await self._t.request("aio.stats", {}))
