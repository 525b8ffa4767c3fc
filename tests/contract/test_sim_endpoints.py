"""Every endpoint the listener and workers use, against the simulator, with its typed errors
(README "Actions service client")."""

from __future__ import annotations

import anyio
import pytest

from services.embedded.actions_sim.runner_agent import run_runner
from shared.actions import (
    DEFAULT_RUNNER_GROUP_ID,
    JobAssigned,
    JobCompleted,
    JobStarted,
    JobStillRunningError,
    MessageSessionClient,
    RunnerExistsError,
    RunnerGroupNotFoundError,
    RunnerNotFoundError,
    ScaleSetNotFoundError,
    SessionConflictError,
    SessionNotFoundError,
    scale_set_labels,
)
from tests.contract.conftest import endpoint_calls, pat_client, wait_for
from tests.fixtures.actions_sim import ActionsSim

pytestmark = pytest.mark.anyio


async def test_runner_group_lookup(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        group = await client.get_runner_group_by_name("Default")
        assert group.id == DEFAULT_RUNNER_GROUP_ID and group.is_default_group
        assert await client.resolve_runner_group_id("default") == 1
        with pytest.raises(RunnerGroupNotFoundError, match="no-such-group"):
            await client.get_runner_group_by_name("no-such-group")
    # the default group is resolved without a request
    assert len(await endpoint_calls(actions_sim, "get_runner_group")) == 2


async def test_scale_set_lifecycle(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        assert await client.get_scale_set_by_name("web") is None
        created = await client.create_scale_set(
            "web", labels=[lb.name for lb in scale_set_labels("web", ["linux", "web"])]
        )
        assert created.id > 0 and created.name == "web" and created.runner_group_id == 1
        assert [lb.name for lb in created.labels] == ["web", "linux"]
        assert all(lb.type == "System" for lb in created.labels)
        assert created.runner_setting.disable_update is True
        assert created.statistics is not None

        got = await client.get_scale_set(created.id)
        assert got is not None and got.name == "web"
        got = await client.get_scale_set_by_name("web")
        assert got is not None and got.id == created.id

        renamed = await client.update_scale_set(created.id, name="web-2")
        assert renamed.name == "web-2" and [lb.name for lb in renamed.labels] == ["web", "linux"]
        relabelled = await client.update_scale_set(created.id, labels=["web-2", "gpu"])
        assert [lb.name for lb in relabelled.labels] == ["web-2", "gpu"]

        await client.delete_scale_set(created.id)
        assert await client.get_scale_set_by_name("web-2") is None
        with pytest.raises(ScaleSetNotFoundError):
            await client.get_scale_set(created.id)
        with pytest.raises(ScaleSetNotFoundError):
            await client.delete_scale_set(created.id)
        with pytest.raises(ScaleSetNotFoundError):
            await client.update_scale_set(created.id, name="x")
    create_body = (await endpoint_calls(actions_sim, "create_scale_set"))[0]
    assert create_body.status == 200


async def test_runner_registration_lookup_and_removal(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("runners")
        jit = await client.generate_jit_config(scale_set.id, "runner-ab12cd34")
        assert jit.runner.name == "runner-ab12cd34" and jit.runner.runner_scale_set_id == scale_set.id
        assert jit.encoded_jit_config
        assert (await client.get_runner(jit.runner.id)).name == "runner-ab12cd34"
        got = await client.get_runner_by_name("runner-ab12cd34")
        assert got is not None and got.id == jit.runner.id
        assert await client.get_runner_by_name("runner-absent") is None

        with pytest.raises(RunnerExistsError) as exists:
            await client.generate_jit_config(scale_set.id, "runner-ab12cd34")
        assert "AgentExistsException" in exists.value.type_name

        await client.remove_runner(jit.runner.id)
        with pytest.raises(RunnerNotFoundError):
            await client.get_runner(jit.runner.id)
        with pytest.raises(RunnerNotFoundError):  # already gone: 404 AgentNotFoundException, as the service
            await client.remove_runner(jit.runner.id)
        with pytest.raises(ScaleSetNotFoundError):
            await client.generate_jit_config(scale_set.id + 100, "runner-other")


async def test_session_lifecycle_and_conflict(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("sessions")
        session = await client.create_message_session(scale_set.id, "listener-a")
        assert session.session_id and session.owner_name == "listener-a"
        assert session.statistics is not None and session.message_queue_url.startswith(actions_sim.url)

        with pytest.raises(SessionConflictError) as conflict:
            await client.create_message_session(scale_set.id, "listener-b")
        assert conflict.value.status == 409
        assert "RunnerScaleSetSessionConflictException" in conflict.value.type_name

        refreshed = await client.refresh_message_session(scale_set.id, session.session_id)
        assert refreshed.session_id == session.session_id
        assert refreshed.message_queue_access_token != session.message_queue_access_token

        await client.delete_message_session(scale_set.id, session.session_id)
        with pytest.raises(SessionNotFoundError):
            await client.delete_message_session(scale_set.id, session.session_id)
        with pytest.raises(SessionNotFoundError):
            await client.refresh_message_session(scale_set.id, session.session_id)
        # the slot is free again
        again = await client.create_message_session(scale_set.id, "listener-b")
        await client.delete_message_session(scale_set.id, again.session_id)
        with pytest.raises(ScaleSetNotFoundError):
            await client.create_message_session(scale_set.id + 100, "listener-c")


async def test_session_client_deletes_its_session_on_exit_even_when_cancelled(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("closing")
        with anyio.CancelScope() as scope:
            async with await MessageSessionClient.create(client, scale_set.id, "me"):
                assert len(await actions_sim.control.sessions()) == 1
                scope.cancel()
                await anyio.sleep_forever()  # cancelled here; exit must still delete
        assert await actions_sim.control.sessions() == []


async def test_messages_poll_ack_and_job_lifecycle(actions_sim: ActionsSim) -> None:
    """dotcom flow: JobAssigned, then a runner from our JIT config starts and completes it."""
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("flow")
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            await actions_sim.control.enqueue_jobs(count=1, labels=["flow"], duration=0.0, result="succeeded")
            message = await session.get_message(0, max_capacity=5)
            assert message is not None and message.message_id >= 100000000
            assert [type(j) for j in message.jobs] == [JobAssigned]
            assert message.statistics.total_assigned_jobs == 1
            await session.delete_message(message.message_id)

            jit = await client.generate_jit_config(scale_set.id, "runner-flow-1")
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_runner, None, jit.encoded_jit_config)
                seen: list[object] = []
                last = message.message_id
                with anyio.fail_after(10):
                    while not any(isinstance(j, JobCompleted) for j in seen):
                        m = await session.get_message(last, max_capacity=5)
                        if m is not None:
                            seen.extend(m.jobs)
                            last = m.message_id
                            await session.delete_message(m.message_id)
            started = [j for j in seen if isinstance(j, JobStarted)]
            completed = [j for j in seen if isinstance(j, JobCompleted)]
            assert started[0].runner_name == "runner-flow-1" and started[0].runner_id == jit.runner.id
            assert completed[0].result == "succeeded" and completed[0].job_id == message.jobs[0].job_id
        sessions = await actions_sim.control.sessions()
        assert sessions == []
    messages = await actions_sim.control.messages(scale_set.id)
    assert messages and all(m.acked for m in messages)


async def test_remove_busy_runner_is_job_still_running(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("busy")
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            await actions_sim.control.enqueue_jobs(count=1, labels=["busy"], duration=30.0)
            assert await session.get_message(0, max_capacity=1) is not None
            jit = await client.generate_jit_config(scale_set.id, "runner-busy-1")
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_runner, None, jit.encoded_jit_config)

                async def busy() -> bool:
                    return any(r.status == "busy" for r in await actions_sim.control.runners())

                await wait_for(busy)
                with pytest.raises(JobStillRunningError) as info:
                    await client.remove_runner(jit.runner.id)
                assert "JobStillRunningException" in info.value.type_name
                tg.cancel_scope.cancel()


async def test_ghes_flow_acquires_available_jobs(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(mode="ghes")
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("ghes")
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            await actions_sim.control.enqueue_jobs(count=2, labels=["ghes"])
            message = await session.get_message(0, max_capacity=5)
            assert message is not None and len(message.available) == 2
            assert message.statistics.total_available_jobs == 2
            assert all(j.acquire_job_url for j in message.available)
            legacy = await client.get_acquirable_jobs(scale_set.id)
            assert sorted(j.runner_request_id for j in legacy) == sorted(j.runner_request_id for j in message.available)
            await session.delete_message(message.message_id)
            ids = [j.runner_request_id for j in message.available]
            assert sorted(await session.acquire_jobs([*ids, 987654321])) == sorted(ids)
            assert await session.acquire_jobs([]) == []
            nxt = await session.get_message(message.message_id, max_capacity=5)
            assert nxt is not None and len(nxt.assigned) == 2
    acquire = (await endpoint_calls(actions_sim, "acquire_jobs"))[0]
    assert acquire.headers["Authorization"].startswith("Bearer")
