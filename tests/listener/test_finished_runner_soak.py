"""Soak for issue #14: many short waves of jobs through the whole runner path — the real listener,
the real runner-set and runner workers (in-process), the node simulator running each runner pod's
runner agent, the Actions simulator, NATS and the API emulator — and not one runner is created
for a job that already finished.

Invariant (exact): every EphemeralRunner ever created either ran exactly one job or is one of the
``minRunners`` idle runners alive at the end, so ``created == jobs + minRunners``. A runner created
for a finished job is idle and shows up as one more. Runners are counted from a watch on
EphemeralRunners opened before the first one exists, so none is missed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from msgspec.structs import replace

from services.runner.decide import RunnerSettings
from services.runner.worker import WORKER as RUNNER_WORKER
from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER as RUNNER_SET_WORKER
from shared.listener_config import ListenerConfig
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.listener.conftest import ScaleSet, start_listener
from tests.listener.test_ha_runner_set import RunnerCensus, watch_runners
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.runner_set_helpers import create_ers, runners
from tests.scenario.test_runner_node_sim import node_sim

pytestmark = pytest.mark.anyio

MIN_RUNNERS = 3
WAVES = 8
JOBS_PER_WAVE = 3
JOB_SECONDS = 0.5
ACK_DELAY = 0.3


async def test_short_waves_create_one_runner_per_job(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    kube: Kube,
    kube_api: KubeApi,
    namespace: str,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
    tmp_path: Path,
) -> None:
    # The listener acknowledges a message only after publishing its effects; holding every
    # acknowledgement a little keeps each partial desired state (one completion accounted, the
    # others not yet) the level while the finished runners leave — the window of issue #14.
    await actions_sim.control.set_fault("delete_message", kind="delay", seconds=ACK_DELAY, count=None)
    # the node simulator runs the runner agent in the container named "runner" (JIT config env)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=scale_set.id
    )
    cfg = make_config(
        min_runners=MIN_RUNNERS,
        max_runners=10,
        ephemeral_runner_set_namespace=namespace,
        ephemeral_runner_set_name="set",
    )
    census = RunnerCensus()
    runner_settings = replace(RunnerSettings(), failure_backoff=(0.0, 0.2))
    async with anyio.create_task_group() as watch:
        await watch.start(watch_runners, kube.client, namespace, census)
        async with (
            running_worker(
                RUNNER_SET_WORKER.name,
                worker_settings("rs", bus={"shards": 2}),
                RUNNER_SET_WORKER.setup(FailurePolicy()),
            ) as rs,
            running_worker(
                RUNNER_WORKER.name, worker_settings("r", bus={"shards": 2}), RUNNER_WORKER.setup(runner_settings)
            ) as rw,
            node_sim(kube_api, namespace, tmp_path, actions_sim.url),
            anyio.create_task_group() as tg,
        ):
            await rs.wait_ready()
            await rw.wait_ready()
            await start_listener(tg, cfg, "listener-a")

            async def idle_at_minimum() -> bool:
                live = await runners(kube, namespace, include_deleting=True)
                return len(live) == MIN_RUNNERS and all(
                    r.status is not None and r.status.runner_id and r.status.phase == "Running" for r in live
                )

            await wait_for(idle_at_minimum, timeout=30, what="the idle minimum")
            for wave in range(1, WAVES + 1):
                await actions_sim.control.enqueue_jobs(
                    count=JOBS_PER_WAVE, labels=[scale_set.name], duration=JOB_SECONDS
                )

                async def wave_done(n: int = wave * JOBS_PER_WAVE) -> bool:
                    jobs = await actions_sim.control.jobs()
                    return sum(1 for j in jobs if j.state == "completed") == n

                await wait_for(wave_done, timeout=30, what=f"wave {wave} completed")
                await wait_for(idle_at_minimum, timeout=30, what=f"back at the minimum after wave {wave}")
            tg.cancel_scope.cancel()
        watch.cancel_scope.cancel()

    jobs = await actions_sim.control.jobs()
    assert len(jobs) == WAVES * JOBS_PER_WAVE and all(j.state == "completed" for j in jobs)
    ran = {j.runner_name for j in jobs}
    assert len(ran) == len(jobs), "an ephemeral runner ran more than one job"
    idle = set(census.ever.values()) - ran
    assert len(census.ever) == len(jobs) + MIN_RUNNERS, f"created {len(census.ever)} runners; idle ones: {sorted(idle)}"
    assert len(idle) == MIN_RUNNERS
