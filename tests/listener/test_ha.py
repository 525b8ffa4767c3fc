"""Crashes and handovers: nothing a killed listener received is lost, a standby takes over in bound."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import nats
import pytest

from services.embedded.actions_sim.runner_agent import run_runner
from shared.actions import ActionsClient, PersonalAccessToken
from shared.bus import messages as busmsg
from shared.bus import subjects
from shared.listener_config import ListenerConfig
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.nats import NatsServer
from tests.listener.conftest import NAMESPACE, BusTap, ScaleSet, start_listener, wait_until

pytestmark = pytest.mark.anyio


async def last_message(nats_url: str, subject: str) -> busmsg.BusMessage | None:
    """The latest message on a subject, read straight from its stream."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        stream = subjects.DESIRED_STREAM if ".desired." in subject else subjects.JOBS_STREAM
        try:
            raw = await js.get_last_msg(stream.name, subject)
        except nats.js.errors.NotFoundError:
            return None
        assert raw.data is not None
        return busmsg.decode(subject, raw.data)
    finally:
        await nc.close()


async def test_standby_takes_over_within_the_lease_bound(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    cfg = make_config(min_runners=1, max_runners=5)
    await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
    async with anyio.create_task_group() as tg:
        leader = await start_listener(tg, cfg, "listener-a")
        await bus_tap.wait_for(lambda t: t.desired and t.desired[-1].replicas == 3)
        standby = await start_listener(tg, cfg, "listener-b")
        await wait_until(lambda: standby.health.role.value == "standby")
        assert leader.is_leader and not standby.is_leader and standby.session_id == ""
        assert len(await actions_sim.control.sessions()) == 1

        mark = len(bus_tap.desired)
        killed_at = time.monotonic()
        leader.crash()
        took_over = await bus_tap.wait_for(
            lambda t: [d for d in t.desired[mark:] if d.listener_epoch != leader.epoch], timeout=20
        )
        elapsed = time.monotonic() - killed_at
        settings = standby.bus_settings
        # Bound: the lease outlives its last renewal by the TTL; the standby retries every
        # renew interval; the session take-over and first publish add well under a second here.
        assert elapsed <= settings.lease_ttl + settings.effective_renew_interval + 3.0, elapsed
        first = took_over[0]
        # The same level under a higher epoch, authoritative: no duplicate runner is asked for.
        assert (first.replicas, first.patch_id) == (3, 0)
        assert standby.epoch is not None and leader.epoch is not None
        assert first.listener_epoch == standby.epoch > leader.epoch
        sessions = await actions_sim.control.sessions()
        assert [(s.session_id, s.owner_name) for s in sessions] == [(standby.session_id, "listener-b")]
        assert all(d.replicas == 3 for d in bus_tap.desired)
        tg.cancel_scope.cancel()


async def test_killed_between_receiving_and_publishing_loses_nothing(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], nats_server: NatsServer
) -> None:
    # A lease long enough that the leader is still leading (retrying its publish) when killed.
    cfg = make_config(min_runners=1, max_runners=5, ha={"lease_ttl_seconds": 12, "renew_interval_seconds": 0.5})
    # Polls held until a message comes: the JobStarted must reach the listener in the poll that is
    # open when NATS stops. With the default 1 s hold, that poll ended empty before the runner took
    # the job on a loaded machine; the listener then retried publishing the desired state (polling
    # pauses while NATS is down) and never received it.
    await actions_sim.control.configure(poll_wait=30.0)
    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        jit = await client.generate_jit_config(scale_set.id, "arc-runners-kill1")
    async with anyio.create_task_group() as runners:
        async with anyio.create_task_group() as tg:
            victim = await start_listener(tg, cfg, "listener-a")
            await actions_sim.control.enqueue_jobs(count=1, labels=[scale_set.name], duration=60)
            await wait_until(lambda: desired_replicas_is(nats_server.url, scale_set.name, 2))
            nats_server.stop()  # from here on every publish fails: nothing can be acknowledged
            await actions_sim.control.clear_requests()
            runners.start_soon(run_runner, None, jit.encoded_jit_config)  # takes the job: JobStarted

            async def delivered() -> bool:
                requests = await actions_sim.control.requests()
                return any(r.endpoint == "get_message" and r.status == 200 for r in requests)

            await wait_until(delivered)
            unacked = [m for m in await actions_sim.control.messages(scale_set.id) if not m.acked]
            assert len(unacked) == 1 and "JobStarted" in unacked[0].body  # received, not acknowledged
            victim.crash()
        nats_server.start()
        async with anyio.create_task_group() as tg:
            successor = await start_listener(tg, cfg, "listener-b")
            # The successor gets the unacknowledged message again and publishes its effect.
            started = await wait_until(
                lambda: last_message(nats_server.url, subjects.job_started_subject(NAMESPACE, scale_set.name)),
                timeout=60,  # the victim's lease (12 s) runs out first
            )
            assert (started.runner_name, started.listener_epoch) == ("arc-runners-kill1", successor.epoch)
            await wait_until(lambda: all_acked(actions_sim, scale_set.id), timeout=10)
            assert await desired_replicas_is(nats_server.url, scale_set.name, 2)
            tg.cancel_scope.cancel()
        runners.cancel_scope.cancel()


async def desired_replicas_is(nats_url: str, ers_name: str, replicas: int) -> bool:
    state = await last_message(nats_url, subjects.desired_subject(NAMESPACE, ers_name))
    return isinstance(state, busmsg.DesiredState) and state.replicas == replicas


async def all_acked(actions_sim: ActionsSim, scale_set_id: int) -> bool:
    messages = await actions_sim.control.messages(scale_set_id)
    return bool(messages) and all(m.acked for m in messages)


async def test_waits_for_nats_at_start_up(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], nats_server: NatsServer
) -> None:
    cfg = make_config(min_runners=1)
    nats_server.stop()
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, cfg, "listener-0")
        await wait_until(lambda: listener.health.last_progress is not None)
        assert listener.session_id == "" and await actions_sim.control.sessions() == []
        nats_server.start()
        await wait_until(lambda: desired_replicas_is(nats_server.url, scale_set.name, 1), timeout=20)
        assert listener.is_leader
        tg.cancel_scope.cancel()


async def test_stopping_while_nats_is_down_is_clean_and_bounded(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], nats_server: NatsServer
) -> None:
    """Cancellation (SIGTERM) during a NATS outage: no error escapes the listener, the shutdown is
    bounded, and the session is still deleted. Bus.connect closes the dead connection itself."""
    from prometheus_client import REGISTRY

    cfg = make_config(min_runners=1)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await start_listener(tg, cfg, "listener-0")
            await wait_until(lambda: desired_replicas_is(nats_server.url, scale_set.name, 1))
            nats_server.stop()
            # The listener's connection noticed the outage (the only bus in this test).
            await wait_until(lambda: REGISTRY.get_sample_value("runnerscale_bus_connected") == 0)
            stopping = time.monotonic()
            tg.cancel_scope.cancel()
        shutdown = time.monotonic() - stopping
    nats_server.start()
    assert shutdown < 15, f"shutdown took {shutdown:.1f}s"
    assert await actions_sim.control.sessions() == []  # deleted on the way out despite the outage
