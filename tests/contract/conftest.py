"""Fixtures of the Actions client contract tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.actions import ActionsClient, ClientSettings, PersonalAccessToken, RetryPolicy
from tests.contract.scripted import ScriptedServer

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


def pat_client(sim: object, *, settings: ClientSettings = FAST, **kwargs: object) -> ActionsClient:
    """A PAT client of the simulator's default org."""
    return ActionsClient.from_config(
        sim.config_url(), PersonalAccessToken(sim.pat), settings=settings, environ={}, **kwargs
    )  # type: ignore[attr-defined]


async def endpoint_calls(sim: object, endpoint: str) -> list[object]:
    """The simulator's request log, filtered by endpoint name (e.g. ``"refresh_session"``)."""
    return [r for r in await sim.control.requests() if r.endpoint == endpoint]  # type: ignore[attr-defined]


async def wait_for(predicate, *, timeout: float = 5.0, interval: float = 0.02):  # type: ignore[no-untyped-def]
    """:func:`tests.support.eventually.eventually` with this directory's defaults."""
    from tests.support.eventually import eventually

    return await eventually(predicate, timeout=timeout, interval=interval)
