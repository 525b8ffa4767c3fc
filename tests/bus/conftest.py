"""Helpers for bus tests against a real nats-server (the ``nats_server`` fixture)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from shared.bus.settings import BusSettings
from tests.fixtures.nats import NatsServer
from tests.support.eventually import eventually


@pytest.fixture
def bus_settings(nats_server: NatsServer) -> BusSettings:
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
    """:func:`tests.support.eventually.eventually` with this directory's defaults."""
    await eventually(condition, timeout=timeout, interval=interval, describe=describe)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0
