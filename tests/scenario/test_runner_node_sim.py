"""A real job through the node simulator: the runner worker's pod runs the simulator's runner
agent, which takes the job, finishes it and exits 0; the worker then deletes the runner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from services.embedded.node_sim.node import NodeSim, NodeSimConfig
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import wait_for
from tests.scenario.test_runner_helpers import SCALE_SET, RunnerEnv

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def node_sim(kube_api: Any, namespace: str, tmp_path: Any, actions_url: str) -> AsyncIterator[NodeSim]:
    config = NodeSimConfig(
        kubeconfig=str(kube_api.kubeconfig),
        namespace=namespace,
        state_dir=str(tmp_path / "node"),
        actions_url=actions_url,
        retry_interval=0.2,
        restart_backoff_base=0.2,
        restart_backoff_max=1.0,
        max_grace_seconds=2.0,
    )
    node = NodeSim(config, output=lambda line: None)
    async with anyio.create_task_group() as tg:
        await tg.start(node.run)
        with anyio.fail_after(10):
            await node.synced.wait()
        yield node
        tg.cancel_scope.cancel()


async def test_a_real_job_runs_and_the_runner_is_cleaned_up(
    runner_env: RunnerEnv, kube_api: KubeApi, namespace: str, tmp_path: Path
) -> None:
    env = runner_env
    await env.sim.control.enqueue_jobs(count=1, labels=[SCALE_SET], duration=0.3)
    async with node_sim(kube_api, namespace, tmp_path, env.sim.url):
        await env.create_er("er-real")

        async def running() -> bool:
            er = await env.er("er-real")
            return er is not None and er.status is not None and er.status.phase == "Running"

        await wait_for(running, timeout=20, what="ER Running from the node's pod status")
        await env.wait_gone("er-real", timeout=30)
    jobs = await env.sim.control.jobs()
    assert [(j.state, j.runner_name) for j in jobs] == [("completed", "er-real")]
    assert await env.service_runners() == []


async def test_an_outdated_runner_through_the_node_is_marked_outdated(
    runner_env: RunnerEnv, kube_api: KubeApi, namespace: str, tmp_path: Path
) -> None:
    env = runner_env
    await env.sim.control.set_min_runner_version("99.0.0")
    async with node_sim(kube_api, namespace, tmp_path, env.sim.url):
        await env.create_er("er-stale")

        async def outdated() -> bool:
            er = await env.er("er-stale")
            return er is not None and er.status is not None and er.status.phase == "Outdated"

        await wait_for(outdated, timeout=20, what="ER Outdated")

    async def unregistered() -> bool:
        return await env.service_runners() == []

    # the status is written before the (best-effort) removal from the service: wait for it
    await wait_for(unregistered, what="runner removed from the service")


async def test_deleting_a_busy_runner_waits_for_its_job(
    runner_env: RunnerEnv, kube_api: KubeApi, namespace: str, tmp_path: Path
) -> None:
    from shared.kube import EPHEMERAL_RUNNERS

    env = runner_env
    await env.sim.control.enqueue_jobs(count=1, labels=[SCALE_SET], duration=2.0)
    async with node_sim(kube_api, namespace, tmp_path, env.sim.url):
        await env.create_er("er-busy")

        async def busy() -> bool:
            return any(r.status == "busy" for r in await env.service_runners())

        await wait_for(busy, timeout=20, what="runner busy with the job")
        await env.kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-busy"))
        # the service refuses removal while the job runs: the ER waits, its pod keeps running
        er = await env.er("er-busy")
        assert er is not None and er.metadata.is_deleting
        pod = await env.pod("er-busy")
        assert pod is not None and not pod.metadata.is_deleting
        await env.wait_gone("er-busy", timeout=30)
    jobs = await env.sim.control.jobs()
    assert [(j.state, j.final_result or j.result) for j in jobs] == [("completed", "succeeded")]
