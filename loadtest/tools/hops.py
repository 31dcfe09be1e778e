"""Where a sync execution's time goes between the services, seen from NATS itself.

Subscribes to every subject of a running mesh (as its admin), for SECONDS, and splits each
`exec` request into the hops the server saw: the scheduler's first request out, the risk
assessment and session record round trips, the dispatch to the executor, the executor's round
trip (its own `exec_ms` is inside), and the result's store and the reply. Passive: it adds one
subscriber, nothing to the path. Needs `pip install nats-py`.

usage: python3 loadtest/tools/hops.py DATA_DIR PORT SECONDS
  DATA_DIR  the mesh's data dir (its tenancy.json holds the admin's credentials), e.g. the
            `mesh` folder a `loadtest --spawn-mesh` run logs under /tmp/sandmesh-loadtest-*
  PORT      its NATS port
Run it while `loadtest ... exec --tiers session -c 1` is in its session series.
"""
import asyncio
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import nats

PREFIX = "sandbox.v1."


def kind(subject):
    if subject == PREFIX + "risk.assess":
        return "risk"
    if subject.startswith("$JS.API.DIRECT.GET.KV_sandbox_sessions"):
        return "session"
    if subject.startswith(PREFIX + "executor.") and subject.endswith(".run"):
        return "executor"
    if subject.startswith(PREFIX + "results."):
        return "result"
    return None


def hops(log):
    """Per exec request: the hop durations in ns, from the messages in arrival order."""
    first_seen = {}
    for t, subject, _ in log:
        first_seen.setdefault(subject, t)
    out = defaultdict(list)
    for i, (start, subject, reply) in enumerate(log):
        if subject != PREFIX + "exec" or reply not in first_seen:
            continue
        end = first_seen[reply]
        seen = {}
        for t, s, r in log[i + 1:]:
            if t > end:
                break
            k = kind(s)
            if k and k not in seen:
                seen[k] = (t, first_seen.get(r))
        if not all(k in seen and seen[k][1] for k in ("risk", "executor")) or "result" not in seen:
            continue
        out_first = min(seen[k][0] for k in ("risk", "session") if k in seen)
        ready = max(seen[k][1] or 0 for k in ("risk", "session") if k in seen)
        sent, answered = seen["executor"]
        out["1 scheduler: request in -> first request out"].append(out_first - start)
        out["2 risk assessment round trip"].append(seen["risk"][1] - seen["risk"][0])
        if "session" in seen and seen["session"][1]:
            out["2 session record read (meanwhile)"].append(seen["session"][1] - seen["session"][0])
        out["3 scheduler: assessed -> executor request out"].append(sent - ready)
        out["4 executor round trip (exec_ms inside)"].append(answered - sent)
        out["5 scheduler: executor answer -> result out"].append(seen["result"][0] - answered)
        out["6 scheduler: result out -> reply out"].append(end - seen["result"][0])
        out["total (server's view)"].append(end - start)
    return out


async def main(data_dir, port, seconds):
    admin = json.loads((Path(data_dir) / "tenancy.json").read_text())["admin"]
    nc = await nats.connect(f"nats://{admin['user']}:{admin['password']}@127.0.0.1:{port}")
    log = []

    async def seen(msg):
        log.append((time.perf_counter_ns(), msg.subject, msg.reply or ""))

    await nc.subscribe(">", cb=seen)
    await asyncio.sleep(seconds)
    await nc.close()
    for name, values in sorted(hops(log).items()):
        values.sort()
        p50, p90 = statistics.median(values) / 1e6, values[int(len(values) * 0.9)] / 1e6
        print(f"{name:48s} n={len(values):5d}  p50 {p50:7.3f} ms  p90 {p90:7.3f} ms")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
