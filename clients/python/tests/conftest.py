"""One real mesh for the whole test session (meshfixture.py starts it), and the agents of two
tenants on it."""

from __future__ import annotations

from typing import Iterator

import pytest

from sandmesh import Sandmesh

from meshfixture import FIXTURE_HOST, MAX_QUEUE, RUN_TIMEOUT, SANDMESH, Mesh, free_port, start_mesh

__all__ = ["FIXTURE_HOST", "MAX_QUEUE", "RUN_TIMEOUT", "SANDMESH", "Mesh", "free_port"]


@pytest.fixture(scope="session")
def mesh() -> Iterator[Mesh]:
    yield from start_mesh()


@pytest.fixture(scope="session")
def sm(mesh: Mesh) -> Iterator[Sandmesh]:
    """The default tenant's agent (MessagePack, the SDK's default encoding)."""
    client = Sandmesh(mesh.agent_url, run_timeout=RUN_TIMEOUT)
    yield client
    client.close()


@pytest.fixture(scope="session")
def other(mesh: Mesh) -> Iterator[Sandmesh]:
    """Another tenant's agent, for the boundaries between tenants."""
    client = Sandmesh(mesh.other_url, run_timeout=RUN_TIMEOUT)
    yield client
    client.close()
