"""Shard ownership in Kubernetes Leases (shared.kube.leases) against the API emulator (or a real
cluster), watched by an invariant monitor that samples every replica every 2 ms."""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from services.embedded.apiserver import EmulatorControl
from shared.bus import Bus, BusSettings, NotOwner, ShardOwnership
from shared.kube import (
    LEASES,
    NAMESPACES,
    SECRETS,
    AlreadyExists,
    ApiReader,
    ApiWriter,
    KubeClient,
    KubeError,
    ObjectKey,
)
from shared.kube.leases import (
    GROUP_LABEL,
    SHARDS_ANNOTATION,
    KubeShardOwnership,
    LeaseTiming,
    default_lease_namespace,
    member_lease_name,
    parse_claims,
)
from tests.bus.replicas import OwnershipMonitor
from tests.fixtures.apiserver import KubeApi
from tests.fixtures.nats import NatsServer
from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio

SHARDS = 16
TIMING = LeaseTiming(duration=2.0)  # validity 1.4 s, write every 1 s, list every 0.2 s, requests 0.4 s
SLACK = 1.5  # request latency and scheduling on a busy CI box


def handover_bound(timing: LeaseTiming = TIMING) -> float:
    return timing.handover_bound + SLACK


async def wait_for(
    condition: Callable[[], object], timeout: float = 10.0, describe: Callable[[], object] | None = None
) -> None:
    """:func:`tests.support.eventually.eventually`, re-checked every 10 ms."""
    await eventually(condition, timeout=timeout, interval=0.01, describe=describe)


class Replica:
    """One worker replica: its own API client for its leases (``lease_client``, which a test may
    cut off) and another for its work (``work_client``, which keeps working: a zombie)."""

    def __init__(
        self,
        kube_api: KubeApi,
        group: str,
        replica_id: str,
        namespace: str,
        *,
        timing: LeaseTiming = TIMING,
        work: Callable[[Replica], Awaitable[None]] | None = None,
    ) -> None:
        self.kube_api = kube_api
        self.group = group
        self.id = replica_id
        self.namespace = namespace
        self.timing = timing
        self.work = work
        self.shards: KubeShardOwnership | None = None
        self.lease_client: KubeClient | None = None
        self.work_client: KubeClient | None = None
        self.scope = anyio.CancelScope()
        self.alive = True
        self.changes: list[Any] = []

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            lease_client = await KubeClient.from_kubeconfig(self.kube_api.kubeconfig, request_timeout=5)
            work_client = await KubeClient.from_kubeconfig(self.kube_api.kubeconfig, request_timeout=5)
            async with lease_client, work_client:
                self.lease_client, self.work_client = lease_client, work_client
                async with KubeShardOwnership.join(
                    lease_client,
                    self.group,
                    replica_id=self.id,
                    shards=SHARDS,
                    namespace=self.namespace,
                    timing=self.timing,
                    on_change=self.changes.append,
                ) as shards:
                    self.shards = shards
                    await shards.wait_ready()
                    task_status.started()
                    if self.work is not None:
                        await self.work(self)
                    await anyio.sleep_forever()

    @property
    def joined(self) -> KubeShardOwnership:
        """The ownership the replica joined (it has started)."""
        assert self.shards is not None, f"replica {self.id} has not joined yet"
        return self.shards

    def owned(self) -> frozenset[int]:
        return self.shards.owned_shards() if (self.shards is not None and self.alive) else frozenset()

    def crash(self) -> None:
        """Die without releasing anything."""
        assert self.shards is not None
        self.shards.abandon()
        self.alive = False
        self.scope.cancel()

    def stop(self) -> None:
        """A clean shutdown: leases released, member lease deleted."""
        self.alive = False
        self.scope.cancel()

    async def cut_off(self) -> None:
        """The lease client loses the API server; the replica's code (and work client) keep running."""
        assert self.lease_client is not None
        await self.lease_client.close()


def coverage(replicas: list[Replica]) -> tuple[set[int], list[int]]:
    owned = [r.owned() for r in replicas]
    return set().union(*owned), sorted(len(o) for o in owned)


