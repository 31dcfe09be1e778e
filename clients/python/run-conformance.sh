#!/usr/bin/env bash
# The framework adapters (src/sandmesh/integrations) against one real mesh: pydantic-ai's
# WorkspaceBackendSuite and LangChain's SandboxIntegrationTests (the frameworks' own conformance
# suites), the OpenAI Agents SDK provider and the smolagents executor end to end with scripted
# models, and the recipes of docs/guide/agents.md. The frameworks are pinned in
# requirements-integrations.txt and installed into a cached venv (reinstalled only when they or
# the package change); the mesh starts as for run-tests.sh.
#
# The rules run on SANDMESH_ADAPTERS_WORKERS pytest-xdist workers (3) against the one mesh: they
# mostly wait on it, and a few wait out their suite's own hang guards (30-60 s each). Each rule
# goes on its own to the next free worker (`loadgroup`: no rule is grouped), so the ones that
# wait, which start first, wait on different workers. More workers start no sooner on 2 cores:
# each imports every framework first.
#
#   clients/python/run-conformance.sh               # everything
#   clients/python/run-conformance.sh -k smolagents # extra arguments go to pytest
#   clients/python/run-conformance.sh -n 0          # in one process
set -euo pipefail
SANDMESH_PY_SUITE=integrations exec "$(dirname "${BASH_SOURCE[0]}")/run-tests.sh" \
  -n "${SANDMESH_ADAPTERS_WORKERS:-3}" --dist loadgroup "$@"
