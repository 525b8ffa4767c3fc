"""Sharded ownership of resource keys held in Kubernetes Leases (coordination.k8s.io/v1).

Why here and not in NATS KV: the writes a shard lease protects go to the Kubernetes API server,
so the lease lives there too. A NATS outage then changes nothing about who owns what (workers keep
reconciling from Kubernetes, issue 5), and a replica cut off from the API server loses its leases
at the same moment it loses the ability to write. See README "Shard ownership leases".

Objects, in ``namespace`` (default ``$POD_NAMESPACE``, else ``runnerscale-system``):

- ``runnerscale-<group>-shard-<n>``: one per shard; ``spec.holderIdentity`` is the owner
  (``<replica>_<random>``: a restarted pod of the same name is another holder).
- ``runnerscale-<group>-member-<replica>``: one per live replica, renewed every round, so each
  replica claims only its fair share ``ceil(shards / live members)``.

Protocol (client-go's leader election, per shard). Every round (``renew_period``, default
``duration / 3``) a replica lists the group's leases once, renews the shards it holds with a merge
patch carrying the listed ``resourceVersion`` (409: re-read and decide again), releases shards
above its fair share, and claims shards that are free (no lease, empty holder) or expired. A
lease is *expired* only when this replica has seen the same resourceVersion for a full
``max(duration, spec.leaseDurationSeconds)`` by its own monotonic clock, counted from when it
first *observed* that version; ``renewTime`` is informational and never compared across machines,
so no clock synchronisation is assumed. A clean shutdown clears ``holderIdentity`` (with the
resourceVersion of our last write) and deletes the member lease, so peers take over on their next
round.

The local validity deadline (why a replica stops acting before anyone else can start): let ``s``
be the moment this replica *sent* its last successful acquire/renew, ``D`` the duration, ``T``
``request_timeout`` and ``V`` the validity. The write that succeeded was applied by the server at
some ``l >= s``; a peer can only ever observe that version at ``>= l``, and only acquires (with
that version, else the compare-and-swap fails with 409) after seeing it unchanged for ``D``, so
no peer holds the shard before ``s + D``. This replica trusts the lease only until
``s + V`` with ``V = D - T - margin`` (margin = ``D / 10``, for clock-rate differences between
machines and scheduling). A Kubernetes write sent under the lease before ``s + V`` and applied
within ``T`` of being sent therefore lands before ``s + V + T < s + D``: before any other replica
can have acquired the shard. Defaults: ``D`` = 15 s, ``T`` = ``D/5`` = 3 s, margin 1.5 s,
``V`` = 10.5 s, renewals every 5 s (a failed one is retried after 2.5 s), so two renewal attempts
can fail before the shard lapses locally. A write that reaches the server later than ``T`` after
it was sent is not covered by the time fence; resourceVersion preconditions and deterministic
object names (a second create is ``AlreadyExists``) are the second line (README "Kubernetes access layer").

Hand-over bound: a crashed replica's last renewal landed at ``l``; a peer lists every ``R`` so it
first sees that version by ``l + R`` and acquires ``D`` later: within ``D + R`` (20 s with the
defaults) of the crash, plus request latency. A clean shutdown hands over within one round (``R``).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from shared import shards as sharding
from shared.kube.client import KubeClient
from shared.kube.errors import AlreadyExists, Conflict, Forbidden, KubeError, NotFound
from shared.kube.objects import Lease, micro_time
from shared.kube.reader import ApiReader
from shared.kube.resources import LEASES, NAMESPACES, ObjectKey
from shared.kube.writer import ApiWriter
from shared.log import get_logger
from shared.tasks import background_tasks

log = get_logger(__name__)

DEFAULT_NAMESPACE = "runnerscale-system"
DEFAULT_DURATION = 15.0
DEFAULT_SHARDS = 16
GROUP_LABEL = "runnerscale.io/lease-group"
ROLE_LABEL = "runnerscale.io/lease-role"
PART_OF_LABEL = "app.kubernetes.io/part-of"

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_NAMESPACE",
    "KubeShardOwnership",
    "LeaseTiming",
    "default_lease_namespace",
    "member_lease_name",
    "shard_lease_name",
]


def _now() -> float:
    return anyio.current_time()


def _wall() -> str:
    return micro_time(datetime.now(UTC))


def default_lease_namespace(environ: Mapping[str, str] | None = None) -> str:
    """The worker's own namespace (``POD_NAMESPACE``, from the Downward API), else ``runnerscale-system``."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAMESPACE") or DEFAULT_NAMESPACE


