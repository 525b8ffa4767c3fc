"""The listener against the simulator and nats-server: desired state, patch IDs, job events."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import msgspec
import nats
import pytest

from services.embedded.actions_sim.runner_agent import run_runner
from services.listener.session import SessionRecord
from shared.actions import ActionsClient, PersonalAccessToken
from shared.bus.subjects import SESSIONS_BUCKET, listener_session_key
from shared.listener_config import ListenerConfig
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.nats import NatsServer
from tests.listener.conftest import BusTap, ScaleSet, start_listener

pytestmark = pytest.mark.anyio


async def test_assigned_jobs_scale_to_min_plus_n_capped_at_max(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    cfg = make_config(min_runners=1, max_runners=3)
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, cfg, "listener-0")
        # Idle: the first decision of an incarnation is authoritative (patch 0) at min.
        first = await bus_tap.wait_for(lambda t: t.desired)
        assert (first[0].replicas, first[0].patch_id, first[0].listener_epoch) == (1, 0, listener.epoch)

        await actions_sim.control.enqueue_jobs(count=1, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 2)
        await actions_sim.control.enqueue_jobs(count=4, labels=[scale_set.name])
        # 5 jobs queued; the service assigns at most X-ScaleSetMaxCapacity (3) and desired caps at 3.
        last = await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 3 and t.desired[-1])
        assert last.statistics.total_assigned_jobs == 3
        assert all(d.replicas <= 3 for d in bus_tap.desired)
        sessions = await actions_sim.control.sessions()
        assert [s.last_poll_capacity for s in sessions] == [3]
        tg.cancel_scope.cancel()


async def test_patch_ids_job_events_and_empty_polls(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    cfg = make_config(min_runners=0, max_runners=5)
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, cfg, "listener-0")
        # Empty polls re-send the target: at min with nothing happening, patch 0 every time.
        await bus_tap.wait_for(lambda t: len(t.desired) >= 3)
        assert [(d.replicas, d.patch_id) for d in bus_tap.desired[:3]] == [(0, 0)] * 3

        await actions_sim.control.enqueue_jobs(count=1, labels=[scale_set.name], duration=0.5, display_name="build")
        up = await bus_tap.wait_for(lambda t: [d for d in t.desired if d.replicas == 1])
        assert up[0].patch_id > 0

        # A runner takes the job: JobStarted then JobCompleted, with its name.
        async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
            jit = await client.generate_jit_config(scale_set.id, "arc-runners-abcde")
        outcome = await run_runner(None, jit.encoded_jit_config, job_wait=10)
        assert outcome.exit_code == 0
        await bus_tap.wait_for(lambda t: t.started and t.completed)
        started, completed = bus_tap.started[0], bus_tap.completed[0]
        assert started.runner_name == completed.runner_name == "arc-runners-abcde"
        assert completed.result == "succeeded" and started.job_display_name == "build"
        assert started.scale_set.name == scale_set.name and started.listener_epoch == listener.epoch
        assert started.repository == f"{actions_sim.org}/{actions_sim.repo}"

        # The completion marks the scaler dirty: a fresh non-zero patch ID for the scale down...
        mark = len(bus_tap.desired)
        await bus_tap.wait_for(lambda t: [d for d in t.desired if d.replicas == 0 and d.patch_id > 0])
        # ...then, idle at min again, the sequence collapses back to the authoritative 0.
        await bus_tap.wait_for(lambda t: [d for d in t.desired[mark:] if d.replicas == 0 and d.patch_id == 0])
        ids = [d.patch_id for d in bus_tap.desired if d.patch_id > 0]
        assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
        tg.cancel_scope.cancel()


async def session_record(nats_url: str, scale_set_id: int) -> SessionRecord | None:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(SESSIONS_BUCKET)
        try:
            entry = await kv.get(listener_session_key(scale_set_id))
        except nats.js.errors.KeyNotFoundError:
            return None
        assert entry.value is not None
        return msgspec.json.decode(entry.value, type=SessionRecord)
    finally:
        await nc.close()


async def test_restart_starts_a_new_epoch_at_patch_zero(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    nats_server: NatsServer,
) -> None:
    cfg = make_config(min_runners=0, max_runners=5)
    await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
    async with anyio.create_task_group() as tg:
        first = await start_listener(tg, cfg, "listener-0")
        await bus_tap.wait_for(lambda t: any(d.replicas == 2 and d.patch_id > 0 for d in t.desired))
        first_epoch = first.epoch
        record = await session_record(nats_server.url, scale_set.id)
        assert record is not None and (record.session_id, record.owner_name) == (first.session_id, "listener-0")
        tg.cancel_scope.cancel()
    assert await actions_sim.control.sessions() == []  # clean shutdown deleted the session...
    assert await session_record(nats_server.url, scale_set.id) is None  # ...and forgot its record
    mark = len(bus_tap.desired)
    async with anyio.create_task_group() as tg:
        second = await start_listener(tg, cfg, "listener-0")
        again = await bus_tap.wait_for(lambda t: t.desired[mark:])
        # The new incarnation restarts the sequence at 0 (authoritative) under a higher epoch.
        assert (again[0].replicas, again[0].patch_id) == (2, 0)
        assert second.epoch is not None and first_epoch is not None
        assert again[0].listener_epoch == second.epoch > first_epoch
        tg.cancel_scope.cancel()


async def test_ghes_available_jobs_are_acquired(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    await actions_sim.control.configure(mode="ghes")
    cfg = make_config(min_runners=0, max_runners=5)
    async with anyio.create_task_group() as tg:
        await start_listener(tg, cfg, "listener-0")
        await bus_tap.wait_for(lambda t: t.desired)
        await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 2, timeout=10)
        jobs = await actions_sim.control.jobs()
        assert sorted(j.state for j in jobs) == ["assigned", "assigned"]
        requests = await actions_sim.control.requests()
        assert any(r.endpoint == "acquire_jobs" and r.status == 200 for r in requests)
        tg.cancel_scope.cancel()
