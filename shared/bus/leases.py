"""Leases in NATS KV: sharded ownership of resource keys (the membership protocol of
:mod:`shared.membership` with its records in NATS KV), and single-key leader leases.

The rest of this docstring is about the leader lease.

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
from shared.bus.bus import Bus
from shared.bus.errors import InvalidResourceName
from shared.bus.settings import BusSettings
from shared.log import get_logger
from shared.membership import LeaseTiming, Member, Membership, StaleRecord
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


class MemberValue(msgspec.Struct, frozen=True):
    """The value of a member key in ``runnerscale_members`` (readable with ``nats kv get``)."""

    replica: str
    instance: str
    claims: list[int] = []
    duration: float = 0.0


def membership_timing(settings: BusSettings) -> LeaseTiming:
    """The membership protocol's durations on NATS: ``D`` = the bucket TTL (the server also removes
    a key that stopped being written after ``D``), written every ``renew_interval``, listed twice
    as often; membership requests get at most ``D/5`` (the time fence needs ``V + T < D``)."""
    renew = settings.effective_renew_interval
    return LeaseTiming(
        duration=settings.lease_ttl,
        renew_period=renew,
        list_period=renew / 2,
        request_timeout=min(settings.request_timeout, settings.lease_ttl / 5),
    )


class NatsMemberStore:
    """Membership records as keys ``<group>.<replica>_<instance>`` of ``runnerscale_members``."""

    def __init__(
        self, bus: Bus, kv: KeyValue, group: str, *, replica_id: str, shards: int, timing: LeaseTiming
    ) -> None:
        holder = make_holder(replica_id)
        self.bus = bus
        self.kv = kv
        self.group = group
        self.replica_id = replica_id
        self.instance = holder.instance
        self.identity = f"{replica_id}_{holder.instance}"
        self.own_name = subjects.member_key(group, self.identity)
        self.shards = shards
        self.timing = timing

    async def list(self) -> list[Member]:
        # One request names the group's keys (expired ones are gone from the stream), one get each.
        filt = f"$KV.{subjects.MEMBERS_BUCKET}.{subjects.encode_token(self.group)}.>"
        with anyio.fail_after(self.timing.timeout):
            info = await self.bus.js.stream_info(f"KV_{subjects.MEMBERS_BUCKET}", subjects_filter=filt)
        prefix = f"$KV.{subjects.MEMBERS_BUCKET}."
        out: list[Member] = []
        for subject in info.state.subjects or {}:
            key = subject.removeprefix(prefix)
            try:
                with anyio.fail_after(self.timing.timeout):
                    entry = await self.kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                continue
            if entry.value is None or entry.revision is None:
                continue
            try:
                value = msgspec.json.decode(entry.value, type=MemberValue)
            except (msgspec.ValidationError, msgspec.DecodeError):
                value = MemberValue(replica="", instance="")
            out.append(
                Member(
                    name=key,
                    version=str(entry.revision),
                    identity=f"{value.replica}_{value.instance}" if value.replica else "",
                    claims=frozenset(s for s in value.claims if 0 <= s < self.shards),
                    duration=value.duration,
                )
            )
        return out

    async def write(self, claims: frozenset[int], version: str | None) -> str:
        value = msgspec.json.encode(MemberValue(self.replica_id, self.instance, sorted(claims), self.timing.duration))
        try:
            with anyio.fail_after(self.timing.timeout):
                if version is None:
                    revision = await self.kv.create(self.own_name, value)
                else:
                    revision = await self.kv.update(self.own_name, value, last=int(version))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise StaleRecord(self.own_name) from None
        return str(revision)

    async def delete(self, name: str, version: str) -> None:
        try:
            with anyio.fail_after(self.timing.timeout):
                await self.kv.delete(name, last=int(version))
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
            pass  # changed (alive again) or gone


class ShardOwnership(Membership):
    """This replica's share of a group's shards, its membership record in NATS KV; use :meth:`join`.

    The protocol is :mod:`shared.membership` (README "Shard ownership leases"), the same as
    :class:`shared.kube.leases.KubeShardOwnership`'s.
    """

    store: NatsMemberStore

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
        """Join ``group`` and keep listing/claiming/renewing until the block exits, then leave."""
        timing = membership_timing(bus.settings)
        count = shards or bus.settings.shards
        kv = await bus.key_value(subjects.MEMBERS_BUCKET)
        store = NatsMemberStore(bus, kv, group, replica_id=replica_id, shards=count, timing=timing)
        self = cls(store, group, replica_id=replica_id, shards=count, timing=timing, on_change=on_change)
        async with self.running():
            yield self


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
