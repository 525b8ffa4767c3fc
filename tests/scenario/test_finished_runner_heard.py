"""A finished runner is accounted by the runner-set from the listener's own JobCompleted on the
bus, without waiting for the runner worker's job-completed mark (README "Typed state (new fields)").

Measured by `python -m tests.bench e2e`: with 50 runners cycling, the runner worker's job-event
consumer wrote the mark ~4 s after the job ended, and the runner-set held every finished runner
(counted toward the total) until then. Here the runner worker is stopped once the runner is
Succeeded, so no mark is ever written: before the fix the runner stayed until the 60 s hold."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from msgspec.structs import replace

from services.runner.worker import WORKER as RUNNER_WORKER
from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER as RUNNER_SET_WORKER
from shared.api.constants import ANNOTATION_JOB_COMPLETED
from shared.bus import Bus
from shared.bus.messages import JobCompleted, JobStarted
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.runner_set_helpers import create_ers, get_ers, runners, sim_scale_set
from tests.scenario.test_finished_runner_race import desired, job_event
from tests.scenario.test_runner_helpers import FAST, RunnerEnv

pytestmark = pytest.mark.anyio


async def test_finished_runner_accounted_from_the_bus_without_the_mark(
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    async with running_worker(
        RUNNER_SET_WORKER.name, worker_settings("rs", bus={"shards": 2}), RUNNER_SET_WORKER.setup(FailurePolicy())
    ) as rs:
        await rs.wait_ready()
        async with running_worker(
            RUNNER_WORKER.name,
            worker_settings("r", bus={"shards": 2}),
            RUNNER_WORKER.setup(replace(FAST, finished_release_after=300.0)),
        ) as rw:
            await rw.wait_ready()
            env = RunnerEnv(kube, namespace, actions_sim, ss, github_secret, worker=rw)
            await bus.publish(desired(namespace, replicas=1, patch=3))

            async def registered() -> str | None:
                rs_ = await runners(kube, namespace)
                ok = len(rs_) == 1 and rs_[0].status is not None and rs_[0].status.runner_id
                return rs_[0].metadata.name if ok else None

            name = await wait_for(registered, timeout=30, what="1 registered runner")
            await env.wait_pod(name)
            await env.run(name)
            er = await env.er(name)
            assert er is not None
            await env.reconciler.handle_job_event(job_event(JobStarted, namespace, er, 1))
            await env.terminate(name, 0, phase="Succeeded")

            async def succeeded() -> bool:
                e = await env.er(name)
                return e is not None and e.status is not None and e.status.phase == "Succeeded"

            await wait_for(succeeded, timeout=20, what="runner Succeeded")
        # The runner worker is gone: nothing writes the job-completed mark from here on.
        er = await env.er(name)
        assert er is not None

        # The listener: JobCompleted, then (later) the desired state computed from that message.
        await bus.publish(job_event(JobCompleted, namespace, er, 1, result="succeeded"))
        with anyio.move_on_after(1.0):  # the completion alone accounts for nothing: held
            while True:
                now = await runners(kube, namespace, include_deleting=True)
                assert [r.metadata.name for r in now] == [name]
                assert not now[0].metadata.is_deleting, "deleted before the desired state accounted for its job"
                await anyio.sleep(0.05)
        await bus.publish(desired(namespace, replicas=0, patch=4))

        async def applied() -> bool:
            return (await get_ers(kube, namespace)).spec.patch_id == 4

        await wait_for(applied, what="patch 4 applied")

        async def deleting() -> bool:
            e = await env.er(name)
            return e is None or e.metadata.is_deleting

        # well before FINISHED_HOLD (60 s): the runner-set heard the completion itself
        await wait_for(deleting, timeout=10, what="finished runner deleted by the runner-set")
        e = await env.er(name)
        assert e is None or ANNOTATION_JOB_COMPLETED not in e.metadata.annotations  # not via the mark
        assert [r.metadata.name for r in await runners(kube, namespace, include_deleting=True)] in ([], [name])
