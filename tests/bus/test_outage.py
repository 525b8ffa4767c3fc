"""NATS restarts and outages: no desired state is lost, the outbox drains in order, publishes are bounded."""

import re
from typing import cast

import anyio
import msgspec
import pytest

from shared.bus import Bus, BusSettings, Delivery, DesiredState, JobStarted, OutboxFull, PublishFailed, subjects
from shared.bus.messages import subject_for
from tests.bus.conftest import metric, wait_for
from tests.fixtures.nats import NatsServer
from tests.unit.shared.bus.test_messages import samples

pytestmark = pytest.mark.anyio


def desired(name: str, patch_id: int) -> DesiredState:
    base = cast(DesiredState, samples()[0])  # samples() starts with a DesiredState
    return msgspec.structs.replace(base, ers=msgspec.structs.replace(base.ers, name=name), patch_id=patch_id)


async def test_a_nats_restart_mid_stream_loses_no_desired_state(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    latest: dict[str, int] = {}

    async def handler(delivery: Delivery) -> None:
        message = cast(DesiredState, delivery.message)  # RUNNER_SET_DESIRED
        latest[message.ers.name] = message.patch_id

    names = [f"ers-{i}" for i in range(5)]
    async with Bus.connect(bus_settings) as bus:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, subjects.RUNNER_SET_DESIRED, handler)
            for name in names:
                await bus.publish(desired(name, 1))
            await wait_for(lambda: len(latest) == 5)
            await anyio.to_thread.run_sync(nats_server.restart)
            for name in names:  # published right after the restart: retried until JetStream is back
                await bus.publish(desired(name, 2))
            await wait_for(lambda: all(latest.get(n) == 2 for n in names), timeout=15)
            tg.cancel_scope.cancel()
        # The stream on disk still has every ERS's latest level.
        for name in names:
            assert (
                cast(DesiredState, await bus.last_message(subjects.desired_subject("arc.runners", name))).patch_id == 2
            )


async def test_a_restarted_consumer_resumes_from_the_latest_level_after_a_restart(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    async with Bus.connect(bus_settings) as bus:
        for patch_id in range(1, 4):
            await bus.publish(desired("a", patch_id))
    nats_server.restart()
    seen: list[int] = []

    async def handler(delivery: Delivery) -> None:
        seen.append(cast(DesiredState, delivery.message).patch_id)  # RUNNER_SET_DESIRED

    async with Bus.connect(bus_settings) as bus, anyio.create_task_group() as tg:
        tg.start_soon(bus.consume, subjects.RUNNER_SET_DESIRED, handler)
        await wait_for(lambda: seen)
        tg.cancel_scope.cancel()
    assert seen == [3]


async def test_outbox_keeps_messages_while_nats_is_down_and_drains_them_in_order(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    async with Bus.connect(bus_settings) as bus:
        await bus.publish(desired("a", 0))
        await anyio.to_thread.run_sync(nats_server.stop)
        await wait_for(lambda: not bus.connected)
        for patch_id in range(1, 21):
            bus.enqueue(desired("a", patch_id))
        assert bus.outbox_depth >= 19  # nothing can leave while the server is down
        await anyio.to_thread.run_sync(nats_server.start)
        assert await bus.flush(timeout=20)
        stream = subjects.DESIRED_STREAM.name
        info = await bus.js.stream_info(stream)
        # history=10 per subject: the last 10 levels, in the order they were enqueued.
        last = [
            msgspec.json.decode(cast(bytes, (await bus.js.get_msg(stream, seq)).data))["patchId"]
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]
        assert last == list(range(11, 21))
        assert bus.outbox_depth == 0
        assert metric("runnerscale_bus_outbox_depth") == 0


async def test_publish_gives_up_with_publish_failed_after_its_deadline(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    async with Bus.connect(bus_settings) as bus:
        await anyio.to_thread.run_sync(nats_server.stop)
        await wait_for(lambda: not bus.connected)
        with anyio.fail_after(10):
            with pytest.raises(PublishFailed, match=re.escape("runnerscale.desired")):
                await bus.publish(desired("a", 1), deadline=1.0)
        await anyio.to_thread.run_sync(nats_server.start)
        ack = await bus.publish(desired("a", 2))  # the connection comes back by itself
        assert ack.stream == subjects.DESIRED_STREAM.name


async def test_a_full_outbox_refuses_instead_of_dropping(bus_settings: BusSettings, nats_server: NatsServer) -> None:
    small = msgspec.structs.replace(bus_settings, outbox_capacity=3)
    async with Bus.connect(small) as bus:
        await anyio.to_thread.run_sync(nats_server.stop)
        await wait_for(lambda: not bus.connected)
        for patch_id in range(3):
            bus.enqueue(desired("a", patch_id))
        with pytest.raises(OutboxFull):
            bus.enqueue(desired("a", 99))
        await anyio.to_thread.run_sync(nats_server.start)
        assert await bus.flush(timeout=20)


async def test_job_events_are_deduplicated_by_message_id(bus_settings: BusSettings) -> None:
    started = cast(JobStarted, samples()[1])  # samples()[1] is a JobStarted
    async with Bus.connect(bus_settings) as bus:
        first = await bus.publish(started)
        again = await bus.publish(started)  # e.g. a listener retry after a lost ack
        assert not first.duplicate and again.duplicate
        other_runner = await bus.publish(msgspec.structs.replace(started, runner_id=started.runner_id + 1))
        assert not other_runner.duplicate
        info = await bus.js.stream_info(subjects.JOBS_STREAM.name)
        assert info.state.messages == 2
        assert subject_for(started).endswith(".started")


async def test_leaving_the_bus_flushes_the_outbox(bus_settings: BusSettings) -> None:
    async with Bus.connect(bus_settings) as bus:
        for patch_id in range(1, 6):
            bus.enqueue(desired("a", patch_id))
    async with Bus.connect(bus_settings) as bus:
        assert cast(DesiredState, await bus.last_message(subjects.desired_subject("arc.runners", "a"))).patch_id == 5


async def test_shutdown_while_nats_is_down_is_bounded_and_reports_unsent_messages(
    bus_settings: BusSettings, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    quick = msgspec.structs.replace(bus_settings, publish_deadline=0.5)
    with anyio.fail_after(10):
        async with Bus.connect(quick) as bus:
            await anyio.to_thread.run_sync(nats_server.stop)
            await wait_for(lambda: not bus.connected)
            bus.enqueue(desired("a", 1))
    assert any("unsent" in r.getMessage() or "unsent" in str(getattr(r, "fields", "")) for r in caplog.records)
