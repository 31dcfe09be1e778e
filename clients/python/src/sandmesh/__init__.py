"""sandmesh: run untrusted code for AI agents on a sandmesh mesh, over NATS.

Five lines::

    from sandmesh import Sandmesh

    with Sandmesh.from_env() as sm:          # SANDMESH_NATS_URL="$(sandmesh creds --url-only)"
        result = sm.run("print(6*7)")
        print(result.stdout)                 # 42

:class:`Sandmesh` blocks; :class:`AsyncSandmesh` has the same shape for asyncio. Both speak
the mesh's own protocol (request-reply and JetStream on ``sandbox.v1.*``, JSON
or MessagePack) with a tenant's credentials, so the mesh enforces every boundary: this
package decides nothing a service would not decide for a plain NATS request.
"""

from ._exec import AsyncJob
from ._files import AsyncFiles
from ._ports import AsyncPorts, ExposedPort, Ports
from ._processes import AsyncProcesses, Process, Processes
from ._browser import AsyncAio, AsyncBrowser
from ._audit import AsyncAudit, AsyncAuditFollow
from ._transport import new_id
from .client import AsyncSandmesh, AsyncSession
from .errors import (
    BadRequest,
    Conflict,
    Denied,
    Internal,
    NotFound,
    NotSupported,
    Overloaded,
    SandmeshError,
    Timeout,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from .sync import Aio, Audit, AuditFollow, Browser, Files, Job, Sandmesh, Session
from .types import (
    AioExecResult,
    AioLease,
    AioReleased,
    AioStats,
    AuditEvent,
    BrowserElement,
    CellError,
    BrowserResult,
    Confirmation,
    ConfirmationOutcome,
    ExecResult,
    FileEntry,
    Finding,
    OutputChunk,
    RefusedFile,
    RichOutput,
    RiskAssessment,
    SessionInfo,
    TestCase,
    TestReport,
    Timing,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "Sandmesh",
    "Session",
    "Files",
    "Browser",
    "Aio",
    "Audit",
    "AuditFollow",
    "Job",
    "AsyncSandmesh",
    "AsyncSession",
    "AsyncFiles",
    "AsyncPorts",
    "AsyncProcesses",
    "Process",
    "Processes",
    "ExposedPort",
    "Ports",
    "AsyncBrowser",
    "AsyncAio",
    "AsyncAudit",
    "AsyncAuditFollow",
    "AsyncJob",
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
    "ExecResult",
    "TestReport",
    "TestCase",
    "RichOutput",
    "CellError",
    "RefusedFile",
    "RiskAssessment",
    "Finding",
    "ConfirmationOutcome",
    "Confirmation",
    "Timing",
    "Usage",
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
    "new_id",
]
