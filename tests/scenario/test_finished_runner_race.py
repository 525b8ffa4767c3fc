"""Issue #14: never a replacement runner for a job that already finished, whoever deletes the
finished runner. The real runner worker and the real runner-set worker against the emulator +
nats-server + Actions simulator; the test plays the listener (job events and desired states in a
controlled order) and the kubelet (pod status)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from msgspec.structs import replace

from services.runner.worker import WORKER as RUNNER_WORKER
from services.runner_set import decide as rs_decide
from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER as RUNNER_SET_WORKER
from shared.api import EphemeralRunner
from shared.bus import Bus, DesiredState, ResourceRef
from shared.bus.messages import JobCompleted, JobStarted
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.runner_set_helpers import create_ers, get_ers, runners, sim_scale_set
from tests.scenario.test_runner_helpers import FAST, RunnerEnv

pytestmark = pytest.mark.anyio

EPOCH = 4


def desired(namespace: str, *, replicas: int, patch: int) -> DesiredState:
    return DesiredState(
        scale_set_id=1, ers=ResourceRef(namespace, "set"), patch_id=patch, replicas=replicas, listener_epoch=EPOCH
    )


def job_event(cls: Any, namespace: str, er: EphemeralRunner, n: int, **extra: Any) -> Any:
    return cls(
        scale_set_id=er.spec.runner_scale_set_id,
        scale_set=ResourceRef(namespace, "set"),
        runner_name=er.metadata.name,
        runner_id=er.status.runner_id if er.status else 0,
        job_id=f"job-{n}",
        runner_request_id=100 + n,
        listener_epoch=EPOCH,
        **extra,
    )


class Seen:
    """Every EphemeralRunner name the test ever observed (polled; a spurious runner created for a
    finished job is idle and not scaled down by a non-zero patch ID, so it cannot slip by)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    async def watch(self, kube: Any, namespace: str) -> None:
        while True:
            self.names |= {r.metadata.name for r in await runners(kube, namespace, include_deleting=True)}
            await anyio.sleep(0.02)  # a sampling loop, not synchronisation


async def _phase_or_gone(env: RunnerEnv, names: list[str]) -> bool:
    for name in names:
        er = await env.er(name)
        if er is not None and not er.metadata.is_deleting and (er.status is None or er.status.phase != "Succeeded"):
            return False
    return True


