"""Every message type through JetStream and a durable consumer; rejects, retries, cancellation."""

import functools
from typing import cast

import anyio
import msgspec
import nats
import pytest

from shared.bus import Bus, BusSettings, Delivery, DesiredState, Handler, Redeliver, subjects
from shared.bus.messages import subject_for
from shared.bus.subjects import ConsumerSpec, DeliverFrom
from tests.bus.conftest import metric, wait_for
from tests.fixtures.nats import NatsServer
from tests.support.eventually import eventually
from tests.unit.shared.bus.test_messages import samples

pytestmark = pytest.mark.anyio

ALL_DESIRED = ConsumerSpec(
    subjects.DESIRED_STREAM.name, "test-desired", ("runnerscale.desired.>",), DeliverFrom.ALL, max_deliver=3
)


def consumer_for(stream: subjects.StreamSpec) -> ConsumerSpec:
    return ConsumerSpec(stream.name, f"test-{stream.name.lower()}", stream.subjects, DeliverFrom.ALL)


async def test_every_message_type_round_trips_through_a_stream(bus_settings: BusSettings) -> None:
    sent = samples()
    received: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        received.append(delivery)

    async with Bus.connect(bus_settings) as bus:
        for message in sent:
            await bus.publish(message)
        async with anyio.create_task_group() as tg:
            for stream in subjects.STREAMS:
                tg.start_soon(bus.consume, consumer_for(stream), handler)
            await wait_for(lambda: len(received) == len(sent))
            tg.cancel_scope.cancel()
    assert sorted((d.message for d in received), key=lambda m: type(m).__name__) == sorted(
        sent, key=lambda m: type(m).__name__
    )
    assert all(d.subject == subject_for(d.message) and d.num_delivered == 1 for d in received)


async def _publish_raw(url: str, subject: str, data: bytes) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().publish(subject, data)).seq
    finally:
        await nc.close()


async def test_malformed_and_unknown_version_messages_are_terminated_counted_and_skipped(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    desired = samples()[0]
    subject = subject_for(desired)
    body = msgspec.json.decode(msgspec.json.encode(desired))
    future = msgspec.json.encode({**body, "schemaVersion": 99})
    malformed_before = metric("runnerscale_bus_rejected_messages_total", subject_kind="desired", reason="malformed")
    unknown_before = metric(
        "runnerscale_bus_rejected_messages_total", subject_kind="desired", reason="unknown_schema_version"
    )
    seen: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        seen.append(delivery)

    async with Bus.connect(bus_settings) as bus:
        await _publish_raw(nats_server.url, subject, b"{garbage")
        await _publish_raw(nats_server.url, subject, future)
        await _publish_raw(nats_server.url, "runnerscale.desired.bad_zz.x", msgspec.json.encode(body))
        good = await bus.publish(desired)
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, ALL_DESIRED, handler)
            await wait_for(lambda: len(seen) == 1)

            # Terminated messages are gone for good: the consumer has nothing pending or unacked.
            async def settled() -> bool:
                info = await bus.js.consumer_info(ALL_DESIRED.stream, ALL_DESIRED.durable)
                return bool(info.num_pending == 0 and info.num_ack_pending == 0)

            await eventually(settled, timeout=5, interval=0.02, what="the consumer settled")
            tg.cancel_scope.cancel()
    assert [d.stream_sequence for d in seen] == [good.sequence]
    assert (
        metric("runnerscale_bus_rejected_messages_total", subject_kind="desired", reason="malformed")
        == malformed_before + 1
    )
    assert (
        metric("runnerscale_bus_rejected_messages_total", subject_kind="desired", reason="unknown_schema_version")
        == unknown_before + 1
    )
    assert metric("runnerscale_bus_rejected_messages_total", subject_kind="unknown", reason="malformed") >= 1


async def test_a_failing_handler_is_retried_then_acked_and_later_messages_still_flow(bus_settings: BusSettings) -> None:
    first = cast(DesiredState, samples()[0])  # samples() starts with a DesiredState
    second = msgspec.structs.replace(first, patch_id=1)
    attempts: list[int] = []
    handled: list[int] = []

    async def flaky(delivery: Delivery) -> None:
        message = cast(DesiredState, delivery.message)  # ALL_DESIRED
        attempts.append(message.patch_id)
        if message.patch_id == first.patch_id and delivery.num_delivered < 2:
            raise RuntimeError("kubernetes said 500")
        handled.append(message.patch_id)

    async with Bus.connect(bus_settings) as bus:
        await bus.publish(first)
        await bus.publish(second)
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, ALL_DESIRED, flaky)
            await wait_for(lambda: len(handled) == 2)
            tg.cancel_scope.cancel()
    assert attempts.count(first.patch_id) == 2
    assert sorted(handled) == sorted([first.patch_id, second.patch_id])


@pytest.mark.parametrize(
    "outcome", [ValueError("bug"), Redeliver(0.0, "never ready")], ids=["failure", "deferred at the last delivery"]
)
async def test_a_handler_that_always_fails_is_terminated_after_max_deliver(
    bus_settings: BusSettings, outcome: Exception
) -> None:
    before = metric("runnerscale_bus_terminated_messages_total", subject_kind="desired")
    attempts: list[int] = []

    async def broken(delivery: Delivery) -> None:
        attempts.append(delivery.num_delivered)
        raise outcome

    async with Bus.connect(bus_settings) as bus:
        await bus.publish(samples()[0])
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, ALL_DESIRED, broken)
            await wait_for(
                lambda: metric("runnerscale_bus_terminated_messages_total", subject_kind="desired") == before + 1,
                timeout=10,
            )
            tg.cancel_scope.cancel()
    assert attempts == [1, 2, 3]


