"""Every injected fault of the simulator and what the client makes of it:
token expiry, conflicts, rate limits, 5xx with retries, slow and dropped polls, duplicate and
out-of-order messages, acted-then-500, payload quirks, and no secret in any error or log."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import anyio
import msgspec
import pytest

from shared.actions import (
    ActionsHTTPError,
    JobAssigned,
    JobCompleted,
    JobStarted,
    MessageDecodeError,
    MessageQueueTokenExpiredError,
    MessageSessionClient,
    RateLimitedError,
    RunnerExistsError,
    ScaleSetExistsError,
    ScaleSetNotFoundError,
    ServiceUnavailableError,
    SessionConflictError,
    SessionNotFoundError,
)
from shared.log import configure_logging
from tests.contract.conftest import FAST, endpoint_calls, pat_client
from tests.fixtures.actions_sim import ActionsSim

pytestmark = pytest.mark.anyio


async def open_session(client, name: str) -> MessageSessionClient:  # type: ignore[no-untyped-def]
    scale_set = await client.create_scale_set(name)
    return await MessageSessionClient.create(client, scale_set.id, "me")


@pytest.fixture(autouse=True)
async def short_polls(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(poll_wait=0.2)


# -- the queue token ----------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["get_message", "delete_message"])
async def test_queue_401_refreshes_the_session_once_and_retries(actions_sim: ActionsSim, endpoint: str) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "q401") as session:
        await actions_sim.control.enqueue_jobs(count=1, labels=["q401"])
        await actions_sim.control.set_fault(endpoint, status=401, count=1)
        message = await session.get_message(0, max_capacity=3)
        assert message is not None
        await session.delete_message(message.message_id)
    assert len(await endpoint_calls(actions_sim, "refresh_session")) == 1
    assert [r.status for r in await endpoint_calls(actions_sim, endpoint)][:2] == [
        401,
        200 if endpoint == "get_message" else 204,
    ]


async def test_acquire_401_refreshes_the_session_once_and_retries(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(mode="ghes")
    async with pat_client(actions_sim) as client, await open_session(client, "a401") as session:
        await actions_sim.control.enqueue_jobs(count=1, labels=["a401"])
        message = await session.get_message(0, max_capacity=3)
        assert message is not None
        await actions_sim.control.set_fault("acquire_jobs", status=401, count=1)
        ids = [j.runner_request_id for j in message.available]
        assert await session.acquire_jobs(ids) == ids
    assert len(await endpoint_calls(actions_sim, "refresh_session")) == 1


async def test_repeated_queue_401_fails_after_one_refresh(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "q401x") as session:
        await actions_sim.control.set_fault("get_message", status=401, count=None)
        with pytest.raises(MessageQueueTokenExpiredError) as info:
            await session.get_message(0, max_capacity=3)
        assert info.value.status == 401
    assert len(await endpoint_calls(actions_sim, "get_message")) == 2
    assert len(await endpoint_calls(actions_sim, "refresh_session")) == 1


async def test_expired_tokens_after_clock_jump_heal_through_refreshes(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(session_idle_timeout=86400)  # only the tokens expire
    async with pat_client(actions_sim) as client, await open_session(client, "clock") as session:
        assert await session.get_message(0, max_capacity=3) is None
        await actions_sim.control.advance_clock(2 * 3600)  # queue and admin tokens expire server-side
        await actions_sim.control.enqueue_jobs(count=1, labels=["clock"])
        message = await session.get_message(0, max_capacity=3)
        assert message is not None and len(message.assigned) == 1
    statuses = [r.status for r in await endpoint_calls(actions_sim, "refresh_session")]
    assert statuses[0] == 401 and statuses[-1] == 200  # the refresh itself needed a new admin token


async def test_queue_token_close_to_expiry_is_refreshed_before_use(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(queue_token_ttl=60)  # inside the 120 s margin
    async with pat_client(actions_sim) as client, await open_session(client, "proactive") as session:
        assert await session.get_message(0, max_capacity=3) is None
    assert [r.status for r in await endpoint_calls(actions_sim, "get_message")] == [202]
    assert len(await endpoint_calls(actions_sim, "refresh_session")) == 1


# -- sessions ------------------------------------------------------------------------------------


async def test_injected_409_on_session_create(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("conflict")
        await actions_sim.control.set_fault(
            "create_session",
            status=409,
            body=json.dumps(
                {
                    "typeName": "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException, GitHub.Actions.Runtime.WebApi",
                    "message": "The actions runner scaleset conflict already has an active session.",
                }
            ),
        )
        with pytest.raises(SessionConflictError, match="already has an active session"):
            await client.create_message_session(scale_set.id, "me")
        assert len(await endpoint_calls(actions_sim, "create_session")) == 1


async def test_session_create_acted_then_500_surfaces_as_conflict_on_retry(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("acted")
        await actions_sim.control.set_fault("create_session", kind="after", status=500)
        with pytest.raises(SessionConflictError):
            await client.create_message_session(scale_set.id, "me")
        assert len(await actions_sim.control.sessions()) == 1  # the first attempt did create it


async def test_jit_acted_then_500_surfaces_as_runner_exists_on_retry(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("jit")
        await actions_sim.control.set_fault("generate_jit_config", kind="after", status=502)
        with pytest.raises(RunnerExistsError):
            await client.generate_jit_config(scale_set.id, "runner-twice")
        found = await client.get_runner_by_name("runner-twice")
        assert found is not None and found.runner_scale_set_id == scale_set.id


async def test_scale_set_create_acted_then_500_surfaces_as_exists_on_retry(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        await actions_sim.control.set_fault("create_scale_set", kind="after", status=503)
        with pytest.raises(ScaleSetExistsError):
            await client.create_scale_set("twice")
        assert (await client.get_scale_set_by_name("twice")) is not None  # recover by lookup


async def test_double_ack_is_idempotent(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "ack2") as session:
        await actions_sim.control.enqueue_jobs(count=1, labels=["ack2"])
        message = await session.get_message(0, max_capacity=3)
        assert message is not None
        await session.delete_message(message.message_id)
        await session.delete_message(message.message_id)  # already acked: still fine
    statuses = [r.status for r in await endpoint_calls(actions_sim, "delete_message")]
    assert statuses[0] == 204 and len(statuses) == 2


async def test_evicted_session_is_session_not_found(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "evict") as session:
        await actions_sim.control.evict_session(session.session.session_id)
        with pytest.raises(SessionNotFoundError):
            await session.get_message(0, max_capacity=3)
        with pytest.raises(SessionNotFoundError):
            await session.refresh()


async def test_scale_set_deleted_under_a_running_listener(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "vanish") as session:
        await actions_sim.control.delete_scale_set(session.scale_set_id)
        with pytest.raises((ScaleSetNotFoundError, SessionNotFoundError)) as info:
            await session.get_message(0, max_capacity=3)
        assert info.value.status == 404
        with pytest.raises(ScaleSetNotFoundError):
            await client.create_message_session(session.scale_set_id, "me")
        with pytest.raises(ScaleSetNotFoundError):
            await client.generate_jit_config(session.scale_set_id, "runner-late")


# -- retries -------------------------------------------------------------------------------------


async def test_429_with_retry_after_is_honoured(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("limited")
        await actions_sim.control.set_fault("get_scale_set", status=429, retry_after=1, count=1)
        started = time.monotonic()
        got = await client.get_scale_set(scale_set.id)
        assert got is not None and got.id == scale_set.id
        assert time.monotonic() - started >= 0.95


async def test_429_storm_is_rate_limited_error(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        await actions_sim.control.set_fault("get_scale_set_by_name", status=429, count=None)
        with pytest.raises(RateLimitedError):
            await client.get_scale_set_by_name("x")
    assert len(await endpoint_calls(actions_sim, "get_scale_set_by_name")) == 5


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_transient_5xx_is_retried_until_success(actions_sim: ActionsSim, status: int) -> None:
    async with pat_client(actions_sim) as client:
        await actions_sim.control.set_fault("create_scale_set", status=status, count=3)
        created = await client.create_scale_set("retry")
        assert created.name == "retry"
    assert [r.status for r in await endpoint_calls(actions_sim, "create_scale_set")] == [status] * 3 + [200]


async def test_5xx_storm_on_the_poll_gives_up_as_service_unavailable(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "storm") as session:
        await actions_sim.control.set_fault("get_message", status=503, count=None)
        with pytest.raises(ServiceUnavailableError) as info:
            await session.get_message(0, max_capacity=3)
        assert info.value.activity_id  # the diagnostic id is carried
    assert len(await endpoint_calls(actions_sim, "get_message")) == 5


async def test_501_is_not_retried(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        await actions_sim.control.set_fault("get_runner_by_name", status=501, count=None)
        with pytest.raises(ActionsHTTPError) as info:
            await client.get_runner_by_name("r")
        assert info.value.status == 501
    assert len(await endpoint_calls(actions_sim, "get_runner_by_name")) == 1


async def test_slow_poll_beyond_the_attempt_timeout_is_retried(actions_sim: ActionsSim) -> None:
    settings = msgspec.structs.replace(FAST, poll_timeout=0.5)
    async with pat_client(actions_sim, settings=settings) as client, await open_session(client, "slow") as session:
        await actions_sim.control.set_fault("get_message", kind="delay", seconds=3.0, count=1)
        await actions_sim.control.enqueue_jobs(count=1, labels=["slow"])
        message = await session.get_message(0, max_capacity=3)
        assert message is not None and len(message.assigned) == 1


async def test_dropped_poll_connection_is_retried(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "drop") as session:
        await actions_sim.control.set_fault("get_message", kind="drop", count=1)
        await actions_sim.control.enqueue_jobs(count=1, labels=["drop"])
        message = await session.get_message(0, max_capacity=3)
        assert message is not None


async def test_capacity_rejection_text_plain_400(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "cap400") as session:
        await actions_sim.control.set_fault(
            "get_message", status=400, body="X-ScaleSetMaxCapacity is invalid", content_type="text/plain; charset=utf-8"
        )
        with pytest.raises(ActionsHTTPError) as info:
            await session.get_message(0, max_capacity=3)
        assert info.value.status == 400 and info.value.service_message == "X-ScaleSetMaxCapacity is invalid"


# -- payload quirks and delivery order ----------------------------------------------------------


async def test_empty_200_poll_body_is_a_decode_error(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "empty") as session:
        await actions_sim.control.set_fault("get_message", kind="empty_body")
        with pytest.raises(MessageDecodeError, match="empty body"):
            await session.get_message(0, max_capacity=3)


@pytest.mark.parametrize("endpoint", ["get_message", "create_session", "get_scale_set_by_name", "runner_registration"])
async def test_bom_prefixed_bodies_decode(actions_sim: ActionsSim, endpoint: str) -> None:
    await actions_sim.control.set_fault(endpoint, kind="bom", count=None)
    async with pat_client(actions_sim) as client:
        assert await client.get_scale_set_by_name("bom") is None
        async with await open_session(client, "bom") as session:
            await actions_sim.control.enqueue_jobs(count=1, labels=["bom"])
            assert await session.get_message(0, max_capacity=3) is not None


async def test_redelivered_message_after_ack(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "redeliver") as session:
        await actions_sim.control.enqueue_jobs(count=1, labels=["redeliver"])
        await actions_sim.control.set_fault("get_message", kind="redeliver")
        first = await session.get_message(0, max_capacity=3)
        assert first is not None
        await session.delete_message(first.message_id)
        again = await session.get_message(first.message_id, max_capacity=3)
        assert again is not None and again.message_id == first.message_id
        assert again.jobs == first.jobs


async def test_duplicate_job_events_across_messages(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "dup") as session:
        await actions_sim.control.set_fault("get_message", kind="duplicate_events")
        await actions_sim.control.enqueue_jobs(count=1, labels=["dup"])
        job_ids: list[str] = []
        last = 0
        with anyio.fail_after(5):
            while len(job_ids) < 3:
                message = await session.get_message(last, max_capacity=3)
                if message is None:
                    break
                job_ids.extend(j.job_id for j in message.jobs)
                last = message.message_id
                await session.delete_message(message.message_id)
        assert len(job_ids) >= 2 and len(set(job_ids)) == 1


async def test_odd_and_out_of_order_messages_decode(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, await open_session(client, "odd") as session:
        sid = session.scale_set_id
        events: list[dict[str, Any]] = [
            {
                "messageType": "JobCompleted",
                "jobId": "never-started",
                "result": "canceled",
                "runnerRequestId": 0,
                "finishTime": "2026-01-01T00:00:00.1234567Z",
                "extraField": {"nested": True},
            },
            {"messageType": "JobStarted", "jobId": "j-2", "runnerId": 999, "runnerName": "runner-we-never-made"},
            {"messageType": "JobRerouted", "jobId": "j-3"},
            {"messageType": "JobAssigned", "jobId": "j-4", "runnerRequestId": 0},
        ]
        await actions_sim.control.inject_message(sid, events=events)
        await actions_sim.control.inject_message(sid, body="")
        await actions_sim.control.inject_message(sid, message_type="SomethingElse")
        first = await session.get_message(0, max_capacity=3)
        assert first is not None
        assert [type(j) for j in first.jobs] == [JobCompleted, JobStarted, JobAssigned]
        assert first.skipped_types == ("JobRerouted",)
        finish_time = first.completed[0].finish_time
        assert finish_time is not None and finish_time.microsecond == 123457
        await session.delete_message(first.message_id)
        stats_only = await session.get_message(first.message_id, max_capacity=3)
        assert stats_only is not None
        assert stats_only.jobs == () and stats_only.statistics is not None
        await session.delete_message(stats_only.message_id)
        with pytest.raises(MessageDecodeError, match="unsupported messageType"):
            await session.get_message(stats_only.message_id, max_capacity=3)


# -- secrets -------------------------------------------------------------------------------------


async def test_no_secret_in_errors_or_logs(actions_sim: ActionsSim) -> None:
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    errors: list[str] = []
    try:
        async with pat_client(actions_sim) as client, await open_session(client, "secret") as session:
            jit = await client.generate_jit_config(session.scale_set_id, "runner-secret")
            await actions_sim.control.set_fault("get_message", status=401, count=None)
            await actions_sim.control.set_fault("get_scale_set", status=500, count=None)
            for call in (
                session.get_message(0, max_capacity=3),
                client.get_scale_set(session.scale_set_id),
                client.generate_jit_config(session.scale_set_id, "runner-secret"),
            ):
                try:
                    await call
                except Exception as exc:  # collecting every error text
                    errors.append(f"{exc!r} {exc}")
            assert client._admin is not None  # signed in by the calls above
            secrets = [
                actions_sim.pat,
                client._admin.token,  # the live token, to look for it
                session.session.message_queue_access_token,
                jit.encoded_jit_config,
            ]
    finally:
        configure_logging("warning")
    assert len(errors) == 3
    text = "\n".join(errors) + stream.getvalue()
    assert "retrying actions request" in text  # the log did record the retries
    for secret in secrets:
        assert secret and secret not in text
