"""The controller shell end to end against the API under test: primary and owned-child sources,
wake-up streams, error backoff, requeue_after, sharding by owns(), metrics, and shutdown."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from shared.kube import (
    EPHEMERAL_RUNNER_SETS,
    PODS,
    ApiWriter,
    Controller,
    For,
    Informer,
    KubeClient,
    ObjectKey,
    Owns,
    Result,
    WakeUps,
)

from .conftest import ers, eventually, pod

pytestmark = pytest.mark.anyio


def sample(registry: CollectorRegistry, metric: str, /, **labels: str) -> float:
    return registry.get_sample_value(metric, labels) or 0.0


async def test_reconciles_primaries_and_owner_of_changed_children(
    kube: KubeClient, writer: ApiWriter, namespace: str
) -> None:
    registry = CollectorRegistry()
    seen: Counter[str] = Counter()

    async def reconcile(key: ObjectKey) -> None:
        seen[str(key)] += 1

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

    async def reconcile(key: ObjectKey) -> Result | None:
        attempts[key.name] += 1
        if key.name == "flaky" and attempts["flaky"] <= 3:
            raise RuntimeError("transient failure")
        if key.name == "poll" and attempts["poll"] < 3:
            return Result(requeue_after=0.02)
        if attempts["flaky"] > 3 and attempts["poll"] >= 3:
            done.set()
        return None

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

    async def reconcile(key: ObjectKey) -> None:
        nonlocal overlaps
        in_flight[str(key)] += 1
        overlaps += in_flight[str(key)] > 1
        await anyio.sleep(0.005)
        reconciled[str(key)] += 1
        in_flight[str(key)] -= 1

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

    async def reconcile(key: ObjectKey) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cleaned_up.set()

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

    async def reconcile(key: ObjectKey) -> None:
        started.set()
        await release.wait()
        finished.append(key.name)

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

    async def one(key: ObjectKey) -> None:
        seen_one[key.name] += 1

    async def two(key: ObjectKey) -> None:
        seen_two[key.name] += 1

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

    async def reconcile(key: ObjectKey) -> None:
        stamps[key.name].append(time.monotonic())
        if key.name == "t" and len(stamps["t"]) == 1:
            raise Throttled("PATCH x", "slow down", status=429, retry_after=0.3)

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
