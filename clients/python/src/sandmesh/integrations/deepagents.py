"""deepagents' (LangChain's) sandbox backend on a sandmesh session: ``SandmeshSandbox``.

::

    from deepagents import create_deep_agent
    from sandmesh import Sandmesh
    from sandmesh.integrations.deepagents import SandmeshSandbox

    with Sandmesh.from_env() as sm, SandmeshSandbox(sm) as sandbox:
        agent = create_deep_agent(model=..., backend=sandbox)

``execute`` runs the command as a sandmesh ``shell`` run in the session's container (assessed,
audited, and waiting for a person when the policy asks: ``on_awaiting_approval`` hears of it at
once); ``upload_files``/``download_files`` use the session's workspace API for paths under
``/workspace`` and a run for other absolute paths. ``BaseSandbox`` derives ``ls``, ``read``,
``write``, ``edit``, ``grep`` and ``glob`` from them. The session closes with ``close()`` (or
the ``with`` block).
"""

from __future__ import annotations

import base64
import posixpath
import shlex
from typing import Any, List, Optional, Tuple

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from ..errors import BadRequest, Conflict, Denied, NotFound, SandmeshError, Timeout, TooLarge
from ..sync import Sandmesh
from ..types import ExecResult
from ._common import ApprovalNotice, MeshSession, workspace_relative

__all__ = ["SandmeshSandbox"]

#: What a transfer run answers for a path it cannot use (its exit status), in deepagents' words.
_TRANSFER_ERRORS = {3: "file_not_found", 4: "is_directory", 5: "permission_denied"}
#: Mesh errors a model can act on, answered as a command's output; the others (the mesh
#: overloaded or unreachable, the session gone) raise, for the framework's retry and error paths.
_TOLD_TO_THE_MODEL = (Denied, Timeout, BadRequest, TooLarge)
_READ_SCRIPT = (
    'p=$1; [ -e "$p" ] || exit 3; [ -d "$p" ] && exit 4; [ -r "$p" ] || exit 5; base64 < "$p" | tr -d "\\n"'
)
_WRITE_SCRIPT = 'p=$1; [ -d "$p" ] && exit 4; mkdir -p -- "$(dirname -- "$p")" || exit 5; base64 -d > "$p" || exit 5'


class SandmeshSandbox(BaseSandbox):
    """A deepagents ``SandboxBackendProtocol`` on one sandmesh session.

    Args:
        sm: the client.
        session_id: use this session (opened if new, idempotent by id); default a new one.
        on_awaiting_approval: called with the :class:`~sandmesh.Confirmation` when a command
            waits for a person (default: a warning naming it); the command goes on waiting.
        session_options: ``sm.session(...)`` options (``template``, ``env``, ``network``, ...).
    """

    def __init__(
        self,
        sm: Sandmesh,
        session_id: Optional[str] = None,
        *,
        on_awaiting_approval: Optional[ApprovalNotice] = None,
        **session_options: Any,
    ) -> None:
        self._session = MeshSession(
            sm, session_id, on_awaiting_approval=on_awaiting_approval, open_fields=session_options
        )

    @property
    def id(self) -> str:
        self._session.open()
        return str(self._session.session_id)

    def close(self) -> None:
        """Closes the session (its container goes; the workspace stays until its TTL)."""
        self._session.close()

    def __enter__(self) -> "SandmeshSandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # === commands ===

    def execute(self, command: str, *, timeout: Optional[int] = None) -> ExecuteResponse:
        try:
            result = self._session.run(command, "shell", timeout=timeout or None)
        except _TOLD_TO_THE_MODEL as e:
            return _refused(e)
        return _response(result)

    async def aexecute(self, command: str, *, timeout: Optional[int] = None) -> ExecuteResponse:  # noqa: ASYNC109
        try:
            result = await self._session.arun(command, "shell", timeout=timeout or None)
        except _TOLD_TO_THE_MODEL as e:
            return _refused(e)
        return _response(result)

    # === files ===

    def upload_files(self, files: List[Tuple[str, bytes]]) -> List[FileUploadResponse]:
        return [FileUploadResponse(path=path, error=self._upload(path, content)) for path, content in files]

    def _upload(self, path: str, content: bytes) -> Optional[str]:
        if not posixpath.isabs(path):
            return "invalid_path"
        rel = workspace_relative(path)
        if rel is None:  # elsewhere in the container: a run writes it
            return self._transfer(_WRITE_SCRIPT, path, stdin=base64.b64encode(content).decode())[1]
        if rel == "":
            return "is_directory"
        try:
            self._session.files("write", rel, content)
        except (BadRequest, Conflict):
            return "is_directory" if self._is_dir(rel) else "invalid_path"
        except Denied:
            return "permission_denied"
        return None

    def download_files(self, paths: List[str]) -> List[FileDownloadResponse]:
        out = []
        for path in paths:
            content, error = self._download(path)
            out.append(FileDownloadResponse(path=path, content=content, error=error))
        return out

    def _download(self, path: str) -> Tuple[Optional[bytes], Optional[str]]:
        if not posixpath.isabs(path):
            return None, "invalid_path"
        rel = workspace_relative(path)
        if rel is None:
            out, error = self._transfer(_READ_SCRIPT, path)
            return (None, error) if error else (base64.b64decode(out), None)
        if rel == "":
            return None, "is_directory"
        try:
            entry = self._session.files("stat", rel)
            if entry.is_dir:
                return None, "is_directory"
            # The workspace keeps the sandbox's permission bits (always set): a file its owner
            # may not read (chmod 000 in a run) is not handed out by the API either.
            if not entry.mode & 0o400:
                return None, "permission_denied"
            return self._session.files("read", rel), None
        except NotFound:
            return None, "file_not_found"
        except Denied:
            return None, "permission_denied"

    def _is_dir(self, rel: str) -> bool:
        try:
            return bool(self._session.files("stat", rel).is_dir)
        except SandmeshError:
            return False

    def _transfer(self, script: str, path: str, stdin: Optional[str] = None) -> Tuple[str, Optional[str]]:
        try:
            result = self._session.run(f"sh -c {shlex.quote(script)} sh {shlex.quote(path)}", "shell", stdin=stdin)
        except SandmeshError as e:
            return "", "permission_denied" if isinstance(e, Denied) else str(e)
        if result.exit_code == 0:
            return result.stdout, None
        return "", _TRANSFER_ERRORS.get(result.exit_code or 0, result.stderr.strip() or result.status)


def _response(result: ExecResult) -> ExecuteResponse:
    output = result.stdout + result.stderr
    if result.status == "timeout":
        output += f"\n[sandmesh: the command timed out (execution {result.execution_id})]"
    truncated = result.status == "output_limit" or result.stdout_truncated or result.stderr_truncated
    return ExecuteResponse(output=output, exit_code=result.exit_code, truncated=truncated)


def _refused(e: SandmeshError) -> ExecuteResponse:
    """A command the mesh did not run, told to the model the way deepagents tells a failed
    command (it reads the output, there is no exception channel): a person's or the policy's
    refusal, a wait for a person that outlived the caller (with the confirmation to decide)."""
    return ExecuteResponse(output=f"[sandmesh: not run: {e}]", exit_code=None, truncated=False)
