"""What each framework adapter adds to a command: ``echo 1`` through every adapter and through
the SDK's own ``session.run``, in one run, against a running mesh.

    export SANDMESH_NATS_URL="$(target/debug/sandmesh creds --url-only)"
    python loadtest/tools/adapters_overhead.py [rounds]      # the integrations venv: the
                                                             # frameworks must be importable

Each path gets a session of its own, warmed by one run; then the paths take turns, one
``echo 1`` each per round (so the machine's drift falls on all alike), and the p50 of each is
printed beside the SDK's with their ratio (target ≤ 1.1×). A measurement, not a test.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

from sandmesh import Sandmesh
from sandmesh.integrations.deepagents import SandmeshSandbox
from sandmesh.integrations.openai_agents import SandmeshSandboxClient
from sandmesh.integrations.pydantic_ai import SandmeshWorkspace
from sandmesh.integrations.smolagents import SandmeshExecutor

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 40


def main() -> None:
    sm = Sandmesh.from_env()
    loop = asyncio.new_event_loop()
    sdk = sm.session()
    workspace = SandmeshWorkspace(sm)
    sandbox = SandmeshSandbox(sm)
    client = SandmeshSandboxClient(sm)
    oa_session = loop.run_until_complete(client.create())
    loop.run_until_complete(oa_session.start())
    executor = SandmeshExecutor(sm)

    def sdk_run() -> str:
        return sdk.run("echo 1", "shell").stdout

    def pydantic_ai_run() -> str:
        return loop.run_until_complete(workspace.run(["echo", "1"])).stdout

    def deepagents_run() -> str:
        return sandbox.execute("echo 1").output

    def openai_agents_run() -> str:
        return loop.run_until_complete(oa_session.exec("echo", "1", shell=False)).stdout.decode()

    def smolagents_run() -> str:
        # A code action is a kernel cell: the executor's own unit, timed beside the SDK's cell.
        return executor.run_code_raise_errors("print(1)").logs

    def sdk_cell() -> str:
        return sdk.run("print(1)", kernel=True).stdout

    paths: Dict[str, Callable[[], str]] = {
        "sdk session.run": sdk_run,
        "pydantic-ai SandmeshWorkspace.run": pydantic_ai_run,
        "deepagents SandmeshSandbox.execute": deepagents_run,
        "openai-agents session.exec": openai_agents_run,
        "sdk session.run(kernel=True)": sdk_cell,
        "smolagents SandmeshExecutor (cell)": smolagents_run,
    }
    for run in paths.values():  # warm every session (container placed, kernel started)
        assert run().strip() == "1"
    times: Dict[str, List[float]] = {name: [] for name in paths}
    for _ in range(ROUNDS):
        for name, run in paths.items():
            started = time.perf_counter()
            out = run()
            times[name].append(time.perf_counter() - started)
            assert out.strip() == "1", (name, out)
    load = os.getloadavg()
    p50 = {name: statistics.median(t) * 1000 for name, t in times.items()}
    print(f"echo 1, {ROUNDS} rounds, paths in turn; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name, value in p50.items():
        base = p50["sdk session.run(kernel=True)"] if "cell" in name or "kernel" in name else p50["sdk session.run"]
        print(f"  {name:40s} p50 {value:7.1f} ms   p90 {statistics.quantiles(times[name], n=10)[-1] * 1000:7.1f} ms   "
              f"{value / base:5.3f}x the SDK's")
    sdk.close()
    loop.run_until_complete(workspace.aclose())
    sandbox.close()
    loop.run_until_complete(client.delete(oa_session))
    executor.cleanup()
    sm.close()


if __name__ == "__main__":
    main()
