"""runner-set worker under failure: two replicas and a killed one (never a duplicate runner),
malformed bus input, and a 409 injected on the status patch."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import anyio
import pytest

from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER
from shared.bus import Bus, DesiredState, ResourceRef, subjects
from shared.kube import EVENTS, ObjectKey
from shared.kube.objects import Event
from shared.worker import WorkerContext, WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.runner_set_helpers import create_ers, fake_runner_worker, get_ers, runners, sim_scale_set

pytestmark = pytest.mark.anyio


def desired(namespace: str, *, replicas: int, patch: int = 0, epoch: int = 1) -> DesiredState:
    return DesiredState(
        scale_set_id=1, ers=ResourceRef(namespace, "set"), patch_id=patch, replicas=replicas, listener_epoch=epoch
    )


async def test_two_replicas_and_a_killed_one_never_duplicate_runners(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    key = ObjectKey(namespace, "set")
    peak = 0
    wanted = 0

    async def monitor() -> None:
        nonlocal peak
        while True:
            n = len(await runners(kube, namespace, include_deleting=True))
            peak = max(peak, n)
            assert n <= wanted, f"{n} runners exist while at most {wanted} were asked for"
            await anyio.sleep(0.02)

    async with (
        running_worker(WORKER.name, worker_settings("a"), WORKER.setup(FailurePolicy())) as a,
        running_worker(WORKER.name, worker_settings("b"), WORKER.setup(FailurePolicy())) as b,
        fake_runner_worker(kube, namespace, actions_sim, ss, register=False),
        anyio.create_task_group() as tg,
    ):
        await a.wait_ready()
        await b.wait_ready()
        await wait_for(
            lambda: cast(WorkerContext, a.ctx).owns_key(key) != cast(WorkerContext, b.ctx).owns_key(key),
            timeout=20,
            what="exactly one owner",
        )
        tg.start_soon(monitor)
        wanted = 5
        await bus.publish(desired(namespace, replicas=5))
        await wait_for(lambda: _count(kube, namespace, 5), what="5 runners")
        owner, other = (a, b) if cast(WorkerContext, a.ctx).owns_key(key) else (b, a)
        owner.kill()
        wanted = 9
        await bus.publish(desired(namespace, replicas=9))
        await wait_for(
            lambda: cast(WorkerContext, other.ctx).owns_key(key), timeout=20, what="the survivor takes the shard over"
        )
        await wait_for(lambda: _count(kube, namespace, 9), timeout=20, what="9 runners after the handover")
        with anyio.move_on_after(1.0):
            while True:  # and it stays exactly 9 (no late duplicate from the dead replica)
                assert await _count(kube, namespace, 9)
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert peak == 9


async def test_malformed_and_invalid_desired_state_do_not_stop_the_worker(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    subject = subjects.desired_subject(namespace, "set")
    async with running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w:
        await w.wait_ready()
        await bus.js.publish(subject, b"{not json")
        await bus.js.publish(subject, b'{"kind":"DesiredState","replicas":"many"}')
        await bus.js.publish(subject, b'{"kind":"DesiredState","schemaVersion":99}')
        await bus.publish(desired(namespace, replicas=-3, patch=1))  # well-formed, invalid

        async def event() -> list[Event]:
            items = (await kube.reader.list(EVENTS, namespace=namespace)).items
            return [e for e in items if e.reason == "InvalidDesiredState"]

        await wait_for(event, what="an InvalidDesiredState Event on the ERS")
        await bus.publish(desired(namespace, replicas=2, patch=2))
        await wait_for(lambda: _count(kube, namespace, 2), what="a valid message after garbage is applied")
        assert (await get_ers(kube, namespace)).spec.replicas == 2
        assert not w.done


async def test_conflict_on_status_patch_rereads_and_converges(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    kube_api: KubeApi,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    control = kube_api.require_emulator()
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    async with running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w:
        await w.wait_ready()
        await wait_for(lambda: _has_status(kube, namespace), what="first status")
        await control.add_fault_async(
            action="error",
            code=409,
            verb="patch",
            resource="ephemeralrunnersets",
            subresource="status",
            namespace=namespace,
            times=3,
        )
        await bus.publish(desired(namespace, replicas=2))
        await wait_for(lambda: _count(kube, namespace, 2), what="2 runners")

        async def converged() -> bool:
            s = (await get_ers(kube, namespace)).status
            return s is not None and s.current_replicas == 2 and s.pending_ephemeral_runners == 2

        await wait_for(converged, what="status converges after the injected 409s")
        assert not [f for f in await anyio.to_thread.run_sync(control.faults) if f.namespace == namespace]
        assert await _count(kube, namespace, 2)  # the conflict never caused extra runners


async def _count(kube: Kube, namespace: str, n: int) -> bool:
    return len(await runners(kube, namespace, include_deleting=True)) == n


async def _has_status(kube: Kube, namespace: str) -> bool:
    s = (await get_ers(kube, namespace)).status
    return s is not None and s.phase == "Running"
