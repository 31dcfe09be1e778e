"""The mesh's wire types as dataclasses (the ``messages`` crate is the source of truth).

Each type is built from a decoded reply with ``from_wire``, which ignores fields it does not
know (the protocol adds fields; it never renames them) and keeps the whole decoded reply in
``raw`` for anything newer than this SDK.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = [
    "Finding",
    "RiskAssessment",
    "ConfirmationOutcome",
    "Timing",
    "Usage",
    "ExecResult",
    "TestCase",
    "TestReport",
    "RichOutput",
    "CellError",
    "RefusedFile",
    "Confirmation",
    "OutputChunk",
    "FileEntry",
    "SessionInfo",
    "BrowserElement",
    "BrowserResult",
    "AioLease",
    "AioExecResult",
    "AioReleased",
    "AioStats",
    "AuditEvent",
    "RAN_STATUSES",
]

#: Statuses of an execution whose program ran (its exit status, output and files are real).
#: The others (``denied``, ``rejected``, ``executor_lost``, ``unavailable``, ``internal``) are raised as errors
#: by ``run`` and ``Job.result`` unless ``check=False``.
RAN_STATUSES = frozenset({"ok", "error", "timeout", "oom", "output_limit", "killed"})


def _str(d: Mapping[str, Any], key: str, default: str = "") -> str:
    value = d.get(key)
    return value if isinstance(value, str) else default


def _opt_str(d: Mapping[str, Any], key: str) -> Optional[str]:
    value = d.get(key)
    return value if isinstance(value, str) else None


def _int(d: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = d.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _opt_int(d: Mapping[str, Any], key: str) -> Optional[int]:
    value = d.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(d: Mapping[str, Any], key: str) -> bool:
    return bool(d.get(key, False))


def _strs(d: Mapping[str, Any], key: str) -> List[str]:
    value = d.get(key)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _map(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = d.get(key)
    return value if isinstance(value, Mapping) else {}


@dataclass
class Finding:
    """One rule the risk assessor matched, with its place in the source when it has one."""

    rule: str
    severity: str
    description: str
    line: Optional[int] = None
    start: Optional[int] = None
    end: Optional[int] = None
    #: The request's file the finding is in (`line`/`start`/`end` are then into that file);
    #: None: in the code itself.
    path: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "Finding":
        return cls(
            rule=_str(d, "rule"),
            severity=_str(d, "severity", "safe"),
            description=_str(d, "description"),
            line=_opt_int(d, "line"),
            start=_opt_int(d, "start"),
            end=_opt_int(d, "end"),
            path=_opt_str(d, "path"),
        )


@dataclass
class RiskAssessment:
    """The risk assessor's verdict: advisory (the container is the boundary).

    ``level`` is one of ``safe, low, medium, high, critical``; ``suggested_tier`` one of
    ``ephemeral, session, aio, reject``.
    """

    level: str = "safe"
    reason: str = ""
    requires_confirmation: bool = False
    requires_isolation: bool = False
    suggested_tier: str = "ephemeral"
    findings: List[Finding] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "RiskAssessment":
        findings = d.get("findings")
        return cls(
            level=_str(d, "level", "safe"),
            reason=_str(d, "reason"),
            requires_confirmation=_bool(d, "requires_confirmation"),
            requires_isolation=_bool(d, "requires_isolation"),
            suggested_tier=_str(d, "suggested_tier", "ephemeral"),
            findings=[Finding.from_wire(f) for f in findings if isinstance(f, Mapping)]
            if isinstance(findings, list)
            else [],
            raw=dict(d),
        )


@dataclass
class ConfirmationOutcome:
    """Whether a person had to decide: ``not_required``, ``approved``, ``denied``, ``timeout``."""

    decision: str = "not_required"
    by: Optional[str] = None
    reason: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "ConfirmationOutcome":
        return cls(
            decision=_str(d, "decision", "not_required"),
            by=_opt_str(d, "by"),
            reason=_opt_str(d, "reason"),
        )


@dataclass
class Timing:
    """Where an execution's time went, in milliseconds."""

    queued_ms: int = 0
    assess_ms: int = 0
    confirm_ms: int = 0
    exec_ms: int = 0
    total_ms: int = 0

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "Timing":
        return cls(**{k: _int(d, k) for k in ("queued_ms", "assess_ms", "confirm_ms", "exec_ms", "total_ms")})


