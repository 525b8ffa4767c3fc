"""Actions simulator: long-poll wake-up latency, message throughput, full job cycles with runners.

``python -m tests.bench actions_sim [--quick]``. Raw HTTP with aiohttp (the simulator's own
cost, not the client's); the simulator runs in its own thread and loop, as in the tests.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import aiohttp
import anyio
import msgspec

from services.embedded.actions_sim.runner_agent import run_runner
from services.embedded.actions_sim.views import SimSettings
from tests.bench.table import Table
from tests.fixtures.actions_sim import ActionsSim, start_actions_sim
from tests.support.eventually import eventually


class _Api:
    def __init__(self, sim: ActionsSim, http: aiohttp.ClientSession) -> None:
        self.sim, self.http = sim, http
        self.base = self.token = ""

    async def call(self, method: str, url: str, token: str, body: object = None, **kw: object) -> tuple[int, bytes]:
        data = None if body is None else msgspec.json.encode(body)
        extra: dict[str, str] = kw.pop("headers", {})  # type: ignore[assignment]
        headers = {"Authorization": token, "Content-Type": "application/json", **extra}
        async with self.http.request(method, url, data=data, headers=headers, **kw) as resp:  # type: ignore[arg-type]
            return resp.status, await resp.read()

    async def login(self) -> None:
        _, raw = await self.call(
            "POST",
            f"{self.sim.url}/api/v3/orgs/{self.sim.org}/actions/runners/registration-token",
            f"Bearer {self.sim.pat}",
        )
        reg = msgspec.json.decode(raw)["token"]
        _, raw = await self.call(
            "POST",
            f"{self.sim.url}/api/v3/actions/runner-registration",
            f"RemoteAuth {reg}",
            {"url": self.sim.config_url(), "runner_event": "register"},
        )
        body = msgspec.json.decode(raw)
        self.base, self.token = body["url"], f"Bearer {body['token']}"

    async def scale_set_and_session(self, name: str) -> tuple[int, dict[str, Any]]:
        _, raw = await self.call(
            "POST", self.base + "_apis/runtime/runnerscalesets", self.token, {"name": name, "runnerGroupId": 1}
        )
        ss = msgspec.json.decode(raw)["id"]
        _, raw = await self.call(
            "POST", self.base + f"_apis/runtime/runnerscalesets/{ss}/sessions", self.token, {"ownerName": "bench"}
        )
        return ss, msgspec.json.decode(raw)

    async def poll(self, session: dict[str, Any], last: int) -> dict[str, Any] | None:
        params = {"lastMessageId": str(last)} if last else {}
        status, raw = await self.call(
            "GET",
            session["messageQueueUrl"],
            f"Bearer {session['messageQueueAccessToken']}",
            headers={"X-ScaleSetMaxCapacity": "100000"},
            params=params,
        )
        return msgspec.json.decode(raw) if status == 200 else None

    async def ack(self, session: dict[str, Any], message_id: int) -> None:
        url, _, query = session["messageQueueUrl"].partition("?")
        await self.call("DELETE", f"{url}/{message_id}?{query}", f"Bearer {session['messageQueueAccessToken']}")


async def _wake_latency(api: _Api, rounds: int) -> list[float]:
    """Time from enqueueing a job to the held poll answering with it."""
    _, session = await api.scale_set_and_session("latency")
    latencies: list[float] = []
    last = 0

    async def poll(after: int, got: list[dict[str, Any]]) -> None:
        message = await api.poll(session, after)
        if message:
            got.append(message)

    async def poll_in_flight() -> bool:
        return bool((await api.sim.control.sessions())[0].polls_in_flight)

    for _ in range(rounds):
        got: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(poll, last, got)
            await eventually(poll_in_flight, timeout=10, interval=0.001, what="the poll held by the service")
            started = time.perf_counter()
            await api.sim.control.enqueue_jobs(labels=["latency"])
        latencies.append(time.perf_counter() - started)
        last = got[0]["messageId"]
        await api.ack(session, last)
    return latencies


async def _throughput(api: _Api, jobs: int) -> tuple[float, int]:
    """Events per second drained by one listener-like poll/ack loop."""
    _, session = await api.scale_set_and_session("throughput")
    await api.sim.control.enqueue_jobs(count=jobs, labels=["throughput"])
    started = time.perf_counter()
    events = messages = last = 0
    while events < jobs:
        message = await api.poll(session, last)
        if message is None:
            continue
        events += len(msgspec.json.decode(message["body"]))
        messages += 1
        last = message["messageId"]
        await api.ack(session, last)
    return events / (time.perf_counter() - started), messages


async def _job_cycles(api: _Api, runners: int) -> float:
    """Jobs per second through assigned → started → completed with concurrent fake runners."""
    ss, _ = await api.scale_set_and_session("cycle")
    await api.sim.control.enqueue_jobs(count=runners, labels=["cycle"])
    configs = []
    for i in range(runners):
        _, raw = await api.call(
            "POST",
            api.base + f"_apis/runtime/runnerscalesets/{ss}/generatejitconfig",
            api.token,
            {"name": f"bench-{i}", "workFolder": ""},
        )
        configs.append(msgspec.json.decode(raw)["encodedJITConfig"])
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for config in configs:
            tg.start_soon(functools.partial(run_runner, api.sim.url, config, job_wait=5))
    return runners / (time.perf_counter() - started)


async def _measure(quick: bool) -> Table:
    sim = start_actions_sim(SimSettings(poll_wait=5.0))
    try:
        async with aiohttp.ClientSession() as http:
            api = _Api(sim, http)
            await api.login()
            rounds, jobs, runners = (10, 200, 10) if quick else (100, 5000, 100)
            latencies = sorted(await _wake_latency(api, rounds))
            rate, messages = await _throughput(api, jobs)
            cycles = await _job_cycles(api, runners)
    finally:
        sim.stop()
    table = Table("actions simulator", ["measure", "size", "result"])
    table.add("long-poll wake-up, median (ms)", rounds, statistics.median(latencies) * 1000)
    table.add("long-poll wake-up, max (ms)", rounds, latencies[-1] * 1000)
    table.add("job events drained per second (poll+ack, 50/msg)", f"{jobs} jobs / {messages} msgs", rate)
    table.add("job cycles per second (concurrent fake runners)", runners, cycles)
    return table


def run(quick: bool = False) -> Table:
    return anyio.run(_measure, quick)
