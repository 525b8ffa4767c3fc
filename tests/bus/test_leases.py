"""Shard ownership and leader leases against a real nats-server, watched by an invariant monitor."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import cast

import anyio
import msgspec
import pytest

from shared.bus import Bus, BusSettings, NotOwner, ShardOwnership, subjects
from shared.shards import ShardChange, resource_key
from tests.bus.conftest import wait_for
from tests.bus.replicas import LeaderReplica, OwnershipMonitor, ShardReplica

pytestmark = pytest.mark.anyio

SHARDS = 16


def handover_bound(settings: BusSettings) -> float:
    # The dead replica's keys expire one TTL after its last renewal; survivors notice on their
    # next round. The slack covers the server's expiry timer and scheduling on a busy CI box.
    return settings.lease_ttl + settings.effective_renew_interval + 1.5


def coverage(replicas: Sequence[ShardReplica]) -> tuple[set[int], list[int]]:
    owned = [r.owned() for r in replicas]
    covered: set[int] = set().union(*owned)
    return covered, sorted(len(o) for o in owned)


def balanced(replicas: Sequence[ShardReplica]) -> bool:
    """All shards held, none by two (the monitor checks that), nobody above ceil(shards/n)."""
    covered, sizes = coverage(replicas)
    return covered == set(range(SHARDS)) and sum(sizes) == SHARDS and max(sizes) <= -(-SHARDS // len(replicas))


def _leader_set(replica: LeaderReplica) -> Callable[[], set[str]]:
    return lambda: {"leader"} if replica.leading() else set()


async def test_two_then_three_replicas_split_shards_disjointly(bus_settings: BusSettings) -> None:
    replicas = [ShardReplica(bus_settings, "runner-set", f"pod-{i}") for i in range(3)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas[:2]:
            await tg.start(r.run)
        await wait_for(
            lambda: coverage(replicas[:2]) == (set(range(SHARDS)), [8, 8]),
            timeout=10,
            describe=lambda: coverage(replicas[:2]),
        )
        await tg.start(replicas[2].run)
        await wait_for(lambda: balanced(replicas), timeout=10, describe=lambda: coverage(replicas))
        tg.cancel_scope.cancel()
    assert monitor.samples > 100
    assert monitor.violations == []


async def test_a_crashed_replicas_shards_move_within_the_bound(bus_settings: BusSettings) -> None:
    replicas = [ShardReplica(bus_settings, "runner", f"pod-{i}") for i in range(3)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: balanced(replicas), timeout=10, describe=lambda: coverage(replicas))
        victim = max(replicas, key=lambda r: len(r.owned()))
        orphaned = victim.owned()
        survivors = [r for r in replicas if r is not victim]
        crashed_at = time.monotonic()
        victim.crash()
        await wait_for(
            lambda: coverage(survivors) == (set(range(SHARDS)), [8, 8]),
            timeout=handover_bound(bus_settings) + 5,
            describe=lambda: (coverage(survivors), [cast(ShardOwnership, r.shards).members for r in survivors]),
        )
        moved_after = time.monotonic() - crashed_at
        tg.cancel_scope.cancel()
    print(f"shards moved {moved_after:.2f}s after the crash (bound {handover_bound(bus_settings):.2f}s)")
    assert orphaned
    assert moved_after <= handover_bound(bus_settings), moved_after
    assert monitor.violations == []


async def test_change_callbacks_and_held_follow_ownership(bus_settings: BusSettings) -> None:
    changes: list[ShardChange] = []

    async def on_change(change: ShardChange) -> None:
        changes.append(change)

    async with (
        Bus.connect(bus_settings) as bus,
        ShardOwnership.join(bus, "runner", replica_id="solo", on_change=on_change) as shards,
    ):
        await wait_for(lambda: len(shards.owned_shards()) == SHARDS)
        key = resource_key("ns", "runner-1")
        async with shards.held(key):
            shards.check(key)
        async with ShardOwnership.join(bus, "runner", replica_id="other") as other:
            await wait_for(
                lambda: len(shards.owned_shards()) == SHARDS // 2 and len(other.owned_shards()) == SHARDS // 2
            )
            not_mine = next(f"ns/r-{i}" for i in range(1000) if not shards.owns(f"ns/r-{i}"))
            with pytest.raises(NotOwner, match=not_mine):
                async with shards.held(not_mine):
                    raise AssertionError("the block must not run")
            with pytest.raises(NotOwner):
                shards.check(not_mine)
        await wait_for(lambda: len(shards.owned_shards()) == SHARDS)
    gained = [s for c in changes for s in c.gained]
    lost = [s for c in changes for s in c.lost]
    assert len(lost) == SHARDS // 2  # handed to "other" when it joined...
    assert len(gained) == SHARDS + SHARDS // 2  # ...and taken back when it left


async def test_a_clean_shutdown_hands_shards_over_at_once(bus_settings: BusSettings) -> None:
    # A longer TTL than the other tests: a hand-over by expiry could not beat it.
    bus_settings = msgspec.structs.replace(bus_settings, lease_ttl=3.0)
    replicas = [ShardReplica(bus_settings, "runner", f"pod-{i}") for i in range(2)]
    async with anyio.create_task_group() as tg:
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: coverage(replicas) == (set(range(SHARDS)), [8, 8]), timeout=10)
        leaving, staying = replicas
        stopped_at = time.monotonic()
        leaving.alive = False
        leaving.scope.cancel()  # releases its leases and purges its membership
        await wait_for(lambda: len(staying.owned()) == SHARDS, timeout=5)
        took = time.monotonic() - stopped_at
        tg.cancel_scope.cancel()
    # Much faster than a TTL: no waiting for expiry.
    assert took < bus_settings.lease_ttl, took


async def test_racing_replicas_never_create_an_object_twice_even_when_one_dies_mid_flight(
    bus_settings: BusSettings,
) -> None:
    """Three replicas 'create runners' for the same keys from a stale view (as a cached
    Kubernetes list would be); one crashes and one is cut off NATS while mid-flight."""
    keys = [resource_key("arc.runners", f"runner-{i}") for i in range(48)]
    created: dict[str, list[str]] = {}  # the shared idempotency record: key -> creators
    in_flight: dict[str, set[str]] = {}
    replicas = [ShardReplica(bus_settings, "runner", f"pod-{i}") for i in range(3)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    refused: list[str] = []

    async def worker(replica: ShardReplica) -> None:
        shards = replica.shards
        assert shards is not None
        while True:
            snapshot = set(created)  # a stale read, taken before the slow part
            for key in keys:
                if key in snapshot or not shards.owns(key):
                    continue
                try:
                    async with shards.held(key):
                        in_flight.setdefault(replica.id, set()).add(key)
                        await anyio.sleep(0.02)  # simulated API latency: the window a crash can hit
                        shards.check(key)  # right before the write
                        created.setdefault(key, []).append(replica.id)
                except NotOwner:
                    refused.append(replica.id)
                finally:
                    in_flight.get(replica.id, set()).discard(key)
            await anyio.sleep(0.01)

    for r in replicas:
        r.work = worker
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            await tg.start(r.run)
        crasher, zombie, survivor = replicas
        await wait_for(lambda: in_flight.get(crasher.id) and in_flight.get(zombie.id), timeout=5)
        crashed_at = time.monotonic()
        crasher.crash()  # cancelled mid-flight (its worker too), leases not released
        await zombie.partition()  # keeps running its worker, but can no longer renew
        await wait_for(lambda: set(created) == set(keys), timeout=handover_bound(bus_settings) * 2 + 5)
        finished_after = time.monotonic() - crashed_at
        tg.cancel_scope.cancel()
    duplicates = {k: v for k, v in created.items() if len(v) > 1}
    assert duplicates == {}
    assert monitor.violations == []
    creators = {c for v in created.values() for c in v}
    assert survivor.id in creators
    # The crasher's unfinished keys could only be taken over after its leases expired.
    assert finished_after >= bus_settings.lease_validity
    print(f"race: all keys created {finished_after:.2f}s after the crash; refusals={len(refused)}")


async def test_exactly_one_leader_and_a_standby_takes_over_a_crashed_leader(bus_settings: BusSettings) -> None:
    name = subjects.listener_lease_name("arc.runners", "my.scale-set")
    replicas = [LeaderReplica(bus_settings, name, f"listener-{i}") for i in range(3)]
    monitor = OwnershipMonitor({r.id: _leader_set(r) for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: sum(r.leading() for r in replicas) == 1, timeout=5)
        leader = next(r for r in replicas if r.leading())
        assert leader.lease is not None
        first_epoch = leader.lease.epoch
        crashed_at = time.monotonic()
        leader.crash()
        standbys = [r for r in replicas if r is not leader]
        await wait_for(lambda: any(r.leading() for r in standbys), timeout=handover_bound(bus_settings) + 5)
        took = time.monotonic() - crashed_at
        new_lease = next(r for r in standbys if r.leading()).lease
        assert new_lease is not None
        new_epoch = new_lease.epoch
        tg.cancel_scope.cancel()
    assert took <= handover_bound(bus_settings), took
    assert new_epoch is not None and first_epoch is not None
    assert new_epoch > first_epoch
    assert monitor.violations == []


async def test_leadership_block_is_cancelled_when_the_leader_is_cut_off(bus_settings: BusSettings) -> None:
    name = subjects.listener_lease_name("ns", "set")
    a, b = LeaderReplica(bus_settings, name, "a"), LeaderReplica(bus_settings, name, "b")
    events: list[tuple[str, str, float]] = []

    async def session(replica: LeaderReplica) -> None:
        while True:
            assert replica.lease is not None
            async with replica.lease.leadership() as term:
                events.append((replica.id, "start", time.monotonic()))
                try:
                    await anyio.sleep_forever()
                finally:
                    events.append((replica.id, "stop", time.monotonic()))
            assert term.epoch > 0

    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        await wait_for(a.leading)
        await tg.start(b.run)
        tg.start_soon(session, a)
        tg.start_soon(session, b)
        await wait_for(lambda: events)
        assert a.bus is not None
        await a.bus.nc.close()  # a keeps running but can no longer renew
        await wait_for(
            lambda: any(e[0] == "b" and e[1] == "start" for e in events), timeout=handover_bound(bus_settings) + 5
        )
        tg.cancel_scope.cancel()
    a_stop = next(t for rid, what, t in events if rid == "a" and what == "stop")
    b_start = next(t for rid, what, t in events if rid == "b" and what == "start")
    assert a_stop < b_start  # the old session ended before the new one began
