"""Shard ownership from one membership record per replica: the core both backends share.

README "Shard ownership leases" has the argument; in short. Each replica process writes one
record (a Kubernetes Lease, or a NATS KV key) naming the shards it *claims*. Every ``list_period``
it lists the group's records; a record whose version this replica has seen unchanged for
``duration`` by its own monotonic clock is dead, the others are live. The live members split the
shards by balanced rendezvous hashing (:func:`shared.shards.assign`). A replica claims shard
``s`` only if ``s`` is its own by that split and no other live record claims ``s``; it *acts* on
``s`` only after a list that started after its claim was written shows no other live claim on
``s``. Dropping a shard: stop acting first, then write the record without it. The record is
rewritten when the claims change or every ``renew_period``; lists are reads.

Why no two replicas act on one shard: say A and B both act on ``s``. Each wrote its claim before
the list that confirmed it. If A's confirming list read before B's claim was applied, B's
confirming list read after A's claim was applied and (A only withdraws a claim after it stopped
acting) shows A's claim, unless B judged A's record dead: B saw the same version for ``duration``
``D`` since it first observed it, and A stops acting ``V = D - T - margin`` after *sending* the
write that made that version (``T`` the request timeout), the time fence of the per-shard design.

The backend (:class:`MemberStore`) lists records, writes this replica's record with a
compare-and-swap on its last version, and deletes a record with a compare-and-swap (a clean
leave, or the garbage of a dead process).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from shared import shards as sharding
from shared.log import get_logger
from shared.tasks import background_tasks

log = get_logger(__name__)

__all__ = ["LeaseTiming", "Member", "MemberStore", "Membership", "StaleRecord"]


def _now() -> float:
    return anyio.current_time()


@dataclass(frozen=True)
class LeaseTiming:
    """The durations of the protocol (seconds); see the module docstring and the README."""

    duration: float = 20.0
    renew_period: float = 0.0  # 0: duration / 2 (a write at rest)
    list_period: float = 0.0  # 0: duration / 10 (a read)
    request_timeout: float = 0.0  # 0: duration / 5; the deadline of every request

    def __post_init__(self) -> None:
        if self.duration <= 0:
            raise ValueError(f"lease duration must be > 0, got {self.duration}")
        if self.validity <= self.period + self.lister:
            raise ValueError(
                f"lease timing leaves no room to renew: validity {self.validity:.2f}s (duration - request timeout - "
                f"margin) must exceed the renew period {self.period:.2f}s plus the list period {self.lister:.2f}s"
            )

    @property
    def period(self) -> float:
        return self.renew_period or self.duration / 2

    @property
    def lister(self) -> float:
        return self.list_period or self.duration / 10

    @property
    def retry_period(self) -> float:
        return self.lister

    @property
    def timeout(self) -> float:
        return self.request_timeout or self.duration / 5

    @property
    def margin(self) -> float:
        return self.duration / 10

    @property
    def validity(self) -> float:
        """How long after sending a successful write this replica still acts on its claims."""
        return self.duration - self.timeout - self.margin

    @property
    def duration_seconds(self) -> int:
        """``spec.leaseDurationSeconds`` (an integer: rounded up, never shorter than ``duration``)."""
        return max(1, math.ceil(self.duration))

    @property
    def handover_bound(self) -> float:
        """A crashed replica's shards are acted on by another within this long (plus request latency):
        first seen within one list period of its last write, dead ``duration`` later, noticed at
        the next list, then claimed, confirmed, and the split settles within one more list."""
        return self.duration + 3 * self.lister


@dataclass(frozen=True)
class Member:
    """One membership record as listed."""

    name: str  # unique per process
    version: str
    identity: str  # "" when released
    claims: frozenset[int]
    duration: float = 0.0  # what the record says it lives (0: unknown)


class StaleRecord(Exception):
    """Our record was changed or removed by someone else (or a write's answer was lost)."""


class MemberStore(Protocol):
    """Where records live. Every call has its own deadline; transport errors propagate."""

    own_name: str
    identity: str

    async def list(self) -> list[Member]: ...

    async def write(self, claims: frozenset[int], version: str | None) -> str:
        """Write our record (create when ``version`` is None, else compare-and-swap); the new version.
        Raises :class:`StaleRecord` when the version does not match or the record is gone."""
        ...

    async def delete(self, name: str, version: str) -> None:
        """Delete a record if it still has ``version``; no error if it changed or is gone."""
        ...


@dataclass
class _Seen:
    version: str
    since: float  # anyio clock: when this replica first saw this version


@dataclass
class _Acting:
    scopes: set[anyio.CancelScope] = field(default_factory=set)


class Membership:
    """This replica's share of a group's shards; the public interface of both backends.

    :meth:`owns` filters work, ``async with ownership.held(key):`` (or :meth:`check`, raising
    :class:`shared.shards.NotOwner`) right before a write, ``on_change`` is called with
    gained/lost shards after every round that changed them, :meth:`owned_shards`,
    :meth:`shard_of`, :meth:`wait_ready`, ``members`` and :meth:`abandon`.
    """

    def __init__(
        self,
        store: MemberStore,
        group: str,
        *,
        replica_id: str,
        shards: int,
        timing: LeaseTiming,
        on_change: sharding.ChangeCallback | None = None,
    ) -> None:
        if shards < 1:
            raise ValueError("shards must be >= 1")
        self.store = store
        self.group = group
        self.replica_id = replica_id
        self.identity = store.identity
        self.shards = shards
        self.timing = timing
        self.on_change = on_change
        self.members = 1
        self._version: str | None = None  # of our record, after our last successful write
        self._claimed: frozenset[int] = frozenset()  # what our record says
        self._written_at = -math.inf  # anyio clock: when our last successful write was sent
        self._confirm_after = math.inf  # a list started after this confirms our claims
        self._valid_until = -math.inf
        self._acting: dict[int, _Acting] = {}
        self._seen: dict[str, _Seen] = {}
        self._abandoned = False
        self._first_round = anyio.Event()
        self._reported: frozenset[int] = frozenset()
        # Shards whose acting was interrupted (stopped, or their blocks cancelled by a lapse) since
        # the last report: reported as lost and, if acted on again, gained, so that the keys whose
        # reconciles were cancelled (or skipped) meanwhile are enqueued again.
        self._interrupted: set[int] = set()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Membership]:
        """Keep listing/claiming/renewing until the block exits, then leave (unless abandoned)."""
        try:
            async with background_tasks(self._run):  # the block's own exception propagates unwrapped
                yield self
        finally:
            self._stop_all()
            if not self._abandoned:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.timing.timeout * 2):
                    await self._leave()
            sharding.SHARDS_OWNED.labels(self.group).set(0)

    # -- queries (pure, local) --

    def shard_of(self, key: str) -> int:
        return sharding.shard_of(key, self.shards)

    def owned_shards(self) -> frozenset[int]:
        """Shards this replica acts on right now."""
        if _now() >= self._valid_until:
            return frozenset()
        return frozenset(self._acting)

    def owns(self, key: str) -> bool:
        return self.shard_of(key) in self._acting and _now() < self._valid_until

    def check(self, key: str) -> None:
        """Raise :class:`shared.shards.NotOwner` unless this replica acts on ``key``'s shard right now."""
        if not self.owns(key):
            raise sharding.NotOwner(key, self.shard_of(key))

    @asynccontextmanager
    async def held(self, key: str) -> AsyncIterator[None]:
        """Run the block only while owning ``key``: raises NotOwner at entry, or when the shard
        is dropped or the claims lapse mid-block (the block is cancelled at that moment)."""
        shard = self.shard_of(key)
        acting = self._acting.get(shard)
        if acting is None or _now() >= self._valid_until:
            raise sharding.NotOwner(key, shard)
        with anyio.CancelScope(deadline=self._valid_until) as scope:
            acting.scopes.add(scope)
            try:
                yield
            finally:
                acting.scopes.discard(scope)
        if scope.cancelled_caught:
            raise sharding.NotOwner(key, shard)

    async def wait_ready(self) -> None:
        """Wait for the first round (so :meth:`owns` reflects a real decision)."""
        await self._first_round.wait()

    def abandon(self) -> None:
        """Stop without leaving, as a crash would (tests, and fatal errors)."""
        self._abandoned = True

    # -- acting --

    def _stop(self, shard: int) -> None:
        acting = self._acting.pop(shard, None)
        if acting is not None:
            self._interrupted.add(shard)
            for scope in list(acting.scopes):
                scope.cancel()

    def _stop_all(self) -> None:
        for shard in list(self._acting):
            self._stop(shard)

    def _extend(self) -> None:
        for acting in self._acting.values():
            for scope in acting.scopes:
                scope.deadline = self._valid_until

    # -- the loop --

    async def _run(self) -> None:
        while True:
            ok = False
            try:
                ok = await self._round()
            except Exception as exc:
                log.info("membership round incomplete", group=self.group, error=f"{type(exc).__name__}: {exc}")
            self._lapse_if_due()
            await self._report()
            self._first_round.set()
            await anyio.sleep(self.timing.lister if ok else self.timing.retry_period)

    def _lapse_if_due(self) -> None:
        """Past the claims' validity (the renewal came too late): stop acting; others may have
        judged this replica dead, so act again only after a write and a list that confirms it."""
        if _now() >= self._valid_until and self._confirm_after != math.inf:
            if self._acting:
                log.info("claims lapsed locally (renewal too late)", group=self.group, shards=sorted(self._acting))
            self._stop_all()
            self._confirm_after = math.inf

    async def _list(self) -> tuple[float, dict[str, Member]]:
        started = _now()
        listed = await self.store.list()
        now = _now()
        by_name = {m.name: m for m in listed}
        for m in listed:
            seen = self._seen.get(m.name)
            if seen is None or seen.version != m.version:
                self._seen[m.name] = _Seen(m.version, now)
        for name in list(self._seen):
            if name not in by_name:
                del self._seen[name]
        return started, by_name

    def _live_others(self, by_name: dict[str, Member], now: float) -> tuple[list[Member], list[Member]]:
        live: list[Member] = []
        dead: list[Member] = []
        for m in by_name.values():
            if m.name == self.store.own_name:
                continue
            seen = self._seen[m.name]
            if m.identity and now - seen.since < max(m.duration, self.timing.duration):
                live.append(m)
            else:
                dead.append(m)
        return live, dead

    def _confirm(self, started: float, others: list[Member]) -> None:
        """A list that started after our last write was answered confirms our uncontested claims."""
        if started < self._confirm_after or _now() >= self._valid_until:
            return
        contested = set().union(*(m.claims for m in others)) if others else set()
        for shard in self._claimed - contested:
            self._acting.setdefault(shard, _Acting())

    async def _round(self) -> bool:
        try:
            started, by_name = await self._list()
        except Exception as exc:
            log.info("membership list failed", group=self.group, error=f"{type(exc).__name__}: {exc}")
            # Still renew what the record claims (safe without a list: it claims nothing new), so
            # a failing list alone does not make this replica stop acting; decide nothing blind.
            if self._version is not None and _now() - self._written_at >= self.timing.period:
                await self._write(self._claimed)
            return False
        now = _now()
        own = by_name.get(self.store.own_name)
        own_version = own.version if own is not None and own.identity == self.identity else None
        if own_version != self._version:
            # Someone removed our record (it looked dead), or a write's answer was lost: act on
            # nothing until a fresh write and a list after it.
            self._stop_all()
            self._version = own_version
            self._claimed = own.claims if own is not None and own_version is not None else frozenset()
            self._confirm_after = math.inf
        others, dead = self._live_others(by_name, now)
        self.members = 1 + len(others)
        self._confirm(started, others)
        claimers: dict[int, set[str]] = {}
        for m in others:
            for s in m.claims:
                claimers.setdefault(s, set()).add(m.name)
        live_names = [self.store.own_name, *(m.name for m in others)]
        want = sharding.plan_membership(
            self.store.own_name, self.shards, live_names, self._claimed, frozenset(self._acting), claimers
        )
        # Stop acting on what we drop (and on what someone else now claims while we never confirmed it).
        for shard in list(self._acting):
            if shard not in want:
                self._stop(shard)
        ok = True
        due = now - self._written_at >= self.timing.period or self._version is None
        if want != self._claimed or due:
            ok = await self._write(want)
            if ok and want - frozenset(self._acting):
                # New claims: confirm them with a list right away rather than a period later.
                started, by_name = await self._list()
                others, dead = self._live_others(by_name, _now())
                self._confirm(started, others)
        await self._collect(dead)
        return ok

    async def _write(self, claims: frozenset[int]) -> bool:
        # A slow round (a slow list under load) may reach its renewal after the validity ended:
        # the new write must not silently resume acting without a confirming list.
        self._lapse_if_due()
        sent = _now()
        try:
            self._version = await self.store.write(claims, self._version)
        except StaleRecord:
            log.info("membership record changed under us; rewriting", group=self.group)
            self._stop_all()
            self._version = None
            self._confirm_after = math.inf
            return False
        except Exception as exc:
            # The outcome is unknown (the write may still land): only the claims in both the old
            # and the new record are certain, so only those may be confirmed until the next write.
            self._claimed &= claims
            log.info(
                "membership write failed; claims still valid locally until their deadline",
                group=self.group,
                error=f"{type(exc).__name__}: {exc}",
            )
            return False
        if _now() >= self._valid_until:
            # Sent in time but answered after the validity ended: the blocks running on our shards
            # were cancelled at that deadline (their keys must be enqueued again).
            self._interrupted.update(self._acting)
        added = claims - self._claimed
        self._claimed = claims
        self._written_at = sent
        self._valid_until = sent + self.timing.validity
        if added or self._confirm_after == math.inf:
            self._confirm_after = _now()
        self._extend()
        return True

    async def _collect(self, dead: list[Member]) -> None:
        """Delete records of dead processes (compare-and-swap on the version seen expiring)."""
        for m in dead:
            try:
                await self.store.delete(m.name, m.version)
            except Exception as exc:
                log.info("dead member record not deleted", group=self.group, member=m.name, error=type(exc).__name__)

    async def _leave(self) -> None:
        if self._version is None:
            return
        try:
            await self.store.delete(self.store.own_name, self._version)
            if self._claimed:
                sharding.LEASE_CHANGES.labels(self.group, "released").inc(len(self._claimed))
        except Exception as exc:
            log.info("membership record delete failed; it will expire", group=self.group, error=type(exc).__name__)

    async def _report(self) -> None:
        after = self.owned_shards()
        interrupted, self._interrupted = self._interrupted, set()
        gained = (after - self._reported) | (after & interrupted)
        lost = (self._reported - after) | (self._reported & interrupted)
        self._reported = after
        sharding.SHARDS_OWNED.labels(self.group).set(len(after))
        if not (gained or lost):
            return
        if gained:
            sharding.LEASE_CHANGES.labels(self.group, "gained").inc(len(gained))
        if lost:
            sharding.LEASE_CHANGES.labels(self.group, "lost").inc(len(lost))
        log.info(
            "shards changed",
            group=self.group,
            replica=self.replica_id,
            gained=sorted(gained),
            lost=sorted(lost),
            owned=len(after),
        )
        if self.on_change is not None:
            try:
                result = self.on_change(sharding.ShardChange(gained, lost))
                if result is not None:
                    await result
            except Exception as exc:
                log.error("shard change callback failed", group=self.group, error=f"{type(exc).__name__}: {exc}")
