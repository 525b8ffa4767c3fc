"""Helpers for bus tests against a real nats-server (the ``nats_server`` fixture)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from prometheus_client import REGISTRY

from shared.bus.settings import BusSettings


@pytest.fixture
def bus_settings(nats_server) -> BusSettings:
    # A 1 s lease (renewed every 0.2 s) keeps hand-over tests short; production defaults are 10 s.
    return BusSettings(
        nats_urls=(nats_server.url,),
        lease_ttl=1.0,
        renew_interval=0.2,
        connect_timeout=5.0,
        request_timeout=2.0,
        publish_deadline=10.0,
        reconnect_wait=0.1,
    )


async def wait_for(
    condition: Callable[[], object],
    timeout: float = 5.0,
    interval: float = 0.01,
    describe: Callable[[], object] | None = None,
) -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds, saying what was seen."""
    try:
        with anyio.fail_after(timeout):
            while not condition():
                await anyio.sleep(interval)
    except TimeoutError:
        seen = f"; last seen: {describe()!r}" if describe is not None else ""
        raise AssertionError(f"condition not met within {timeout}s{seen}") from None


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0
