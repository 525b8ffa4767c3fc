"""ActionsClientPool's credential reads: a call uses a read that began at most ``max_age`` before it
(concurrent callers share it); with ``max_age=0``, one that began after the call did."""

from __future__ import annotations

import base64
from typing import Any

import anyio
import pytest

from shared.api import ObjectMeta
from shared.kube import ObjectKey
from shared.kube.objects import Secret
from shared.worker import ActionsClientPool
from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio

URL = "https://github.example/org/repo"


class GatedSecretReader:
    """An ApiReader for one Secret whose GETs wait until the test opens the gate."""

    def __init__(self) -> None:
        self.version = 1
        self.gets = 0
        self.gate = anyio.Event()
        self.waiting = 0

    async def get(self, resource: Any, key: ObjectKey) -> Secret:
        self.gets += 1
        seen = self.version  # the state at the moment the read reaches the server
        self.waiting += 1
        await self.gate.wait()
        self.waiting -= 1
        token = base64.b64encode(f"token-{seen}".encode()).decode()
        return Secret(
            metadata=ObjectMeta(name=key.name, namespace=key.namespace, resource_version=str(seen)),
            data={"github_token": token},
        )


async def test_concurrent_callers_share_a_read_that_began_after_they_arrived() -> None:
    reader = GatedSecretReader()
    pool = ActionsClientPool(reader, timeout=5, max_age=0)  # type: ignore[arg-type]
    clients: list[object] = []

    async def call() -> None:
        clients.append(await pool.get("ns", config_url=URL, secret_name="gh"))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)  # the first caller reads at once
            await eventually(lambda: reader.waiting == 1, timeout=5, interval=0.001, what="first read in flight")
            for _ in range(9):  # arrive while the first read is in flight: it began before them
                tg.start_soon(call)
            (lock,) = pool._locks.values()
            await eventually(
                lambda: lock.statistics().tasks_waiting == 9, timeout=5, interval=0.001, what="nine callers queued"
            )
            reader.gate.set()
        # The first read, then ONE read for the nine that arrived during it (it began after them).
        assert reader.gets == 2
        assert pool.reads == 2 and pool.builds == 1
        assert len(clients) == 10 and len({id(c) for c in clients}) == 1
    finally:
        await pool.close()


async def test_a_call_after_a_rotation_reads_again_and_rebuilds() -> None:
    reader = GatedSecretReader()
    reader.gate.set()
    pool = ActionsClientPool(reader, timeout=5, max_age=0)  # type: ignore[arg-type]
    try:
        first = await pool.get("ns", config_url=URL, secret_name="gh")
        assert await pool.get("ns", config_url=URL, secret_name="gh") is first  # sequential calls still read
        assert reader.gets == 2
        reader.version = 2  # rotated between calls: the next call must see it
        rotated = await pool.get("ns", config_url=URL, secret_name="gh")
        assert rotated is not first and pool.builds == 2 and reader.gets == 3
    finally:
        await pool.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_calls_within_max_age_reuse_a_read_and_a_rotation_is_seen_once_it_is_older() -> None:
    reader = GatedSecretReader()
    reader.gate.set()
    clock = FakeClock()
    pool = ActionsClientPool(reader, timeout=5, max_age=1.0)  # type: ignore[arg-type]
    pool._clock = clock
    try:
        first = await pool.get("ns", config_url=URL, secret_name="gh")
        assert reader.gets == 1
        clock.now += 0.5
        assert await pool.get("ns", config_url=URL, secret_name="gh") is first  # within the bound: no GET
        assert reader.gets == 1
        clock.now += 0.1
        reader.version = 2  # rotated at t0 + 0.6
        clock.now += 0.4  # t0 + 1.0: the read (began at t0) is exactly max_age old: still used
        assert await pool.get("ns", config_url=URL, secret_name="gh") is first
        assert reader.gets == 1
        clock.now += 0.01  # older than max_age: read again, the rotation is seen
        rotated = await pool.get("ns", config_url=URL, secret_name="gh")
        assert rotated is not first and reader.gets == 2 and pool.builds == 2
        clock.now += 0.3
        assert await pool.get("ns", config_url=URL, secret_name="gh") is rotated
        assert reader.gets == 2
    finally:
        await pool.close()


async def test_concurrent_callers_within_max_age_share_the_first_read() -> None:
    reader = GatedSecretReader()
    pool = ActionsClientPool(reader, timeout=5, max_age=1.0)  # type: ignore[arg-type]
    pool._clock = FakeClock()  # frozen: every caller arrives within max_age of the read's start
    clients: list[object] = []

    async def call() -> None:
        clients.append(await pool.get("ns", config_url=URL, secret_name="gh"))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await eventually(lambda: reader.waiting == 1, timeout=5, interval=0.001, what="first read in flight")
            for _ in range(9):
                tg.start_soon(call)
            (lock,) = pool._locks.values()
            await eventually(
                lambda: lock.statistics().tasks_waiting == 9, timeout=5, interval=0.001, what="nine callers queued"
            )
            reader.gate.set()
        assert reader.gets == 1 and pool.reads == 1 and pool.builds == 1
        assert len(clients) == 10 and len({id(c) for c in clients}) == 1
    finally:
        await pool.close()


def test_negative_max_age_is_refused() -> None:
    with pytest.raises(ValueError, match="max_age"):
        ActionsClientPool(GatedSecretReader(), max_age=-1)  # type: ignore[arg-type]
