"""Bus benchmark: publish→handler latency and messages/s through a local nats-server.

Starts its own nats-server (file storage, as in production) and measures:
- publish→handler latency (p50/p99), one message in flight at a time,
- end-to-end throughput with 32 concurrent publishers and one durable consumer,
- sequential publishes, each waiting for JetStream's ack,
- leader-lease takeover time after a crash (1 s TTL, 0.2 s renew).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import cast

import anyio
from anyio.abc import TaskStatus

from shared.bus import Bus, BusSettings, Delivery, DesiredState, LeaderLease, ResourceRef, subjects
from shared.bus.subjects import ConsumerSpec, DeliverFrom
from tests.bench.table import Table
from tests.fixtures.nats import NatsServer, _free_port
from tests.support.eventually import eventually


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _desired(i: int) -> DesiredState:
    # One ERS per message: a level stream keeps only `history` messages per subject, so reusing
    # subjects would let the stream drop messages before a slow consumer reads them.
    return DesiredState(
        scale_set_id=1, ers=ResourceRef("bench", f"ers-{i}"), patch_id=i, replicas=i % 50, listener_epoch=1
    )


async def _measure(url: str, n: int) -> dict[str, float]:
    settings = BusSettings(nats_urls=(url,), lease_ttl=1.0, renew_interval=0.2)
    results: dict[str, float] = {}
    async with Bus.connect(settings) as bus:
        sent_at: dict[int, float] = {}
        latencies: list[float] = []
        handled = 0
        done = anyio.Event()
        expected = 0

        async def handler(delivery: Delivery) -> None:
            nonlocal handled
            start = sent_at.pop(cast(DesiredState, delivery.message).patch_id, None)  # the desired stream
            if start is not None:
                latencies.append(time.perf_counter() - start)
            handled += 1
            if handled >= expected:
                done.set()

        # A fresh server: delivering ALL is just "everything from now on", without a subscribe race.
        consumer = ConsumerSpec(subjects.DESIRED_STREAM.name, "bench", ("runnerscale.desired.>",), DeliverFrom.ALL)
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.consume, consumer, handler)

            # 1. Latency, one message in flight at a time: publish, wait for the handler.
            for i in range(n):
                expected, done = handled + 1, anyio.Event()
                sent_at[i] = time.perf_counter()
                await bus.publish(_desired(i))
                with anyio.fail_after(30):
                    await done.wait()
            results["publish→handler p50 (ms)"] = statistics.median(latencies) * 1000
            results["publish→handler p99 (ms)"] = _percentile(latencies, 0.99) * 1000

            # 2. Concurrent publishers, one consumer: end-to-end messages/s.
            handled, done, expected = 0, anyio.Event(), n * 2
            t0 = time.perf_counter()

            async def publisher(offset: int) -> None:
                for i in range(offset, n * 2, 32):
                    await bus.publish(_desired(n + i))

            async with anyio.create_task_group() as pubs:
                for k in range(32):
                    pubs.start_soon(publisher, k)
            with anyio.fail_after(60):
                await done.wait()
            results["end-to-end, 32 publishers (msgs/s)"] = expected / (time.perf_counter() - t0)
            tg.cancel_scope.cancel()

        # 3. Publishing alone, each publish waiting for its ack.
        t0 = time.perf_counter()
        for i in range(n):
            await bus.publish(_desired(i))
        results["sequential publish, acked (msgs/s)"] = n / (time.perf_counter() - t0)

        # 4. Leader takeover after a crash: a leader on its own connection, then a standby.
        name = subjects.listener_lease_name("bench", "set")
        crashed = anyio.CancelScope()

        async def leader(*, task_status: TaskStatus[LeaderLease] = anyio.TASK_STATUS_IGNORED) -> None:
            with crashed:
                async with Bus.connect(settings) as other, LeaderLease.join(other, name, replica_id="leader") as lease:
                    await lease.wait_leader()
                    task_status.started(lease)
                    await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            lease = await tg.start(leader)
            async with LeaderLease.join(bus, name, replica_id="standby") as standby:
                t0 = time.perf_counter()
                lease.abandon()
                crashed.cancel()
                await eventually(lambda: standby.is_leader, timeout=30, interval=0.01, what="the standby leading")
                results["leader takeover after crash, ttl 1 s (s)"] = time.perf_counter() - t0
    return results


def run(quick: bool = False) -> Table:
    n = 200 if quick else 2000
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(port=_free_port(), store_dir=Path(tmp) / "js")
        server.start()
        try:
            results = anyio.run(_measure, server.url, n)
        finally:
            server.stop()
    table = Table(f"bus: NATS JetStream, file storage, {n} messages", ["measure", "value"])
    for name, value in results.items():
        table.add(name, round(value, 3 if value < 10 else 0))
    return table


if __name__ == "__main__":
    print(run(quick=False).render())
