"""Runner-side API (via runner_agent), fault injection, and the control API."""

from __future__ import annotations

from typing import Any

import aiohttp
import anyio
import pytest

from services.embedded.actions_sim import views
from services.embedded.actions_sim.control_client import SimControlError
from services.embedded.actions_sim.runner_agent import EXIT_ERROR, EXIT_OK, EXIT_OUTDATED, run_runner
from tests.fixtures.actions_sim import ActionsSim
from tests.sim.conftest import Service, job_events
from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio


async def drain_events(service: Service, session: dict[str, Any], *, until: int) -> list[dict[str, Any]]:
    """Poll and ack until ``until`` job events arrived (each poll returns at once when any exist)."""
    events: list[dict[str, Any]] = []
    last = 0
    with anyio.fail_after(10):
        while len(events) < until:
            reply = await service.poll(session, last=last)
            if reply.status == 202:
                continue
            message = reply.json()
            events += job_events(message)
            last = message["messageId"]
            assert (await service.ack(session, last)).status == 204
    return events


async def test_runner_agent_plays_a_job_to_completion(service: Service) -> None:
    await service.sim.control.configure(poll_wait=0.2)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    [job] = await service.sim.control.enqueue_jobs(labels=["linux"], duration=0.05, result="failed")
    jit = (await service.jit(ss["id"], "runner-a")).json()
    seen_running = []

    async def on_started(runner_job: views.RunnerJob) -> None:
        [runner] = await service.sim.control.runners()
        seen_running.append((runner_job.job_id, runner.status))

    with anyio.fail_after(10):
        outcome = await run_runner(service.sim.url, jit["encodedJITConfig"], job_wait=1.0, on_started=on_started)
    assert outcome.exit_code == EXIT_OK and outcome.reason == "completed"
    assert outcome.job_id == job.job_id and outcome.result == "failed"
    assert seen_running == [(job.job_id, "busy")]

    events = await drain_events(service, session, until=3)
    assert [e["messageType"] for e in events] == ["JobAssigned", "JobStarted", "JobCompleted"]
    assert events[1]["runnerName"] == "runner-a" and events[1]["runnerId"] == jit["runner"]["id"]
    assert events[2]["result"] == "failed"
    [state] = await service.sim.control.jobs()
    assert state.state == "completed" and state.final_result == "failed"
    assert await service.sim.control.runners() == []  # ephemeral: deregistered after its job
    gone = await service.admin("GET", f"_apis/distributedtask/pools/0/agents/{jit['runner']['id']}")
    assert gone.status == 404


async def test_busy_runner_cannot_be_removed(service: Service) -> None:
    ss = await service.create_scale_set()
    await service.sim.control.enqueue_jobs(labels=["linux"], duration=30)
    jit = (await service.jit(ss["id"], "runner-b")).json()
    started = anyio.Event()

    async def on_started(_job: views.RunnerJob) -> None:
        started.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_runner(service.sim.url, jit["encodedJITConfig"], on_started=on_started))
            await started.wait()
            reply = await service.admin("DELETE", f"_apis/distributedtask/pools/0/agents/{jit['runner']['id']}")
            tg.cancel_scope.cancel()
    assert reply.status == 400 and "JobStillRunningException" in reply.json()["typeName"]


async def test_killed_runner_cancels_its_job_and_can_then_be_removed(service: Service) -> None:
    await service.sim.control.configure(poll_wait=0.2)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.enqueue_jobs(labels=["linux"], duration=60)
    jit = (await service.jit(ss["id"], "doomed")).json()
    started = anyio.Event()

    async def on_started(_job: views.RunnerJob) -> None:
        started.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_runner(service.sim.url, jit["encodedJITConfig"], on_started=on_started))
            await started.wait()
            tg.cancel_scope.cancel()  # the pod is killed
    [runner] = await service.sim.control.runners()
    assert runner.status == "offline" and runner.job_id == ""
    events = await drain_events(service, session, until=3)
    assert [e["messageType"] for e in events] == ["JobAssigned", "JobStarted", "JobCompleted"]
    assert events[2]["result"] == "canceled"
    assert (await service.admin("DELETE", f"_apis/distributedtask/pools/0/agents/{runner.id}")).status == 204


async def test_crashed_runner_before_start_hands_the_job_to_another(service: Service) -> None:
    ss = await service.create_scale_set()
    [job] = await service.sim.control.enqueue_jobs(labels=["linux"])
    first = (await service.jit(ss["id"], "first")).json()
    second = (await service.jit(ss["id"], "second")).json()
    # Connect the first runner by hand so that it holds the job without starting it.
    await _connect_by_hand(service, first["encodedJITConfig"])
    [held] = await service.sim.control.jobs()
    assert held.runner_name == "first"
    await service.sim.control.crash_runner(first["runner"]["id"])
    with anyio.fail_after(10):
        outcome = await run_runner(service.sim.url, second["encodedJITConfig"])
    assert outcome.job_id == job.job_id and outcome.reason == "completed"


