"""Fixtures of the Actions client contract tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from services.embedded.actions_sim.views import RequestRecord
from shared.actions import ActionsClient, ClientSettings, PersonalAccessToken, RetryPolicy
from tests.contract.scripted import ScriptedServer
from tests.fixtures.actions_sim import ActionsSim

T = TypeVar("T")

# Fast retries keep the suite quick; the policy's shape (counts, doubling, Retry-After) is unchanged.
FAST = ClientSettings(
    request_timeout=5.0,
    poll_timeout=5.0,
    deadline=10.0,
    retry=RetryPolicy(max_retries=4, backoff_base=0.02, backoff_max=0.5, retry_after_max=5.0),
)


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def pat_client(sim: ActionsSim, *, settings: ClientSettings = FAST) -> ActionsClient:
    """A PAT client of the simulator's default org."""
    return ActionsClient.from_config(sim.config_url(), PersonalAccessToken(sim.pat), settings=settings, environ={})


async def endpoint_calls(sim: ActionsSim, endpoint: str) -> list[RequestRecord]:
    """The simulator's request log, filtered by endpoint name (e.g. ``"refresh_session"``)."""
    records: list[RequestRecord] = await sim.control.requests()
    return [r for r in records if r.endpoint == endpoint]


async def wait_for(predicate: Callable[[], Awaitable[T]], *, timeout: float = 5.0, interval: float = 0.02) -> T:
    """:func:`tests.support.eventually.eventually` with this directory's defaults."""
    from tests.support.eventually import eventually

    return await eventually(predicate, timeout=timeout, interval=interval)
