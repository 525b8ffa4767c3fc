"""A 409 "session already exists" on session create: the listener says in its log which recovery
it took (issue 6) — it took over the stale session an earlier listener recorded, or it waited.

The log is checked as the JSON lines the process writes (``shared.log.JsonFormatter``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from services.listener.session import SessionRecord, SessionRecords
from shared.actions import ActionsClient, PersonalAccessToken
from shared.bus import Bus
from shared.listener_config import ListenerConfig, bus_settings
from shared.log import JsonFormatter
from tests.fixtures.actions_sim import ActionsSim
from tests.listener.conftest import BusTap, ScaleSet, start_listener
from tests.listener.test_faults import CONFLICT_BODY, endpoint_calls

pytestmark = pytest.mark.anyio

TAKE_OVER = "session conflict: taking over the stale session recorded by an earlier listener"
WAIT = "session conflict: another session is active and not ours to take over; waiting for it to expire"


def json_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name.startswith("services.listener")]


async def test_a_recorded_stale_session_is_taken_over_and_the_log_says_so(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    cfg = make_config(min_runners=1)
    # What a SIGKILLed predecessor leaves behind: its live session at the service, and its record.
    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        stale = await client.create_message_session(scale_set.id, "listener-old")
    async with Bus.connect(bus_settings(cfg, environ={}), name="test-seed") as bus:
        await SessionRecords(bus).put(
            SessionRecord(
                scale_set_id=scale_set.id,
                session_id=stale.session_id,
                owner_name="listener-old",
                listener_epoch=1,
                created=dt.datetime.now(dt.UTC),
            )
        )
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, cfg, "listener-new")
        await bus_tap.wait_for(lambda t: t.desired, timeout=15)
        sessions = await actions_sim.control.sessions()
        assert [(s.session_id, s.owner_name) for s in sessions] == [(listener.session_id, "listener-new")]
        tg.cancel_scope.cancel()

    requests = await actions_sim.control.requests()
    assert endpoint_calls(requests, "create_session", 409) == 1
    lines = json_lines(caplog)
    taken = [line for line in lines if line["msg"] == TAKE_OVER]
    assert len(taken) == 1, [line["msg"] for line in lines]
    assert taken[0]["level"] == "warning"
    assert (taken[0]["stale_session_id"], taken[0]["stale_owner"]) == (stale.session_id, "listener-old")
    assert taken[0]["scale_set_id"] == scale_set.id
    assert not [line for line in lines if line["msg"] == WAIT]
    # The take-over is logged before the new session exists.
    created = [i for i, line in enumerate(lines) if line["msg"] == "message session created"]
    assert created and lines.index(taken[0]) < created[0]


async def test_an_unrecorded_session_is_waited_out_and_the_log_says_so(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No record names the conflicting session (somebody else's, or one whose create answer was
    lost): the listener waits with backoff, saying so on every attempt, and never deletes it."""
    caplog.set_level(logging.INFO)
    await actions_sim.control.set_fault("create_session", status=409, count=2, body=CONFLICT_BODY)
    async with anyio.create_task_group() as tg:
        await start_listener(tg, make_config(min_runners=1), "listener-0")
        await bus_tap.wait_for(lambda t: t.desired, timeout=15)
        tg.cancel_scope.cancel()

    requests = await actions_sim.control.requests()
    assert endpoint_calls(requests, "create_session", 409) == 2
    lines = json_lines(caplog)
    waited = [line for line in lines if line["msg"] == WAIT]
    assert len(waited) == 2, [line["msg"] for line in lines]
    assert all(line["level"] == "warning" and line["scale_set_id"] == scale_set.id for line in waited)
    assert all(0 < line["retry_in"] <= 1.2 for line in waited)  # conflict backoff 0.2 s .. 1 s, ±20 %
    assert not [line for line in lines if line["msg"] == TAKE_OVER]
    # Nothing was taken over: the only delete is the listener's own session on shutdown.
    assert endpoint_calls(requests, "delete_session") == 1
