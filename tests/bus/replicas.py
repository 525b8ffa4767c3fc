"""Test harness: replicas with their own NATS connection, crashable, and an ownership invariant monitor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import anyio
from anyio.abc import TaskStatus

from shared.bus import Bus, BusSettings, LeaderLease, ShardOwnership


class ShardReplica:
    """One worker replica holding a share of ``group``'s shards over its own connection."""

    def __init__(
        self,
        settings: BusSettings,
        group: str,
        replica_id: str,
        work: Callable[[ShardReplica], Awaitable[None]] | None = None,
    ) -> None:
        self.work = work  # async (replica) -> None, run for the replica's lifetime
        self.settings = settings
        self.group = group
        self.id = replica_id
        self.bus: Bus | None = None
        self.shards: ShardOwnership | None = None
        self.scope = anyio.CancelScope()
        self.alive = True

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            async with (
                Bus.connect(self.settings) as bus,
                ShardOwnership.join(bus, self.group, replica_id=self.id) as shards,
            ):
                self.bus, self.shards = bus, shards
                task_status.started()
                if self.work is not None:
                    await self.work(self)
                await anyio.sleep_forever()

    def owned(self) -> frozenset[int]:
        return self.shards.owned_shards() if (self.shards is not None and self.alive) else frozenset()

    def crash(self) -> None:
        """Die without releasing anything."""
        assert self.shards is not None
        self.shards.abandon()
        self.alive = False
        self.scope.cancel()

    async def partition(self) -> None:
        """Cut this replica off NATS while its code keeps running (a zombie)."""
        assert self.bus is not None
        await self.bus.nc.close()


class LeaderReplica:
    def __init__(self, settings: BusSettings, name: str, replica_id: str) -> None:
        self.settings = settings
        self.name = name
        self.id = replica_id
        self.bus: Bus | None = None
        self.lease: LeaderLease | None = None
        self.scope = anyio.CancelScope()
        self.alive = True

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            async with Bus.connect(self.settings) as bus, LeaderLease.join(bus, self.name, replica_id=self.id) as lease:
                self.bus, self.lease = bus, lease
                task_status.started()
                await anyio.sleep_forever()

    def leading(self) -> bool:
        return self.alive and self.lease is not None and self.lease.is_leader

    def crash(self) -> None:
        assert self.lease is not None
        self.lease.abandon()
        self.alive = False
        self.scope.cancel()


class OwnershipMonitor:
    """Samples every replica's locally-valid leases and records any key held by two at once."""

    def __init__(self, owned_by: dict[str, Callable[[], Iterable[object]]]) -> None:
        self.owned_by = owned_by  # replica id -> () -> set of held things
        self.violations: list[tuple[object, str, str]] = []
        self.samples = 0

    async def run(self) -> None:
        while True:
            holder: dict[object, str] = {}
            for replica_id, owned in list(self.owned_by.items()):
                for item in owned():
                    if item in holder:
                        self.violations.append((item, holder[item], replica_id))
                    else:
                        holder[item] = replica_id
            self.samples += 1
            await anyio.sleep(0.002)
