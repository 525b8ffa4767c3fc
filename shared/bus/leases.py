"""Leases in NATS KV: sharded ownership of resource keys, and single-key leader leases.

A lease is a KV key whose value names the holder. It is taken with ``create`` (fails if the
key exists), renewed with ``update(last=revision)`` (fails if anyone else wrote it since), and
released with ``delete(last=revision)``. The bucket's TTL (``lease_ttl``) removes a key that
stopped being renewed, so a dead replica's leases become free after at most one TTL.

A replica trusts a lease locally only until ``sent + lease_validity`` where ``sent`` is the
moment it *sent* the last successful create/renew and ``lease_validity < lease_ttl``. The
server stamps the key no earlier than ``sent``, so it expires it no earlier than ``sent +
lease_ttl``: the old holder has stopped trusting the lease before anyone else can take it,
even if its renewals fail silently (network partition, NATS down, a stalled event loop).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import msgspec
import nats.js.errors
from nats.js.kv import KeyValue

from shared import shards as sharding
from shared.bus import metrics as m
from shared.bus import subjects
from shared.bus.bus import Bus, is_transient
from shared.bus.errors import InvalidResourceName
from shared.log import get_logger
from shared.tasks import background_tasks

log = get_logger(__name__)

_KV_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=/.")


def _now() -> float:
    return anyio.current_time()


class Holder(msgspec.Struct, frozen=True):
    """The value of a lease key (readable with ``nats kv get``)."""

    replica: str
    instance: str  # random per process: a restarted replica of the same name is another holder


@dataclass
class _Lease:
    """One lease this process believes it holds."""

    key: str
    revision: int
    valid_until: float  # anyio clock
    scopes: set[anyio.CancelScope] = field(default_factory=set)


class _LeaseStore:
    """The KV operations of leasing, each with a deadline; errors other than 'someone else has it' propagate."""

    def __init__(self, kv: KeyValue, holder: Holder, *, validity: float, timeout: float) -> None:
        self.kv = kv
        self.holder = holder
        self.value = msgspec.json.encode(holder)
        self.validity = validity
        self.timeout = timeout

    async def claim(self, key: str) -> _Lease | None:
        """Take ``key`` if it is free (or already ours from an unacknowledged write); None if taken."""
        sent = _now()
        try:
            with anyio.fail_after(self.timeout):
                revision = await self.kv.create(key, self.value)
            return _Lease(key, revision, sent + self.validity)
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        # Taken. If the value is ours (a create whose ack we lost), continue from its revision.
        try:
            with anyio.fail_after(self.timeout):
                entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None  # expired between the two calls; next round will create it
        if entry.value != self.value or entry.revision is None:
            return None
        return await self.renew(_Lease(key, entry.revision, sent))

    async def renew(self, lease: _Lease) -> _Lease | None:
        """Extend ``lease``; None if it is no longer ours (someone else wrote the key)."""
        sent = _now()
        try:
            with anyio.fail_after(self.timeout):
                revision = await self.kv.update(lease.key, self.value, last=lease.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            # Maybe our previous renew landed but its ack was lost: adopt it if the value is ours.
            try:
                with anyio.fail_after(self.timeout):
                    entry = await self.kv.get(lease.key)
            except nats.js.errors.KeyNotFoundError:
                return None
            if entry.value != self.value or entry.revision is None or entry.revision == lease.revision:
                return None
            lease.revision = entry.revision
            return await self.renew(lease)
        lease.revision = revision
        lease.valid_until = sent + self.validity
        return lease

    async def release(self, lease: _Lease) -> None:
        try:
            with anyio.fail_after(self.timeout):
                await self.kv.delete(lease.key, last=lease.revision)
        except Exception as exc:
            log.info("lease release failed; it will expire", key=lease.key, error=type(exc).__name__)


def _lose(lease: _Lease) -> None:
    for scope in list(lease.scopes):
        scope.cancel()


def _extend(lease: _Lease) -> None:
    for scope in lease.scopes:
        scope.deadline = lease.valid_until


def make_holder(replica_id: str) -> Holder:
    return Holder(replica=replica_id, instance=secrets.token_hex(6))


# --- shard ownership -------------------------------------------------------------------------


class ShardOwnership:
    """This replica's share of a group's shards; use :meth:`join`.

    A worker calls :meth:`owns` to filter work and ``async with ownership.held(key):`` (or
    :meth:`check`) right before a write. ``on_change`` is called with gained/lost shards after
    every round that changed them (gained: re-list those keys from Kubernetes; lost: stop).
    """

    def __init__(
        self,
        bus: Bus,
        group: str,
        *,
        replica_id: str,
        shards: int | None = None,
        on_change: sharding.ChangeCallback | None = None,
    ) -> None:
        self.bus = bus
        self.group = group
        self.replica_id = replica_id
        self.shards = shards or bus.settings.shards
        self.on_change = on_change
        self.holder = make_holder(replica_id)
        self._held: dict[int, _Lease] = {}
        self._preference = sharding.preference_order(replica_id, self.shards)
        self._abandoned = False
        self._store: _LeaseStore | None = None
        self._members_kv: KeyValue | None = None
        self._first_round = anyio.Event()
        self._reported: frozenset[int] = frozenset()
        self.members = 1

    @classmethod
    @asynccontextmanager
    async def join(
        cls,
        bus: Bus,
        group: str,
        *,
        replica_id: str,
        shards: int | None = None,
        on_change: sharding.ChangeCallback | None = None,
    ) -> AsyncIterator[ShardOwnership]:
        """Join ``group`` and keep claiming/renewing until the block exits, then release."""
        self = cls(bus, group, replica_id=replica_id, shards=shards, on_change=on_change)
        s = bus.settings
        self._store = _LeaseStore(
            await bus.key_value(subjects.SHARDS_BUCKET),
            self.holder,
            validity=s.lease_validity,
            timeout=s.request_timeout,
        )
        self._members_kv = await bus.key_value(subjects.MEMBERS_BUCKET)
        try:
            async with background_tasks(self._run):
                yield self
        finally:
            if not self._abandoned:
                with anyio.CancelScope(shield=True), anyio.move_on_after(s.request_timeout):
                    await self._leave()
            # Whatever happened above, nothing maintains these leases any more.
            for lease in self._held.values():
                _lose(lease)
            self._held.clear()
            sharding.SHARDS_OWNED.labels(group).set(0)

    # -- queries (pure, local) --

    def shard_of(self, key: str) -> int:
        return sharding.shard_of(key, self.shards)

    def owned_shards(self) -> frozenset[int]:
        """Shards whose lease is locally valid right now."""
        now = _now()
        return frozenset(s for s, lease in self._held.items() if now < lease.valid_until)

    def owns(self, key: str) -> bool:
        lease = self._held.get(self.shard_of(key))
        return lease is not None and _now() < lease.valid_until

    def check(self, key: str) -> None:
        """Raise :class:`shared.shards.NotOwner` unless this replica holds ``key``'s shard right now."""
        if not self.owns(key):
            raise sharding.NotOwner(key, self.shard_of(key))

    @asynccontextmanager
    async def held(self, key: str) -> AsyncIterator[None]:
        """Run the block only while holding ``key``: raises NotOwner at entry, or when the lease
        is lost or lapses mid-block (the block is cancelled at that moment)."""
        shard = self.shard_of(key)
        lease = self._held.get(shard)
        if lease is None or _now() >= lease.valid_until:
            raise sharding.NotOwner(key, shard)
        with anyio.CancelScope(deadline=lease.valid_until) as scope:
            lease.scopes.add(scope)
            try:
                yield
            finally:
                lease.scopes.discard(scope)
        if scope.cancelled_caught:
            raise sharding.NotOwner(key, shard)

    async def wait_ready(self) -> None:
        """Wait for the first claim round (so :meth:`owns` reflects a real decision)."""
        await self._first_round.wait()

    def abandon(self) -> None:
        """Stop without releasing anything, as a crash would (tests, and fatal errors)."""
        self._abandoned = True

    # -- the loop --

    async def _run(self) -> None:
        interval = self.bus.settings.effective_renew_interval
        while True:
            try:
                await self._round()
            except Exception as exc:
                if is_transient(exc):
                    log.info("shard round skipped: NATS unavailable", group=self.group, error=type(exc).__name__)
                else:
                    log.warning("shard round failed", group=self.group, error=f"{type(exc).__name__}: {exc}")
                await self._expire_lapsed()
            self._first_round.set()
            await anyio.sleep(interval)

    async def _round(self) -> None:
        assert self._store is not None and self._members_kv is not None
        with anyio.fail_after(self.bus.settings.request_timeout):
            await self._members_kv.put(
                subjects.member_key(self.group, self.replica_id), msgspec.json.encode(self.holder)
            )
        self.members = await self._count_members()
        lost_now: set[int] = set()
        for shard, lease in list(self._held.items()):
            renewed = None
            try:
                renewed = await self._store.renew(lease)
            except Exception as exc:
                if _now() < lease.valid_until:
                    log.info("renew failed, lease still valid locally", shard=shard, error=type(exc).__name__)
                    continue
            if renewed is None:
                lost_now.add(shard)
                del self._held[shard]
                _lose(lease)
            else:
                _extend(lease)
        to_claim, to_release = sharding.plan_claims(set(self._held), self.shards, self.members, self._preference)
        for shard in to_release:
            lease = self._held.pop(shard)
            _lose(lease)
            await self._store.release(lease)
            sharding.LEASE_CHANGES.labels(self.group, "released").inc()
        share = sharding.fair_share(self.shards, self.members)
        for shard in to_claim:
            if len(self._held) >= share:
                break
            claimed = await self._store.claim(subjects.shard_lease_key(self.group, shard))
            if claimed is not None:
                self._held[shard] = claimed
        await self._report()

    async def _expire_lapsed(self) -> None:
        now = _now()
        for shard, lease in list(self._held.items()):
            if now >= lease.valid_until:
                del self._held[shard]
                _lose(lease)
        await self._report()

    async def _report(self) -> None:
        after = self.owned_shards()
        gained, lost = after - self._reported, self._reported - after
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

    async def _count_members(self) -> int:
        # One request lists the live member keys: expired ones are gone from the stream, and a
        # clean leave purges its key rather than leaving a delete marker.
        filt = f"$KV.{subjects.MEMBERS_BUCKET}.{subjects.encode_token(self.group)}.>"
        with anyio.fail_after(self.bus.settings.request_timeout):
            info = await self.bus.js.stream_info(f"KV_{subjects.MEMBERS_BUCKET}", subjects_filter=filt)
        return max(1, len(info.state.subjects or {}))

    async def _leave(self) -> None:
        assert self._store is not None
        for lease in list(self._held.values()):
            _lose(lease)
            await self._store.release(lease)
            sharding.LEASE_CHANGES.labels(self.group, "released").inc()
        self._held.clear()
        member_subject = f"$KV.{subjects.MEMBERS_BUCKET}.{subjects.member_key(self.group, self.replica_id)}"
        try:
            await self.bus.js.purge_stream(f"KV_{subjects.MEMBERS_BUCKET}", subject=member_subject)
        except Exception as exc:
            log.info("member key purge failed; it will expire", error=type(exc).__name__)


