"""The five lines: run code on the mesh and print its output.

    export SANDMESH_NATS_URL="$(target/release/sandmesh creds --url-only)"
    python clients/python/examples/quickstart.py        # 42
"""
from sandmesh import Sandmesh

with Sandmesh.from_env() as sm:
    result = sm.run("print(6*7)")
    print(result.stdout, end="")