@dataclass
class Usage:
    """Resources an execution used."""

    peak_memory_bytes: int = 0
    cpu_ms: int = 0

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "Usage":
        return cls(peak_memory_bytes=_int(d, "peak_memory_bytes"), cpu_ms=_int(d, "cpu_ms"))


@dataclass
class RichOutput:
    """A kernel cell's typed output: ``mime_type`` is ``text/plain``, ``text/html``,
    ``image/png`` or ``application/json``; ``kind`` is ``result`` (the last expression's
    value) or ``display`` (``display(...)``, a matplotlib figure). Small outputs are inline in
    ``content`` (base64 when ``encoding`` says so); large ones are workspace files at ``path``
    (under ``artifacts/``, read them with ``session.files``).
    """

    kind: str
    mime_type: str
    content: Optional[str] = None
    encoding: str = "utf8"
    path: Optional[str] = None

    @property
    def data(self) -> Optional[bytes]:
        """The inline content as bytes (decoded from base64 for binary types)."""
        if self.content is None:
            return None
        if self.encoding == "base64":
            return base64.b64decode(self.content)
        return self.content.encode()

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "RichOutput":
        return cls(
            kind=_str(d, "kind", "result"),
            mime_type=_str(d, "mime_type"),
            content=_opt_str(d, "content"),
            encoding=_str(d, "encoding", "utf8"),
            path=_opt_str(d, "path"),
        )


@dataclass
class CellError:
    """The exception a kernel cell raised."""

    name: str
    value: str
    traceback: List[str] = field(default_factory=list)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "CellError":
        return cls(name=_str(d, "name"), value=_str(d, "value"), traceback=_strs(d, "traceback"))


@dataclass
class RefusedFile:
    """A file a run created or changed that its session's workspace did not take, and why: a
    name no workspace path may have (a newline, a backslash, an encoded ``..``), or past the
    total size one run saves. ``path`` is the name as the run made it: show it escaped."""

    path: str
    reason: str

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "RefusedFile":
        return cls(path=_str(d, "path"), reason=_str(d, "reason"))


@dataclass
class ExecResult:
    """The result of one execution (``ExecResult`` on the wire).

    ``status`` is one of ``ok`` (exit 0), ``error`` (non-zero exit), ``timeout``, ``oom``,
    ``output_limit``, ``killed``, ``rejected``, ``denied``, ``executor_lost``, ``unavailable``
    (an async job no executor ran within its queue time), ``internal``.
    ``tier`` says where it ran: ``ephemeral``, ``session``, ``aio`` or ``reject``.
    ``files_refused`` names the files the run made that its workspace did not take (every
    other change was saved); ``files_omitted`` counts changes past the most one run saves
    (``error`` then names the limit).
    """

    execution_id: str
    status: str
    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    tier: str = "ephemeral"
    session_id: Optional[str] = None
    node: Optional[str] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    risk: RiskAssessment = field(default_factory=RiskAssessment)
    confirmation: ConfirmationOutcome = field(default_factory=ConfirmationOutcome)
    files_created: List[str] = field(default_factory=list)
    files_modified: List[str] = field(default_factory=list)
    files_refused: List[RefusedFile] = field(default_factory=list)
    files_omitted: int = 0
    usage: Optional[Usage] = None
    timing: Timing = field(default_factory=Timing)
    session_restored: bool = False
    network: Optional[Dict[str, Any]] = None
    outputs: List[RichOutput] = field(default_factory=list)
    cell_error: Optional[CellError] = None
    state_lost: bool = False
    error: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """The program ran and exited 0."""
        return self.status == "ok"

    @property
    def ran(self) -> bool:
        """The program ran (whatever its exit): its output and files are real."""
        return self.status in RAN_STATUSES

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "ExecResult":
        usage = d.get("usage")
        network = d.get("network")
        error = d.get("error")
        outputs = d.get("outputs")
        cell_error = d.get("cell_error")
        refused = d.get("files_refused")
        return cls(
            execution_id=_str(d, "execution_id"),
            status=_str(d, "status", "internal"),
            stdout=_str(d, "stdout"),
            stderr=_str(d, "stderr"),
            exit_code=_opt_int(d, "exit_code"),
            tier=_str(d, "tier", "ephemeral"),
            session_id=_opt_str(d, "session_id"),
            node=_opt_str(d, "node"),
            stdout_truncated=_bool(d, "stdout_truncated"),
            stderr_truncated=_bool(d, "stderr_truncated"),
            risk=RiskAssessment.from_wire(_map(d, "risk")),
            confirmation=ConfirmationOutcome.from_wire(_map(d, "confirmation")),
            files_created=_strs(d, "files_created"),
            files_modified=_strs(d, "files_modified"),
            files_refused=[RefusedFile.from_wire(f) for f in refused if isinstance(f, Mapping)]
            if isinstance(refused, list)
            else [],
            files_omitted=_int(d, "files_omitted"),
            usage=Usage.from_wire(usage) if isinstance(usage, Mapping) else None,
            timing=Timing.from_wire(_map(d, "timing")),
            session_restored=_bool(d, "session_restored"),
            network=dict(network) if isinstance(network, Mapping) else None,
            outputs=[RichOutput.from_wire(o) for o in outputs if isinstance(o, Mapping)]
            if isinstance(outputs, list)
            else [],
            cell_error=CellError.from_wire(cell_error) if isinstance(cell_error, Mapping) else None,
            state_lost=_bool(d, "state_lost"),
            error=dict(error) if isinstance(error, Mapping) else None,
            raw=dict(d),
        )


