"""Two replicas of the runner worker: every runner is reconciled by exactly one of them, and a
replica dying mid-way never creates a duplicate registration or pod."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.runner.worker import WORKER
from shared.kube import PODS
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_runner_helpers import FAST, RunnerEnv, register_scale_set

pytestmark = pytest.mark.anyio

N = 6


async def test_two_replicas_no_duplicates_across_a_crash(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    env = RunnerEnv(kube, namespace, actions_sim, await register_scale_set(actions_sim), github_secret)
    settings: Callable[[str], WorkerSettings] = lambda rid: worker_settings(rid, bus={"shards": 4})  # noqa: E731
    async with running_worker(WORKER.name, settings("a"), WORKER.setup(FAST)) as a:
        await a.wait_ready()
        async with running_worker(WORKER.name, settings("b"), WORKER.setup(FAST)) as b:
            await b.wait_ready()
            for i in range(N // 2):
                await env.create_er(f"er-ha-{i}")
            await wait_for(lambda: _all_registered(env, N // 2), timeout=20, what="first half registered")
            a.kill()  # a crash: a's shards move to b after the lease expires
            for i in range(N // 2, N):
                await env.create_er(f"er-ha-{i}")
            await wait_for(lambda: _all_registered(env, N), timeout=30, what="all registered after the crash")
            await wait_for(lambda: _pods(env, N), timeout=20, what="one pod per runner")
    runners = await env.service_runners()
    assert sorted(r.name for r in runners) == sorted(f"er-ha-{i}" for i in range(N))  # one registration each


async def _all_registered(env: RunnerEnv, n: int) -> bool:
    ids = []
    for i in range(n):
        er = await env.er(f"er-ha-{i}")
        if er is None or er.status is None or not er.status.runner_id:
            return False
        ids.append(er.status.runner_id)
    return len(set(ids)) == n


async def _pods(env: RunnerEnv, n: int) -> bool:
    listed = await env.kube.reader.list(PODS, namespace=env.namespace)
    return sorted(p.metadata.name for p in listed.items) == sorted(f"er-ha-{i}" for i in range(n))
