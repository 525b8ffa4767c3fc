"""Harness for the listener's acceptance tests: the real Actions simulator, a real nats-server,
and listeners running in-process as anyio tasks.

* ``scale_set`` registers a scale set in the simulator (through the real Actions client);
* ``make_config(**overrides)`` builds a listener config pointing at both servers;
* ``bus_tap`` records every message the listener publishes on JetStream, decoded;
* ``run_listener(tg, cfg, owner)`` starts a :class:`Listener` and returns it once its HTTP
  endpoints are bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from services.listener.service import Listener
from shared.actions import ActionsClient, PersonalAccessToken
from shared.bus import Bus
from shared.bus import messages as busmsg
from shared.listener_config import ListenerConfig, bus_settings, parse_config
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.nats import NatsServer
from tests.scenario.conftest import Kube, github_secret, kube, worker_settings  # noqa: F401 - scenario fixtures, shared here
from tests.support.eventually import eventually

SCALE_SET_NAME = "arc-runners"
NAMESPACE = "arc-systems"


@dataclass
class ScaleSet:
    id: int
    name: str


@pytest.fixture
async def scale_set(actions_sim: ActionsSim) -> ScaleSet:
    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        created = await client.create_scale_set(SCALE_SET_NAME)
    return ScaleSet(id=created.id, name=created.name)


@pytest.fixture
def make_config(actions_sim: ActionsSim, nats_server: NatsServer, scale_set: ScaleSet) -> Callable[..., ListenerConfig]:
    def build(**overrides: Any) -> ListenerConfig:
        doc: dict[str, Any] = {
            "configure_url": actions_sim.config_url(),
            "github_token": actions_sim.pat,
            "runner_scale_set_id": scale_set.id,
            "runner_scale_set_name": scale_set.name,
            "ephemeral_runner_set_namespace": NAMESPACE,
            "ephemeral_runner_set_name": scale_set.name,
            "min_runners": 0,
            "max_runners": 10,
            "nats": {"servers": [nats_server.url], "request_timeout_seconds": 2, "publish_deadline_seconds": 3},
            "ha": {"lease_ttl_seconds": 3, "renew_interval_seconds": 0.5},
            "session": {
                "conflict_backoff_initial_seconds": 0.2,
                "conflict_backoff_max_seconds": 1,
                "conflict_give_up_seconds": 60,
                "error_backoff_seconds": 0.2,
                "poll_staleness_seconds": 30,
            },
            "metrics_addr": "127.0.0.1:0",
            "health_addr": "127.0.0.1:0",
            "log_level": "debug",
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        return parse_config(msgspec.json.encode(doc))

    return build


async def start_listener(tg: anyio.abc.TaskGroup, cfg: ListenerConfig, owner: str) -> Listener:
    listener = Listener(cfg, owner=owner)
    await tg.start(listener.run)
    return listener


@dataclass
class BusTap:
    """Every DesiredState / JobStarted / JobCompleted published, in stream order per kind."""

    desired: list[busmsg.DesiredState] = field(default_factory=list)
    started: list[busmsg.JobStarted] = field(default_factory=list)
    completed: list[busmsg.JobCompleted] = field(default_factory=list)

    async def wait_for(self, predicate: Callable[[BusTap], Any], timeout: float = 15.0, what: str = "condition") -> Any:
        return await eventually(lambda: predicate(self), timeout=timeout, interval=0.02, what=what)


@pytest.fixture
async def bus_tap(nats_server: NatsServer, make_config: Callable[..., ListenerConfig]) -> AsyncIterator[BusTap]:
    """Creates the streams (as the listener would) and records everything published on them."""
    tap = BusTap()
    async with Bus.connect(bus_settings(make_config(), environ={}), name="test-tap"):
        pass  # streams and buckets exist from here on
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()

    async def on_desired(msg: Msg) -> None:
        tap.desired.append(cast(busmsg.DesiredState, busmsg.decode(msg.subject, msg.data)))  # the desired stream

    async def on_job(msg: Msg) -> None:
        decoded = busmsg.decode(msg.subject, msg.data)
        if isinstance(decoded, busmsg.JobStarted):
            tap.started.append(decoded)
        else:
            tap.completed.append(cast(busmsg.JobCompleted, decoded))  # the jobs stream

    subs = [
        await js.subscribe("runnerscale.desired.>", cb=on_desired, ordered_consumer=True),
        await js.subscribe("runnerscale.jobs.>", cb=on_job, ordered_consumer=True),
    ]
    try:
        yield tap
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with anyio.move_on_after(2):
            await nc.close()


async def wait_until(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    """:func:`tests.support.eventually.eventually` with this directory's default deadline."""
    return await eventually(predicate, timeout=timeout)
