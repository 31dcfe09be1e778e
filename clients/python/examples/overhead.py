"""What the SDK costs over a raw nats-py request for the same execution.

    export SANDMESH_NATS_URL="$(target/release/sandmesh creds --url-only)"
    python clients/python/examples/overhead.py [rounds]

Runs `print(1)` alternately through `Sandmesh.run` and through a bare `nc.request` on
`sandbox.v1.exec` (same connection details, JSON and MessagePack), and prints the medians and
their ratio. A measurement, not a test: the machine's noise is in it.
"""
import asyncio
import json
import statistics
import sys
import time

import msgpack
import nats

from sandmesh import Sandmesh
from sandmesh._transport import connect_info

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 50


async def raw_once(nc: "nats.NATS", encoding: str) -> float:
    body = {"language": "python", "code": "print(1)"}
    payload = msgpack.packb(body) if encoding == "msgpack" else json.dumps(body).encode()
    started = time.perf_counter()
    msg = await nc.request("sandbox.v1.exec", payload, timeout=60,
                           headers={"Content-Type": f"application/{encoding}"})
    elapsed = time.perf_counter() - started
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data
    return elapsed


def main() -> None:
    info = connect_info()
    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(nats.connect(servers=info.servers, user=info.user, password=info.password))
    times = {"sdk": [], "raw": []}
    with Sandmesh.from_env() as sm:
        sm.run("print(1)")  # warm both paths
        loop.run_until_complete(raw_once(nc, sm.async_client._codec.name))
        for _ in range(ROUNDS):
            started = time.perf_counter()
            assert sm.run("print(1)").stdout == "1\n"
            times["sdk"].append(time.perf_counter() - started)
            times["raw"].append(loop.run_until_complete(raw_once(nc, sm.async_client._codec.name)))
        encoding = sm.async_client._codec.name
    loop.run_until_complete(nc.close())
    sdk, raw = statistics.median(times["sdk"]), statistics.median(times["raw"])
    print(f"print(1), {ROUNDS} rounds each, alternating, {encoding}: "
          f"SDK p50 {sdk * 1000:.1f} ms, raw nats-py p50 {raw * 1000:.1f} ms, ratio {sdk / raw:.3f}")


if __name__ == "__main__":
    main()