async def test_three_runners_finish_together_listener_accounts_one_at_a_time_no_replacement(
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    """The measured race of #14: three runners exit 0 within milliseconds; the listener accounts
    for the completions one message at a time (patch 9: replicas 2, then patch 10: replicas 0).
    Before the fix the runner worker deleted the finished runners, the runner-set saw 0 runners at
    patch 9 and created 2 for jobs that had already completed."""
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    seen = Seen()
    async with (
        running_worker(
            RUNNER_SET_WORKER.name, worker_settings("rs", bus={"shards": 2}), RUNNER_SET_WORKER.setup(FailurePolicy())
        ) as rs,
        running_worker(
            RUNNER_WORKER.name,
            worker_settings("r", bus={"shards": 2}),
            RUNNER_WORKER.setup(replace(FAST, finished_release_after=300.0)),
        ) as rw,
        anyio.create_task_group() as tg,
    ):
        await rs.wait_ready()
        await rw.wait_ready()
        env = RunnerEnv(kube, namespace, actions_sim, ss, github_secret, worker=rw)
        tg.start_soon(seen.watch, kube, namespace)

        # three jobs: patch 8 asks for 3 runners; each registers, its pod runs, it gets a job
        await bus.publish(desired(namespace, replicas=3, patch=8))

        async def three_registered() -> list[EphemeralRunner] | None:
            rs_ = await runners(kube, namespace)
            ok = len(rs_) == 3 and all(r.status is not None and r.status.runner_id for r in rs_)
            return sorted(rs_, key=lambda r: r.metadata.name) if ok else None

        ers = await wait_for(three_registered, timeout=30, what="3 registered runners")
        names = [r.metadata.name for r in ers]
        for name in names:
            await env.wait_pod(name)
            await env.run(name)
        for n, er in enumerate(ers, 1):
            await env.reconciler.handle_job_event(job_event(JobStarted, namespace, er, n))

        # all three runners exit 0 together, before the listener has heard of any completion
        for name in names:
            await env.terminate(name, 0, phase="Succeeded")
        await wait_for(lambda: _phase_or_gone(env, names), timeout=20, what="the runner worker acted on all three")

        # the listener: JobCompleted(1), then the desired state computed from that message
        await env.reconciler.handle_job_event(job_event(JobCompleted, namespace, ers[0], 1, result="succeeded"))
        await bus.publish(desired(namespace, replicas=2, patch=9))

        async def applied(patch: int) -> bool:
            return (await get_ers(kube, namespace)).spec.patch_id == patch

        await wait_for(lambda: applied(9), what="patch 9 applied")
        # the runner-set decides on patch 9 (and on the runner events that follow) for a while
        with anyio.move_on_after(1.5):
            while True:
                assert seen.names <= set(names), f"a replacement was created: {sorted(seen.names - set(names))}"
                await anyio.sleep(0.05)

        # the listener accounts for the other two completions
        for n, er in enumerate(ers[1:], 2):
            await env.reconciler.handle_job_event(job_event(JobCompleted, namespace, er, n, result="succeeded"))
        await bus.publish(desired(namespace, replicas=0, patch=10))

        async def all_gone() -> bool:
            return not await runners(kube, namespace, include_deleting=True)

        # accounted finished runners go away promptly (well before the 60 s hold)
        await wait_for(all_gone, timeout=15, what="finished runners reaped")
        tg.cancel_scope.cancel()
    assert seen.names == set(names), f"runners created for finished jobs: {sorted(seen.names - set(names))}"
    # the runners created were exactly the three asked for at patch 8
    assert all(n.startswith("set-runner-") for n in names)


async def test_completion_never_reported_is_held_then_reaped_with_the_marker(
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner exits 0 but its JobCompleted never arrives (the event was lost), while the listener
    keeps publishing (another job's event: patch 4): the runner-set holds the finished runner for
    FINISHED_HOLD (shortened here), then reaps it the seeds' way — marker first — so no replacement
    is made under that patch ID; the next desired state lifts the suppression."""
    monkeypatch.setattr(rs_decide, "FINISHED_HOLD", dt.timedelta(seconds=1.0))
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    seen = Seen()
    async with (
        running_worker(
            RUNNER_SET_WORKER.name, worker_settings("rs", bus={"shards": 2}), RUNNER_SET_WORKER.setup(FailurePolicy())
        ) as rs,
        running_worker(
            RUNNER_WORKER.name,
            worker_settings("r", bus={"shards": 2}),
            RUNNER_WORKER.setup(replace(FAST, finished_release_after=300.0)),
        ) as rw,
        anyio.create_task_group() as tg,
    ):
        await rs.wait_ready()
        await rw.wait_ready()
        env = RunnerEnv(kube, namespace, actions_sim, ss, github_secret, worker=rw)
        tg.start_soon(seen.watch, kube, namespace)
        await bus.publish(desired(namespace, replicas=1, patch=3))

        async def registered() -> EphemeralRunner | None:
            rs_ = await runners(kube, namespace)
            return rs_[0] if len(rs_) == 1 and rs_[0].status is not None and rs_[0].status.runner_id else None

        er = await wait_for(registered, timeout=30, what="1 registered runner")
        await env.wait_pod(er.metadata.name)
        await env.run(er.metadata.name)
        await env.reconciler.handle_job_event(job_event(JobStarted, namespace, er, 1))
        await env.terminate(er.metadata.name, 0, phase="Succeeded")
        await env.wait_finished(er.metadata.name, "RunnerSucceeded")
        # a desired state that does not account for the completion (its JobCompleted was lost)
        await bus.publish(desired(namespace, replicas=1, patch=4))

        async def marker(n: int) -> bool:
            s = (await get_ers(kube, namespace)).status
            return s is not None and s.finished_runner_cleanup_patch_id == n

        async def gone() -> bool:
            return not await runners(kube, namespace, include_deleting=True)

        await wait_for(lambda: marker(4), timeout=15, what="marker recorded when the hold ran out")
        await wait_for(gone, timeout=15, what="the finished runner reaped")
        with anyio.move_on_after(1.0):  # suppressed at patch 4: no replacement
            while True:
                assert seen.names == {er.metadata.name}
                await anyio.sleep(0.05)
        # the listener's next desired state (still one job queued, say) lifts the suppression
        await bus.publish(desired(namespace, replicas=1, patch=5))
        await wait_for(lambda: len(seen.names) == 2, timeout=15, what="a runner for the new desired state")
        tg.cancel_scope.cancel()
