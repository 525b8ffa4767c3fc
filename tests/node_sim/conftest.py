"""Fixtures of the node simulator tests (helpers live in ``helpers.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.embedded.node_sim.kube import KubeRest
from tests.fixtures.apiserver import KubeApi


@pytest.fixture
async def kube(kube_api: KubeApi) -> AsyncIterator[KubeRest]:
    """Raw JSON access to the API under test (the node sim's own thin client)."""
    k = await KubeRest.from_kubeconfig(kube_api.kubeconfig)
    try:
        yield k
    finally:
        await k.close()