_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def _dns_part(text: str, limit: int) -> str:
    """``text`` as a DNS-1123 label fragment of at most ``limit`` characters (a hash keeps it unique)."""
    clean = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if clean == text and len(clean) <= limit:
        return clean
    digest = f"{zlib.crc32(text.encode()):08x}"
    return f"{clean[: max(1, limit - 9)].strip('-')}-{digest}"


def shard_lease_name(group: str, shard: int) -> str:
    return f"runnerscale-{_dns_part(group, 200)}-shard-{shard}"


def member_lease_name(group: str, replica_id: str) -> str:
    return f"runnerscale-{_dns_part(group, 120)}-member-{_dns_part(replica_id, 100)}"


def _label_value(text: str) -> str:
    return _dns_part(text, 63)


@dataclass(frozen=True)
class LeaseTiming:
    """The durations of the protocol (seconds); see the module docstring for the arithmetic."""

    duration: float = DEFAULT_DURATION
    renew_period: float = 0.0  # 0: duration / 3
    request_timeout: float = 0.0  # 0: duration / 5; the deadline of every lease request

    def __post_init__(self) -> None:
        if self.duration <= 0:
            raise ValueError(f"lease duration must be > 0, got {self.duration}")
        if self.validity <= self.period:
            raise ValueError(
                f"lease timing leaves no room to renew: validity {self.validity:.2f}s (duration - request timeout - "
                f"margin) must exceed the renew period {self.period:.2f}s"
            )

    @property
    def period(self) -> float:
        return self.renew_period or self.duration / 3

    @property
    def retry_period(self) -> float:
        """The pause after a round in which something failed."""
        return self.period / 2

    @property
    def timeout(self) -> float:
        return self.request_timeout or self.duration / 5

    @property
    def margin(self) -> float:
        return self.duration / 10

    @property
    def validity(self) -> float:
        """How long after sending a successful acquire/renew this replica still acts on the lease."""
        return self.duration - self.timeout - self.margin

    @property
    def duration_seconds(self) -> int:
        """``spec.leaseDurationSeconds`` (an integer: rounded up, never shorter than ``duration``)."""
        return max(1, math.ceil(self.duration))

    @property
    def handover_bound(self) -> float:
        """A crashed replica's shards are taken over within this long (plus request latency)."""
        return self.duration + self.period


@dataclass
class _Held:
    """A shard lease this replica believes it holds."""

    shard: int
    name: str
    resource_version: str
    transitions: int
    valid_until: float  # anyio clock
    scopes: set[anyio.CancelScope] = field(default_factory=set)


@dataclass
class _Seen:
    """The last version of a lease this replica observed, and when it first saw that version."""

    resource_version: str
    holder: str
    duration: float
    transitions: int
    since: float  # anyio clock


def _lose(lease: _Held) -> None:
    for scope in list(lease.scopes):
        scope.cancel()


def _extend(lease: _Held) -> None:
    for scope in lease.scopes:
        scope.deadline = lease.valid_until


