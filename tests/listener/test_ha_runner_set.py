"""HA handover creates no duplicate runner (issue 6): two listener replicas (leader + standby) for
one scale set, the real runner-set worker in-process (``running_worker``) against the Kubernetes
API emulator, NATS and the Actions simulator. N jobs are queued, the leader is killed while the
runner-set is still scaling up, the standby takes over, and the number of EphemeralRunners never
exceeds min+N and converges to it.

The runner count is followed through a watch on EphemeralRunners from before the first one
exists, so every create and delete is seen (no sampling gaps): the live count is exact at every
event, and a runner created and deleted again in between (a duplicate repaired) would show too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import msgspec
import pytest
from anyio.abc import TaskStatus

from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER
from shared.kube import EPHEMERAL_RUNNERS, KubeClient
from shared.listener_config import ListenerConfig
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.listener.conftest import BusTap, ScaleSet, start_listener
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.runner_set_helpers import create_ers, fake_runner_worker

pytestmark = pytest.mark.anyio

MIN_RUNNERS = 1
JOBS = 4


class _Meta(msgspec.Struct, frozen=True):
    uid: str = ""
    name: str = ""


class _Object(msgspec.Struct):
    metadata: _Meta = _Meta()


class _Event(msgspec.Struct):
    type: str
    object: _Object


@dataclass
class RunnerCensus:
    """Every EphemeralRunner that ever existed in the namespace, from a watch."""

    live: set[str] = field(default_factory=set)
    ever: dict[str, str] = field(default_factory=dict)  # uid -> name
    max_live: int = 0
    events: list[tuple[str, str, int]] = field(default_factory=list)  # (type, name, live after)

    def apply(self, event: _Event) -> None:
        uid = event.object.metadata.uid
        if event.type == "ADDED":
            self.live.add(uid)
            self.ever[uid] = event.object.metadata.name
        elif event.type == "DELETED":
            self.live.discard(uid)
        self.max_live = max(self.max_live, len(self.live))
        self.events.append((event.type, event.object.metadata.name, len(self.live)))


async def watch_runners(
    client: KubeClient,
    namespace: str,
    census: RunnerCensus,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    path = EPHEMERAL_RUNNERS.collection_path(namespace)
    query = [("watch", "true"), ("resourceVersion", "0"), ("timeoutSeconds", "600")]
    async with client.stream(path, what="watch ephemeralrunners", query=query, read_timeout=600) as lines:
        task_status.started()
        async for line in lines:
            event = msgspec.json.decode(line, type=_Event)
            if event.type in ("ADDED", "MODIFIED", "DELETED"):
                census.apply(event)


async def test_handover_during_scale_up_creates_no_duplicate_runner(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    kube: Kube,
    namespace: str,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    bound = MIN_RUNNERS + JOBS
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
    async with anyio.create_task_group() as watch:
        await watch.start(watch_runners, kube.client, namespace, census)
        async with (
            running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as worker,
            fake_runner_worker(kube, namespace, actions_sim, scale_set.id) as fake,
            anyio.create_task_group() as tg,
        ):
            await worker.wait_ready()
            leader = await start_listener(tg, cfg, "listener-a")
            await bus_tap.wait_for(lambda t: t.desired and t.desired[-1].replicas == MIN_RUNNERS)
            standby = await start_listener(tg, cfg, "listener-b")
            await wait_for(lambda: standby.health.role.value == "standby", what="standby")
            await wait_for(lambda: len(census.live) == MIN_RUNNERS, what="the idle minimum")

            await actions_sim.control.enqueue_jobs(count=JOBS, labels=[scale_set.name], duration=120)
            await bus_tap.wait_for(
                lambda t: t.desired[-1].replicas == bound and t.desired[-1].listener_epoch == leader.epoch
            )
            # SIGKILL the leader as soon as the runner-set acts on its desired state (scale-up under way).
            await wait_for(lambda: len(census.ever) > MIN_RUNNERS, interval=0.002, what="scale-up started")
            leader.crash()
            created_before_crash = len(census.ever)

            took_over = await bus_tap.wait_for(
                lambda t: [d for d in t.desired if d.listener_epoch != leader.epoch],
                timeout=20,
                what="the standby's desired state",
            )
            assert standby.epoch is not None and leader.epoch is not None
            assert took_over[0].listener_epoch == standby.epoch > leader.epoch
            assert (took_over[0].replicas, took_over[0].patch_id) == (bound, 0)
            await wait_for(
                lambda: len(census.live) == bound and len(fake.registered) == bound, what="converged on min+N"
            )
            # Consistently: a few more of the standby's polls (each re-publishes the level) change nothing.
            seen = len(bus_tap.desired)
            await bus_tap.wait_for(lambda t: len(t.desired) >= seen + 3, timeout=15)
            await wait_for(lambda: len(fake.registered) == bound, what="all registered")
            tg.cancel_scope.cancel()
        watch.cancel_scope.cancel()

    assert census.max_live <= bound, census.events
    assert len(census.live) == bound
    # No runner was ever created in excess and removed again: exactly min+N were ever created.
    assert len(census.ever) == bound, census.events
    assert MIN_RUNNERS < created_before_crash <= bound
    assert {d.replicas for d in bus_tap.desired} <= {MIN_RUNNERS, bound}
