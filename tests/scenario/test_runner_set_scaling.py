"""runner-set worker: desired state from the bus → EphemeralRunners, ARC's patch-ID protocol, and
the finished-runner cleanup marker (seeds 000, 003). Emulator + nats-server + Actions simulator."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import cast

import anyio
import msgspec
import pytest
import yaml
from prometheus_client import REGISTRY

from services.runner_set import decide
from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER
from shared.api import EphemeralRunnerSet, EphemeralRunnerStatus, OwnerReference
from shared.api.constants import ANNOTATION_ACTIONABLE_REVISION, ANNOTATION_PATCH_ID, FINALIZER_EPHEMERAL_RUNNER_SET
from shared.bus import Bus, DesiredState, ResourceRef
from shared.kube import AUTOSCALING_RUNNER_SETS, EPHEMERAL_RUNNER_SETS, ObjectKey
from shared.worker import WorkerContext, WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.runner_set_helpers import (
    create_ers,
    fake_runner_worker,
    get_ers,
    runners,
    set_runner_status,
    sim_scale_set,
)

pytestmark = pytest.mark.anyio

DATA = Path(__file__).resolve().parents[1] / "data" / "arc"


def desired(namespace: str, *, replicas: int, patch: int, epoch: int = 1, name: str = "set") -> DesiredState:
    return DesiredState(
        scale_set_id=1, ers=ResourceRef(namespace, name), patch_id=patch, replicas=replicas, listener_epoch=epoch
    )


async def count(kube: Kube, namespace: str) -> int:
    return len(await runners(kube, namespace))


def desired_handled() -> float:
    """Desired-state messages whose handler returned (bus metric, this process's registry): once it
    has counted a message, the runner-set worker has taken it into account (``on_desired``)."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == "runnerscale_bus_handled_messages"
        for sample in family.samples
        if sample.name.endswith("_total") and "desired" in sample.labels.get("subject_kind", "").lower()
    )


async def publish_handled(bus: Bus, message: DesiredState) -> None:
    """Publish and wait until the runner-set worker has handled the message, so that a following
    'nothing changes' observation covers the message instead of passing before it arrived."""
    before = desired_handled()
    await bus.publish(message)
    await wait_for(lambda: desired_handled() > before, what="desired state handled")


async def stays(kube: Kube, namespace: str, n: int, seconds: float = 1.0) -> None:
    """Observe for a bounded window that the live runner count stays ``n`` (a 'consistently' check)."""
    with anyio.move_on_after(seconds):
        while True:
            assert await count(kube, namespace) == n
            await anyio.sleep(0.05)