class KubeShardOwnership:
    """This replica's share of a group's shards, leased in Kubernetes; use :meth:`join`.

    The public interface is that of :class:`shared.bus.leases.ShardOwnership`: :meth:`owns` to
    filter work, ``async with ownership.held(key):`` (or :meth:`check`, raising
    :class:`shared.shards.NotOwner`) right before a write, ``on_change`` called with
    gained/lost shards after every round that changed them, :meth:`owned_shards`,
    :meth:`shard_of`, :meth:`wait_ready`, ``members`` and :meth:`abandon`.
    """

    def __init__(
        self,
        kube: KubeClient,
        group: str,
        *,
        replica_id: str,
        shards: int | None = None,
        namespace: str | None = None,
        timing: LeaseTiming | None = None,
        on_change: sharding.ChangeCallback | None = None,
    ) -> None:
        if not replica_id:
            raise ValueError("replica_id must not be empty")
        self.group = group
        self.replica_id = replica_id
        self.shards = shards or DEFAULT_SHARDS
        if self.shards < 1:
            raise ValueError("shards must be >= 1")
        self.namespace = namespace or default_lease_namespace()
        self.timing = timing or LeaseTiming()
        self.on_change = on_change
        self.identity = f"{replica_id}_{secrets.token_hex(4)}"
        self.reader = ApiReader(kube)
        self.writer = ApiWriter(kube)
        self.members = 1
        self._labels = {GROUP_LABEL: _label_value(group), PART_OF_LABEL: "runnerscale"}
        self._selector = f"{GROUP_LABEL}={_label_value(group)}"
        self._names = [shard_lease_name(group, s) for s in range(self.shards)]
        self._member_name = member_lease_name(group, replica_id)
        self._held: dict[int, _Held] = {}
        self._seen: dict[str, _Seen] = {}
        self._preference = sharding.preference_order(replica_id, self.shards)
        self._abandoned = False
        self._first_round = anyio.Event()
        self._reported: frozenset[int] = frozenset()

    @classmethod
    @asynccontextmanager
    async def join(
        cls,
        kube: KubeClient,
        group: str,
        *,
        replica_id: str,
        shards: int | None = None,
        namespace: str | None = None,
        timing: LeaseTiming | None = None,
        on_change: sharding.ChangeCallback | None = None,
    ) -> AsyncIterator[KubeShardOwnership]:
        """Join ``group`` and keep claiming/renewing until the block exits, then release."""
        self = cls(
            kube, group, replica_id=replica_id, shards=shards, namespace=namespace, timing=timing, on_change=on_change
        )
        try:
            async with background_tasks(self._run):  # the block's own exception propagates unwrapped
                yield self
        finally:
            if not self._abandoned:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.timing.timeout * 2):
                    await self._leave()
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
        while True:
            ok = False
            try:
                ok = await self._round()
            except KubeError as exc:
                log.info(
                    "shard round incomplete: Kubernetes API unavailable",
                    group=self.group,
                    error=f"{type(exc).__name__}: {exc}",
                )
            except Exception as exc:
                log.warning("shard round failed", group=self.group, error=f"{type(exc).__name__}: {exc}")
            self._expire_lapsed()
            await self._report()
            self._first_round.set()
            await anyio.sleep(self.timing.period if ok else self.timing.retry_period)

    async def _round(self) -> bool:
        """One round; False when something failed (the next round comes sooner).

        Requests of one kind run concurrently, so a round takes about three request times at worst
        (heartbeat and list, renewals, claims), whatever the number of shards."""
        outcome: dict[str, Any] = {}

        async def heartbeat() -> None:
            outcome["heartbeat"] = await self._heartbeat()

        async def list_leases() -> None:
            try:
                outcome["listed"] = await self.reader.list(
                    LEASES, namespace=self.namespace, label_selector=self._selector, timeout=self.timing.timeout
                )
            except Forbidden as exc:
                log.error(
                    "lease list forbidden: grant get, list, create, patch and delete on coordination.k8s.io leases in the lease namespace",
                    group=self.group,
                    namespace=self.namespace,
                    error=str(exc),
                )
            except KubeError as exc:
                log.info(
                    "lease list failed; renewing held shards only",
                    group=self.group,
                    error=f"{type(exc).__name__}: {exc}",
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            tg.start_soon(list_leases)
        ok = bool(outcome.get("heartbeat"))
        listed = outcome.get("listed")
        if listed is None:
            # Still renew what we hold, locked on our own last writes; claim nothing blind.
            await self._renew_all(None)
            return False
        now = _now()
        by_name = {lease.metadata.name: lease for lease in listed.items}
        self._observe(by_name, now)
        self.members = self._count_members(by_name, now)
        if not await self._renew_all(by_name):
            ok = False

        to_claim, to_release = sharding.plan_claims(
            set(self.owned_shards()), self.shards, self.members, self._preference
        )
        for shard in to_release:
            await self._release(self._held.pop(shard))
        wanted = sharding.fair_share(self.shards, self.members) - len(self.owned_shards())
        now = _now()
        claims = [shard for shard in to_claim if self._claimable(shard, now)][: max(0, wanted)]
        failures: list[int] = []

        async def claim(shard: int) -> None:
            try:
                await self._acquire(shard)
            except KubeError as exc:
                failures.append(shard)
                log.info("shard claim failed", group=self.group, shard=shard, error=f"{type(exc).__name__}: {exc}")

        async with anyio.create_task_group() as tg:
            for shard in claims:
                tg.start_soon(claim, shard)
        return ok and not failures

    # -- observation --

    def _observe(self, by_name: dict[str, Lease], now: float) -> None:
        for name, lease in by_name.items():
            rv = lease.metadata.resource_version
            seen = self._seen.get(name)
            if seen is None or seen.resource_version != rv:
                spec = lease.spec
                self._seen[name] = _Seen(
                    resource_version=rv,
                    holder=spec.holder_identity or "",
                    duration=float(spec.lease_duration_seconds or 0),
                    transitions=spec.lease_transitions or 0,
                    since=now,
                )
        for name in list(self._seen):
            if name not in by_name:
                del self._seen[name]

    def _expired(self, seen: _Seen, now: float) -> bool:
        return now - seen.since >= max(seen.duration, self.timing.duration)

    def _count_members(self, by_name: dict[str, Lease], now: float) -> int:
        live = {self._member_name}
        for name, lease in by_name.items():
            if lease.metadata.labels.get(ROLE_LABEL) != "member":
                continue
            seen = self._seen[name]
            if seen.holder and not self._expired(seen, now):
                live.add(name)
        return len(live)

    def _claimable(self, shard: int, now: float) -> bool:
        seen = self._seen.get(self._names[shard])
        return seen is None or not seen.holder or seen.holder == self.identity or self._expired(seen, now)

    # -- writes (each with the request deadline) --

    def _meta(self, name: str, role: str) -> dict[str, Any]:
        return {"name": name, "namespace": self.namespace, "labels": {**self._labels, ROLE_LABEL: role}}

    async def _heartbeat(self) -> bool:
        """Renew this replica's member lease (last-write-wins on purpose: it only counts replicas)."""
        stamp = _wall()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.timing.duration_seconds,
            "renewTime": stamp,
        }
        try:
            await self.writer.patch_merge(
                LEASES, ObjectKey(self.namespace, self._member_name), {"spec": spec}, timeout=self.timing.timeout
            )
            return True
        except NotFound:
            pass
        except KubeError as exc:
            log.info("member lease renewal failed", group=self.group, error=f"{type(exc).__name__}: {exc}")
            return False
        body = {"metadata": self._meta(self._member_name, "member"), "spec": {**spec, "acquireTime": stamp}}
        with suppress(AlreadyExists):
            await self._create(body)
        return True

    async def _create(self, body: dict[str, Any]) -> Lease:
        try:
            return await self.writer.create(LEASES, body, namespace=self.namespace, timeout=self.timing.timeout)
        except NotFound:
            await self._ensure_namespace()
            return await self.writer.create(LEASES, body, namespace=self.namespace, timeout=self.timing.timeout)

    async def _ensure_namespace(self) -> None:
        try:
            await self.writer.create(NAMESPACES, {"metadata": {"name": self.namespace}}, timeout=self.timing.timeout)
            log.info("created the lease namespace", namespace=self.namespace)
        except AlreadyExists:
            pass
        except Forbidden as exc:
            log.error(
                "lease namespace is missing and cannot be created: create it or set the lease namespace",
                namespace=self.namespace,
                error=str(exc),
            )
            raise

    def _holding(self, shard: int, lease: Lease, sent: float) -> _Held:
        return _Held(
            shard=shard,
            name=self._names[shard],
            resource_version=lease.metadata.resource_version,
            transitions=lease.spec.lease_transitions or 0,
            valid_until=sent + self.timing.validity,
        )

    async def _acquire(self, shard: int) -> None:
        """Take a free or expired shard lease (compare-and-swap on the observed version)."""
        name = self._names[shard]
        seen = self._seen.get(name)
        stamp = _wall()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.timing.duration_seconds,
            "acquireTime": stamp,
            "renewTime": stamp,
        }
        sent = _now()
        try:
            if seen is None:
                spec["leaseTransitions"] = 0
                stored = await self._create({"metadata": self._meta(name, "shard"), "spec": spec})
            else:
                if seen.holder == self.identity:
                    del spec["acquireTime"]  # ours already (a write whose answer we lost): just renew
                    spec["leaseTransitions"] = seen.transitions
                else:
                    spec["leaseTransitions"] = seen.transitions + 1
                stored = await self.writer.patch_merge(
                    LEASES,
                    ObjectKey(self.namespace, name),
                    {"spec": spec},
                    resource_version=seen.resource_version,
                    timeout=self.timing.timeout,
                )
        except (AlreadyExists, Conflict, NotFound):
            return  # someone else moved first; the next round sees the new state
        if stored.spec.holder_identity != self.identity:
            return
        self._held[shard] = self._holding(shard, stored, sent)
        self._seen.pop(name, None)

    async def _renew_all(self, by_name: dict[str, Lease] | None) -> bool:
        """Renew every held lease concurrently; False if any renewal failed."""
        results: list[bool] = []

        async def renew_one(lease: _Held) -> None:
            results.append(await self._renew(lease, by_name))

        async with anyio.create_task_group() as tg:
            for lease in list(self._held.values()):
                tg.start_soon(renew_one, lease)
        return all(results)

    async def _renew(self, lease: _Held, by_name: dict[str, Lease] | None) -> bool:
        """Renew a held lease (compare-and-swap on the version read); True unless the renewal
        failed. A lease someone else now holds is dropped at once; on other errors it is kept
        until its local deadline. ``by_name`` None: no fresh list, lock on our own last write."""
        key = ObjectKey(self.namespace, lease.name)
        rv = lease.resource_version
        if by_name is not None:
            listed = by_name.get(lease.name)
            if listed is None or listed.spec.holder_identity != self.identity:
                self._drop(lease, "taken" if listed is not None else "deleted")
                return True
            rv = listed.metadata.resource_version
        for _ in range(2):
            sent = _now()
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.timing.duration_seconds,
                "renewTime": _wall(),
            }
            try:
                stored = await self.writer.patch_merge(
                    LEASES, key, {"spec": spec}, resource_version=rv, timeout=self.timing.timeout
                )
            except Conflict:
                try:  # decided on stale data: re-read and decide again
                    current = await self.reader.get_or_none(LEASES, key, timeout=self.timing.timeout)
                except KubeError as exc:
                    log.info("lease re-read failed", group=self.group, shard=lease.shard, error=type(exc).__name__)
                    return False
                if current is None or current.spec.holder_identity != self.identity:
                    self._drop(lease, "taken" if current is not None else "deleted")
                    return True
                rv = current.metadata.resource_version
                continue
            except NotFound:
                self._drop(lease, "deleted")
                return True
            except KubeError as exc:
                log.info(
                    "lease renewal failed; still valid locally until its deadline",
                    group=self.group,
                    shard=lease.shard,
                    error=f"{type(exc).__name__}: {exc}",
                )
                return False
            if stored.spec.holder_identity != self.identity:
                self._drop(lease, "taken")
                return True
            lease.resource_version = stored.metadata.resource_version
            lease.valid_until = sent + self.timing.validity
            _extend(lease)
            return True
        return False

    def _drop(self, lease: _Held, why: str) -> None:
        if self._held.get(lease.shard) is lease:
            del self._held[lease.shard]
        _lose(lease)
        log.info("shard lease lost", group=self.group, shard=lease.shard, reason=why)

    async def _release(self, lease: _Held) -> None:
        """Give a lease back (client-go's release: empty holder, duration 1 s), locked on our last write."""
        _lose(lease)
        key = ObjectKey(self.namespace, lease.name)
        rv = lease.resource_version
        for _ in range(2):
            stamp = _wall()
            spec = {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": stamp, "renewTime": stamp}
            try:
                await self.writer.patch_merge(
                    LEASES, key, {"spec": spec}, resource_version=rv, timeout=self.timing.timeout
                )
                sharding.LEASE_CHANGES.labels(self.group, "released").inc()
                return
            except Conflict:
                try:
                    current = await self.reader.get_or_none(LEASES, key, timeout=self.timing.timeout)
                except KubeError:
                    break
                if current is None or current.spec.holder_identity != self.identity:
                    return  # not ours any more: nothing to release
                rv = current.metadata.resource_version
            except KubeError as exc:
                log.info(
                    "lease release failed; it will expire",
                    group=self.group,
                    shard=lease.shard,
                    error=type(exc).__name__,
                )
                return

    async def _leave(self) -> None:
        leases = list(self._held.values())
        for lease in leases:
            _lose(lease)
        self._held.clear()
        # Released concurrently so a shutdown is bounded by one request time, not one per shard.
        async with anyio.create_task_group() as tg:
            for lease in leases:
                tg.start_soon(self._release, lease)
        try:
            await self.writer.delete(
                LEASES, ObjectKey(self.namespace, self._member_name), missing_ok=True, timeout=self.timing.timeout
            )
        except KubeError as exc:
            log.info("member lease delete failed; it will expire", group=self.group, error=type(exc).__name__)

    def _expire_lapsed(self) -> None:
        now = _now()
        for shard, lease in list(self._held.items()):
            if now >= lease.valid_until:
                del self._held[shard]
                _lose(lease)
                log.info("shard lease lapsed locally (renewals failing)", group=self.group, shard=shard)

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