@dataclass
class TestCase:
    """One test's outcome in a :class:`TestReport`: ``status`` is ``passed``, ``failed`` (an
    assertion in the test), ``error`` (something around it broke: a fixture, a hook) or
    ``skipped``."""

    name: str
    status: str
    classname: Optional[str] = None
    duration_ms: int = 0
    message: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "TestCase":
        return cls(
            name=_str(d, "name"),
            status=_str(d, "status", "error"),
            classname=_opt_str(d, "classname"),
            duration_ms=_int(d, "duration_ms"),
            message=_opt_str(d, "message"),
        )


@dataclass
class TestReport:
    """What a test run answered (``TestReport`` on the wire): per-test results read from the
    JUnit report the run left in its workspace (never from its stdout).

    ``status`` is ``passed`` (every test passed), ``failed`` (one failed or errored), ``error``
    (no usable report: ``error`` says why), ``timeout`` (``tests`` holds those that finished),
    ``rejected`` or ``denied``. ``totals`` counts ``passed``, ``failed``, ``errors`` and
    ``skipped``; ``exec_status``, ``stdout`` and ``stderr`` are the underlying execution's.
    """

    __test__ = False  # not a pytest class, whatever its name

    execution_id: str
    status: str
    tests: List[TestCase] = field(default_factory=list)
    totals: Dict[str, int] = field(default_factory=dict)
    error: Optional[Dict[str, Any]] = None
    exec_status: str = "internal"
    exit_code: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    session_id: Optional[str] = None
    template: Optional[Dict[str, Any]] = None
    risk: RiskAssessment = field(default_factory=RiskAssessment)
    confirmation: ConfirmationOutcome = field(default_factory=ConfirmationOutcome)
    timing: Timing = field(default_factory=Timing)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """Every test passed."""
        return self.status == "passed"

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "TestReport":
        tests = d.get("tests")
        error = d.get("error")
        template = d.get("template")
        totals = _map(d, "totals")
        return cls(
            execution_id=_str(d, "execution_id"),
            status=_str(d, "status", "error"),
            tests=[TestCase.from_wire(t) for t in tests if isinstance(t, Mapping)]
            if isinstance(tests, list)
            else [],
            totals={k: _int(totals, k) for k in ("passed", "failed", "errors", "skipped")},
            error=dict(error) if isinstance(error, Mapping) else None,
            exec_status=_str(d, "exec_status", "internal"),
            exit_code=_opt_int(d, "exit_code"),
            stdout=_str(d, "stdout"),
            stderr=_str(d, "stderr"),
            session_id=_opt_str(d, "session_id"),
            template=dict(template) if isinstance(template, Mapping) else None,
            risk=RiskAssessment.from_wire(_map(d, "risk")),
            confirmation=ConfirmationOutcome.from_wire(_map(d, "confirmation")),
            timing=Timing.from_wire(_map(d, "timing")),
            raw=dict(d),
        )