async def test_desired_state_patch_protocol_and_epochs(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    ss = await sim_scale_set(actions_sim)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, revision=2
    )
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss) as fake,
    ):
        await w.wait_ready()
        await wait_for(lambda: get_ers(kube, namespace), what="ERS")
        ers = await wait_for(lambda: _with_finalizer(kube, namespace), what="finalizer")
        assert FINALIZER_EPHEMERAL_RUNNER_SET in ers.metadata.finalizers

        # patch 0 = authoritative: up to N, every runner annotated and owned
        await bus.publish(desired(namespace, replicas=3, patch=0))
        await wait_for(lambda: _count_is(kube, namespace, 3), what="3 runners")
        ers = await get_ers(kube, namespace)
        assert ers.spec.replicas == 3 and ers.spec.patch_id == 0
        applied = decide.parse_applied_desired(ers.metadata.annotations)
        assert applied is not None
        assert applied.epoch == 1
        for r in await runners(kube, namespace):
            assert r.metadata.annotations[ANNOTATION_PATCH_ID] == "0"
            assert r.metadata.annotations[ANNOTATION_ACTIONABLE_REVISION] == "2"
            assert r.metadata.annotations["arc.test/runner-set-annotation"] == "initial"
            assert cast(OwnerReference, r.metadata.controller_reference()).uid == ers.metadata.uid
            assert r.metadata.labels["app.kubernetes.io/component"] == "runner"
        await wait_for(lambda: len(fake.registered) == 3, what="runners registered")
        await wait_for(lambda: _status(kube, namespace, current=3, running=3), what="status counts")

        # a new patch ID scales up only
        await bus.publish(desired(namespace, replicas=1, patch=1))
        await wait_for(lambda: _spec_is(kube, namespace, 1, 1), what="spec applied")
        await stays(kube, namespace, 3, 0.5)
        await bus.publish(desired(namespace, replicas=4, patch=2))
        await wait_for(lambda: _count_is(kube, namespace, 4), what="scale up to 4")

        # same patch ID: status only (re-publishing patch 2 changes nothing)
        await publish_handled(bus, desired(namespace, replicas=4, patch=2))
        await stays(kube, namespace, 4, 0.5)

        # a deposed leader (older epoch) never overrides the newer epoch
        await bus.publish(desired(namespace, replicas=6, patch=0, epoch=2))
        await wait_for(lambda: _count_is(kube, namespace, 6), what="epoch 2 applied")
        await wait_for(lambda: len(fake.registered) == 6, what="all registered")
        # the fake records a registration before its status patch lands, and the runner-set worker
        # removes a runner from the service only when its (cached) status has the runner id: wait
        # until its status counts all six as running (it counted them from runners with ids)
        await wait_for(lambda: _status(kube, namespace, current=6, running=6), what="6 running in status")
        await publish_handled(bus, desired(namespace, replicas=0, patch=0, epoch=1))
        await stays(kube, namespace, 6, 0.5)
        assert (await get_ers(kube, namespace)).spec.replicas == 6

        # patch 0 is authoritative down: idle registered runners removed from the service first
        await bus.publish(desired(namespace, replicas=2, patch=0, epoch=2))
        # four service removals and deletions (each a retry after 5 s if the service call fails):
        # a longer deadline, seen exceeding 20 s on an overloaded machine
        await wait_for(lambda: _count_is(kube, namespace, 2), timeout=60, what="scale down to 2")
        live_ids = {cast(EphemeralRunnerStatus, r.status).runner_id for r in await runners(kube, namespace)}
        sim_ids = {r.id for r in await actions_sim.control.runners()}
        removed = set(fake.registered.values()) - live_ids
        assert removed and not (removed & sim_ids), "scaled-down runners must be removed from the service"


async def test_finished_runners_reaped_once_no_replacement_and_descending_patch_ids(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss) as fake,
    ):
        await w.wait_ready()
        await bus.publish(desired(namespace, replicas=2, patch=7))
        await wait_for(lambda: _count_is(kube, namespace, 2), what="2 runners")
        await wait_for(lambda: len(fake.registered) == 2, what="registered")
        first, second = sorted(await runners(kube, namespace), key=lambda r: r.metadata.name)
        await set_runner_status(kube, second, jobId="job-1")  # busy

        # job finished on `first`; the listener publishes a fresh patch still asking for 2
        await set_runner_status(kube, first, phase="Succeeded")
        await bus.publish(desired(namespace, replicas=2, patch=8))
        await wait_for(lambda: _marker_is(kube, namespace, 8), what="marker 8")
        await wait_for(lambda: _count_is(kube, namespace, 1), what="finished runner reaped")
        await stays(kube, namespace, 1, 1.0)  # no replacement for the completed job

        # listener restart: new epoch, patch IDs restart low; patch 0 is authoritative
        await bus.publish(desired(namespace, replicas=2, patch=0, epoch=2))
        await wait_for(lambda: _count_is(kube, namespace, 2), what="refilled by patch 0")
        await wait_for(lambda: len(fake.registered) == 3, what="registered")
        newest = next(r for r in await runners(kube, namespace) if r.metadata.name != second.metadata.name)
        # the new listener's sequence reaches 7 = the highest patch-id on a live runner: status only,
        # so the job finishing now is not reaped under this patch
        await bus.publish(desired(namespace, replicas=2, patch=7, epoch=2))
        await wait_for(lambda: _spec_is(kube, namespace, 2, 7), what="patch 7 applied")
        await set_runner_status(kube, newest, phase="Succeeded")
        await stays(kube, namespace, 2, 0.3)
        assert await _marker_is(kube, namespace, 8)
        # descending patch ID (3 < 8 = the marker): the marker must follow it down, and suppression fire at 3
        await bus.publish(desired(namespace, replicas=2, patch=3, epoch=2))
        await wait_for(lambda: _marker_is(kube, namespace, 3), what="marker follows the patch ID down")
        await wait_for(lambda: _count_is(kube, namespace, 1), what="reaped")
        await stays(kube, namespace, 1, 1.0)
        # the next patch accounts for the completion: scale-up resumes
        await bus.publish(desired(namespace, replicas=2, patch=4, epoch=2))
        await wait_for(lambda: _count_is(kube, namespace, 2), what="scale-up after a fresh patch")


