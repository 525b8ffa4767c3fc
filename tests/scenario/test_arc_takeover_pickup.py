"""Job pickup across the listener swap of a switch from ARC (README "Switching from ARC", step 4).

ARC 0.14's leftovers, its listener objects included, are installed while no worker runs and jobs
are already queued at the Actions simulator (ARC's listener is stopped with its controller here:
nothing picks them up). Then runnerscale starts: the scale-set, runner-set and listener-pod
workers, and the node simulator, which runs runnerscale's listener pod as a real ``runnerscale
listener`` process. A runner stand-in registers every runner runnerscale creates and plays it
against the simulator (``run_runner``), so each job is handed to a runner by the service itself.

Measured: the time from runnerscale's start to its first new runner, which must stay within one
message poll plus the start-up bound below; and that every queued job runs exactly once (one
runner each, never re-queued).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import pytest

from services.embedded.actions_sim.runner_agent import run_runner
from shared.actions import ActionsClient, PersonalAccessToken
from shared.kube import EPHEMERAL_RUNNERS, PODS, NotFound, ObjectKey
from shared.worker import WorkerSettings
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.node_sim.helpers import node_config, running_node
from tests.scenario.conftest import Kube, require_crds, wait_for
from tests.scenario.runner_set_helpers import (
    release_runner,
    report_registered_running,
    runners,
    set_runner_status,
    sim_scale_set,
)
from tests.scenario.test_arc_takeover import NAME, install_arc_leftovers, listener_pod_worker, workers

pytestmark = pytest.mark.anyio

#: Jobs queued while the switch happens (the fixture's maxRunners is 5, minRunners 1).
JOBS = 3
#: What runnerscale needs from its start to its first runner besides waiting for a message: the
#: scale-set worker's first pass (delete ARC's listener, create its own), the listener-pod worker
#: building the pod, the node starting a Python process (the listener's imports dominate: seconds
#: on a loaded 2-core test machine), the session, the DesiredState on the bus, the runner-set
#: worker's write. README "Switching from ARC" quotes this bound and what was measured.
STARTUP_BOUND = 25.0


@asynccontextmanager
async def runner_stand_in(
    kube: Any, namespace: str, actions_sim: Any, known: set[str], live: dict[str, str]
) -> AsyncIterator[list[str]]:
    """Registers every runner not in ``known`` (JIT config → status Running) and runs it against
    the simulator; runs ARC's ``live`` runners (name → JIT config: their pods kept running through
    the switch); strips the finalizers of deleting runners. Yields the names it started."""
    started: list[str] = []

    async def play(name: str, jit: str) -> None:
        await run_runner(actions_sim.url + "/", jit, job_wait=60.0)
        # The runner process exited: the runner worker reports it, the runner-set worker removes
        # the runner and creates another if still wanted.
        er = await kube.reader.get_or_none(EPHEMERAL_RUNNERS, ObjectKey(namespace, name))
        if er is not None:
            with suppress(NotFound):  # removed meanwhile (scaled down): nothing to report
                await set_runner_status(kube, er, phase="Succeeded", ready=False)

    async with (
        ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client,
        anyio.create_task_group() as tg,
    ):

        async def loop() -> None:
            while True:
                for r in await runners(kube, namespace, include_deleting=True):
                    if r.metadata.is_deleting:
                        await release_runner(kube, r)
                        continue
                    if r.metadata.uid in known or r.metadata.name in started:
                        continue
                    jit = await client.generate_jit_config(sid, r.metadata.name)
                    if not await report_registered_running(kube, r, jit.runner.id):
                        continue
                    started.append(r.metadata.name)
                    tg.start_soon(play, r.metadata.name, jit.encoded_jit_config)
                await anyio.sleep(0.05)  # a polling controller loop, not synchronisation

        sid = await sim_scale_set(actions_sim, NAME)
        for name, jit in live.items():
            tg.start_soon(play, name, jit)
        tg.start_soon(loop)
        try:
            yield started
        finally:
            tg.cancel_scope.cancel()


async def test_listener_swap_picks_up_queued_jobs_within_one_poll(
    kube: Kube,
    kube_api: KubeApi,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
    tmp_path: Path,
) -> None:
    await require_crds(kube)
    jits: dict[str, str] = {}
    await install_arc_leftovers(
        kube, "arc-0.14.yaml", namespace, actions_sim, github_secret, more=("arc-0.14-listener.yaml",), jits=jits
    )
    poll = (await actions_sim.control.settings()).poll_wait
    queued = await actions_sim.control.enqueue_jobs(count=JOBS, labels=[NAME])
    job_ids = {j.job_id for j in queued}
    arc_runners = {r.metadata.uid for r in await runners(kube, namespace, include_deleting=True)}
    arc_pod = await kube.reader.get(PODS, ObjectKey(namespace, "arc-runner-set-754b578d-listener"))

    # ARC's idle runner is a live runner process waiting for a job (the busy ones are mid-job).
    idle = "arc-runner-set-m4n8p-runner-x2k7f"
    ss, rs = workers(worker_settings, namespace)
    start = time.monotonic()
    async with (
        running_node(node_config(kube_api, namespace, tmp_path)) as node,
        ss as s,
        rs as r,
        listener_pod_worker(worker_settings) as p,
        runner_stand_in(kube, namespace, actions_sim, arc_runners, {idle: jits[idle]}) as started,
    ):
        for w in (s, r, p):
            await w.wait_ready()

        async def first_runner() -> float | None:
            return time.monotonic() - start if started else None

        try:
            gap = await wait_for(first_runner, timeout=poll + STARTUP_BOUND, what="runnerscale's first runner")
        except AssertionError:
            for pod in (await kube.reader.list(PODS, namespace=namespace)).items:
                print(pod.metadata.name, "\n".join(node.logs(namespace, pod.metadata.name) or []))
            raise
        print(f"first runner {gap:.2f}s after runnerscale started (poll {poll}s, bound {STARTUP_BOUND}s)")
        assert gap <= poll + STARTUP_BOUND
        arc_pod_now = await kube.reader.get_or_none(PODS, ObjectKey(namespace, arc_pod.metadata.name))
        assert (
            arc_pod_now is None or arc_pod_now.metadata.uid != arc_pod.metadata.uid or arc_pod_now.metadata.is_deleting
        )

        async def all_ran() -> list[Any] | None:
            jobs = [j for j in await actions_sim.control.jobs() if j.job_id in job_ids]
            return jobs if all(j.state == "completed" for j in jobs) else None

        try:
            jobs = await wait_for(all_ran, timeout=60, what="every queued job completed")
        except AssertionError:
            print("started", started)
            for j in await actions_sim.control.jobs():
                print(j)
            for er in await runners(kube, namespace, include_deleting=True):
                print(er.metadata.name, er.metadata.controller_reference(), er.status)
            raise

    # Exactly once: each job ran on its own runner (ARC's kept idle one or one runnerscale created),
    # on the first attempt (never re-queued), and succeeded.
    assert len(jobs) == JOBS
    assert all(j.attempts == 0 and j.final_result == "succeeded" for j in jobs), jobs
    names = [j.runner_name for j in jobs]
    assert len(set(names)) == JOBS and set(names) <= {idle, *started}, (names, started)
