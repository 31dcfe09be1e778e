"""smolagents' Python executor on a sandmesh session's kernel: ``SandmeshExecutor``.

::

    from smolagents import CodeAgent
    from sandmesh import Sandmesh
    from sandmesh.integrations.smolagents import SandmeshExecutor

    sm = Sandmesh.from_env()
    agent = CodeAgent(tools=[], model=..., executor=SandmeshExecutor(sm, template="python-data"))

Each code action is a cell of the session's Python kernel (``kernel=True`` runs): variables,
imports and the tools ``send_tools`` defined stay between cells, the last expression's value
comes back as the output, a PNG (a matplotlib figure, a ``PIL`` image) as a ``PIL.Image`` the
way smolagents' other remote executors return images, and ``final_answer(...)`` ends the run
through the framework's own ``FinalAnswerException``. Cells are assessed and audited like any
run: one that waits for a person calls ``on_awaiting_approval`` at once and goes on waiting;
one a person denies raises ``AgentError`` naming the refusal.
"""

from __future__ import annotations

import shlex
from io import BytesIO
from typing import Any, List, Optional

import PIL.Image
from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from ..errors import SandmeshError
from ..sync import Sandmesh
from ..types import ExecResult, RichOutput
from ._common import ApprovalNotice, MeshSession

__all__ = ["SandmeshExecutor"]

_IMAGE_TYPES = ("image/png", "image/jpeg")
#: Packages whose import name is not their distribution's.
_MODULES = {"pillow": "PIL", "scikit-learn": "sklearn", "beautifulsoup4": "bs4", "pyyaml": "yaml"}


def _module_of(package: str) -> str:
    name = package.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()
    return _MODULES.get(name, name.replace("-", "_"))


class SandmeshExecutor(RemotePythonExecutor):
    """A smolagents ``RemotePythonExecutor`` whose cells run in a sandmesh session's kernel.

    Args:
        sm: the client.
        logger: a smolagents ``AgentLogger`` for the executor's messages (default: its own).
        additional_imports: packages to ``pip install`` into the session first (needs egress to
            a package index in the session's ``network`` policy).
        session_id: use this session (opened if new); default a new one.
        on_awaiting_approval: called with the :class:`~sandmesh.Confirmation` when a cell waits
            for a person (default: a warning naming it); the cell goes on waiting.
        allow_pickle: as smolagents' remote executors (``False``: JSON-safe values only).
        session_options: ``sm.session(...)`` options (``template="python-data"`` for numpy,
            pandas and matplotlib; ``network``, ``env``, ...).
    """

    def __init__(
        self,
        sm: Sandmesh,
        logger: Any = None,
        additional_imports: Optional[List[str]] = None,
        *,
        session_id: Optional[str] = None,
        on_awaiting_approval: Optional[ApprovalNotice] = None,
        allow_pickle: bool = False,
        **session_options: Any,
    ) -> None:
        super().__init__(list(additional_imports or []), logger or AgentLogger(), allow_pickle)
        self._session = MeshSession(
            sm, session_id, on_awaiting_approval=on_awaiting_approval, open_fields=session_options
        )
        self.installed_packages = self.install_packages(self.additional_imports)

    @property
    def session_id(self) -> Optional[str]:
        return self._session.session_id

    def _cell(self, code: str) -> ExecResult:
        try:
            return self._session.run(code, "python", kernel=True)
        except SandmeshError as e:
            raise AgentError(f"sandmesh did not run the code: {e}", self.logger) from e

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        result = self._cell(code)
        logs = result.stdout + result.stderr
        error = result.cell_error
        if error is not None and error.name == self.FINAL_ANSWER_EXCEPTION:
            return CodeOutput(
                output=self._deserialize_final_answer(error.value, self.allow_pickle), logs=logs, is_final_answer=True
            )
        if error is not None:
            trace = "\n".join(error.traceback)
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{error.name}\n{error.value}\n{trace}", self.logger
            )
        if result.status != "ok":
            lost = " (the kernel restarted: earlier variables are gone)" if result.state_lost else ""
            raise AgentError(f"{logs}\nExecuting code ended with status {result.status}{lost}", self.logger)
        return CodeOutput(output=self._output(result.outputs), logs=logs, is_final_answer=False)

    def _output(self, outputs: List[RichOutput]) -> Any:
        """The cell's value as smolagents' remote executors return it: an image as a
        ``PIL.Image`` (a displayed figure counts, as E2B's do), else the last expression's text."""
        for out in outputs:
            if out.mime_type in _IMAGE_TYPES:
                return PIL.Image.open(BytesIO(self._content(out)))
        for out in outputs:
            if out.kind == "result":
                return self._content(out).decode("utf-8", errors="replace")
        return None

    def _content(self, out: RichOutput) -> bytes:
        if out.path is not None:  # large outputs are workspace files
            return self._session.files("read", out.path)
        data = out.data
        return data if data is not None else b""

    def install_packages(self, additional_imports: List[str]) -> List[str]:
        """``pip install``s the packages the session's image lacks (a shell run, assessed like
        any; it needs egress to a package index in the session's ``network`` policy). Those
        the image has already (``python-data``: numpy, pandas, matplotlib, pillow) are left
        alone, so an agent's tools work without a network."""
        if not additional_imports:
            return []
        probe = "import importlib.util\n" + "".join(
            f"print({name!r}) if importlib.util.find_spec({_module_of(name)!r}) is None else None\n"
            for name in additional_imports
        )
        missing = [line for line in self._session.run(probe, "python").stdout.splitlines() if line]
        if missing:
            command = shlex.join(
                ["python3", "-m", "pip", "install", "--quiet", "--user", "--break-system-packages", *missing]
            )
            try:
                result = self._session.run(command, "shell", timeout=300)
            except SandmeshError as e:
                raise AgentError(f"sandmesh did not install {missing}: {e}", self.logger) from e
            if result.exit_code != 0:
                raise AgentError(f"pip install {missing} failed:\n{result.stderr}", self.logger)
            self.logger.log(result.stdout)
        return list(additional_imports)

    def cleanup(self) -> None:
        """Closes the session (the kernel and its container go)."""
        self._session.close()

    def delete(self) -> None:
        self.cleanup()
