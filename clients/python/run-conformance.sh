#!/usr/bin/env bash
# The framework adapters (src/sandmesh/integrations) against one real mesh: pydantic-ai's
# WorkspaceBackendSuite and LangChain's SandboxIntegrationTests (the frameworks' own conformance
# suites), the OpenAI Agents SDK provider and the smolagents executor end to end with scripted
# models, and the recipes of docs/guide/agents.md. The frameworks are pinned in
# requirements-integrations.txt and installed into a cached venv (reinstalled only when they or
# the package change); the mesh starts as for run-tests.sh.
#
#   clients/python/run-conformance.sh               # everything
#   clients/python/run-conformance.sh -k smolagents # extra arguments go to pytest
set -euo pipefail
SANDMESH_PY_SUITE=integrations exec "$(dirname "${BASH_SOURCE[0]}")/run-tests.sh" "$@"