async def _with_finalizer(kube: Kube, namespace: str) -> EphemeralRunnerSet | None:
    ers = await get_ers(kube, namespace)
    return ers if FINALIZER_EPHEMERAL_RUNNER_SET in ers.metadata.finalizers else None


async def _count_is(kube: Kube, namespace: str, n: int) -> bool:
    return await count(kube, namespace) == n


async def _spec_is(kube: Kube, namespace: str, replicas: int, patch: int) -> bool:
    ers = await get_ers(kube, namespace)
    return ers.spec.replicas == replicas and ers.spec.patch_id == patch


async def _marker_is(kube: Kube, namespace: str, marker: int) -> bool:
    ers = await get_ers(kube, namespace)
    return ers.status is not None and ers.status.finished_runner_cleanup_patch_id == marker


async def _status(kube: Kube, namespace: str, *, current: int, running: int) -> bool:
    s = (await get_ers(kube, namespace)).status
    return (
        s is not None
        and s.current_replicas == current
        and s.running_ephemeral_runners == running
        and s.phase == "Running"
    )


_ = dt


async def test_identical_desired_states_write_nothing(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    """The listener republishes its desired state on every poll; the ERS is written only when what
    it records changes (epoch, patchID, replicas). Counted from a watch of the ERS, so it holds on
    a real API server too: N identical publishes, then one changed one; exactly one write lands."""
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    async with running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w:
        await w.wait_ready()
        await bus.publish(desired(namespace, replicas=0, patch=1))
        await wait_for(lambda: _spec_is(kube, namespace, 0, 1), what="first desired state applied")
        await wait_for(lambda: _status(kube, namespace, current=0, running=0), what="status settled")
        before = await get_ers(kube, namespace)
        first = before.metadata.annotations[decide.ANNOTATION_APPLIED_DESIRED_STATE]
        records: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_collect_records, kube, namespace, before.metadata.resource_version, first, records)
            for _ in range(10):
                await bus.publish(desired(namespace, replicas=0, patch=1))
            await bus.publish(desired(namespace, replicas=0, patch=2))  # the marker: one real change
            await wait_for(lambda: _spec_is(kube, namespace, 0, 2), what="changed desired state applied")
            await wait_for(lambda: len(records) >= 1, what="the change seen by the watch")
            tg.cancel_scope.cancel()
    assert len(records) == 1, f"ERS written {len(records)} times for 10 identical publishes + 1 change: {records}"
    assert '"patchId":2' in records[0]


async def _collect_records(kube: Kube, namespace: str, since: str, last: str, records: list[str]) -> None:
    """Every change of the applied-desired-state annotation after ``since``, from a watch."""
    path = EPHEMERAL_RUNNER_SETS.collection_path(namespace)
    query = [("watch", "1"), ("resourceVersion", since), ("fieldSelector", "metadata.name=set")]
    async with kube.client.stream(path, what="WATCH ers", query=query, read_timeout=60) as lines:
        async for line in lines:
            event = msgspec.json.decode(line)
            if event["type"] != "MODIFIED":
                continue
            record = event["object"]["metadata"].get("annotations", {}).get(decide.ANNOTATION_APPLIED_DESIRED_STATE)
            if record != last:
                last = record
                records.append(record)


async def test_lagging_informer_cache_never_creates_a_replacement_for_a_completed_job(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    kube_api: KubeApi,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    """Seed 001/003: the suppression must be decided on authoritative reads. With every watch event
    delayed, the worker's cache still shows the marker unset and the finished runner present; the
    reconciles that its own writes trigger must still not create a replacement."""
    control = kube_api.require_emulator()
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss) as fake,
    ):
        await w.wait_ready()
        await bus.publish(desired(namespace, replicas=2, patch=1))
        await wait_for(lambda: _count_is(kube, namespace, 2), what="2 runners")
        await wait_for(lambda: len(fake.registered) == 2, what="registered")
        done = sorted(await runners(kube, namespace), key=lambda r: r.metadata.name)[0]
        await control.settings_async(watch_lag_seconds=0.4)
        try:
            await set_runner_status(kube, done, phase="Succeeded")
            await bus.publish(desired(namespace, replicas=2, patch=2))
            await wait_for(lambda: _marker_is(kube, namespace, 2), what="marker 2")
            await wait_for(lambda: _count_is(kube, namespace, 1), what="reaped")
            await stays(kube, namespace, 1, 1.5)
        finally:
            await control.settings_async(watch_lag_seconds=0.0)


