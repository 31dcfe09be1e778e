#!/usr/bin/env python3
"""Run code through the sandmesh mesh from Python: request-reply and async jobs, in JSON.

    python3 -m venv .venv && .venv/bin/pip install -r clients/python/requirements.txt
    .venv/bin/python clients/python/exec.py --url "$(sandmesh creds --url-only)"

The URL carries the credentials `sandmesh creds` prints (`nats://user:password@host:port`):
with them the mesh knows the tenant, and everything below stays within it.

Request-reply: `ExecRequest` on `sandbox.v1.exec`, the reply is the `ExecResult`.
Async: publish the request to JetStream on `sandbox.v1.jobs.exec` with `Nats-Msg-Id` set to
the execution id (the idempotency key: publishing twice runs it once); the JetStream ack means
"accepted". The result is then asked for on `sandbox.v1.exec.result` with `wait_ms`: the
scheduler holds the answer until the result is stored (a long poll), so the client needs no
access to the results stream. Each result is printed as one JSON line.
"""

import argparse
import asyncio
import json
import time
import uuid

import nats

JSON_HEADERS = {"Content-Type": "application/json"}


async def exec_sync(nc, request):
    msg = await nc.request("sandbox.v1.exec", json.dumps(request).encode(), timeout=120,
                           headers=JSON_HEADERS)
    code = (msg.headers or {}).get("Nats-Service-Error-Code")
    body = json.loads(msg.data)
    if code:
        return {"error": int(code), "message": body.get("message")}
    return body


async def exec_async(nc, js, request, wait_s=120):
    execution_id = request["execution_id"]
    for _ in range(2):  # the second publish is deduplicated by Nats-Msg-Id
        ack = await js.publish("sandbox.v1.jobs.exec", json.dumps(request).encode(),
                               headers={**JSON_HEADERS, "Nats-Msg-Id": execution_id})
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        ask = {"execution_id": execution_id, "wait_ms": 10_000}
        msg = await nc.request("sandbox.v1.exec.result", json.dumps(ask).encode(), timeout=20,
                               headers=JSON_HEADERS)
        code = (msg.headers or {}).get("Nats-Service-Error-Code")
        body = json.loads(msg.data)
        if code == "404":  # not taken from the queue yet
            await asyncio.sleep(0.1)
            continue
        if code:
            return {"error": int(code), "message": body.get("message")}
        if body.get("state") == "done":
            return {**body["result"], "duplicate_publish_acked": ack.duplicate}
    return {"error": 504, "message": f"no result for {execution_id} within {wait_s}s"}


def summary(mode, result):
    keys = ("execution_id", "status", "exit_code", "stdout", "tier", "error", "message",
            "duplicate_publish_acked")
    return json.dumps({"mode": mode, **{k: result[k] for k in keys if k in result}})


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    args = parser.parse_args()
    nc = await nats.connect(args.url)
    js = nc.jetstream()
    print(summary("sync", await exec_sync(nc, {"language": "python", "code": "print(6 * 7)"})))
    print(summary("sync", await exec_sync(nc, {"language": "javascript",
                                                 "code": "console.log([1,2,3].length)"})))
    print(summary("sync", await exec_sync(nc, {"language": "cobol", "code": "DISPLAY 1"})))
    job = {"execution_id": uuid.uuid4().hex, "language": "shell", "code": "echo async-$((40+2))"}
    print(summary("async", await exec_async(nc, js, job)))
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
