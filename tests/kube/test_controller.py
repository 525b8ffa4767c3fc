"""The controller shell end to end against the API under test: primary and owned-child sources,
wake-up streams, error backoff, requeue_after, sharding by owns(), metrics, and shutdown."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
from prometheus_client import CollectorRegistry

from shared.kube import (
    DONE,
    EPHEMERAL_RUNNER_SETS,
    PODS,
    ApiWriter,
    Conflict,
    Controller,
    For,
    Informer,
    KubeClient,
    LocklessWrite,
    ObjectKey,
    Owns,
    ReconcileContext,
    Result,
    WakeUps,
)
from shared.kube.controller import REPEATED_PATCHES_MESSAGE
from shared.shards import NotOwner

from .conftest import ers, eventually, pod

pytestmark = pytest.mark.anyio


def sample(registry: CollectorRegistry, metric: str, /, **labels: str) -> float:
    return registry.get_sample_value(metric, labels) or 0.0


async def test_reconciles_primaries_and_owner_of_changed_children(
    kube: KubeClient, writer: ApiWriter, namespace: str
) -> None:
    registry = CollectorRegistry()
    seen: Counter[str] = Counter()

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        seen[str(key)] += 1
        return DONE

    sets = Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace)
    pods = Informer(kube, PODS, namespace=namespace)
    controller = Controller(
        "ers-test", reconcile, [For(sets), Owns(pods, "EphemeralRunnerSet")], workers=2, registry=registry
    )
    created = [await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, name)) for name in ("a", "b")]
    async with anyio.create_task_group() as tg:
        tg.start_soon(controller.run)
        await eventually(lambda: seen[f"{namespace}/a"] >= 1 and seen[f"{namespace}/b"] >= 1, what="initial reconciles")
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "c"))
        await eventually(lambda: seen[f"{namespace}/c"] >= 1, what="new primary reconciled")

        before = seen[f"{namespace}/a"]
        await writer.create(PODS, pod(namespace, "a-runner", owner=created[0]))
        await eventually(lambda: seen[f"{namespace}/a"] > before, what="owner of a new child reconciled")
        await writer.create(PODS, pod(namespace, "orphan"))  # no owner: maps to nothing
        before = seen[f"{namespace}/a"]
        await writer.patch_merge(PODS, f"{namespace}/a-runner", {"metadata": {"labels": {"changed": "yes"}}})
        await eventually(lambda: seen[f"{namespace}/a"] > before, what="owner of a changed child reconciled")
        # The orphan's event came before the patch's on the same watch, so it has been handled.
        assert set(seen) == {f"{namespace}/a", f"{namespace}/b", f"{namespace}/c"}
        controller.stop()
    assert sample(registry, "controller_runtime_reconcile_total", controller="ers-test", result="success") >= 5
    assert sample(registry, "controller_runtime_reconcile_time_seconds_count", controller="ers-test") >= 5
    assert sample(registry, "controller_runtime_max_concurrent_reconciles", controller="ers-test") == 2
    assert sample(registry, "workqueue_depth", controller="ers-test", name="ers-test") == 0


async def test_failures_are_logged_retried_with_backoff_and_do_not_stop_the_loop(
    kube: KubeClient, writer: ApiWriter, namespace: str
) -> None:
    registry = CollectorRegistry()
    attempts: Counter[str] = Counter()
    done = anyio.Event()

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        attempts[key.name] += 1
        if key.name == "flaky" and attempts["flaky"] <= 3:
            raise RuntimeError("transient failure")
        if key.name == "poll" and attempts["poll"] < 3:
            return Result(requeue_after=0.02)
        if attempts["flaky"] > 3 and attempts["poll"] >= 3:
            done.set()
        return DONE

    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "flaky"))
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "poll"))
    controller = Controller(
        "retry-test",
        reconcile,
        [For(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))],
        registry=registry,
        base_delay=0.01,
    )
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(controller.run)
            await done.wait()
            controller.stop()
    assert attempts["flaky"] == 4 and attempts["poll"] == 3
    assert sample(registry, "controller_runtime_reconcile_total", controller="retry-test", result="error") == 3
    assert sample(registry, "controller_runtime_reconcile_errors_total", controller="retry-test") == 3
    assert sample(registry, "controller_runtime_reconcile_total", controller="retry-test", result="requeue_after") == 2
    assert controller.queue.failures(ObjectKey(namespace, "flaky")) == 0  # success forgot the backoff


async def test_wakeups_sharding_and_no_concurrent_reconcile_per_key() -> None:
    registry = CollectorRegistry()
    send, receive = anyio.create_memory_object_stream[Any](100)
    in_flight: Counter[str] = Counter()
    overlaps = 0
    reconciled: Counter[str] = Counter()

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        nonlocal overlaps
        in_flight[str(key)] += 1
        overlaps += in_flight[str(key)] > 1
        await anyio.sleep(0.005)
        reconciled[str(key)] += 1
        in_flight[str(key)] -= 1
        return DONE

    controller = Controller(
        "wake-test", reconcile, [WakeUps(receive)], workers=4, owns=lambda key: key.name != "theirs", registry=registry
    )
    with receive, anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(controller.run)
            async with send:
                for _ in range(30):
                    await send.send("ns/hot")
                    await send.send(ObjectKey("ns", "theirs"))
                await send.send("not/a/key")  # malformed: logged and ignored
                await send.send("ns/last")
            await eventually(
                lambda: reconciled["ns/last"] == 1 and in_flight["ns/hot"] == 0 and len(controller.queue) == 0
            )
            controller.stop()
    assert overlaps == 0
    assert 1 <= reconciled["ns/hot"] <= 30  # de-duplicated while queued, never concurrent
    assert reconciled["ns/theirs"] == 0
    assert sample(registry, "runnerscale_controller_skipped_total", controller="wake-test") == 30


async def test_cancelling_the_task_group_cancels_an_in_flight_reconcile_cleanly(
    kube: KubeClient, writer: ApiWriter, namespace: str
) -> None:
    started, cleaned_up = anyio.Event(), anyio.Event()

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cleaned_up.set()
        return DONE

    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "stuck"))
    informer = Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace)
    controller = Controller("cancel-test", reconcile, [For(informer)], workers=2, registry=CollectorRegistry())
    tasks_before = set(asyncio.all_tasks())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(controller.run)
            await started.wait()
            tg.cancel_scope.cancel()
    assert cleaned_up.is_set()
    assert not informer.running
    assert set(asyncio.all_tasks()) == tasks_before  # nothing leaked


async def test_stop_lets_the_in_flight_reconcile_finish(kube: KubeClient, writer: ApiWriter, namespace: str) -> None:
    started, release = anyio.Event(), anyio.Event()
    finished: list[str] = []

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        started.set()
        await release.wait()
        finished.append(key.name)
        return DONE

    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "slow"))
    controller = Controller(
        "stop-test",
        reconcile,
        [For(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))],
        registry=CollectorRegistry(),
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(controller.run)
            await started.wait()
            controller.stop()
            controller.enqueue(f"{namespace}/other")  # refused after stop
            release.set()
    assert finished == ["slow"]


async def test_shared_informer_run_by_the_caller(kube: KubeClient, writer: ApiWriter, namespace: str) -> None:
    informer = Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace)
    seen_one: Counter[str] = Counter()
    seen_two: Counter[str] = Counter()

    async def one(key: ObjectKey, ctx: ReconcileContext) -> Result:
        seen_one[key.name] += 1
        return DONE

    async def two(key: ObjectKey, ctx: ReconcileContext) -> Result:
        seen_two[key.name] += 1
        return DONE

    registry = CollectorRegistry()
    first = Controller("shared-1", one, [For(informer)], registry=registry)
    second = Controller("shared-2", two, [For(informer)], registry=registry)
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "s"))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(informer.run)
            await informer.wait_synced()
            tg.start_soon(first.run)
            tg.start_soon(second.run)
            await eventually(lambda: seen_one["s"] >= 1 and seen_two["s"] >= 1)
            first.stop()
            second.stop()
            tg.cancel_scope.cancel()
    assert informer.watches >= 1 and informer.relists == 1  # run once, by the caller


async def test_throttled_reconcile_waits_for_retry_after_and_resync_reoffers_keys(
    kube: KubeClient, writer: ApiWriter, namespace: str
) -> None:
    import time

    from shared.kube import Throttled

    stamps: dict[str, list[float]] = {"t": [], "u": []}
    owned = {"t"}

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        stamps[key.name].append(time.monotonic())
        if key.name == "t" and len(stamps["t"]) == 1:
            raise Throttled("PATCH x", "slow down", status=429, retry_after=0.3)
        return DONE

    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "t"))
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "u"))
    controller = Controller(
        "throttle-test",
        reconcile,
        [For(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))],
        owns=lambda k: k.name in owned,
        registry=CollectorRegistry(),
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(controller.run)
            await eventually(lambda: len(stamps["t"]) == 2)
            assert stamps["t"][1] - stamps["t"][0] >= 0.3  # not the 5 ms backoff
            assert stamps["u"] == []  # another replica's key
            owned.add("u")  # this replica took over u's shard
            assert controller.resync() == 2
            await eventually(lambda: len(stamps["u"]) == 1)
            controller.stop()


# --- the policy every controller applies (README "Worker runtime") ----------------------------------------


def wake_ups() -> tuple[Any, WakeUps]:
    send, receive = anyio.create_memory_object_stream[Any](10)
    return send, WakeUps(receive)


async def run_until(controller: Controller, send: Any, keys: list[Any], done: Callable[[], Any]) -> None:
    """Run ``controller``, feed it ``keys`` as wake-ups, stop it once ``done()`` holds."""
    (source,) = [s for s in controller.sources if isinstance(s, WakeUps)]
    with source.stream, anyio.fail_after(10):  # type: ignore[attr-defined]
        async with anyio.create_task_group() as tg:
            await tg.start(controller.run)
            async with send:
                for key in keys:
                    await send.send(key)
                await eventually(done)
            controller.stop()


def outcome(registry: CollectorRegistry, controller: str, result: str) -> float:
    return sample(registry, "controller_runtime_reconcile_total", controller=controller, result=result)


async def test_the_lease_fence_spans_the_whole_reconcile_and_a_lost_lease_drops_the_key() -> None:
    """The reconcile runs inside ``fence(key)``; the fence cancelling it (lease lost) ends it as
    ``not_owner``: not retried here, not counted as an error."""
    registry = CollectorRegistry()
    send, source = wake_ups()
    inside: list[str] = []
    attempts: Counter[str] = Counter()
    lose = anyio.Event()

    @asynccontextmanager
    async def fence(key: ObjectKey) -> AsyncIterator[None]:
        inside.append(f"enter {key.name}")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    if key.name == "lost":
                        await lose.wait()
                        scope.cancel()

                tg.start_soon(watch)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        inside.append(f"exit {key.name}")
        if scope.cancelled_caught:
            raise NotOwner(str(key))

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        attempts[key.name] += 1
        assert inside[-1] == f"enter {key.name}"  # the write happens under the lease
        if key.name == "lost":
            lose.set()
            await anyio.sleep_forever()
        return DONE

    controller = Controller("fence-test", reconcile, [source], fence=fence, registry=registry)
    await run_until(controller, send, ["ns/kept", "ns/lost"], lambda: outcome(registry, "fence-test", "not_owner") == 1)
    assert attempts == {"kept": 1, "lost": 1}  # the lost key was dropped, not retried
    assert outcome(registry, "fence-test", "success") == 1
    assert sample(registry, "controller_runtime_reconcile_errors_total", controller="fence-test") == 0


async def test_a_reconcile_past_its_deadline_is_cancelled_and_retried() -> None:
    registry = CollectorRegistry()
    send, source = wake_ups()
    attempts: list[float] = []
    cancelled = anyio.Event()

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        attempts.append(ctx.deadline)
        if len(attempts) == 1:
            try:
                await anyio.sleep_forever()  # hangs: only the deadline ends it
            finally:
                cancelled.set()
        return DONE

    controller = Controller("deadline-test", reconcile, [source], timeout=0.2, registry=registry, base_delay=0.01)
    await run_until(controller, send, ["ns/hung"], lambda: len(attempts) == 2)
    assert cancelled.is_set()
    assert attempts[0] < float("inf")
    assert outcome(registry, "deadline-test", "timeout") == 1
    assert sample(registry, "controller_runtime_reconcile_errors_total", controller="deadline-test") == 1
    assert outcome(registry, "deadline-test", "success") == 1


async def test_conflicts_rerun_the_reconcile_and_exhausted_attempts_are_retried_later() -> None:
    """Each 409 re-runs the reconcile at once (a fresh attempt number); when every attempt met a
    409 the outcome is ``conflict`` and the key comes back with its backoff."""
    registry = CollectorRegistry()
    send, source = wake_ups()
    seen: list[tuple[str, int]] = []

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        seen.append((key.name, ctx.attempt))
        calls = sum(1 for name, _ in seen if name == key.name)
        if key.name == "twice" and calls <= 2:
            raise Conflict("PATCH x", "the object has been modified")
        if key.name == "always" and calls <= 3:
            raise Conflict("PATCH y", "the object has been modified")
        return DONE

    controller = Controller(
        "conflict-test", reconcile, [source], conflict_attempts=3, registry=registry, base_delay=0.01
    )
    await run_until(
        controller, send, ["ns/twice", "ns/always"], lambda: outcome(registry, "conflict-test", "success") == 2
    )
    assert [a for name, a in seen if name == "twice"] == [1, 2, 3]
    assert [a for name, a in seen if name == "always"] == [1, 2, 3, 1]  # exhausted, retried later from attempt 1
    assert outcome(registry, "conflict-test", "conflict") == 1
    assert sample(registry, "runnerscale_controller_conflicts_total", controller="conflict-test") == 5
    assert sample(registry, "controller_runtime_reconcile_errors_total", controller="conflict-test") == 0


async def test_a_write_without_a_precondition_is_refused_inside_every_reconcile(
    writer: ApiWriter, namespace: str
) -> None:
    """The lock-less-write guard of retry_on_conflict is always on: such a write could never
    conflict, so the controller refuses it before it is sent (outcome ``error``)."""
    registry = CollectorRegistry()
    send, source = wake_ups()
    failures: list[BaseException] = []
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "unlocked"))

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        try:
            await writer.patch_merge(EPHEMERAL_RUNNER_SETS, key, {"metadata": {"labels": {"x": "y"}}})
        except LocklessWrite as exc:
            failures.append(exc)
            raise
        return DONE

    controller = Controller("guard-test", reconcile, [source], registry=registry, base_delay=10.0)
    await run_until(controller, send, [ObjectKey(namespace, "unlocked")], lambda: failures)
    stored = await writer.client.request(
        "GET", EPHEMERAL_RUNNER_SETS.object_path(ObjectKey(namespace, "unlocked")), what="GET"
    )
    assert b'"x":"y"' not in stored  # refused before it was sent
    assert outcome(registry, "guard-test", "error") == 1


@pytest.mark.repeated_patches_expected
async def test_two_patches_of_one_part_in_one_reconcile_are_counted_and_logged(
    writer: ApiWriter, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The one-patch-per-part rule (README "Worker runtime"): a reconcile that patches one object's
    metadata twice is counted and logged with the object; one metadata and one status patch of the
    same object, or one patch each of two objects, are not."""
    registry = CollectorRegistry()
    send, source = wake_ups()
    done: list[str] = []
    for name in ("twice", "once-each", "other"):
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, name))

    async def label(key: ObjectKey, value: str) -> None:
        stored = await writer.client.request("GET", EPHEMERAL_RUNNER_SETS.object_path(key), what="GET")
        rv = msgspec.json.decode(stored)["metadata"]["resourceVersion"]
        await writer.patch_merge(
            EPHEMERAL_RUNNER_SETS, key, {"metadata": {"labels": {"x": value}}}, resource_version=rv
        )

    async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
        if key.name == "twice":
            await label(key, "1")
            await label(key, "2")
        else:
            await label(key, "1")
            if key.name == "once-each":
                await label(ObjectKey(key.namespace, "other"), "1")
                stored = await writer.client.request("GET", EPHEMERAL_RUNNER_SETS.object_path(key), what="GET")
                rv = msgspec.json.decode(stored)["metadata"]["resourceVersion"]
                await writer.patch_status(
                    EPHEMERAL_RUNNER_SETS, key, {"status": {"currentReplicas": 0}}, resource_version=rv
                )
        done.append(key.name)
        return DONE

    controller = Controller("ledger-test", reconcile, [source], registry=registry)
    with caplog.at_level("WARNING", logger="shared.kube.controller"):
        await run_until(
            controller, send, [ObjectKey(namespace, "twice"), ObjectKey(namespace, "once-each")], lambda: len(done) == 2
        )
    assert sample(registry, "runnerscale_reconcile_repeated_patches_total", controller="ledger-test") == 1
    warned = [r for r in caplog.records if r.getMessage() == REPEATED_PATCHES_MESSAGE]
    assert len(warned) == 1
    fields = warned[0].fields  # type: ignore[attr-defined]
    assert fields["name"] == "twice"
    assert fields["patches"] == [f"2 metadata/spec patches of ephemeralrunnersets.actions.github.com {namespace}/twice"]