async def test_desired_state_consumer_starts_from_the_latest_per_subject(bus_settings: BusSettings) -> None:
    base = cast(DesiredState, samples()[0])  # samples() starts with a DesiredState
    other = msgspec.structs.replace(base, ers=msgspec.structs.replace(base.ers, name="other"))
    seen: list[DesiredState] = []

    async def handler(delivery: Delivery) -> None:
        seen.append(cast(DesiredState, delivery.message))  # RUNNER_SET_DESIRED

    async with Bus.connect(bus_settings) as bus:
        for patch_id in range(1, 6):
            await bus.publish(msgspec.structs.replace(base, patch_id=patch_id))
        await bus.publish(other)
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, subjects.RUNNER_SET_DESIRED, handler)
            await wait_for(lambda: len(seen) == 2)
            tg.cancel_scope.cancel()
        assert sorted((m.ers.name, m.patch_id) for m in seen) == sorted(
            [(base.ers.name, 5), (other.ers.name, other.patch_id)]
        )
        latest = await bus.last_message(subject_for(base))
        assert isinstance(latest, DesiredState)
        assert latest.patch_id == 5
        assert await bus.last_message(subjects.desired_subject("nobody", "here")) is None
        # The ERS is deleted: its history goes, the other ERS's stays.
        await bus.purge(subject_for(base))
        assert await bus.last_message(subject_for(base)) is None
        assert (await bus.last_message(subject_for(other))) == other


async def test_cancelling_a_consumer_mid_handler_leaves_the_message_for_redelivery(bus_settings: BusSettings) -> None:
    started = anyio.Event()
    seen: list[int] = []

    async def slow(delivery: Delivery) -> None:
        seen.append(delivery.num_delivered)
        started.set()
        await anyio.sleep_forever()

    quick = msgspec.structs.replace(ALL_DESIRED, ack_wait_seconds=1.0)
    async with Bus.connect(bus_settings) as bus:
        await bus.publish(samples()[0])
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, quick, slow)
            await started.wait()
            tg.cancel_scope.cancel()  # shutdown mid-handler: no ack was sent

        redelivered: list[int] = []

        async def record(delivery: Delivery) -> None:
            redelivered.append(delivery.num_delivered)

        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, quick, record)
            await wait_for(lambda: redelivered, timeout=10)
            tg.cancel_scope.cancel()
    assert seen == [1] and redelivered[0] >= 2


async def test_shared_durable_splits_work_and_per_instance_durables_each_see_everything(
    bus_settings: BusSettings,
) -> None:
    per_instance: dict[str, list[int]] = {"a": [], "b": []}
    shared: list[int] = []

    async with Bus.connect(bus_settings) as bus:
        for patch_id in range(10):
            await bus.publish(msgspec.structs.replace(samples()[0], patch_id=patch_id))

        def recorder(into: list[int]) -> Handler:
            async def handler(delivery: Delivery) -> None:
                into.append(cast(DesiredState, delivery.message).patch_id)  # ALL_DESIRED

            return handler

        async with anyio.create_task_group() as tg:
            for name, into in per_instance.items():
                tg.start_soon(functools.partial(bus.consume, ALL_DESIRED, recorder(into), instance=name))
            tg.start_soon(bus.consume, msgspec.structs.replace(ALL_DESIRED, durable="shared"), recorder(shared))
            tg.start_soon(bus.consume, msgspec.structs.replace(ALL_DESIRED, durable="shared"), recorder(shared))
            await wait_for(lambda: len(per_instance["a"]) == len(per_instance["b"]) == len(shared) == 10)
            tg.cancel_scope.cancel()
    assert per_instance["a"] == per_instance["b"] == list(range(10))
    assert sorted(shared) == list(range(10))


async def test_a_lone_message_reaches_an_idle_consumer_without_waiting_for_the_poll_to_expire(
    bus_settings: BusSettings,
) -> None:
    # Regression: a batched long poll would hold a single message until the poll expired.
    seen: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        seen.append(delivery)

    async with Bus.connect(bus_settings) as bus, anyio.create_task_group() as tg:
        tg.start_soon(lambda: bus.consume(ALL_DESIRED, handler, fetch_timeout=30.0))
        for n in range(1, 4):
            await bus.publish(msgspec.structs.replace(samples()[0], patch_id=n))

            def seen_n(n: int = n) -> bool:
                return len(seen) == n

            await wait_for(seen_n, timeout=5)
        tg.cancel_scope.cancel()


async def test_a_deferred_message_comes_back_after_its_delay_and_is_no_failure(bus_settings: BusSettings) -> None:
    deferred_before = metric("runnerscale_bus_deferred_messages_total", subject_kind="desired")
    failures_before = metric("runnerscale_bus_handler_failures_total", subject_kind="desired")
    seen: list[tuple[int, float]] = []

    async def not_yet(delivery: Delivery) -> None:
        seen.append((delivery.num_delivered, anyio.current_time()))
        if delivery.num_delivered == 1:
            raise Redeliver(0.3, "the object does not show it yet")

    async with Bus.connect(bus_settings) as bus:
        await bus.publish(samples()[0])
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, ALL_DESIRED, not_yet)
            await wait_for(lambda: len(seen) == 2)
            tg.cancel_scope.cancel()
    assert [n for n, _ in seen] == [1, 2]
    assert seen[1][1] - seen[0][1] >= 0.25  # the handler's delay, not the failure backoff's 0.5 s
    assert metric("runnerscale_bus_deferred_messages_total", subject_kind="desired") == deferred_before + 1
    assert metric("runnerscale_bus_handler_failures_total", subject_kind="desired") == failures_before


def test_a_negative_redelivery_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay"):
        Redeliver(-1.0)
