"""Typed errors: one class per error kind of the mesh's wire protocol.

Every service answers an error with the NATS micro headers ``Nats-Service-Error`` /
``Nats-Service-Error-Code`` and a body ``{code, kind, message, details}``. This
module turns such a reply into an exception whose class is the kind, so callers write
``except sandmesh.NotFound:`` instead of comparing codes::

    try:
        sm.run("print(1)", language="cobol")
    except sandmesh.BadRequest as e:
        print(e.code, e.kind, e.message, e.details)

Failures before any service answers have kinds too: nobody serving a subject is
:class:`Unavailable`, no answer within the caller's timeout is :class:`Timeout`, a reply this
client cannot decode is :class:`Internal`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "SandmeshError",
    "BadRequest",
    "Unauthorized",
    "Denied",
    "NotFound",
    "Conflict",
    "TooLarge",
    "Overloaded",
    "Unavailable",
    "Timeout",
    "Internal",
    "NotSupported",
    "error_from_body",
    "error_from_reply",
    "KIND_BY_CODE",
]


class SandmeshError(Exception):
    """Base class of every error this SDK raises.

    Attributes:
        code: the HTTP-like status code (400, 401, 403, 404, 409, 413, 429, 500, 501, 503, 504).
        kind: the wire kind (``bad_request``, ``denied``, ``not_found``, ...).
        message: the service's explanation, meant for people.
        details: structured details the service attached (findings, field names, ...), or None.
        subject: the NATS subject the failed call went to, when there was one.
        result: for an execution the mesh refused or could not finish (status ``denied``,
            ``rejected``, ``executor_lost``, ``internal``), its :class:`~sandmesh.ExecResult`.
    """

    code: int = 500
    kind: str = "internal"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[int] = None,
        kind: Optional[str] = None,
        details: Any = None,
        subject: Optional[str] = None,
        result: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if kind is not None:
            self.kind = kind
        self.details = details
        self.subject = subject
        self.result = result

    def __str__(self) -> str:
        where = f"{self.subject}: " if self.subject else ""
        return f"{where}{self.kind} ({self.code}): {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, kind={self.kind!r}, message={self.message!r})"


class BadRequest(SandmeshError):
    """400: the request was malformed or out of bounds (unknown language, bad path, ...)."""

    code = 400
    kind = "bad_request"


class Unauthorized(SandmeshError):
    """401: no credentials, or ones the mesh does not know (a revoked or mistyped key)."""

    code = 401
    kind = "unauthorized"


class Denied(SandmeshError):
    """403: refused: by a person, by the risk policy, or by permissions."""

    code = 403
    kind = "denied"


class NotFound(SandmeshError):
    """404: no such id (execution, session, file, confirmation), or another tenant's."""

    code = 404
    kind = "not_found"


class Conflict(SandmeshError):
    """409: the request conflicts with the current state (e.g. an upload missing a chunk)."""

    code = 409
    kind = "conflict"


class TooLarge(SandmeshError):
    """413: the request, the code or a file is larger than the mesh accepts."""

    code = 413
    kind = "too_large"


class Overloaded(SandmeshError):
    """429: the service sheds load; try again later.

    Attributes:
        retry_after: seconds the service suggests waiting before retrying, when it said
            (``details.retry_after_ms`` or a ``Retry-After`` header); ``None`` when it gave no
            hint, and then a short backoff (say one second, doubling) is the caller's choice.
    """

    code = 429
    kind = "overloaded"

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(SandmeshError):
    """503: the service (or the executor node that ran the code) is not there."""

    code = 503
    kind = "unavailable"


class Timeout(SandmeshError):
    """504: no answer in time.

    Attributes:
        confirmation_id: when the execution was waiting for a person's approval as the
            caller's time ran out, the confirmation to decide (``sandmesh confirm approve
            <id>``); the execution itself stays parked until it is decided or expires.
        execution_id: the execution that was waited for, when known.
    """

    code = 504
    kind = "timeout"

    def __init__(
        self,
        message: str,
        *,
        confirmation_id: Optional[str] = None,
        execution_id: Optional[str] = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.confirmation_id = confirmation_id
        self.execution_id = execution_id


class Internal(SandmeshError):
    """500: the service failed, or its reply could not be understood."""

    code = 500
    kind = "internal"


class NotSupported(SandmeshError, NotImplementedError):
    """501 (``not_implemented``): the mesh cannot do this here, e.g. background processes on
    the bubblewrap backend. (Not named after the kind: ``NotImplemented`` is Python's own.)"""

    code = 501
    kind = "not_implemented"


_CLASSES: Dict[str, Type[SandmeshError]] = {
    cls.kind: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Denied,
        NotFound,
        Conflict,
        TooLarge,
        Overloaded,
        Unavailable,
        Timeout,
        Internal,
        NotSupported,
    )
}

#: The wire kind of each status code; any other code is ``internal``.
KIND_BY_CODE: Dict[int, str] = {cls.code: kind for kind, cls in _CLASSES.items()}


def _retry_after(details: Any, headers: Optional[Mapping[str, str]]) -> Optional[float]:
    if isinstance(details, dict):
        for key, scale in (("retry_after_ms", 1000.0), ("retry_after", 1.0)):
            value = details.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value) / scale
    if headers:
        value = headers.get("Retry-After")
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None


def error_from_body(
    body: Mapping[str, Any],
    *,
    subject: Optional[str] = None,
    headers: Optional[Mapping[str, str]] = None,
    result: Any = None,
) -> SandmeshError:
    """The exception for an error body ``{code, kind, message, details}``.

    The kind decides the class; a kind this SDK does not know falls back to the code, and an
    unknown code to :class:`Internal`.
    """
    raw_code = body.get("code")
    code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None
    kind = body.get("kind")
    if not isinstance(kind, str) or kind not in _CLASSES:
        kind = KIND_BY_CODE.get(code or 500, "internal")
    cls = _CLASSES[kind]
    message = str(body.get("message") or "service error")
    details = body.get("details")
    kw: Dict[str, Any] = dict(
        code=code if code is not None else cls.code,
        kind=kind,
        details=details,
        subject=subject,
        result=result,
    )
    if cls is Overloaded:
        return Overloaded(message, retry_after=_retry_after(details, headers), **kw)
    return cls(message, **kw)


def error_from_reply(
    headers: Optional[Mapping[str, str]],
    body: Optional[Mapping[str, Any]],
    *,
    subject: Optional[str] = None,
) -> Optional[SandmeshError]:
    """The exception an error reply stands for, or ``None`` when the reply is no error.

    ``headers`` are the reply's NATS headers; ``body`` its decoded payload (``None`` when it
    did not decode). The headers decide whether it is an error at all: a service error is a
    *successful* request carrying ``Nats-Service-Error-Code``. A body that does not decode
    still yields the code and the ``Nats-Service-Error`` text.
    """
    if not headers:
        return None
    raw = headers.get("Nats-Service-Error-Code")
    if raw is None:
        return None
    try:
        code = int(raw)
    except ValueError:
        code = 500
    if isinstance(body, Mapping) and ("kind" in body or "message" in body):
        merged: Dict[str, Any] = dict(body)
        merged.setdefault("code", code)
        return error_from_body(merged, subject=subject, headers=headers)
    message = headers.get("Nats-Service-Error") or "service error"
    return error_from_body(
        {"code": code, "kind": KIND_BY_CODE.get(code, "internal"), "message": message},
        subject=subject,
        headers=headers,
    )
