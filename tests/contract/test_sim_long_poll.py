"""The message long poll: 202 after the hold, immediate delivery of a
message that arrives during the hold, capacity header, ack semantics."""

from __future__ import annotations

import time

import anyio
import pytest

from shared.actions import Message, MessageSessionClient
from tests.contract.conftest import endpoint_calls, pat_client
from tests.fixtures.actions_sim import ActionsSim
from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio


async def test_empty_poll_returns_none_after_the_configured_wait(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(poll_wait=1.0)
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("idle")
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            started = time.monotonic()
            assert await session.get_message(0, max_capacity=3) is None
            held = time.monotonic() - started
    assert 0.9 <= held < 3.0
    poll = (await endpoint_calls(actions_sim, "get_message"))[0]
    assert poll.status == 202


async def test_message_arriving_during_the_poll_is_returned_immediately(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(poll_wait=20.0)
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("wake")
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            result: list[tuple[Message | None, float]] = []

            async def poll() -> None:
                got = await session.get_message(0, max_capacity=3)
                result.append((got, time.monotonic()))

            async with anyio.create_task_group() as tg:
                tg.start_soon(poll)

                # wait until the poll is being held by the service, then enqueue
                async def poll_held() -> bool:
                    return any(s.polls_in_flight for s in await actions_sim.control.sessions())

                await eventually(poll_held, timeout=5, interval=0.02, what="the poll held by the service")
                enqueued_at = time.monotonic()
                await actions_sim.control.enqueue_jobs(count=1, labels=["wake"])
            [(message, returned_at)] = result
    assert message is not None and len(message.assigned) == 1
    assert returned_at - enqueued_at < 2.0  # far below the 20 s hold


async def test_capacity_header_reaches_the_service(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(poll_wait=0.2)
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("cap")
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            # The service learns the capacity from a poll; jobs queued before any poll are not capped.
            assert await session.get_message(0, max_capacity=2) is None
            await actions_sim.control.enqueue_jobs(count=4, labels=["cap"])
            message = await session.get_message(0, max_capacity=2)
            assert message is not None and len(message.assigned) == 2
            assert (await actions_sim.control.sessions())[0].last_poll_capacity == 2
            assert message.statistics.total_assigned_jobs == 2
    assert (await endpoint_calls(actions_sim, "get_message"))[0].headers["X-ScaleSetMaxCapacity"] == "2"


async def test_unacked_message_is_redelivered_and_acked_one_is_not(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(poll_wait=0.2)
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("ack")
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            await actions_sim.control.enqueue_jobs(count=1, labels=["ack"])
            first = await session.get_message(0, max_capacity=3)
            again = await session.get_message(0, max_capacity=3)  # lastMessageId 0: oldest unacked
            assert first is not None and again is not None and again.message_id == first.message_id
            await session.delete_message(first.message_id)
            assert await session.get_message(0, max_capacity=3) is None
