"""Helpers for the runner-set scenarios: an ERS against the Actions simulator, a stand-in for the
runner worker (registers runners, strips finalizers of deleting ones), counting runners."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio

from shared.actions import ActionsClient, PersonalAccessToken
from shared.api import EphemeralRunner, EphemeralRunnerSet
from shared.kube import EPHEMERAL_RUNNER_SETS, EPHEMERAL_RUNNERS, Conflict, NotFound, ObjectKey
from tests.scenario.conftest import Kube


async def sim_scale_set(actions_sim: Any, name: str = "rs-set") -> int:
    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        found = await client.get_scale_set_by_name(name)
        return (found or await client.create_scale_set(name)).id


async def create_ers(
    kube: Kube,
    namespace: str,
    *,
    config_url: str,
    secret: str,
    scale_set_id: int,
    name: str = "set",
    revision: int = 0,
    proxy: dict[str, Any] | None = None,
) -> EphemeralRunnerSet:
    body = {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunnerSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"actions.github.com/scale-set-name": name, "actions.github.com/scale-set-namespace": namespace},
            "annotations": {"arc.test/runner-set-annotation": "initial"},
        },
        "spec": {
            "replicas": 0,
            "patchID": 0,
            "actionableRevision": revision,
            "ephemeralRunnerSpec": {
                "githubConfigUrl": config_url,
                "githubConfigSecret": secret,
                "runnerScaleSetId": scale_set_id,
                "spec": {
                    "containers": [{"name": "runner", "image": "ghcr.io/actions/runner:v1"}],
                    "restartPolicy": "Never",
                },
                **({"proxy": proxy} if proxy else {}),
            },
        },
    }
    return await kube.writer.create(EPHEMERAL_RUNNER_SETS, body)


async def runners(kube: Kube, namespace: str, *, include_deleting: bool = False) -> list[EphemeralRunner]:
    items = (await kube.reader.list(EPHEMERAL_RUNNERS, namespace=namespace)).items
    return [r for r in items if include_deleting or not r.metadata.is_deleting]


async def get_ers(kube: Kube, namespace: str, name: str = "set") -> EphemeralRunnerSet:
    return await kube.reader.get(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, name))


async def set_runner_status(kube: Kube, er: EphemeralRunner, **status: Any) -> None:
    """Patch an ER's status as the runner worker would (retried on 409 against a fresh read)."""
    await kube.edit(EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(er), {"status": status}, status=True)


class FakeRunnerWorker:
    """Stands in for the runner worker: registers new runners with the simulator (JIT config →
    runnerId, phase Running) when ``register`` is on, and removes the finalizers of deleting runners
    (no kubelet/runner worker runs in these scenarios, as in ARC's envtest suites)."""

    def __init__(
        self, kube: Kube, namespace: str, actions_sim: Any, scale_set_id: int, *, register: bool = True
    ) -> None:
        self.kube, self.namespace, self.sim, self.scale_set_id = kube, namespace, actions_sim, scale_set_id
        self.register = register
        self.registered: dict[str, int] = {}  # ER name -> runner id

    async def step(self, client: ActionsClient) -> None:
        for r in await runners(self.kube, self.namespace, include_deleting=True):
            if r.metadata.is_deleting:
                await release_runner(self.kube, r)
            elif self.register and r.metadata.name not in self.registered and not (r.status and r.status.runner_id):
                jit = await client.generate_jit_config(self.scale_set_id, r.metadata.name)
                self.registered[r.metadata.name] = jit.runner.id
                if not await report_registered_running(self.kube, r, jit.runner.id):
                    self.registered.pop(r.metadata.name, None)

    async def run(self) -> None:
        async with ActionsClient.from_config(self.sim.config_url(), PersonalAccessToken(self.sim.pat)) as client:
            while True:
                await self.step(client)
                await anyio.sleep(0.05)  # a polling controller loop, not synchronisation


@asynccontextmanager
async def fake_runner_worker(
    kube: Kube, namespace: str, actions_sim: Any, scale_set_id: int, *, register: bool = True
) -> AsyncIterator[FakeRunnerWorker]:
    fake = FakeRunnerWorker(kube, namespace, actions_sim, scale_set_id, register=register)
    async with anyio.create_task_group() as tg:
        tg.start_soon(fake.run)
        try:
            yield fake
        finally:
            tg.cancel_scope.cancel()


async def release_runner(kube: Kube, r: EphemeralRunner) -> None:
    """What a runner worker does last for a deleting runner: drop its finalizers (gone or changed
    meanwhile: nothing to do)."""
    with suppress(Conflict, NotFound):
        await kube.writer.patch_merge(
            EPHEMERAL_RUNNERS,
            EPHEMERAL_RUNNERS.key_of(r),
            {"metadata": {"finalizers": []}},
            resource_version=r.metadata.resource_version,
        )


async def report_registered_running(kube: Kube, r: EphemeralRunner, runner_id: int) -> bool:
    """Status as the runner worker writes it once the runner is registered and its pod runs;
    False when the runner changed or went meanwhile."""
    try:
        await kube.writer.patch_status(
            EPHEMERAL_RUNNERS,
            EPHEMERAL_RUNNERS.key_of(r),
            {"status": {"phase": "Running", "runnerId": runner_id, "runnerName": r.metadata.name, "ready": True}},
            resource_version=r.metadata.resource_version,
        )
    except (Conflict, NotFound):
        return False
    return True
