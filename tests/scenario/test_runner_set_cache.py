"""runner-set worker reading its runners from the informer (README "runner-set worker"): a cache
that lags this replica's own creations never leads to creating again (expectations), and an
expectation the cache never meets is given up for an API read after its timeout. A pass that
writes nothing is decided on the cached set without a GET; any action is decided on the GET, and
a cached set older than what the worker wrote is not used."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from services.runner_set.failures import FailurePolicy
from services.runner_set.reconciler import RunnerSetReconciler
from shared.api import EphemeralRunner
from shared.bus import Bus
from shared.kube import (
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    NEXT_PASS,
    EventRecorder,
    Informer,
    ObjectKey,
    ReconcileContext,
)
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube
from tests.scenario.runner_set_helpers import create_ers, get_ers, runners, sim_scale_set
from tests.scenario.test_runner_helpers import CountingReader
from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio


class NoActions:
    async def for_spec(self, namespace: str, spec: Any) -> Any:
        raise AssertionError("a scale-up needs no Actions client")


async def frozen_cache(kube: Kube, namespace: str) -> Informer[EphemeralRunner]:
    """An informer that listed once and then stopped watching: it never observes a later write,
    the worst case of a lagging cache."""
    informer = Informer(kube.client, EPHEMERAL_RUNNERS, namespace=namespace)
    async with anyio.create_task_group() as tg:
        await tg.start(informer.run)
        tg.cancel_scope.cancel()
    return informer


async def set_of(kube: Kube, namespace: str, actions_sim: ActionsSim, github_secret: str, replicas: int) -> ObjectKey:
    """An ERS ("set") against the simulator, with ``replicas`` set on it."""
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    key = ObjectKey(namespace, "set")
    ers = await get_ers(kube, namespace)
    await kube.writer.patch_merge(
        EPHEMERAL_RUNNER_SETS, key, {"spec": {"replicas": replicas}}, resource_version=ers.metadata.resource_version
    )
    return key


async def test_lagging_cache_never_over_creates(
    kube: Kube, bus: Bus, namespace: str, actions_sim: ActionsSim, github_secret: str
) -> None:
    key = await set_of(kube, namespace, actions_sim, github_secret, replicas=3)
    cache = await frozen_cache(kube, namespace)
    reconciler = RunnerSetReconciler(
        kube.reader, kube.writer, EventRecorder(kube.writer, "test"), NoActions(), bus, FailurePolicy(),
        runners_cache=[cache],
    )  # fmt: skip
    reconciler.pass_spacing = 0.0  # every reconcile below decides (no spacing between passes)
    ctx = ReconcileContext.direct("cache-lag")

    # The first pass only adds the finalizer (one patch per pass, README "Worker runtime"); the
    # next, the key's first decision, reads through the API: creates 3.
    assert await reconciler.reconcile(key, ctx) == NEXT_PASS
    await reconciler.reconcile(key, ctx)
    assert len(await runners(kube, namespace)) == 3
    assert len(cache.list_cached()) == 0  # the cache has not seen them

    # Right after the creations, before the cache observed them: the set waits for its cache.
    result = await reconciler.reconcile(key, ctx)
    assert len(await runners(kube, namespace)) == 3
    assert result.requeue_after is not None and 0 < result.requeue_after <= reconciler.expectations_timeout

    # The cache never catches up: after the timeout the set is read through the API (no creation)
    # and waits again for what that read showed.
    reconciler.expectations_timeout = 0.0
    await reconciler.reconcile(key, ctx)
    assert len(await runners(kube, namespace)) == 3
    assert len(reconciler.expectations[key].creates) == 3


async def test_a_pass_that_writes_nothing_reads_the_cached_set_and_any_action_the_server(
    kube: Kube, bus: Bus, namespace: str, actions_sim: ActionsSim, github_secret: str
) -> None:
    key = await set_of(kube, namespace, actions_sim, github_secret, replicas=2)
    runners_cache = Informer(kube.client, EPHEMERAL_RUNNERS, namespace=namespace)
    sets_cache = Informer(kube.client, EPHEMERAL_RUNNER_SETS, namespace=namespace)
    reader = CountingReader(kube.client, EPHEMERAL_RUNNER_SETS)
    reconciler = RunnerSetReconciler(
        reader, kube.writer, EventRecorder(kube.writer, "test"), NoActions(), bus, FailurePolicy(),
        runners_cache=[runners_cache], sets_cache=[sets_cache],
    )  # fmt: skip
    reconciler.pass_spacing = 0.0
    reconciler.status_window = 0.0  # count writes are not held back: each pass writes what changed
    ctx = ReconcileContext.direct("cached-set")
    async with anyio.create_task_group() as tg:
        await tg.start(runners_cache.run)
        await tg.start(sets_cache.run)

        async def settle() -> None:
            # Passes until one writes nothing (the first ones add the finalizer, create, write counts).
            async def quiet() -> bool:
                before = reader.gets
                await reconciler.reconcile(key, ctx)
                return reader.gets == before

            await eventually(quiet, timeout=10.0)

        await settle()
        assert len(await runners(kube, namespace)) == 2
        # Nothing to do: decided on the caches, no GET of the set.
        gets = reader.gets
        for _ in range(3):
            await reconciler.reconcile(key, ctx)
        assert reader.gets == gets

        # Someone else raises replicas: the cached set shows it, and the scale-up is decided on a GET.
        ers = await get_ers(kube, namespace)
        await kube.writer.patch_merge(
            EPHEMERAL_RUNNER_SETS, key, {"spec": {"replicas": 3}}, resource_version=ers.metadata.resource_version
        )

        def cached_replicas() -> int:
            cached = sets_cache.get_cached(key)
            return cached.spec.replicas if cached is not None else 0

        await eventually(lambda: cached_replicas() == 3, timeout=10.0)
        await reconciler.reconcile(key, ctx)
        assert reader.gets == gets + 1
        assert len(await runners(kube, namespace)) == 3

        # A cached set older than what this worker wrote is not used: with the set's watch stopped,
        # the worker's own status write (the new count) leaves the cache behind, and every pass GETs.
        await eventually(lambda: len(runners_cache.list_cached()) == 3, timeout=10.0)
        tg.cancel_scope.cancel()
    await reconciler.reconcile(key, ctx)  # the count: one status write, on the GET
    stale = sets_cache.get_cached(key)
    assert stale is not None and reconciler.seen_rv[key] > int(stale.metadata.resource_version)
    gets = reader.gets
    await reconciler.reconcile(key, ctx)
    assert reader.gets == gets + 1
    assert len(await runners(kube, namespace)) == 3
