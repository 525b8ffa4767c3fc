"""Actions client: message decoding cost and round trips against the local simulator.

Rows: decoding a full 50-job message; an admin call (get scale set); generating a JIT config;
a poll that finds a waiting message plus its ack. Latencies are per call over loopback HTTP,
so they measure the client's own overhead plus the simulator's, not GitHub's.
"""

from __future__ import annotations

import json
import statistics
import time

import anyio

from shared.actions import ActionsClient, MessageSessionClient, PersonalAccessToken, decode_message
from tests.bench.table import Table
from tests.contract.conftest import FAST
from tests.fixtures.actions_sim import start_actions_sim


def _message_bytes(jobs: int) -> bytes:
    events = [
        {
            "messageType": "JobAssigned",
            "runnerRequestId": 0,
            "jobId": f"job-{i}",
            "repositoryName": "repo",
            "ownerName": "org",
            "jobWorkflowRef": "org/repo/.github/workflows/ci.yml@refs/heads/main",
            "jobDisplayName": "build",
            "workflowRunId": 9000000000 + i,
            "eventName": "push",
            "requestLabels": ["set"],
            "queueTime": "2026-01-01T00:00:00.1234567Z",
        }
        for i in range(jobs)
    ]
    stats = {"totalAssignedJobs": jobs}
    return json.dumps(
        {
            "messageId": 100000001,
            "messageType": "RunnerScaleSetJobMessages",
            "body": json.dumps(events),
            "statistics": stats,
        }
    ).encode()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


async def _round_trips(n: int) -> dict[str, list[float]]:
    sim = start_actions_sim()
    out: dict[str, list[float]] = {"get scale set": [], "generate JIT config": [], "poll + ack (message waiting)": []}
    try:
        await sim.control.configure(poll_wait=1.0)
        async with ActionsClient.from_config(
            sim.config_url(), PersonalAccessToken(sim.pat), settings=FAST, environ={}
        ) as client:
            scale_set = await client.create_scale_set("bench")
            for _ in range(n):
                t = time.perf_counter()
                await client.get_scale_set(scale_set.id)
                out["get scale set"].append(time.perf_counter() - t)
            for i in range(n):
                t = time.perf_counter()
                await client.generate_jit_config(scale_set.id, f"runner-{i:06d}")
                out["generate JIT config"].append(time.perf_counter() - t)
            async with await MessageSessionClient.create(client, scale_set.id, "bench") as session:
                last = 0
                for _ in range(n):
                    await sim.control.enqueue_jobs(count=1, labels=["bench"])
                    t = time.perf_counter()
                    message = await session.get_message(last, max_capacity=100000)
                    assert message is not None
                    await session.delete_message(message.message_id)
                    out["poll + ack (message waiting)"].append(time.perf_counter() - t)
                    last = message.message_id
    finally:
        sim.stop()
    return out


def run(quick: bool = False) -> Table:
    table = Table("Actions client", ["operation", "n", "p50 ms", "p99 ms", "per second"])
    data = _message_bytes(50)
    n = 200 if quick else 5000
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        decode_message(data)
        samples.append(time.perf_counter() - t)
    p50, p99 = _percentiles(samples)
    table.add("decode 50-job message", n, p50, p99, n / sum(samples))
    trips = 20 if quick else 200
    for name, values in anyio.run(_round_trips, trips).items():
        p50, p99 = _percentiles(values)
        table.add(name, len(values), p50, p99, len(values) / sum(values))
    return table