@dataclass
class Confirmation:
    """An execution parked until a person decides (the ``Sandmesh-Notify`` notice).

    An operator decides with ``sandmesh confirm approve <confirmation_id>`` (or ``deny``), or
    on the console; ``expires_at`` is Unix milliseconds, after which it counts as denied.
    """

    execution_id: str
    confirmation_id: str
    expires_at: int

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "Confirmation":
        return cls(
            execution_id=_str(d, "execution_id"),
            confirmation_id=_str(d, "confirmation_id"),
            expires_at=_int(d, "expires_at"),
        )


@dataclass
class OutputChunk:
    """One piece of an execution's live output (``seq`` counts from 0 without gaps)."""

    seq: int
    stream: str
    data: str
    eof: bool = False

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "OutputChunk":
        return cls(
            seq=_int(d, "seq"),
            stream=_str(d, "stream", "stdout"),
            data=_str(d, "data"),
            eof=_bool(d, "eof"),
        )


@dataclass
class FileEntry:
    """A file or directory of a session's workspace (``modified`` in Unix milliseconds)."""

    path: str
    size: int = 0
    is_dir: bool = False
    modified: int = 0
    mode: int = 0
    sha256: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "FileEntry":
        return cls(
            path=_str(d, "path"),
            size=_int(d, "size"),
            is_dir=_bool(d, "is_dir"),
            modified=_int(d, "modified"),
            mode=_int(d, "mode"),
            sha256=_opt_str(d, "sha256"),
        )


@dataclass
class SessionInfo:
    """A session's record: ``state`` is ``open``, ``active``, ``lost`` or ``closed``;
    ``close_reason`` (``requested``, ``ttl``, ``idle``) says why a closed one closed."""

    session_id: str
    state: str = "open"
    tier: str = "session"
    node: Optional[str] = None
    created_at: int = 0
    last_used_at: int = 0
    executions: int = 0
    template: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    timeout_ms: Optional[int] = None
    expires_at: Optional[int] = None
    idle_ms: Optional[int] = None
    closed_at: Optional[int] = None
    close_reason: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "SessionInfo":
        env = d.get("env")
        return cls(
            session_id=_str(d, "session_id"),
            state=_str(d, "state", "open"),
            tier=_str(d, "tier", "session"),
            node=_opt_str(d, "node"),
            created_at=_int(d, "created_at"),
            last_used_at=_int(d, "last_used_at"),
            executions=_int(d, "executions"),
            template=_opt_str(d, "template"),
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, Mapping) else {},
            timeout_ms=_opt_int(d, "timeout_ms"),
            expires_at=_opt_int(d, "expires_at"),
            idle_ms=_opt_int(d, "idle_ms"),
            closed_at=_opt_int(d, "closed_at"),
            close_reason=_opt_str(d, "close_reason"),
            raw=dict(d),
        )


@dataclass
class BrowserElement:
    """An interactive element of the page; ``index`` is what ``click``/``fill`` take."""

    index: int
    tag: str
    role: str
    name: str = ""
    input_type: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "BrowserElement":
        return cls(
            index=_int(d, "index"),
            tag=_str(d, "tag"),
            role=_str(d, "role"),
            name=_str(d, "name"),
            input_type=_opt_str(d, "input_type"),
        )