async def _connect_by_hand(service: Service, encoded_jit_config: str) -> dict[str, Any]:
    """``POST /_runner/connect`` as the runner of this JIT config; its 200 answer."""
    token_headers = {"Authorization": "Bearer " + _runner_token(encoded_jit_config)}
    async with (
        aiohttp.ClientSession(headers=token_headers) as http,
        http.post(service.sim.url + "/_runner/connect", json={"version": "2.330.0"}) as resp,
    ):
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


def _runner_token(encoded: str) -> str:
    from services.embedded.actions_sim.jitconfig import decode_jit_config

    return decode_jit_config(encoded).credentials.data.token


async def test_outdated_runner_exits_7_and_gets_no_job(service: Service) -> None:
    await service.sim.control.set_min_runner_version("2.330.0")
    ss = await service.create_scale_set()
    await service.sim.control.enqueue_jobs(labels=["linux"])
    jit = (await service.jit(ss["id"], "old-runner")).json()
    with anyio.fail_after(10):
        outcome = await run_runner(None, jit["encodedJITConfig"], version="2.300.0")
    assert outcome.exit_code == EXIT_OUTDATED
    [runner] = await service.sim.control.runners()
    assert runner.status == "outdated"
    [job] = await service.sim.control.jobs()
    assert job.runner_id is None


async def test_runner_removed_while_waiting_exits_cleanly(service: Service) -> None:
    ss = await service.create_scale_set()
    jit = (await service.jit(ss["id"], "idle-runner")).json()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            outcomes = []

            async def play() -> None:
                outcomes.append(await run_runner(service.sim.url, jit["encodedJITConfig"], job_wait=5))

            tg.start_soon(play)

            async def idle_runner() -> bool:
                return any(r.status == "idle" for r in await service.sim.control.runners())

            await eventually(idle_runner, timeout=10, interval=0.01, what="an idle runner")
            removed = await service.admin("DELETE", f"_apis/distributedtask/pools/0/agents/{jit['runner']['id']}")
            assert removed.status == 204
    assert outcomes[0].exit_code == EXIT_OK and outcomes[0].reason == "removed"


async def test_garbage_jit_config_is_exit_1() -> None:
    outcome = await run_runner("http://127.0.0.1:1", "not base64!")
    assert outcome.exit_code == EXIT_ERROR and "base64" in outcome.reason


async def test_unstarted_job_is_cancelled_and_reassigned(service: Service) -> None:
    await service.sim.control.configure(assign_timeout=30)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    [job] = await service.sim.control.enqueue_jobs(labels=["linux"])
    await service.sim.control.advance_clock(31)
    events = await drain_events(service, session, until=3)
    assert [e["messageType"] for e in events] == ["JobAssigned", "JobCompleted", "JobAssigned"]
    assert events[1]["result"] == "canceled" and {e["jobId"] for e in events} == {job.job_id}


# -- faults ------------------------------------------------------------------------------------


async def test_status_fault_with_retry_after_fires_count_times(service: Service) -> None:
    ss = await service.create_scale_set()
    await service.sim.control.set_fault("create_session", status=429, retry_after=2, count=2)
    for _ in range(2):
        reply = await service.create_session(ss["id"])
        assert reply.status == 429 and reply.headers["Retry-After"] == "2"
    assert (await service.create_session(ss["id"])).status == 200
    [fault] = await service.sim.control.faults()
    assert fault.fired == 2


async def test_acted_then_answered_500(service: Service) -> None:
    ss = await service.create_scale_set()
    await service.sim.control.set_fault("A7", kind="after", status=500)
    first = await service.jit(ss["id"], "runner-x")
    assert first.status == 500
    retry = await service.jit(ss["id"], "runner-x")
    assert retry.status == 409 and "AgentExistsException" in retry.json()["typeName"]

    await service.sim.control.set_fault("create_session", kind="after", status=503)
    assert (await service.create_session(ss["id"])).status == 503
    assert (await service.create_session(ss["id"])).status == 409


async def test_fault_for_401_on_the_queue_and_text_plain_bodies(service: Service) -> None:
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.set_fault("get_message", status=401, count=None)
    assert (await service.poll(session)).status == 401
    assert (await service.poll(session)).status == 401
    await service.sim.control.clear_faults()
    await service.sim.control.set_fault("delete_message", status=400, body="bad", content_type="text/plain")
    reply = await service.ack(session, 1)
    assert reply.status == 400 and reply.raw == b"bad" and reply.headers["Content-Type"].startswith("text/plain")


