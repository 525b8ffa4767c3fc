"""Shard ownership under a slow store (a loaded machine): a renewal that lands after the claims'
validity must be seen as a lapse (README "Shard ownership leases"), even when the round that made
it succeeded: the shards are reported lost and gained again so that the worker runtime enqueues
their keys again (their reconciles were cancelled at the deadline), and after a renewal *sent*
late this replica acts again only after a list started after that write."""

from __future__ import annotations

import math
from dataclasses import dataclass

import anyio
import pytest

from shared.membership import LeaseTiming, Member, Membership, StaleRecord
from shared.shards import NotOwner, ShardChange
from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio

SHARDS = 2
TIMING = LeaseTiming(duration=3.0)  # renew every 1.5 s, valid 2.1 s after sending a write


class SlowStore:
    """One member's record in memory; lists and writes take ``list_delay`` / ``write_delay``."""

    own_name = "m-a"
    identity = "a"

    def __init__(self) -> None:
        self.record: Member | None = None
        self.serial = 0
        self.list_delay = 0.0
        self.write_delay = 0.0
        self.lists_started: list[float] = []
        self.writes_sent: list[float] = []

    async def list(self) -> list[Member]:
        self.lists_started.append(anyio.current_time())
        await anyio.sleep(self.list_delay)
        return [self.record] if self.record is not None else []

    async def write(self, claims: frozenset[int], version: str | None) -> str:
        self.writes_sent.append(anyio.current_time())
        await anyio.sleep(self.write_delay)
        if (self.record.version if self.record is not None else None) != version:
            raise StaleRecord()
        self.serial += 1
        self.record = Member(self.own_name, str(self.serial), self.identity, claims, TIMING.duration)
        return self.record.version

    async def delete(self, name: str, version: str) -> None:
        if self.record is not None and self.record.version == version:
            self.record = None


async def _run_lapse(store: SlowStore, *, list_delay: float, write_delay: float) -> Lapse:
    """Own every shard, hold a block on one, then make the store slow until the block is cancelled
    by the lapse, fast again until the shard is reported gained again. Returns the changes reported
    after the store turned slow, when the block was cancelled, and when the shards were owned."""
    changes: list[ShardChange] = []
    membership = Membership(store, "g", replica_id="a", shards=SHARDS, timing=TIMING, on_change=changes.append)
    cancelled_at = math.inf
    key = "ns/set"
    shard = membership.shard_of(key)

    async def hold() -> None:
        nonlocal cancelled_at
        try:
            async with membership.held(key):
                await anyio.sleep_forever()
        except NotOwner:
            cancelled_at = anyio.current_time()

    owned_at: list[float] = []

    async def sample() -> None:
        while True:
            if membership.owned_shards():
                owned_at.append(anyio.current_time())
            await anyio.sleep(0.01)

    async with membership.running(), anyio.create_task_group() as tg:
        await eventually(
            lambda: membership.owned_shards() == frozenset(range(SHARDS)), timeout=10, what="all shards owned"
        )
        tg.start_soon(hold)
        tg.start_soon(sample)
        seen = len(changes)
        store.list_delay, store.write_delay = list_delay, write_delay
        await eventually(lambda: cancelled_at != math.inf, timeout=10, what="the held block cancelled by the lapse")
        store.list_delay = store.write_delay = 0.0
        # Without the lapse reported, the runtime would never enqueue the cancelled key again.
        await eventually(
            lambda: any(shard in c.gained for c in changes[seen:]), timeout=10, what="the shard reported gained again"
        )
        tg.cancel_scope.cancel()
    return Lapse(changes[seen:], cancelled_at, owned_at)


@dataclass
class Lapse:
    changes: list[ShardChange]
    cancelled_at: float
    owned_at: list[float]


async def test_renewal_answered_after_validity_reports_the_shards_lost_and_gained() -> None:
    # Renewals are sent in time (1.5 s after the last write) but answered 1 s later: past the
    # 2.1 s validity, so the held block is cancelled although every write succeeds.
    lapse = await _run_lapse(SlowStore(), list_delay=0.0, write_delay=1.0)
    assert any(c.lost for c in lapse.changes) and any(c.gained for c in lapse.changes)


async def test_renewal_sent_after_validity_acts_again_only_after_a_confirming_list() -> None:
    # Slow lists delay the renewing round: the renewal is sent after the validity ended.
    store = SlowStore()
    lapse = await _run_lapse(store, list_delay=0.9, write_delay=0.0)
    assert any(c.lost for c in lapse.changes) and any(c.gained for c in lapse.changes)
    late_write = next(t for t in store.writes_sent if t >= lapse.cancelled_at)
    confirming_list = next((t for t in store.lists_started if t >= late_write), math.inf)
    resumed = [t for t in lapse.owned_at if lapse.cancelled_at < t < confirming_list]
    assert not resumed, "acted on the shards again before a list confirmed the late write"