@dataclass
class BrowserResult:
    """The reply to one browser action: the page's URL and title, and what the action gave."""

    ok: bool
    url: Optional[str] = None
    title: Optional[str] = None
    content: Optional[str] = None
    value: Any = None
    elements: List[BrowserElement] = field(default_factory=list)
    screenshot_path: Optional[str] = None
    screenshot_base64: Optional[str] = None
    backend: str = "external"
    state_lost: bool = False
    risk_level: Optional[str] = None
    confirmation: Optional[str] = None
    confirmation_id: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def screenshot(self) -> Optional[bytes]:
        """The screenshot's PNG bytes, when it came inline."""
        if self.screenshot_base64 is None:
            return None
        return base64.b64decode(self.screenshot_base64)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "BrowserResult":
        elements = d.get("elements")
        return cls(
            ok=_bool(d, "ok"),
            url=_opt_str(d, "url"),
            title=_opt_str(d, "title"),
            content=_opt_str(d, "content"),
            value=d.get("value"),
            elements=[BrowserElement.from_wire(e) for e in elements if isinstance(e, Mapping)]
            if isinstance(elements, list)
            else [],
            screenshot_path=_opt_str(d, "screenshot_path"),
            screenshot_base64=_opt_str(d, "screenshot_base64"),
            backend=_str(d, "backend", "external"),
            state_lost=_bool(d, "state_lost"),
            risk_level=_opt_str(d, "risk_level"),
            confirmation=_opt_str(d, "confirmation"),
            confirmation_id=_opt_str(d, "confirmation_id"),
            raw=dict(d),
        )


@dataclass
class AioLease:
    """The AIO sandbox instance bound to a session."""

    session_id: str
    instance_id: str
    base_url: str
    cdp_url: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "AioLease":
        return cls(
            session_id=_str(d, "session_id"),
            instance_id=_str(d, "instance_id"),
            base_url=_str(d, "base_url"),
            cdp_url=_opt_str(d, "cdp_url"),
        )


@dataclass
class AioExecResult:
    """A shell command's outcome in the session's AIO instance."""

    session_id: str
    instance_id: str
    status: str
    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    exec_ms: int = 0
    retired: bool = False

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "AioExecResult":
        return cls(
            session_id=_str(d, "session_id"),
            instance_id=_str(d, "instance_id"),
            status=_str(d, "status"),
            stdout=_str(d, "stdout"),
            stderr=_str(d, "stderr"),
            exit_code=_opt_int(d, "exit_code"),
            exec_ms=_int(d, "exec_ms"),
            retired=_bool(d, "retired"),
        )


@dataclass
class AioReleased:
    """The instance a release destroyed."""

    session_id: str
    instance_id: str

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "AioReleased":
        return cls(session_id=_str(d, "session_id"), instance_id=_str(d, "instance_id"))


@dataclass
class AioStats:
    """The aio-pool's instances by state."""

    total: int = 0
    warm: int = 0
    bound: int = 0
    max: int = 0
    creating: int = 0
    retiring: int = 0
    waiting: int = 0
    min: int = 0

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "AioStats":
        return cls(
            **{
                k: _int(d, k)
                for k in ("total", "warm", "bound", "max", "creating", "retiring", "waiting", "min")
            }
        )


def _unscoped(tenant: Optional[str], id: Optional[str]) -> Optional[str]:
    """An id as its tenant knows it (``messages::tenancy::unscoped``)."""
    if id is None or not tenant or not id.startswith(tenant + "-"):
        return id
    return id[len(tenant) + 1 :]


@dataclass
class AuditEvent:
    """One audit event (``kind``: ``request_received``, ``finished``, ``file_written``, ...).

    ``account`` and ``user`` are the authenticated caller, stamped by the mesh. The mesh stores
    ids scoped by tenant (``default`` + ``s1`` → ``default-s1``); ``execution_id`` and
    ``session_id`` here are as the tenant named them.
    """

    id: str
    kind: str
    time: int
    source: str
    execution_id: Optional[str] = None
    session_id: Optional[str] = None
    trace_id: Optional[str] = None
    actor: Optional[str] = None
    tenant: Optional[str] = None
    account: Optional[str] = None
    user: Optional[str] = None
    details: Any = None
    subject: str = ""

    @classmethod
    def from_wire(cls, d: Mapping[str, Any], subject: str = "") -> "AuditEvent":
        tenant = _opt_str(d, "tenant")
        return cls(
            id=_str(d, "id"),
            kind=_str(d, "kind"),
            time=_int(d, "time"),
            source=_str(d, "source"),
            execution_id=_unscoped(tenant, _opt_str(d, "execution_id")),
            session_id=_unscoped(tenant, _opt_str(d, "session_id")),
            trace_id=_opt_str(d, "trace_id"),
            actor=_opt_str(d, "actor"),
            tenant=_opt_str(d, "tenant"),
            account=_opt_str(d, "account"),
            user=_opt_str(d, "user"),
            details=d.get("details"),
            subject=subject,
        )