async def test_failed_finished_runner_cleanup_is_a_reconcile_error_and_is_retried(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    kube_api: KubeApi,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    """Seed 000: cleanup of finished runners is not deferred and its failures are not swallowed:
    a delete the API server refuses fails the reconcile (counted as an error) and is retried until
    the finished runner is gone — with the marker recorded first and no replacement made."""
    control = kube_api.require_emulator()
    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss) as fake,
    ):
        await w.wait_ready()
        await bus.publish(desired(namespace, replicas=2, patch=1))
        await wait_for(lambda: _count_is(kube, namespace, 2), what="2 runners")
        await wait_for(lambda: len(fake.registered) == 2, what="registered")
        done = sorted(await runners(kube, namespace), key=lambda r: r.metadata.name)[0]
        errors = cast(WorkerContext, w.ctx).registry.get_sample_value(
            "controller_runtime_reconcile_errors_total", {"controller": "ephemeralrunnerset"}
        )
        await control.add_fault_async(
            action="error", code=500, verb="delete", resource="ephemeralrunners", namespace=namespace, times=2
        )
        await set_runner_status(kube, done, phase="Succeeded")
        await bus.publish(desired(namespace, replicas=2, patch=2))
        await wait_for(lambda: _marker_is(kube, namespace, 2), what="marker recorded before the reaping")
        await wait_for(lambda: _count_is(kube, namespace, 1), timeout=30, what="reaped after the retries")
        after = cast(WorkerContext, w.ctx).registry.get_sample_value(
            "controller_runtime_reconcile_errors_total", {"controller": "ephemeralrunnerset"}
        )
        assert (after or 0) >= (errors or 0) + 2, "each refused delete must fail its reconcile"
        await stays(kube, namespace, 1, 1.0)  # and no replacement for the completed job


async def test_never_more_runners_than_max_runners_whatever_the_bus_or_spec_says(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    """Defence in depth (the listener clamps too): a well-formed desired state above the set's
    maxRunners, from any publisher, is clamped to it, counted and logged; a spec.replicas written
    above it by hand creates no runner beyond it either."""
    ss = await sim_scale_set(actions_sim)
    ars_tree = yaml.safe_load((DATA / "ars-minimal.yaml").read_text())
    ars_tree["metadata"] = {"name": "set", "namespace": namespace}
    ars_tree["spec"].update(githubConfigUrl=actions_sim.config_url(), githubConfigSecret=github_secret)
    ars_tree["spec"].update(minRunners=1, maxRunners=4)
    ars = await kube.writer.create(AUTOSCALING_RUNNER_SETS, ars_tree)
    ers = await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, revision=1
    )
    owner = {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "name": "set",
        "uid": ars.metadata.uid,
        "controller": True,
    }
    await kube.writer.patch_merge(
        EPHEMERAL_RUNNER_SETS,
        ObjectKey(namespace, "set"),
        {"metadata": {"ownerReferences": [owner]}},
        resource_version=ers.metadata.resource_version,
    )
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss),
    ):
        await w.wait_ready()
        await wait_for(lambda: _with_finalizer(kube, namespace), what="finalizer")
        await bus.publish(desired(namespace, replicas=25, patch=1))
        await wait_for(lambda: _spec_is(kube, namespace, 4, 1), what="desired state clamped to maxRunners")
        await wait_for(lambda: _count_is(kube, namespace, 4), what="4 runners")
        await stays(kube, namespace, 4, 1.0)

        def clamped() -> float:
            return sum(
                sample.value
                for family in cast(WorkerContext, w.ctx).registry.collect()
                if family.name == "runnerscale_runner_set_max_runners_clamped"
                for sample in family.samples
                if sample.name.endswith("_total") and sample.labels["namespace"] == namespace
            )

        assert clamped() >= 1
        # spec.replicas written above maxRunners (not through the bus): creation stops at 4 anyway.
        await kube.edit(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"spec": {"replicas": 9, "patchID": 0}})
        await wait_for(lambda: _spec_is(kube, namespace, 9, 0), what="hand-written replicas")
        await wait_for(lambda: clamped() >= 2, what="scale-up capped and counted")
        await stays(kube, namespace, 4, 1.0)
