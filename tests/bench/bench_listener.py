"""Listener: job assigned → desired state on JetStream, burst catch-up, HA takeover after a crash.

``python -m tests.bench listener [--quick]``. Real parts: the Actions simulator (its own thread),
a nats-server with JetStream file storage, listeners in-process as anyio tasks.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import anyio
import msgspec
import nats
from nats.aio.msg import Msg

from services.embedded.actions_sim.views import SimSettings
from services.listener.service import Listener
from shared.actions import ActionsClient, PersonalAccessToken
from shared.bus import messages as busmsg
from shared.listener_config import ListenerConfig, parse_config
from shared.log import configure_logging
from tests.bench.table import Table
from tests.fixtures.actions_sim import ActionsSim, start_actions_sim
from tests.fixtures.nats import NatsServer, _free_port
from tests.support.eventually import eventually


def _config(sim: ActionsSim, nats_url: str, scale_set_id: int, *, lease_ttl: float, max_runners: int) -> ListenerConfig:
    return parse_config(
        msgspec.json.encode(
            {
                "configure_url": sim.config_url(),
                "github_token": sim.pat,
                "runner_scale_set_id": scale_set_id,
                "runner_scale_set_name": "bench",
                "ephemeral_runner_set_namespace": "bench",
                "ephemeral_runner_set_name": "bench",
                "max_runners": max_runners,
                "nats": {"servers": [nats_url]},
                "ha": {"lease_ttl_seconds": lease_ttl},
                "metrics_addr": "127.0.0.1:0",
                "health_addr": "127.0.0.1:0",
                "log_level": "error",
            }
        )
    )


def _replicas_are(n: int) -> Callable[[busmsg.DesiredState], bool]:
    return lambda d: d.replicas == n


class _Tap:
    def __init__(self) -> None:
        self.desired: list[tuple[float, busmsg.DesiredState]] = []

    async def wait(self, predicate: Callable[[busmsg.DesiredState], bool], timeout: float = 60) -> float:
        with anyio.fail_after(timeout):
            while True:
                for at, d in reversed(self.desired):
                    if predicate(d):
                        return at
                await anyio.sleep(0.001)


async def _bench(quick: bool) -> Table:
    table = Table("listener (simulator + nats-server, in-process)", ["measure", "n", "p50", "p95", "max", "unit"])
    sim = start_actions_sim(SimSettings(poll_wait=5.0))
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(port=_free_port(), store_dir=Path(tmp))
        server.start()
        try:
            async with ActionsClient.from_config(sim.config_url(), PersonalAccessToken(sim.pat)) as client:
                scale_set = await client.create_scale_set("bench")
            lease_ttl = 3.0 if quick else 10.0
            cfg = _config(sim, server.url, scale_set.id, lease_ttl=lease_ttl, max_runners=100_000)
            tap = _Tap()
            nc = await nats.connect(server.url)
            try:
                async with anyio.create_task_group() as tg:
                    leader = Listener(cfg, owner="bench-a")
                    await tg.start(leader.run)
                    js = nc.jetstream()

                    async def on_desired(msg: Msg) -> None:
                        desired = cast(busmsg.DesiredState, busmsg.decode(msg.subject, msg.data))  # the desired stream
                        tap.desired.append((time.monotonic(), desired))

                    while True:  # the stream exists once the listener connected
                        try:
                            await js.subscribe("runnerscale.desired.>", cb=on_desired, ordered_consumer=True)
                            break
                        except Exception:
                            await anyio.sleep(0.05)
                    await tap.wait(lambda d: d.replicas == 0)

                    # 1. one job assigned -> its desired state acknowledged on JetStream
                    rounds = 5 if quick else 30
                    latencies: list[float] = []
                    for i in range(1, rounds + 1):
                        t0 = time.monotonic()
                        await sim.control.enqueue_jobs(count=1, labels=["bench"])
                        at = await tap.wait(_replicas_are(i))
                        latencies.append((at - t0) * 1000)
                    _row(table, "job enqueued -> DesiredState on the bus", latencies, "ms")

                    # 2. a burst: the service batches 50 events per message
                    burst = 100 if quick else 1000
                    t0 = time.monotonic()
                    await sim.control.enqueue_jobs(count=burst, labels=["bench"])
                    at = await tap.wait(lambda d: d.replicas == rounds + burst, timeout=120)
                    table.add(
                        f"burst of {burst} jobs -> DesiredState counts them all",
                        1,
                        round((at - t0) * 1000, 1),
                        "",
                        "",
                        "ms",
                    )

                    async def all_acked() -> bool:
                        return all(m.acked for m in await sim.control.messages(scale_set.id))

                    await eventually(all_acked, timeout=120, interval=0.005, what="every message acked")
                    done = time.monotonic()
                    batches = len(await sim.control.messages(scale_set.id))
                    table.add(
                        f"  ... every message of the burst handled and acked ({batches} total)",
                        1,
                        round((done - t0) * 1000, 1),
                        "",
                        "",
                        "ms",
                    )

                    # 3. HA: crash the leader, measure until the standby's first desired state
                    standby = Listener(cfg, owner="bench-b")
                    await tg.start(standby.run)
                    await eventually(
                        lambda: standby.health.role.value == "standby", timeout=30, interval=0.01, what="a standby"
                    )
                    t0 = time.monotonic()
                    old_epoch = leader.epoch
                    leader.crash()
                    at = await tap.wait(lambda d: d.listener_epoch != old_epoch, timeout=60)
                    bound = standby.bus_settings.lease_ttl + standby.bus_settings.effective_renew_interval
                    table.add(
                        f"HA takeover after a crash (lease ttl {lease_ttl:g}s, bound {bound:g}s)",
                        1,
                        round(at - t0, 2),
                        "",
                        "",
                        "s",
                    )
                    tg.cancel_scope.cancel()
            finally:
                await nc.close()
        finally:
            server.stop()
            sim.stop()
    return table


def _row(table: Table, name: str, values: list[float], unit: str) -> None:
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
    table.add(name, len(values), round(statistics.median(values), 1), round(p95, 1), round(values[-1], 1), unit)


def run(quick: bool = False) -> Table:
    # Quiet the listeners' logs for the table, and leave the caller's logging as it was.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("error")
    try:
        return anyio.run(_bench, quick)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
