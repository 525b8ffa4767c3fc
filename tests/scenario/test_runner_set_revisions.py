"""runner-set worker: revision rollout and the revision-aware Outdated phase (seeds 001, 002)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest

from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER
from shared.api import EphemeralRunner, EphemeralRunnerStatus, runner_revision
from shared.bus import Bus, DesiredState, ResourceRef, RevisionApplied, RevisionPublished, subjects
from shared.kube import EPHEMERAL_RUNNER_SETS, ObjectKey
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
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


async def bump_revision(kube: Kube, bus: Bus, namespace: str, revision: int) -> None:
    await kube.edit(
        EPHEMERAL_RUNNER_SETS,
        ObjectKey(namespace, "set"),
        {
            "spec": {
                "actionableRevision": revision,
                "ephemeralRunnerSpec": {"spec": {"containers": [{"name": "runner", "image": f"img:{revision}"}]}},
            }
        },
    )
    await bus.publish(RevisionPublished(ers=ResourceRef(namespace, "set"), revision=revision))


async def applied(kube: Kube, namespace: str, revision: int) -> bool:
    s = (await get_ers(kube, namespace)).status
    return s is not None and s.applied_actionable_revision == revision


async def live(kube: Kube, namespace: str) -> list[EphemeralRunner]:
    return await runners(kube, namespace)


async def test_rollout_replaces_idle_keeps_busy_then_applies_and_publishes(
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
        await bus.publish(
            DesiredState(scale_set_id=ss, ers=ResourceRef(namespace, "set"), patch_id=0, replicas=3, listener_epoch=1)
        )
        await wait_for(lambda: _registered(kube, namespace, 3), what="3 registered runners")
        busy = sorted(await live(kube, namespace), key=lambda r: r.metadata.name)[0]
        await set_runner_status(kube, busy, jobId="job-42")
        await kube.edit(
            EPHEMERAL_RUNNER_SETS,
            ObjectKey(namespace, "set"),
            {"status": {"finishedRunnerCleanupPatchID": 5}},
            status=True,
        )
        old_ids = {
            cast(EphemeralRunnerStatus, r.status).runner_id
            for r in await live(kube, namespace)
            if r.metadata.name != busy.metadata.name
        }

        await bump_revision(kube, bus, namespace, 1)
        await wait_for(lambda: applied(kube, namespace, 1), what="appliedActionableRevision 1")
        ers = await get_ers(kube, namespace)
        assert ers.status is not None
        assert ers.status.finished_runner_cleanup_patch_id is None  # cleared when a revision is applied
        msg = await wait_for(
            lambda: bus.last_message(subjects.revision_applied_subject(namespace, "set")), what="RevisionApplied"
        )
        assert isinstance(msg, RevisionApplied) and msg.revision == 1

        async def rebuilt() -> bool:
            rs = await live(kube, namespace)
            revs = sorted((r.metadata.name == busy.metadata.name, runner_revision(r.metadata)) for r in rs)
            return revs == [(False, 1), (False, 1), (True, 0)]

        await wait_for(rebuilt, what="idle runners rebuilt at revision 1, busy one kept at revision 0")
        sim_ids = {r.id for r in await actions_sim.control.runners()}
        assert not (old_ids & sim_ids), "idle runners of the old revision are removed from the service"
        new = [r for r in await live(kube, namespace) if r.metadata.name != busy.metadata.name]
        assert all(r.spec.spec["containers"][0]["image"] == "img:1" for r in new)
        assert fake.registered


async def test_outdated_current_holds_phase_stale_is_replaced(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    ss = await sim_scale_set(actions_sim)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, revision=1
    )
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss),
    ):
        await w.wait_ready()
        await wait_for(lambda: applied(kube, namespace, 1), what="revision 1 applied on an empty set")
        await bus.publish(
            DesiredState(scale_set_id=ss, ers=ResourceRef(namespace, "set"), patch_id=0, replicas=2, listener_epoch=1)
        )
        await wait_for(lambda: _registered(kube, namespace, 2), what="2 registered runners")
        a, b = sorted(await live(kube, namespace), key=lambda r: r.metadata.name)

        # current Outdated: holds the phase, not replaced
        await set_runner_status(kube, a, phase="Outdated", reason="Outdated")
        await wait_for(lambda: _phase(kube, namespace, "Outdated"), what="phase Outdated")
        assert {r.metadata.name for r in await live(kube, namespace)} == {a.metadata.name, b.metadata.name}

        # b is busy and survives the rollout to revision 2; a (Outdated at rev 1) is deleted
        await set_runner_status(kube, b, jobId="job-7")
        await bump_revision(kube, bus, namespace, 2)
        await wait_for(lambda: applied(kube, namespace, 2), what="revision 2 applied")
        await wait_for(lambda: _phase(kube, namespace, "Running"), what="phase recomputed to Running")

        # b finishes and reports Outdated: stale (rev 1 < applied 2) → deleted and replaced
        await set_runner_status(kube, b, phase="Outdated", jobId="")

        async def replaced() -> bool:
            rs = await live(kube, namespace)
            return (
                len(rs) == 2
                and all(runner_revision(r.metadata) == 2 for r in rs)
                and all(r.metadata.name != b.metadata.name for r in rs)
            )

        await wait_for(replaced, what="stale Outdated runner replaced by revision-2 runners")
        assert await _phase(kube, namespace, "Running")


async def _registered(kube: Kube, namespace: str, n: int) -> bool:
    rs = await runners(kube, namespace)
    return len(rs) == n and all(r.status and r.status.runner_id for r in rs)


async def _phase(kube: Kube, namespace: str, phase: str) -> bool:
    s = (await get_ers(kube, namespace)).status
    return s is not None and s.phase == phase


async def test_deletion_removes_idle_from_service_waits_for_busy_then_releases_finalizer(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    import aiohttp

    from shared.kube import NotFound

    ss = await sim_scale_set(actions_sim)
    await create_ers(kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss)
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss),
    ):
        await w.wait_ready()
        await bus.publish(
            DesiredState(scale_set_id=ss, ers=ResourceRef(namespace, "set"), patch_id=0, replicas=3, listener_epoch=1)
        )
        await wait_for(lambda: _registered(kube, namespace, 3), what="3 registered runners")
        gauge = f'gha_controller_running_ephemeral_runners{{enterprise="",name="set",namespace="{namespace}",organization="{actions_sim.org}",repository=""}} 3.0'

        async def served() -> bool:
            # The gauge follows the worker's next reconcile after the runners run: wait for it.
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{w.ports['metrics']}/metrics") as r,
            ):
                return gauge in await r.text()

        await wait_for(served, what="running-runners gauge at 3 on /metrics")
        busy = sorted(await live(kube, namespace), key=lambda r: r.metadata.name)[0]
        await set_runner_status(kube, busy, jobId="job-9")
        idle_ids = {
            cast(EphemeralRunnerStatus, r.status).runner_id
            for r in await live(kube, namespace)
            if r.metadata.name != busy.metadata.name
        }

        await kube.writer.delete(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"))
        await wait_for(
            lambda: _names(kube, namespace, {busy.metadata.name}), what="idle runners removed, busy one kept"
        )
        assert not (idle_ids & {r.id for r in await actions_sim.control.runners()})
        assert (await get_ers(kube, namespace)).metadata.is_deleting  # finalizer held while a job runs

        await set_runner_status(kube, busy, phase="Succeeded")

        async def gone() -> bool:
            try:
                await get_ers(kube, namespace)
            except NotFound:
                return True
            return False

        await wait_for(gone, what="ERS gone once its last runner finished")


async def _names(kube: Kube, namespace: str, names: set[str]) -> bool:
    return {r.metadata.name for r in await runners(kube, namespace)} == names


async def test_proxy_secret_created_referenced_and_deleted_with_the_set(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    import base64

    from shared.api.names import runner_proxy_secret_name
    from shared.kube import SECRETS, NotFound
    from tests.scenario.conftest import create_secret

    await create_secret(kube, namespace, "proxy-creds", {"username": "test", "password": "password"})
    proxy = {
        "http": {"url": "http://proxy.example:3128", "credentialSecretRef": "proxy-creds"},
        "https": {"url": "http://proxy.example:3129"},
        "noProxy": ["example.com", "example.org"],
    }
    ss = await sim_scale_set(actions_sim)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, proxy=proxy
    )
    name = runner_proxy_secret_name("set", namespace)
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss, register=False),
    ):
        await w.wait_ready()
        await bus.publish(
            DesiredState(scale_set_id=ss, ers=ResourceRef(namespace, "set"), patch_id=0, replicas=1, listener_epoch=1)
        )
        await wait_for(lambda: _count_live(kube, namespace, 1), what="1 runner")
        secret = await kube.reader.get(SECRETS, ObjectKey(namespace, name))
        data = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
        assert data == {
            "http_proxy": "http://test:password@proxy.example:3128",
            "https_proxy": "http://proxy.example:3129",
            "no_proxy": "example.com,example.org",
        }
        assert all(r.spec.proxy_secret_ref == name for r in await live(kube, namespace))
        await kube.writer.delete(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"))

        async def all_gone() -> bool:
            try:
                await get_ers(kube, namespace)
                return False
            except NotFound:
                pass
            return await kube.reader.get_or_none(SECRETS, ObjectKey(namespace, name)) is None and not await runners(
                kube, namespace, include_deleting=True
            )

        await wait_for(all_gone, what="runners, proxy Secret and ERS gone")


async def _count_live(kube: Kube, namespace: str, n: int) -> bool:
    return len(await runners(kube, namespace)) == n


async def test_parked_outdated_set_drains_idle_runners_busy_ones_finish(
    worker_settings: Callable[..., WorkerSettings],
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
) -> None:
    """Issue #14 item 3: when the scale-set worker parks an Outdated set (no listener; the ERS gets
    replicas 0, patchID 0), registered idle runners of the parked spec are removed from the service
    and deleted, so none takes a job nobody listens for; busy runners finish theirs."""
    ss = await sim_scale_set(actions_sim)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, revision=1
    )
    async with (
        running_worker(WORKER.name, worker_settings(), WORKER.setup(FailurePolicy())) as w,
        fake_runner_worker(kube, namespace, actions_sim, ss),
    ):
        await w.wait_ready()
        await wait_for(lambda: applied(kube, namespace, 1), what="revision 1 applied on an empty set")
        await bus.publish(
            DesiredState(scale_set_id=ss, ers=ResourceRef(namespace, "set"), patch_id=0, replicas=3, listener_epoch=1)
        )
        await wait_for(lambda: _registered(kube, namespace, 3), what="3 registered runners")
        outdated, busy, idle = sorted(await live(kube, namespace), key=lambda r: r.metadata.name)
        await set_runner_status(kube, busy, jobId="job-1")
        await set_runner_status(kube, outdated, phase="Outdated", reason="Outdated")
        await wait_for(lambda: _phase(kube, namespace, "Outdated"), what="phase Outdated")

        # the scale-set worker parks the set (README "scale-set worker", Outdated guard)
        await kube.edit(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"spec": {"replicas": 0, "patchID": 0}})

        async def drained() -> bool:
            names = {r.metadata.name for r in await live(kube, namespace)}
            return names == {outdated.metadata.name, busy.metadata.name}

        await wait_for(drained, what="the idle runner drained")
        service = {r.id for r in await actions_sim.control.runners()}
        assert idle.status is not None and busy.status is not None
        assert idle.status.runner_id not in service, "the drained runner must be removed from the service first"
        assert busy.status.runner_id in service
        assert await _phase(kube, namespace, "Outdated")
