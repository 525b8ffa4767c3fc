"""Helpers for the runner worker's scenario tests (no tests here).

``runner_env`` starts the runner worker in-process against the API emulator, the test's
nats-server and a fresh Actions simulator, with a scale set registered there and short timings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from services.runner.decide import RunnerSettings
from services.runner.worker import WORKER
from shared.actions import ActionsClient, PersonalAccessToken
from shared.api import EphemeralRunner
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
)
from shared.kube import EPHEMERAL_RUNNERS, EVENTS, PODS, SECRETS, ApiReader, KubeClient, ObjectKey, Resource
from shared.worker import running_worker
from tests.scenario.conftest import Kube, wait_for

T = TypeVar("T")

SCALE_SET = "rs-set"
FAST = RunnerSettings(
    failure_backoff=(0.0, 0.05, 0.05, 0.05, 0.05, 0.05),
    job_still_running_requeue=0.2,
    runner_exists_requeue=0.05,
    already_exists_requeue=0.1,
    pending_status_after=0.0,  # Pending with the runner id at once, as the scenario tests expect; the deferral has its own tests
    job_event_defer=0.2,
    finished_release_after=3.0,  # no runner-set worker here: the runner worker releases finished runners (a window wide enough for wait_finished on a loaded machine)
)


def runner_template(**runner_extra: Any) -> dict[str, Any]:
    runner = {
        "name": "runner",
        "image": "ghcr.io/actions/actions-runner:latest",
        "command": ["/home/runner/run.sh"],
        **runner_extra,
    }
    return {
        "metadata": {"labels": {"tmpl": "yes"}, "annotations": {"tmpl-note": "x"}},
        "spec": {"containers": [runner], "restartPolicy": "Never"},
    }


@dataclass
class RunnerEnv:
    kube: Kube
    namespace: str
    sim: Any
    scale_set_id: int
    secret: str
    worker: Any = None

    def key(self, name: str) -> ObjectKey:
        return ObjectKey(self.namespace, name)

    @property
    def reconciler(self) -> Any:
        return self.worker.ctx.reconciler

    async def create_er(
        self,
        name: str,
        *,
        template: dict[str, Any] | None = None,
        revision: int | None = 3,
        scale_set_id: int | None = None,
        finalizers: tuple[str, ...] = (),
    ) -> EphemeralRunner:
        template = template or runner_template()
        annotations = {ANNOTATION_ACTIONABLE_REVISION: str(revision)} if revision is not None else {}
        body = {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {
                    LABEL_SCALE_SET_NAME: SCALE_SET,
                    LABEL_SCALE_SET_NAMESPACE: self.namespace,
                    "app.kubernetes.io/component": "runner",
                },
                "annotations": annotations,
                **({"finalizers": list(finalizers)} if finalizers else {}),
            },
            "spec": {
                "githubConfigUrl": self.sim.config_url(),
                "githubConfigSecret": self.secret,
                "runnerScaleSetId": scale_set_id or self.scale_set_id,
                "metadata": template["metadata"],
                "spec": template["spec"],
            },
        }
        return await self.kube.writer.create(EPHEMERAL_RUNNERS, body)

    async def er(self, name: str) -> EphemeralRunner | None:
        return await self.kube.reader.get_or_none(EPHEMERAL_RUNNERS, self.key(name))

    async def pod(self, name: str) -> Any:
        return await self.kube.reader.get_or_none(PODS, self.key(name))

    async def secret_of(self, name: str) -> Any:
        return await self.kube.reader.get_or_none(SECRETS, self.key(name))

    async def wait_pod(self, name: str, *, other_than: str = "", timeout: float = 20.0) -> Any:
        async def ready() -> Any:
            pod = await self.pod(name)
            return pod if pod is not None and pod.metadata.uid != other_than and not pod.metadata.is_deleting else None

        return await wait_for(
            ready, timeout=timeout, what=f"pod {name}" + (f" other than {other_than}" if other_than else "")
        )

    async def wait_gone(self, name: str, timeout: float = 20.0) -> None:
        async def gone() -> bool:
            return await self.er(name) is None

        await wait_for(gone, timeout=timeout, what=f"EphemeralRunner {name} deleted")

    async def wait_finished(self, name: str, reason: str, timeout: float = 20.0) -> EphemeralRunner:
        """Wait until the runner worker has marked ``name`` finished (issue #14): status Succeeded
        with ``reason`` and ``status.finishedAt`` (one status patch), its pod gone, going or no
        longer running (a finished runner's pod and Secret go with the ER, by garbage collection)."""

        async def finished() -> EphemeralRunner | None:
            er = await self.er(name)
            if er is None or er.status is None or er.status.phase != "Succeeded" or er.status.reason != reason:
                return None
            pod = await self.pod(name)
            stopped = pod is None or pod.metadata.is_deleting or pod.status.phase in ("Succeeded", "Failed")
            return er if er.status.finished_at is not None and stopped else None

        return await wait_for(finished, timeout=timeout, what=f"{name} finished ({reason})")

    async def set_pod_status(self, name: str, status: dict[str, Any]) -> Any:
        return await self.kube.edit(PODS, self.key(name), {"status": status}, status=True)

    async def terminate(self, name: str, exit_code: int, *, phase: str = "Failed", reason: str = "") -> Any:
        state = {
            "terminated": {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error")}
        }
        return await self.set_pod_status(
            name,
            {
                "phase": phase,
                "containerStatuses": [
                    {"name": "runner", "ready": False, "restartCount": 0, "image": "x", "state": state}
                ],
            },
        )

    async def run(self, name: str) -> Any:
        return await self.set_pod_status(
            name,
            {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "runner",
                        "ready": True,
                        "restartCount": 0,
                        "image": "x",
                        "state": {"running": {"startedAt": "2026-11-29T12:00:00Z"}},
                    }
                ],
            },
        )

    async def events(self, name: str) -> list[Any]:
        listed = await self.kube.reader.list(EVENTS, namespace=self.namespace)
        return [e for e in listed.items if e.involved_object.name == name]

    async def event_reasons(self, name: str) -> set[str]:
        return {e.reason for e in await self.events(name)}

    async def wait_events(self, name: str, *reasons: str, timeout: float = 20.0) -> set[str]:
        """Wait until ``name`` has Events with every one of ``reasons``: the worker records Events
        after the status write, and a real API server makes them visible to a list a moment later."""
        wanted = set(reasons)

        async def recorded() -> set[str] | None:
            seen = await self.event_reasons(name)
            return seen if wanted <= seen else None

        return await wait_for(recorded, timeout=timeout, what=f"events {sorted(wanted)} on {name}")

    async def service_runners(self) -> list[Any]:
        return [r for r in await self.sim.control.runners() if r.scale_set_id == self.scale_set_id]


async def register_scale_set(sim: Any, name: str = SCALE_SET) -> int:
    async with ActionsClient.from_config(sim.config_url(), PersonalAccessToken(sim.pat)) as client:
        existing = await client.get_scale_set_by_name(name)
        scale_set = existing or await client.create_scale_set(name)
        return scale_set.id


@asynccontextmanager
async def start_runner_env(
    kube: Kube,
    namespace: str,
    sim: Any,
    secret: str,
    worker_settings: Callable[..., Any],
    *,
    settings: RunnerSettings = FAST,
    replica: str = "r0",
) -> AsyncIterator[RunnerEnv]:
    env = RunnerEnv(kube, namespace, sim, await register_scale_set(sim), secret)
    async with running_worker(WORKER.name, worker_settings(replica, bus={"shards": 2}), WORKER.setup(settings)) as w:
        await w.wait_ready()
        env.worker = w
        yield env


class CountingReader(ApiReader):
    """An API reader counting its GETs of one resource (a worker's reads, in tests of what it
    decides without one)."""

    def __init__(self, client: KubeClient, resource: Resource[Any]) -> None:
        super().__init__(client)
        self.resource = resource
        self.gets = 0

    async def get_or_none(
        self, resource: Resource[T], key: ObjectKey | str, *, timeout: float | None = None
    ) -> T | None:
        if resource is self.resource:
            self.gets += 1
        return await super().get_or_none(resource, key, timeout=timeout)
