"""API emulator throughput: sustained writes/s and list latency at N objects (10,000; quick: 500).

The emulator runs in-process on its own thread (as the ``kube_api`` fixture runs it); the client
is aiohttp with 32 concurrent requests over keep-alive connections.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from services.embedded.apiserver import BackgroundEmulator
from tests.bench.table import Table

CONCURRENCY = 32
CRDS = Path(__file__).resolve().parents[1] / "conformance" / "data" / "crds.yaml"


async def _writes(session: aiohttp.ClientSession, urls_and_bodies: list[tuple[str, str, dict[str, Any], str]]) -> float:
    queue: asyncio.Queue[tuple[str, str, dict[str, Any], str]] = asyncio.Queue()
    for item in urls_and_bodies:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            method, url, body, ctype = queue.get_nowait()
            async with session.request(method, url, json=body, headers={"Content-Type": ctype}) as resp:
                await resp.read()
                if resp.status >= 300:
                    raise RuntimeError(f"{method} {url}: {resp.status}")

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return len(urls_and_bodies) / (time.perf_counter() - start)


async def _latency(
    session: aiohttp.ClientSession, url: str, params: dict[str, str], repeats: int
) -> tuple[float, float, int]:
    samples, count = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        async with session.get(url, params=params) as resp:
            body = await resp.json()
        samples.append((time.perf_counter() - start) * 1000)
        count = len(body["items"])
    return statistics.median(samples), max(samples), count


async def _run(base: str, n: int) -> Table:
    table = Table(f"apiserver emulator, {n:,} objects (concurrency {CONCURRENCY})", ["measure", "value", "unit"])
    ns_url = f"{base}/api/v1/namespaces"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as s:
        async with s.post(ns_url, json={"metadata": {"name": "bench"}}) as resp:
            assert resp.status == 201
        cm_url = f"{base}/api/v1/namespaces/bench/configmaps"
        w_url = f"{base}/apis/conformance.runnerscale.dev/v1/namespaces/bench/widgets"
        creates = [
            (
                "POST",
                cm_url,
                {"metadata": {"name": f"cm-{i:05d}", "labels": {"shard": str(i % 10)}}, "data": {"k": "v"}},
                "application/json",
            )
            for i in range(n)
        ]
        table.add("create ConfigMap", round(await _writes(s, creates)), "writes/s")
        cr_creates = [
            (
                "POST",
                w_url,
                {
                    "apiVersion": "conformance.runnerscale.dev/v1",
                    "kind": "Widget",
                    "metadata": {"name": f"w-{i:05d}"},
                    "spec": {"replicas": 1, "ports": [{"containerPort": 80}]},
                },
                "application/json",
            )
            for i in range(n)
        ]
        table.add("create custom resource (prune+default)", round(await _writes(s, cr_creates)), "writes/s")
        patches = [
            ("PATCH", f"{w_url}/w-{i:05d}", {"spec": {"replicas": 2}}, "application/merge-patch+json") for i in range(n)
        ]
        table.add("merge-patch custom resource", round(await _writes(s, patches)), "writes/s")
        status = [
            ("PATCH", f"{w_url}/w-{i:05d}/status", {"status": {"phase": "Ready"}}, "application/merge-patch+json")
            for i in range(n)
        ]
        table.add("merge-patch /status", round(await _writes(s, status)), "writes/s")
        repeats = 5 if n <= 1000 else 3
        med, worst, count = await _latency(s, cm_url, {}, repeats)
        table.add(f"list all {count:,} ConfigMaps, median", round(med, 1), "ms")
        table.add(f"list all {count:,} ConfigMaps, max", round(worst, 1), "ms")
        med, _, count = await _latency(s, w_url, {}, repeats)
        table.add(f"list all {count:,} custom resources, median", round(med, 1), "ms")
        med, _, count = await _latency(s, cm_url, {"labelSelector": "shard=3"}, repeats)
        table.add(f"list with label selector ({count:,} match), median", round(med, 1), "ms")
        med, _, count = await _latency(s, cm_url, {"limit": "500"}, repeats)
        table.add("list first page (limit=500), median", round(med, 1), "ms")
        med, _, _ = await _latency(s, w_url, {"fieldSelector": "metadata.name=w-00007"}, repeats)
        table.add("list by field selector metadata.name, median", round(med, 1), "ms")
    return table


def run(quick: bool = False) -> Table:
    n = 500 if quick else 10_000
    bg = BackgroundEmulator()
    emu = bg.start()
    try:
        bg.call(lambda: emu.load_crds(CRDS))
        return asyncio.run(_run(emu.url, n))
    finally:
        bg.stop()


if __name__ == "__main__":
    print(run(quick=True).render())