# --- leader lease ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One period of leadership. ``epoch`` increases with every new leader (a fencing token)."""

    epoch: int


def validate_lease_name(name: str) -> str:
    if not name or name.startswith(".") or name.endswith(".") or ".." in name or not set(name) <= _KV_KEY_CHARS:
        raise InvalidResourceName(
            f"lease name {name!r} is not a valid KV key (use subjects.listener_lease_name or encode_token)"
        )
    return name


class LeaderLease:
    """Exactly one holder of ``name`` among all replicas; use :meth:`join`.

    ::

        async with LeaderLease.join(bus, subjects.listener_lease_name(ns, name), replica_id=pod) as lease:
            while True:
                async with lease.leadership() as term:   # waits to become leader
                    await run_session(epoch=term.epoch)  # cancelled the moment leadership is lost
    """

    def __init__(self, bus: Bus, name: str, *, replica_id: str) -> None:
        self.bus = bus
        self.name = validate_lease_name(name)
        self.replica_id = replica_id
        self.holder = make_holder(replica_id)
        self._lease: _Lease | None = None
        self._epoch: int | None = None
        self._changed = anyio.Event()
        self._abandoned = False
        self._store: _LeaseStore | None = None

    @classmethod
    @asynccontextmanager
    async def join(cls, bus: Bus, name: str, *, replica_id: str) -> AsyncIterator[LeaderLease]:
        self = cls(bus, name, replica_id=replica_id)
        s = bus.settings
        self._store = _LeaseStore(
            await bus.key_value(subjects.LEADERS_BUCKET),
            self.holder,
            validity=s.lease_validity,
            timeout=s.request_timeout,
        )
        try:
            async with background_tasks(self._run):
                yield self
        finally:
            lease, self._lease = self._lease, None
            if lease is not None:
                _lose(lease)
                if not self._abandoned:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(s.request_timeout):
                        await self._store.release(lease)
                    sharding.LEASE_CHANGES.labels(self.name, "released").inc()
            m.LEADER.labels(self.name).set(0)

    @property
    def is_leader(self) -> bool:
        return self._lease is not None and _now() < self._lease.valid_until

    @property
    def epoch(self) -> int | None:
        """The current term's epoch while leader, else None."""
        return self._epoch if self.is_leader else None

    def check(self) -> None:
        if not self.is_leader:
            raise sharding.NotOwner(self.name)

    def abandon(self) -> None:
        """Stop without releasing, as a crash would."""
        self._abandoned = True

    async def wait_leader(self) -> Term:
        while not self.is_leader:
            await self._changed.wait()
        assert self._epoch is not None
        return Term(self._epoch)

    @asynccontextmanager
    async def leadership(self) -> AsyncIterator[Term]:
        """Wait until leader, then run the block; it is cancelled (and the block exits normally)
        when leadership is lost or lapses. Check ``lease.is_leader`` after the block if needed."""
        term = await self.wait_leader()
        lease = self._lease
        assert lease is not None
        with anyio.CancelScope(deadline=lease.valid_until) as scope:
            lease.scopes.add(scope)
            try:
                yield term
            finally:
                lease.scopes.discard(scope)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _run(self) -> None:
        assert self._store is not None
        interval = self.bus.settings.effective_renew_interval
        while True:
            was_leader = self.is_leader
            try:
                if self._lease is None:
                    lease = await self._store.claim(self.name)
                    if lease is not None:
                        self._lease, self._epoch = lease, lease.revision
                else:
                    renewed = await self._store.renew(self._lease)
                    if renewed is None:
                        lost, self._lease = self._lease, None
                        _lose(lost)
                    else:
                        _extend(renewed)
            except Exception as exc:
                log.info("leader lease round failed", lease=self.name, error=type(exc).__name__)
            if self._lease is not None and _now() >= self._lease.valid_until:
                lost, self._lease = self._lease, None
                _lose(lost)
            if self.is_leader != was_leader:
                change = "gained" if self.is_leader else "lost"
                sharding.LEASE_CHANGES.labels(self.name, change).inc()
                m.LEADER.labels(self.name).set(1 if self.is_leader else 0)
                log.info(f"leadership {change}", lease=self.name, replica=self.replica_id, epoch=self._epoch)
                self._notify()
            await anyio.sleep(interval)