async def test_dropped_connection(service: Service) -> None:
    ss = await service.create_scale_set()
    # POST: aiohttp would silently retry an idempotent request after a disconnect.
    await service.sim.control.set_fault("create_session", kind="drop")
    with pytest.raises(aiohttp.ClientError):
        await service.create_session(ss["id"])
    assert await service.sim.control.sessions() == []  # dropped before acting
    assert (await service.create_session(ss["id"])).status == 200


async def test_connection_dropped_mid_poll_and_blank_queue_url(service: Service) -> None:
    ss = await service.create_scale_set()
    await service.sim.control.set_fault("create_session", kind="blank_queue_url")
    blank = await service.create_session(ss["id"])
    assert blank.status == 200 and blank.json()["messageQueueUrl"] == ""
    session_id = blank.json()["sessionId"]
    refreshed = await service.admin("PATCH", f"_apis/runtime/runnerscalesets/{ss['id']}/sessions/{session_id}")
    session = refreshed.json()
    assert session["messageQueueUrl"]
    await service.sim.control.set_fault("get_message", kind="drop", seconds=0.2, count=2)
    started = anyio.current_time()
    with pytest.raises(aiohttp.ClientError):
        await service.poll(session)  # aiohttp retries a GET once on a dropped connection: count=2
    assert anyio.current_time() - started >= 0.4


async def test_slow_poll_delay_and_odd_poll_answers(service: Service) -> None:
    await service.sim.control.configure(poll_wait=0.05)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.set_fault("get_message", kind="delay", seconds=0.3)
    started = anyio.current_time()
    assert (await service.poll(session)).status == 202
    assert anyio.current_time() - started >= 0.3
    await service.sim.control.set_fault("get_message", kind="empty_body")
    empty = await service.poll(session)
    assert empty.status == 200 and empty.raw == b""
    await service.sim.control.set_fault("get_message", status=204)
    assert (await service.poll(session)).status == 204


async def test_bom_prefix(service: Service) -> None:
    await service.sim.control.set_fault("get_runner_group", kind="bom")
    reply = await service.admin("GET", "_apis/runtime/runnergroups/")
    assert reply.raw.startswith(b"\xef\xbb\xbf{") and reply.json()["count"] == 1


async def test_redelivery_and_duplicate_events(service: Service) -> None:
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.enqueue_jobs(labels=["linux"])
    await service.sim.control.set_fault("get_message", kind="redeliver")
    first = (await service.poll(session)).json()
    await service.ack(session, first["messageId"])
    again = (await service.poll(session, last=first["messageId"])).json()
    assert again["messageId"] == first["messageId"]  # despite the ack and lastMessageId

    await service.sim.control.set_fault("get_message", kind="duplicate_events")
    await service.sim.control.enqueue_jobs(labels=["linux"])
    doubled = (await service.poll(session, last=first["messageId"])).json()
    events = job_events(doubled)
    assert len(events) == 2 and events[0] == events[1]
    await service.ack(session, doubled["messageId"])
    await service.sim.control.enqueue_jobs(labels=["linux"])
    following = job_events((await service.poll(session, last=doubled["messageId"])).json())
    assert following[0] == events[0] and len(following) == 2  # the earlier event repeated, then the new one


async def test_reordered_events(service: Service) -> None:
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.set_fault("Q1", kind="reorder")
    jit = (await service.jit(ss["id"], "runner-r")).json()
    await service.sim.control.enqueue_jobs(labels=["linux"])
    with anyio.fail_after(10):
        await run_runner(service.sim.url, jit["encodedJITConfig"])
    message = (await service.poll(session)).json()
    assert [e["messageType"] for e in job_events(message)] == ["JobCompleted", "JobStarted", "JobAssigned"]


async def test_injected_message_quirks(service: Service) -> None:
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    control = service.sim.control
    stats_only = await control.inject_message(ss["id"], body="")
    odd = await control.inject_message(
        ss["id"],
        events=[{"messageType": "JobStarted", "jobId": "x", "runnerName": "never-created", "extra": 1}],
        message_type="SomethingNew",
    )
    first = (await service.poll(session)).json()
    assert first["messageId"] == stats_only and first["body"] == ""
    second = (await service.poll(session, last=stats_only)).json()
    assert second["messageId"] == odd and second["messageType"] == "SomethingNew"
    assert job_events(second)[0]["runnerName"] == "never-created"


async def test_fault_rules_are_validated(actions_sim: ActionsSim) -> None:
    with pytest.raises(SimControlError) as err:
        await actions_sim.control.set_fault("no_such_endpoint")
    assert err.value.status == 400 and "endpoint" in err.value.text
    with pytest.raises(SimControlError) as err:
        await actions_sim.control.set_fault("*", status=42)
    assert "status" in err.value.text


