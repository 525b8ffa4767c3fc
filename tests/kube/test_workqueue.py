"""Work queue semantics (no server): de-duplication, one-at-a-time per key, delays, per-key
exponential backoff, shutdown."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from shared.backoff import Backoff
from shared.kube import QueueShutDown, WorkQueue

pytestmark = pytest.mark.anyio


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def get_now(queue: WorkQueue[str]) -> str:
    with anyio.fail_after(1):
        return await queue.get()


def test_backoff_delay_doubles_and_caps() -> None:
    assert [Backoff(0.01, 0.1).delay(n) for n in range(6)] == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    assert Backoff(0.01, 300).delay(10_000) == 300
    with pytest.raises(ValueError):
        Backoff(0.01, 1).delay(-1)


async def test_adds_are_deduplicated_and_fifo() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "a", "c", "b"):
        q.add(key)
    assert len(q) == 3
    assert [await get_now(q) for _ in range(3)] == ["a", "b", "c"]


async def test_a_key_is_never_handed_out_twice_concurrently() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("k")
    assert await get_now(q) == "k"
    q.add("k")  # re-added while being processed
    q.add("k")
    assert len(q) == 0 and q.processing == {"k"}
    with anyio.move_on_after(0.05) as scope:
        await q.get()
    assert scope.cancelled_caught  # nothing to hand out while k is in flight
    q.done("k")
    assert len(q) == 1 and await get_now(q) == "k"  # processed again, once
    q.done("k")
    assert len(q) == 0


async def test_concurrent_workers_never_overlap_on_a_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    active: dict[str, int] = {}
    overlaps = 0
    processed = 0
    enough = anyio.Event()

    async def worker() -> None:
        nonlocal overlaps, processed
        while True:
            try:
                key = await q.get()
            except QueueShutDown:
                return
            active[key] = active.get(key, 0) + 1
            overlaps += active[key] > 1
            await anyio.lowlevel.checkpoint()  # yield so others could run the same key if the queue allowed it
            q.add(key)  # re-add while in flight: must wait for done()
            processed += 1
            if processed >= 200:
                enough.set()
            active[key] -= 1
            q.done(key)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(worker)
            for key in ("x", "y"):
                q.add(key)
            await enough.wait()
            q.shutdown()
    assert overlaps == 0 and processed >= 200


async def test_add_after_waits_and_the_earlier_due_time_wins() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("late", 10)
    q.requeue_after("late", 30)  # a later due time does not postpone it
    q.add_after("early", 5)
    q.add_after("now", 0)
    assert len(q) == 1 and q.delayed == 2
    assert await get_now(q) == "now"
    clock.now += 5
    assert await get_now(q) == "early"
    clock.now += 5
    assert await get_now(q) == "late"
    assert q.delayed == 0


async def test_delayed_key_wakes_a_waiting_getter_in_real_time() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("k", 0.05)
    with anyio.fail_after(2):
        assert await q.get() == "k"


async def test_rate_limited_backoff_is_per_key_and_forget_resets() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(base_delay=1, max_delay=4, clock=clock)
    assert [q.add_rate_limited("a") for _ in range(4)] == [1, 2, 4, 4]
    assert q.failures("a") == 4 and q.add_rate_limited("b") == 1
    q.forget("a")
    assert q.failures("a") == 0 and q.add_rate_limited("a") == 1
    clock.now += 1
    assert {await get_now(q), await get_now(q)} == {"a", "b"}


async def test_shutdown_releases_waiting_getters() -> None:
    q: WorkQueue[str] = WorkQueue()
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await q.get()
        except QueueShutDown as exc:
            errors.append(exc)

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            q.shutdown()
    assert len(errors) == 2
    q.add("ignored")
    assert len(q) == 0 and q.is_shut_down


async def test_rate_limited_respects_a_longer_server_delay() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=1, clock=clock)
    assert q.add_rate_limited("k", at_least=3) == 3
    clock.now += 1
    with anyio.move_on_after(0.05) as scope:  # not due at the (shorter) backoff time
        await q.get()
    assert scope.cancelled_caught
    clock.now += 2
    assert await get_now(q) == "k"
