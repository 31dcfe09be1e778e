"""A session an agent works in: files in, code run with live output, a file out, and a
person asked when the code looks dangerous.

    export SANDMESH_NATS_URL="$(target/release/sandmesh creds --url-only)"
    python clients/python/examples/agent_session.py
"""
import sys

import sandmesh
from sandmesh import Confirmation, Sandmesh


def waiting(c: Confirmation) -> None:
    print(f"waiting for approval: sandmesh confirm approve {c.confirmation_id}", file=sys.stderr)


with Sandmesh.from_env() as sm, sm.session("example") as s:
    s.files.write("data/numbers.txt", "\n".join(str(i) for i in range(10)))
    r = s.run(
        "nums = [int(x) for x in open('data/numbers.txt')]\n"
        "print('sum', sum(nums), flush=True)\n"
        "open('output/total.txt', 'w').write(str(sum(nums)))\n",
        on_stdout=lambda text: print("live:", text, end=""),
    )
    print("files created:", r.files_created)
    print("total:", s.files.read("output/total.txt").decode())
    try:
        s.run("import os\nos.system('id')", on_awaiting_approval=waiting, request_timeout=120)
    except sandmesh.Denied as e:
        print("a person said no:", e.message)
    except sandmesh.Timeout as e:
        print("nobody decided in time; confirmation", e.confirmation_id)
