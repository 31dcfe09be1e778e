#!/usr/bin/env python3
"""The E2B facade beside `/api/v1`, in one run, at c=1, in alternating pairs:

- `create+run`: E2B's `Sandbox.create()` then its first `commands.run("echo 1")`, against
  `POST /api/v1/sessions` then `POST /api/v1/sessions/{id}/execute` (shell, `echo 1`) — a new
  session each time, so the first run places its container either way;
- `cell`: `run_code("1")` in one code-interpreter sandbox, against a kernel cell
  (`"kernel": true`) in one `/api/v1` session.

E2B's own SDK drives the facade (`pip install 'e2b<3' e2b-code-interpreter`), `urllib` the API;
both reach a mesh already up (`sandmesh up`, with the facade). Sandboxes and sessions are
removed after each timed pair, outside the timing.

    E2B_API_URL=http://127.0.0.1:4282 E2B_SANDBOX_URL=http://127.0.0.1:4282 \\
    E2B_API_KEY=$(sandmesh tenant key create default --e2b | tail -n 1) \\
    python3 loadtest/tools/e2b_facade.py --api http://127.0.0.1:4281 \\
        --key "$(sandmesh tenant key create default | tail -n 1)" -n 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from typing import Callable, Dict, List

from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox


class Api:
    def __init__(self, base: str, key: str) -> None:
        self.base = base.rstrip("/") + "/api/v1"
        self.key = key

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.key}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
        return json.loads(raw) if raw else {}


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1000


def summary(name: str, ms: List[float]) -> str:
    ms = sorted(ms)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731 - a one-line quantile
    return f"{name:<28} n={len(ms):<3} p50={statistics.median(ms):8.1f} ms  p90={p(0.9):8.1f} ms  max={ms[-1]:8.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", required=True, help="the gateway's origin, e.g. http://127.0.0.1:4281")
    parser.add_argument("--key", required=True, help="a sandmesh key of the same tenant as E2B_API_KEY")
    parser.add_argument("-n", type=int, default=20, help="pairs per series")
    args = parser.parse_args()
    api = Api(args.api, args.key)
    series: Dict[str, List[float]] = {k: [] for k in ("e2b create+run", "api create+run", "e2b cell", "api cell")}

    print("load average at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    # Warm-up, untimed: the first container of the run and the kernels' first start.
    Sandbox.create().kill()
    for i in range(args.n):
        sbx: List[Sandbox] = []

        def e2b_create_run() -> None:
            s = Sandbox.create()
            sbx.append(s)
            assert s.commands.run("echo 1").stdout == "1\n"

        sessions: List[str] = []

        def api_create_run() -> None:
            sid = api.call("POST", "/sessions", {})["session_id"]
            sessions.append(sid)
            r = api.call("POST", f"/sessions/{sid}/execute", {"language": "shell", "code": "echo 1"})
            assert r["stdout"] == "1\n", r

        pair = [("e2b create+run", e2b_create_run), ("api create+run", api_create_run)]
        for name, work in pair if i % 2 == 0 else reversed(pair):
            series[name].append(timed(work))
        for s in sbx:
            s.kill()
        for sid in sessions:
            api.call("DELETE", f"/sessions/{sid}")

    with CodeSandbox.create() as cs:
        sid = api.call("POST", "/sessions", {})["session_id"]
        cell = {"language": "python", "code": "1", "kernel": True}
        cs.run_code("1")
        api.call("POST", f"/sessions/{sid}/execute", cell)

        def e2b_cell() -> None:
            assert cs.run_code("1").text == "1"

        def api_cell() -> None:
            assert api.call("POST", f"/sessions/{sid}/execute", cell)["status"] == "ok"

        pair = [("e2b cell", e2b_cell), ("api cell", api_cell)]
        for i in range(args.n):
            for name, work in pair if i % 2 == 0 else reversed(pair):
                series[name].append(timed(work))
        api.call("DELETE", f"/sessions/{sid}")

    for name, ms in series.items():
        print(summary(name, ms))
    for what in ("create+run", "cell"):
        e2b, ours = statistics.median(series[f"e2b {what}"]), statistics.median(series[f"api {what}"])
        print(f"facade - api, {what:<11} p50 {e2b - ours:+8.1f} ms")
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