# -- control API -------------------------------------------------------------------------------


async def test_control_api_validates_job_specs(actions_sim: ActionsSim) -> None:
    with pytest.raises(SimControlError) as err:
        await actions_sim.control.enqueue_jobs(count=0)
    assert err.value.status == 400 and "count" in err.value.text
    with pytest.raises(SimControlError) as err:
        await actions_sim.control.enqueue_jobs(repository="no-slash")
    assert "repository" in err.value.text


async def test_reset_forgets_everything(service: Service) -> None:
    await service.create_scale_set()
    await service.sim.control.enqueue_jobs(labels=["linux"])
    await service.sim.control.set_fault("*", status=500, count=None)
    await service.sim.control.reset()
    assert await service.sim.control.jobs() == []
    assert await service.sim.control.scale_sets() == []
    assert await service.sim.control.faults() == []
    await service.login()
    assert (await service.admin("GET", "_apis/runtime/runnerscalesets")).json()["count"] == 0


def test_sync_control_twin(actions_sim: ActionsSim) -> None:
    jobs = actions_sim.control.sync.enqueue_jobs(count=2, labels=["x"])
    assert len(jobs) == 2 and all(j.state == "queued" for j in jobs)
    assert len(actions_sim.control.sync.jobs()) == 2
    assert actions_sim.control.sync.configure(poll_wait=3.0).poll_wait == 3.0


async def test_no_credential_reaches_a_log_line(service: Service, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from shared.log import JsonFormatter

    caplog.set_level(logging.DEBUG)
    await service.sim.control.set_min_runner_version("2.330.0")
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    jit = await service.jit(ss["id"], "old")
    with anyio.fail_after(10):
        await run_runner(service.sim.url, jit.json()["encodedJITConfig"], version="2.0.0")
    formatter = JsonFormatter()
    text = "\n".join(formatter.format(r) for r in caplog.records)
    assert "scale set created" in text and "outdated" in text  # the log is not simply empty
    for secret in (
        service.sim.pat,
        service.admin_token,
        session["messageQueueAccessToken"],
        jit.json()["encodedJITConfig"],
        service.sim.app_private_key_pem.splitlines()[1],
    ):
        assert secret not in text


async def test_settings_are_validated(actions_sim: ActionsSim) -> None:
    with pytest.raises(SimControlError) as err:
        await actions_sim.control.configure(poll_wait=-1)
    assert err.value.status == 400 and "poll_wait" in err.value.text
    with pytest.raises(SimControlError) as err:
        await actions_sim.control.configure(mode="enterprise-ish")
    assert "mode" in err.value.text
    assert (await actions_sim.control.settings()).poll_wait == 1.0


async def test_connect_answers_the_job_already_waiting_and_the_runner_skips_its_poll(service: Service) -> None:
    """Issue 10: a runner that connects while a job waits for an idle runner gets it in the connect
    answer (as the job poll would answer it) and makes no job poll; without a waiting job the
    answer carries none and the runner polls."""
    ss = await service.create_scale_set()
    [job] = await service.sim.control.enqueue_jobs(labels=["linux"])
    jit = (await service.jit(ss["id"], "eager")).json()
    body = await _connect_by_hand(service, jit["encodedJITConfig"])
    assert body["job"]["job_id"] == job.job_id
    await service.sim.control.clear_requests()
    with anyio.fail_after(10):
        outcome = await run_runner(service.sim.url, jit["encodedJITConfig"])
    assert outcome.job_id == job.job_id and outcome.reason == "completed"
    endpoints = [r.endpoint for r in await service.sim.control.requests()]
    assert "runner_job" not in endpoints and "runner_job_started" in endpoints

    idle = (await service.jit(ss["id"], "idle")).json()
    assert "job" not in await _connect_by_hand(service, idle["encodedJITConfig"])


async def test_request_counts_count_every_request_by_endpoint_and_status(service: Service) -> None:
    """Issue 10: the burst bench counts requests per runner by route; the request log keeps only
    the latest 2,000, the counts keep every request until cleared."""
    ss = await service.create_scale_set()
    await service.sim.control.clear_request_counts()
    for i in range(3):
        assert (await service.jit(ss["id"], f"counted-{i}")).status == 200
    assert (await service.jit(ss["id"], "counted-0")).status == 409  # the name is taken
    counts = {(c.method, c.endpoint, c.status): c.count for c in await service.sim.control.request_counts()}
    assert counts == {("POST", "generate_jit_config", 200): 3, ("POST", "generate_jit_config", 409): 1}
    await service.sim.control.clear_requests()  # the bounded log forgets; the counts do not
    assert len(await service.sim.control.request_counts()) == 2
    await service.sim.control.clear_request_counts()
    assert await service.sim.control.request_counts() == []