def balanced(replicas: list[Replica]) -> bool:
    covered, sizes = coverage(replicas)
    return covered == set(range(SHARDS)) and sum(sizes) == SHARDS and max(sizes) <= -(-SHARDS // len(replicas))


def group_name() -> str:
    return f"g-{secrets.token_hex(3)}"


async def holders(reader: ApiReader, namespace: str, group: str) -> dict[str, Any]:
    """Lease name -> (spec, claimed shards)."""
    listed = await reader.list(LEASES, namespace=namespace, label_selector=f"{GROUP_LABEL}={group}")
    return {
        lease.metadata.name: (lease.spec, parse_claims(lease.metadata.annotations.get(SHARDS_ANNOTATION, ""), SHARDS))
        for lease in listed.items
    }


# --- pure ----------------------------------------------------------------------------------------


def test_timing_arithmetic_stops_acting_before_anyone_can_acquire() -> None:
    t = LeaseTiming()
    assert (t.duration, t.period, t.lister, t.timeout, t.validity) == (20.0, 10.0, 2.0, 4.0, 14.0)
    # A write sent just before the local deadline and applied within the request timeout lands
    # before a peer can have seen the last renewal unchanged for a full duration.
    assert t.validity + t.timeout < t.duration
    # A renewal is due after one period and sent at the next list; a failed one is retried at
    # every list after it, twice at least before the claims lapse.
    assert t.validity >= t.period + 2 * t.retry_period
    assert t.handover_bound == 26.0
    assert 60 / t.period * 4 <= 30  # four workers at one replica each: at most 30 writes a minute
    assert TIMING.validity + TIMING.timeout < TIMING.duration
    assert LeaseTiming(duration=1.5).duration_seconds == 2  # never shorter than the real duration
    with pytest.raises(ValueError, match="no room to renew"):
        LeaseTiming(duration=10, request_timeout=8)
    with pytest.raises(ValueError):
        LeaseTiming(duration=0)


def test_lease_names_are_valid_kubernetes_names() -> None:
    assert member_lease_name("runner-set", "runner-set-7d9f-abc") == "runnerscale-runner-set-member-runner-set-7d9f-abc"
    assert (
        member_lease_name("runner-set", "runner-set-7d9f-abc", "0a1b2c3d")
        == "runnerscale-runner-set-member-runner-set-7d9f-abc-0a1b2c3d"
    )
    assert parse_claims("0,5, 11,x,99", 16) == frozenset({0, 5, 11})
    odd = member_lease_name("Runner_Set", "Pod.Name_" + "x" * 300)
    assert len(odd) <= 253 and odd == odd.lower() and "_" not in odd
    assert member_lease_name("g", "a_b") != member_lease_name("g", "a-b")  # sanitised names stay distinct
    assert default_lease_namespace({"POD_NAMESPACE": "arc-system"}) == "arc-system"
    assert default_lease_namespace({}) == "runnerscale-system"


# --- against the API -----------------------------------------------------------------------------


async def test_two_then_three_replicas_split_shards_disjointly(
    kube_api: KubeApi, namespace: str, reader: ApiReader
) -> None:
    group = group_name()
    replicas = [Replica(kube_api, group, f"pod-{i}", namespace) for i in range(3)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas[:2]:
            await tg.start(r.run)
        await wait_for(
            lambda: coverage(replicas[:2]) == (set(range(SHARDS)), [8, 8]), describe=lambda: coverage(replicas[:2])
        )
        await tg.start(replicas[2].run)
        await wait_for(lambda: balanced(replicas), describe=lambda: coverage(replicas))
        # The Lease objects say the same thing (what `kubectl get leases -n <ns>` shows).
        specs = await holders(reader, namespace, group)
        owned = {r.id: r.owned() for r in replicas}
        tg.cancel_scope.cancel()
    assert monitor.samples > 100
    assert monitor.violations == []
    # One Lease per replica process, each claiming (annotation) what the replica acts on.
    assert sorted(specs) == sorted(r.joined.store.own_name for r in replicas)
    for r in replicas:
        spec, claims = specs[r.joined.store.own_name]
        assert spec.lease_duration_seconds == 2 and spec.acquire_time and spec.renew_time
        assert spec.holder_identity.rsplit("_", 1)[0] == r.id
        assert claims == owned[r.id]
    assert sorted(len(claims) for _, claims in specs.values()) in ([5, 5, 6], [4, 6, 6])


async def test_replicas_starting_together_never_act_on_one_shard_twice(kube_api: KubeApi, namespace: str) -> None:
    """Cold start of four replicas at once: each first sees itself alone and claims every shard;
    only the list after its own write (README "Shard ownership leases") keeps two from acting."""
    group = group_name()
    replicas = [Replica(kube_api, group, f"pod-{i}", namespace) for i in range(4)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            tg.start_soon(r.run)
        await wait_for(lambda: balanced(replicas), timeout=20, describe=lambda: coverage(replicas))
        await wait_for(lambda: monitor.samples > 200)  # and a while after settling
        tg.cancel_scope.cancel()
    assert monitor.violations == []


async def test_at_rest_each_replica_writes_once_per_renew_period(
    kube_api: KubeApi, namespace: str, reader: ApiReader
) -> None:
    """Liveness is one Lease write per replica per renew period, however many shards (issue 10:
    it was one write per shard and one per member every third of a duration)."""
    group = group_name()
    replicas = [Replica(kube_api, group, f"pod-{i}", namespace) for i in range(2)]
    versions: dict[str, set[str]] = {}
    async with anyio.create_task_group() as tg:
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: coverage(replicas) == (set(range(SHARDS)), [8, 8]), describe=lambda: coverage(replicas))
        window = 5 * TIMING.period
        with anyio.move_on_after(window):
            while True:
                listed = await reader.list(LEASES, namespace=namespace, label_selector=f"{GROUP_LABEL}={group}")
                for lease in listed.items:
                    versions.setdefault(lease.metadata.name, set()).add(lease.metadata.resource_version)
                await anyio.sleep(0.02)
        owned_after = [r.owned() for r in replicas]
        tg.cancel_scope.cancel()
    writes = {name: len(v) - 1 for name, v in versions.items()}
    print(f"writes in {window:.1f}s at rest: {writes}")
    assert sorted(writes) == sorted(r.joined.store.own_name for r in replicas)
    # One renewal per period (sent at the first list after it is due), give or take one.
    assert all(3 <= n <= 6 for n in writes.values()), writes
    assert sorted(len(o) for o in owned_after) == [8, 8]


async def test_a_crashed_replicas_shards_move_within_the_bound(
    kube_api: KubeApi, namespace: str, reader: ApiReader
) -> None:
    group = group_name()
    replicas = [Replica(kube_api, group, f"pod-{i}", namespace) for i in range(3)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: balanced(replicas), describe=lambda: coverage(replicas))
        victim = max(replicas, key=lambda r: len(r.owned()))
        orphaned = victim.owned()
        victim_lease = victim.joined.store.own_name
        survivors = [r for r in replicas if r is not victim]
        crashed_at = time.monotonic()
        victim.crash()
        seen: dict[str, Any] = {victim_lease: None}

        async def watch_leases() -> None:
            while True:
                seen.clear()
                seen.update(await holders(reader, namespace, group))
                await anyio.sleep(0.05)

        tg.start_soon(watch_leases)
        await wait_for(
            lambda: coverage(survivors) == (set(range(SHARDS)), [8, 8]),
            timeout=handover_bound() + 10,
            describe=lambda: (coverage(survivors), [r.joined.members for r in survivors]),
        )
        moved_after = time.monotonic() - crashed_at
        # The dead process's Lease is deleted by a survivor once it has expired.
        await wait_for(lambda: victim_lease not in seen, timeout=5, describe=lambda: sorted(seen))
        specs = await holders(reader, namespace, group)
        tg.cancel_scope.cancel()
    print(f"shards moved {moved_after:.2f}s after the crash (bound {handover_bound():.2f}s)")
    assert orphaned
    assert moved_after <= handover_bound(), moved_after
    # Not before the victim's claims could have expired: a duration after its last write, which
    # came at most a renew period plus a list period before the crash.
    assert moved_after >= TIMING.duration - TIMING.period - TIMING.lister
    assert monitor.violations == []
    claimed = set().union(*(claims for _, claims in specs.values()))
    assert victim_lease not in specs and orphaned <= claimed


async def test_a_clean_shutdown_hands_shards_over_at_once(kube_api: KubeApi, namespace: str, reader: ApiReader) -> None:
    timing = LeaseTiming(duration=6.0)  # an expiry-based hand-over could not beat this
    group = group_name()
    replicas = [Replica(kube_api, group, f"pod-{i}", namespace, timing=timing) for i in range(2)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            await tg.start(r.run)
        await wait_for(
            lambda: coverage(replicas) == (set(range(SHARDS)), [8, 8]), timeout=20, describe=lambda: coverage(replicas)
        )
        leaving, staying = replicas
        given_back = leaving.owned()
        leaving_lease = leaving.joined.store.own_name
        stopped_at = time.monotonic()
        leaving.stop()
        await wait_for(
            lambda: len(staying.owned()) == SHARDS,
            timeout=timing.duration,
            describe=lambda: (staying.owned(), staying.joined.members),
        )
        took = time.monotonic() - stopped_at
        specs = await holders(reader, namespace, group)
        tg.cancel_scope.cancel()
    print(f"clean hand-over took {took:.2f}s (list period {timing.lister:.2f}s, duration {timing.duration:.1f}s)")
    assert took < timing.lister + SLACK < timing.duration, took
    assert monitor.violations == []
    assert leaving_lease not in specs  # the member lease was deleted
    assert given_back <= specs[staying.joined.store.own_name][1]


async def test_held_check_and_change_callbacks_follow_ownership(kube_api: KubeApi, namespace: str) -> None:
    group = group_name()
    solo = Replica(kube_api, group, "solo", namespace)
    other = Replica(kube_api, group, "other", namespace)
    async with anyio.create_task_group() as tg:
        await tg.start(solo.run)
        shards = solo.shards
        assert shards is not None
        await wait_for(lambda: len(shards.owned_shards()) == SHARDS)
        key = "ns/runner-1"
        async with shards.held(key):
            shards.check(key)
        assert shards.shard_of(key) == shards.shard_of(key) and 0 <= shards.shard_of(key) < SHARDS
        await tg.start(other.run)
        await wait_for(
            lambda: len(shards.owned_shards()) == SHARDS // 2 and len(other.owned()) == SHARDS // 2,
            describe=lambda: coverage([solo, other]),
        )
        assert shards.members == 2
        not_mine = next(f"ns/r-{i}" for i in range(1000) if not shards.owns(f"ns/r-{i}"))
        with pytest.raises(NotOwner, match=not_mine):
            async with shards.held(not_mine):
                raise AssertionError("the block must not run")
        with pytest.raises(NotOwner):
            shards.check(not_mine)
        other.stop()
        await wait_for(lambda: len(shards.owned_shards()) == SHARDS)
        # The callback runs at the end of the round that changed the shards.
        await wait_for(
            lambda: sum(len(c.gained) for c in solo.changes) == SHARDS + SHARDS // 2, describe=lambda: solo.changes
        )
        tg.cancel_scope.cancel()
    gained = [s for c in solo.changes for s in c.gained]
    lost = [s for c in solo.changes for s in c.lost]
    assert len(lost) == SHARDS // 2  # handed to "other" when it joined...
    assert len(gained) == SHARDS + SHARDS // 2  # ...and taken back when it left


async def test_a_replica_cut_off_from_the_api_stops_acting_before_another_starts(
    kube_api: KubeApi, namespace: str
) -> None:
    """The lease client of ``a`` loses the API server while its code keeps running (a zombie
    whose renewals fail): its ``held`` blocks end before ``b`` acquires and starts any."""
    group = group_name()
    a, b = Replica(kube_api, group, "a", namespace), Replica(kube_api, group, "b", namespace)
    key = "ns/the-key"
    events: list[tuple[str, str, float]] = []

    async def session(replica: Replica) -> None:
        shards = replica.shards
        assert shards is not None
        while True:
            if shards.owns(key):
                try:
                    async with shards.held(key):
                        events.append((replica.id, "start", time.monotonic()))
                        try:
                            await anyio.sleep_forever()
                        finally:
                            events.append((replica.id, "stop", time.monotonic()))
                except NotOwner:
                    pass
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        await wait_for(lambda: len(a.owned()) == SHARDS)
        await tg.start(b.run)
        # b joins; a hands half over. Wait until the key's shard sits with a, then start sessions.
        await wait_for(
            lambda: len(a.owned()) == SHARDS // 2 and len(b.owned()) == SHARDS // 2, describe=lambda: coverage([a, b])
        )
        if not a.joined.owns(key):
            a, b = b, a
        tg.start_soon(session, a)
        tg.start_soon(session, b)
        await wait_for(lambda: events)
        cut_at = time.monotonic()
        await a.cut_off()
        await wait_for(
            lambda: any(e[0] == b.id and e[1] == "start" for e in events),
            timeout=handover_bound() + 10,
            describe=lambda: events,
        )
        tg.cancel_scope.cancel()
    a_stop = next(t for rid, what, t in events if rid == a.id and what == "stop")
    b_start = next(t for rid, what, t in events if rid == b.id and what == "start")
    assert a_stop - cut_at <= TIMING.validity + 0.1
    assert b_start - a_stop >= TIMING.duration - TIMING.validity - 0.1  # the fencing margin, at least
    assert a_stop < b_start


async def test_racing_replicas_never_create_an_object_twice_when_one_dies_mid_flight(
    kube_api: KubeApi, namespace: str, reader: ApiReader
) -> None:
    """Three replicas create one Secret per key with a deterministic name, each after an
    authoritative GET under ``held``; one crashes mid-flight and one is cut off from the API for
    its leases while it keeps writing with another client. A second owner would get
    AlreadyExists: it must never happen, and every key has exactly one successful creator."""
    group = group_name()
    keys = [f"{namespace}/obj-{i}" for i in range(48)]
    created: dict[str, list[str]] = {}
    already_exists: list[tuple[str, str]] = []
    in_flight: dict[str, set[str]] = {}
    refused: list[str] = []
    go = anyio.Event()  # all replicas start racing together, once the shards are split

    async def worker(replica: Replica) -> None:
        shards, kube = replica.shards, replica.work_client
        assert shards is not None and kube is not None
        r, w = ApiReader(kube), ApiWriter(kube)
        await go.wait()
        while True:
            for key in keys:
                if not shards.owns(key):
                    continue
                obj = ObjectKey.parse(key)
                try:
                    async with shards.held(key):
                        if await r.get_or_none(SECRETS, obj) is not None:
                            continue
                        in_flight.setdefault(replica.id, set()).add(key)
                        await anyio.sleep(0.05)  # slow decision: the window a crash or a lapse can hit
                        shards.check(key)  # right before the write
                        body = {
                            "metadata": {"name": obj.name, "labels": {"race": group, "creator": replica.id}},
                            "stringData": {"k": key},
                        }
                        try:
                            await w.create(SECRETS, body, namespace=obj.namespace)
                        except AlreadyExists:
                            already_exists.append((key, replica.id))
                        else:
                            created.setdefault(key, []).append(replica.id)
                except NotOwner:
                    refused.append(replica.id)
                except KubeError:
                    pass  # retried on the next pass
                finally:
                    in_flight.get(replica.id, set()).discard(key)
            await anyio.sleep(0.01)

    async def server_objects() -> int:
        return len((await reader.list(SECRETS, namespace=namespace, label_selector=f"race={group}")).items)

    replicas = [Replica(kube_api, group, f"pod-{i}", namespace, work=worker) for i in range(3)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: balanced(replicas), describe=lambda: coverage(replicas))
        go.set()
        crasher, zombie, survivor = replicas
        await wait_for(
            lambda: in_flight.get(crasher.id) and in_flight.get(zombie.id),
            timeout=10,
            describe=lambda: (in_flight, len(created)),
        )
        crashed_at = time.monotonic()
        crasher.crash()  # cancelled mid-flight, leases not released
        await zombie.cut_off()  # its worker keeps running and writing; its renewals fail

        async def all_created() -> bool:
            return await server_objects() >= len(keys)

        await eventually(all_created, timeout=handover_bound() * 2 + 15, what="every key's object created")
        finished_after = time.monotonic() - crashed_at
        tg.cancel_scope.cancel()
    print(f"race: all keys created {finished_after:.2f}s after the crash; refusals={len(refused)}")
    assert already_exists == []
    assert {k: v for k, v in created.items() if len(v) > 1} == {}
    assert monitor.violations == []
    assert survivor.id in {c for v in created.values() for c in v}
    assert finished_after >= TIMING.validity  # the crasher's and zombie's keys waited for expiry


async def test_lease_faults_never_cause_double_ownership(
    kube_api: KubeApi, namespace: str, control: EmulatorControl
) -> None:
    """409s, 500s, slow answers and answers slower than the request deadline on the lease API:
    shards may lapse and move, but the monitor never sees a shard held twice, and the replicas
    settle once the faults are spent."""
    group = group_name()
    replicas = [Replica(kube_api, group, f"pod-{i}", namespace) for i in range(3)]
    monitor = OwnershipMonitor({r.id: r.owned for r in replicas})
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: balanced(replicas), describe=lambda: coverage(replicas))
        scope: dict[str, Any] = dict(resource="leases", namespace=namespace)
        rules = [
            control.add_fault(action="error", code=409, verb="patch", times=25, **scope),
            control.add_fault(action="error", code=500, verb="patch", times=25, **scope),
            control.add_fault(action="error", code=500, verb="list", times=5, **scope),
            control.add_fault(action="latency", delay_seconds=0.25, verb="patch", times=40, **scope),
            control.add_fault(
                action="latency", delay_seconds=0.7, verb="patch", times=8, **scope
            ),  # beyond the 0.4 s deadline
        ]
        # Re-reads after a 409 fail too, while they happen (this rule may not be spent: it is cleared below).
        control.add_fault(action="error", code=503, verb="get", times=5, **scope)
        await wait_for(lambda: not {f.id for f in control.faults()} & set(rules), timeout=60, describe=control.faults)
        control.clear_faults()
        await wait_for(lambda: balanced(replicas), timeout=handover_bound() + 10, describe=lambda: coverage(replicas))
        tg.cancel_scope.cancel()
    assert monitor.samples > 100
    assert monitor.violations == []


async def test_failing_lists_alone_do_not_stop_a_replica_acting(
    kube_api: KubeApi, namespace: str, control: EmulatorControl
) -> None:
    """Lists of the lease API fail for longer than the validity while writes still work: the
    replica keeps renewing what it claims and acts on its shards throughout."""
    group = group_name()
    solo = Replica(kube_api, group, "solo", namespace)
    dropped: list[frozenset[int]] = []
    async with anyio.create_task_group() as tg:
        await tg.start(solo.run)
        await wait_for(lambda: len(solo.owned()) == SHARDS)
        rule = control.add_fault(
            action="error", code=500, verb="list", times=25, resource="leases", namespace=namespace
        )
        started = time.monotonic()

        async def watch() -> None:
            while True:
                if len(solo.owned()) != SHARDS:
                    dropped.append(solo.owned())
                await anyio.sleep(0.002)

        tg.start_soon(watch)
        await wait_for(lambda: rule not in {f.id for f in control.faults()}, timeout=30, describe=control.faults)
        failing_for = time.monotonic() - started
        tg.cancel_scope.cancel()
    print(f"lists failed for {failing_for:.2f}s (validity {TIMING.validity:.2f}s)")
    assert failing_for > 2 * TIMING.validity
    assert dropped == []


async def test_the_lease_namespace_is_created_when_missing(
    kube_api: KubeApi, reader: ApiReader, writer: ApiWriter
) -> None:
    lease_ns = f"t-leases-{secrets.token_hex(3)}"
    assert await reader.get_or_none(NAMESPACES, ObjectKey("", lease_ns)) is None
    group = group_name()
    try:
        r = Replica(kube_api, group, "pod-0", lease_ns)
        async with anyio.create_task_group() as tg:
            await tg.start(r.run)
            await wait_for(lambda: len(r.owned()) == SHARDS)
            running = await holders(reader, lease_ns, group)
            tg.cancel_scope.cancel()
        assert sorted(running) == [r.joined.store.own_name]
        assert await holders(reader, lease_ns, group) == {}  # deleted on a clean stop
    finally:
        await writer.delete(NAMESPACES, ObjectKey("", lease_ns), missing_ok=True)


async def test_ownership_survives_a_nats_outage(kube_api: KubeApi, namespace: str, nats_server: NatsServer) -> None:
    """THE point of Kubernetes Leases: with nats-server stopped, NATS KV ownership drops (shown for
    contrast) while Kubernetes-lease ownership stays put and keeps renewing."""
    group = group_name()
    bus_settings = BusSettings(
        nats_urls=(nats_server.url,),
        lease_ttl=1.0,
        shards=SHARDS,
        connect_timeout=2.0,
        request_timeout=1.0,
        reconnect_wait=0.2,
    )
    replicas = [Replica(kube_api, group, f"pod-{i}", namespace) for i in range(2)]
    changed: list[tuple[str, frozenset[int], frozenset[int]]] = []

    async def stability(baseline: dict[str, frozenset[int]]) -> None:
        while True:
            for r in replicas:
                now = r.owned()
                if now != baseline[r.id]:
                    changed.append((r.id, baseline[r.id], now))
            await anyio.sleep(0.002)

    async with (
        Bus.connect(bus_settings) as bus,
        ShardOwnership.join(bus, group, replica_id="nats-replica") as nats_shards,
        anyio.create_task_group() as tg,
    ):
        for r in replicas:
            await tg.start(r.run)
        await wait_for(lambda: coverage(replicas) == (set(range(SHARDS)), [8, 8]), describe=lambda: coverage(replicas))
        await wait_for(lambda: len(nats_shards.owned_shards()) == SHARDS)
        baseline = {r.id: r.owned() for r in replicas}
        tg.start_soon(stability, baseline)
        stopped_at = anyio.current_time()
        await anyio.to_thread.run_sync(nats_server.stop)
        # The outage is real: the NATS-KV ownership gives everything up...
        await wait_for(lambda: not nats_shards.owned_shards(), timeout=10)

        # ...while the Kubernetes leases are renewed well past what they were valid for at the
        # start of the outage, and owns() stays true for every key of a replica's shards.
        def renewed_after_outage() -> bool:
            return all(r.joined._valid_until > stopped_at + 2 * TIMING.duration for r in replicas)

        await wait_for(renewed_after_outage, timeout=4 * TIMING.duration + 5)
        for r in replicas:
            keys = [f"ns/k-{i}" for i in range(200)]
            assert all(r.joined.owns(k) == (r.joined.shard_of(k) in baseline[r.id]) for k in keys)
        await anyio.to_thread.run_sync(nats_server.start)
        await wait_for(lambda: len(nats_shards.owned_shards()) == SHARDS, timeout=20)
        tg.cancel_scope.cancel()
    assert changed == []


async def test_kubectl_get_leases_shows_the_holders(kube_api: KubeApi, namespace: str) -> None:
    """The inspection command of README "Shard ownership leases" works and names each shard's holder."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl") or "/usr/bin/kubectl"
    group = group_name()
    r = Replica(kube_api, group, "pod-0", namespace)
    async with anyio.create_task_group() as tg:
        await tg.start(r.run)
        await wait_for(lambda: len(r.owned()) == SHARDS)
        argv = [
            kubectl,
            "--kubeconfig",
            str(kube_api.kubeconfig),
            "get",
            "leases",
            "-n",
            namespace,
            "-l",
            f"{GROUP_LABEL}={group}",
        ]
        out = await anyio.to_thread.run_sync(
            lambda: subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
        )
        tg.cancel_scope.cancel()
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "HOLDER"]
    rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert set(rows) == {r.joined.store.own_name}
    assert all(holder.startswith("pod-0_") for holder in rows.values())


async def test_an_error_in_the_block_propagates_as_itself_and_leases_are_released(
    kube_api: KubeApi, namespace: str, reader: ApiReader
) -> None:
    group = group_name()
    async with await KubeClient.from_kubeconfig(kube_api.kubeconfig) as client:
        with pytest.raises(LookupError, match="boom"):
            async with KubeShardOwnership.join(
                client, group, replica_id="solo", shards=4, namespace=namespace, timing=TIMING
            ) as shards:
                await wait_for(lambda: len(shards.owned_shards()) == 4)
                raise LookupError("boom")
        assert shards.owned_shards() == frozenset() and not shards.owns("ns/x")
    assert await holders(reader, namespace, group) == {}  # the member lease was deleted
