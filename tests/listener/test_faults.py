"""Injected faults: the listener recovers and the published desired state stays right."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import cast

import anyio
import msgspec
import pytest

from services.embedded.actions_sim.views import RequestRecord
from services.embedded.actions_sim.wire import Statistics
from services.listener.health import HealthState
from services.listener.loop import Identity, SessionLoop
from services.listener.metrics import ListenerMetrics
from services.listener.service import Listener
from shared.actions import ActionsClient, MessageSessionClient, PersonalAccessToken
from shared.bus import messages as busmsg
from shared.listener_config import ListenerConfig
from tests.fixtures.actions_sim import ActionsSim
from tests.listener.conftest import BusTap, ScaleSet, start_listener, wait_until

pytestmark = pytest.mark.anyio

CONFLICT_BODY = msgspec.json.encode(
    {
        "typeName": "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException, GitHub.Actions.Runtime.WebApi",
        "message": "The actions runner scaleset arc-runners already has an active session.",
    }
).decode()


def endpoint_calls(requests: list[RequestRecord], endpoint: str, status: int | None = None) -> int:
    return sum(1 for r in requests if r.endpoint == endpoint and (status is None or r.status == status))


async def test_queue_token_401_mid_poll_refreshes_and_keeps_the_session(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=1), "listener-0")
        await bus_tap.wait_for(lambda t: t.desired)
        session_id = listener.session_id
        await actions_sim.control.set_fault("get_message", status=401, count=1)
        await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 3)
        requests = await actions_sim.control.requests()
        assert endpoint_calls(requests, "get_message", 401) == 1
        assert endpoint_calls(requests, "refresh_session", 200) == 1
        assert listener.session_id == session_id  # refreshed, not re-created
        tg.cancel_scope.cancel()


async def test_repeated_401_recreates_the_session(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=0), "listener-0")
        await bus_tap.wait_for(lambda t: t.desired)
        first_session = listener.session_id
        # A 401 again after the refresh: the session is unusable; a new one replaces it.
        await actions_sim.control.set_fault("get_message", status=401, count=2)
        await wait_until(lambda: listener.session_id not in ("", first_session))
        await actions_sim.control.enqueue_jobs(count=1, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 1)
        sessions = await actions_sim.control.sessions()
        assert [s.session_id for s in sessions] == [listener.session_id]  # the old one was deleted
        # Same term, same epoch: the patch sequence carried on instead of restarting.
        assert {d.listener_epoch for d in bus_tap.desired} == {listener.epoch}
        tg.cancel_scope.cancel()


async def test_409_on_create_is_waited_out_with_backoff(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    await actions_sim.control.set_fault("create_session", status=409, count=3, body=CONFLICT_BODY)
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=2), "listener-0")
        first = await bus_tap.wait_for(lambda t: t.desired)
        assert (first[0].replicas, first[0].patch_id) == (2, 0)
        assert endpoint_calls(await actions_sim.control.requests(), "create_session", 409) == 3
        conflicts = listener.metrics.registry.get_sample_value(
            "runnerscale_listener_session_conflicts_total",
            {
                "name": scale_set.name,
                "namespace": "arc-systems",
                "repository": "",
                "organization": actions_sim.org,
                "enterprise": "",
            },
        )
        assert conflicts == 3
        tg.cancel_scope.cancel()


async def test_stale_session_after_a_crash_is_taken_over(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    cfg = make_config(min_runners=0)
    await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
    async with anyio.create_task_group() as tg:
        crashed = await start_listener(tg, cfg, "listener-0")
        await bus_tap.wait_for(lambda t: t.desired and t.desired[-1].replicas == 2)
        stale_session = crashed.session_id
        crashed.crash()  # no session delete, no lease release: as SIGKILL
    assert [s.session_id for s in await actions_sim.control.sessions()] == [stale_session]
    mark = len(bus_tap.desired)
    async with anyio.create_task_group() as tg:
        successor = await start_listener(tg, cfg, "listener-1")
        again = await bus_tap.wait_for(lambda t: t.desired[mark:], timeout=20)
        assert (again[0].replicas, again[0].listener_epoch) == (2, successor.epoch)
        requests = await actions_sim.control.requests()
        assert endpoint_calls(requests, "create_session", 409) == 1  # one conflict, then take-over
        assert endpoint_calls(requests, "delete_session", 204) >= 1
        sessions = await actions_sim.control.sessions()
        assert [(s.session_id, s.owner_name) for s in sessions] == [(successor.session_id, "listener-1")]
        tg.cancel_scope.cancel()


async def test_server_errors_and_dropped_connections_are_retried(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=0), "listener-0")
        await bus_tap.wait_for(lambda t: t.desired)
        session_id = listener.session_id
        await actions_sim.control.set_fault("get_message", status=503, count=2)
        await actions_sim.control.set_fault("get_message", kind="drop", count=1)
        await actions_sim.control.set_fault("delete_message", status=500, count=1)
        await actions_sim.control.enqueue_jobs(count=3, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 3, timeout=20)

        async def all_fired_and_acked() -> bool:
            faults = await actions_sim.control.faults()
            messages = await actions_sim.control.messages(scale_set.id)
            fired = all(f.fired == f.rule.count for f in faults)
            return fired and bool(messages) and all(m.acked for m in messages)

        await wait_until(all_fired_and_acked, timeout=30)
        assert listener.session_id == session_id  # transient failures never cost the session
        assert bus_tap.desired[-1].replicas == 3
        tg.cancel_scope.cancel()


async def test_duplicate_deliveries_and_events_are_harmless(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    from services.embedded.actions_sim.runner_agent import run_runner

    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=0), "listener-0")
        await bus_tap.wait_for(lambda t: t.desired)
        await actions_sim.control.set_fault("get_message", kind="redeliver", count=2)
        await actions_sim.control.set_fault("get_message", kind="duplicate_events", count=1)
        await actions_sim.control.enqueue_jobs(count=1, labels=[scale_set.name], duration=0.2, display_name="build")
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 1)
        async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
            jit = await client.generate_jit_config(scale_set.id, "arc-runners-dup01")
        assert (await run_runner(None, jit.encoded_jit_config, job_wait=10)).exit_code == 0
        await bus_tap.wait_for(lambda t: t.completed and t.desired[-1].replicas == 0)
        faults = await actions_sim.control.faults()
        assert [(f.rule.kind, f.fired) for f in faults] == [("redeliver", 2), ("duplicate_events", 1)]
        # Redelivered messages and repeated events reach the bus once per job and runner.
        assert [e.runner_name for e in bus_tap.started] == ["arc-runners-dup01"]
        assert [e.runner_name for e in bus_tap.completed] == ["arc-runners-dup01"]
        labels = {"enterprise": "", "organization": actions_sim.org, "repository": actions_sim.repo,
                  "job_name": "build", "event_name": "workflow_dispatch"}  # fmt: skip
        assert listener.metrics.registry.get_sample_value("gha_started_jobs_total", labels) == 1
        tg.cancel_scope.cancel()


async def test_out_of_order_message_does_not_move_desired_state_back(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig]
) -> None:
    """An older message handled after a newer one: its events count, its statistics do not."""
    cfg = make_config(min_runners=0, max_runners=10)
    older = await actions_sim.control.inject_message(
        scale_set.id, body="", statistics=Statistics(total_assigned_jobs=1)
    )
    newer = await actions_sim.control.inject_message(
        scale_set.id, body="", statistics=Statistics(total_assigned_jobs=4)
    )
    published: list[busmsg.DesiredState] = []

    async def publish(messages: Sequence[busmsg.BusMessage]) -> None:
        published.extend(cast(Sequence[busmsg.DesiredState], messages))  # no job events in these messages

    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        session = await client.create_message_session(scale_set.id, "listener-test")
        async with MessageSessionClient(client, scale_set.id, session) as session_client:
            first = await session_client.get_message(0, cfg.max_runners)
            assert first is not None
            second = await session_client.get_message(first.message_id, cfg.max_runners)
            assert second is not None
            assert (first.message_id, second.message_id) == (older, newer)
            loop = SessionLoop(
                ident=Identity.from_config(cfg), session_client=session_client, publish=publish,
                metrics=ListenerMetrics(name="x", namespace="y"), health=HealthState(), epoch=7,
            )  # fmt: skip
            await loop.handle(second)
            await loop.handle(first)  # delivered late
    assert [(m.replicas, m.statistics.total_assigned_jobs) for m in published] == [(4, 4), (4, 4)]
    assert all(m.acked for m in await actions_sim.control.messages(scale_set.id))


async def test_deleted_scale_set_makes_the_listener_give_up(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    from services.listener.__main__ import _root_cause
    from services.listener.service import Listener, ListenerGaveUp

    listener = Listener(make_config(), owner="listener-0")
    with anyio.fail_after(30):
        with pytest.raises(BaseException) as info:
            async with anyio.create_task_group() as tg:
                await tg.start(listener.run)
                await bus_tap.wait_for(lambda t: t.desired)
                await actions_sim.control.delete_scale_set(scale_set.id)
    cause = _root_cause(info.value)
    assert isinstance(cause, ListenerGaveUp), repr(cause)
    assert f"scale set {scale_set.id} no longer exists" in str(cause)


def _rejected(listener: Listener, scale_set: ScaleSet, actions_sim: ActionsSim, reason: str) -> float | None:
    return listener.metrics.registry.get_sample_value(
        "runnerscale_listener_rejected_messages_total",
        {"name": scale_set.name, "namespace": "arc-systems", "repository": "", "organization": actions_sim.org,
         "enterprise": "", "reason": reason},
    )  # fmt: skip


async def test_undecodable_messages_are_rejected_acknowledged_and_later_messages_flow(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A garbled body or an unknown message type is logged, counted and acknowledged: the queue
    moves on, the desired state stays on the last good statistics, and the session is kept."""
    caplog.set_level(logging.INFO)
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=1, max_runners=10), "listener-0")
        await bus_tap.wait_for(lambda t: t.desired)
        session_id = listener.session_id
        await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 3)
        good_so_far = len(bus_tap.desired)
        # Statistics a rejected message must never contribute (min 1 + 7 = 8 runners).
        bogus = Statistics(total_assigned_jobs=7)
        garbled = await actions_sim.control.inject_message(scale_set.id, body="[{not json", statistics=bogus)
        wrong_type = await actions_sim.control.inject_message(
            scale_set.id, body="", statistics=bogus, message_type="SomethingElse"
        )

        async def both_rejected_and_acked() -> bool:
            acked = {m.message_id for m in await actions_sim.control.messages(scale_set.id) if m.acked}
            return {garbled, wrong_type} <= acked

        await wait_until(both_rejected_and_acked, timeout=20)
        # Each rejection re-published the desired state from the last good statistics.
        await bus_tap.wait_for(lambda t: len(t.desired) >= good_so_far + 2)
        assert all(d.replicas == 3 and d.statistics.total_assigned_jobs == 2 for d in bus_tap.desired[good_so_far:])
        assert _rejected(listener, scale_set, actions_sim, "malformed_body") == 1
        assert _rejected(listener, scale_set, actions_sim, "unsupported_message_type") == 1

        # Later good messages still flow and the desired state follows them.
        await actions_sim.control.enqueue_jobs(count=1, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 4)

        async def all_acked() -> bool:
            return all(m.acked for m in await actions_sim.control.messages(scale_set.id))

        await wait_until(all_acked, timeout=20)
        assert all(d.replicas != 8 for d in bus_tap.desired)
        assert listener.session_id == session_id  # rejected, not a session failure
        assert listener.health.role.value == "leader"
        tg.cancel_scope.cancel()

    from shared.log import JsonFormatter

    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    rejected = {line["message_id"]: line for line in lines if line["msg"].startswith("rejected a service message")}
    assert set(rejected) == {garbled, wrong_type}
    assert rejected[garbled]["reason"] == "malformed_body"
    assert rejected[garbled]["message_type"] == "RunnerScaleSetJobMessages"
    assert "not a JSON array" in rejected[garbled]["error"]
    assert rejected[wrong_type]["message_type"] == "SomethingElse"
    assert "unsupported messageType" in rejected[wrong_type]["error"]
    assert actions_sim.pat not in "\n".join(JsonFormatter().format(r) for r in caplog.records)


async def test_message_without_a_usable_envelope_is_counted_and_the_listener_recovers(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    """No message id to acknowledge: counted as malformed_envelope, the session is re-created, and
    the next messages flow (the service's own copy of the message, if any, is redelivered)."""
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=0), "listener-0")
        await bus_tap.wait_for(lambda t: t.desired)
        await actions_sim.control.set_fault("get_message", kind="empty_body", count=1)
        await wait_until(lambda: _rejected(listener, scale_set, actions_sim, "malformed_envelope") == 1)
        await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
        await bus_tap.wait_for(lambda t: t.desired[-1].replicas == 2)
        tg.cancel_scope.cancel()
