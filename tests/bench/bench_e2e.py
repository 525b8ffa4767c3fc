"""End to end on the embedded stack (issue 10's figures): API writes at rest and per runner life.

The stack is the demo's (``runnerscale demo``): nats-server, the API emulator, the Actions simulator
(poll wait 2 s), node-sim and the four workers, every one a separate process, with the default
worker settings. The emulator counts every request by verb and resource (``/_emulator/requests``).

- **Writes at rest**: ``minRunners`` idle runners (20; quick: 3), everything settled, then a window
  (60 s; quick: 10 s) with no jobs. Every write is counted, by verb and resource.
- **Writes per runner life**: ``jobs`` one-second jobs (10; quick: 3) run on the idle runners and
  each used runner is replaced; the controller writes in that time divided by the jobs. Leases,
  Events and the node simulator's own writes (pod ``status`` and ``binding``, the kubelet's and
  the scheduler's part) are not counted, as in the issue's figure.

The machine's load average is printed with the results: the machine is shared.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from services.embedded.apiserver.control import EmulatorControl
from services.embedded.demo.__main__ import DemoOptions, run_demo
from services.embedded.demo.cluster import DemoKube
from tests.bench.table import Table

WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
# Not the controllers' writes: liveness (counted separately), Events, and the kubelet's and the
# scheduler's part of a pod's life (node-sim plays both).
NOT_CONTROLLER = {("leases", ""), ("events", ""), ("pods", "status"), ("pods", "binding")}
# At rest, node-sim's kubelet heartbeat: its node Lease (``update``) and node status. runnerscale's
# own Leases are written with create, patch and delete.
KUBELET_AT_REST = {("update", "leases", ""), ("update", "nodes", "status"), ("patch", "nodes", "status")}
GOAL_AT_REST = "liveness only"
GOAL_PER_RUNNER = "<= 8"


def _writes(rows: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
    out: Counter[tuple[str, str, str]] = Counter()
    for r in rows:
        if r["verb"] in WRITE_VERBS:
            out[(r["verb"], r["resource"], r["subresource"] or "")] += int(r["count"])
    return out


async def _sim(http: aiohttp.ClientSession, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    with anyio.fail_after(15):
        async with http.request(method, url, json=body) as r:
            r.raise_for_status()
            return await r.json(content_type=None)


class Results:
    def __init__(self) -> None:
        self.at_rest: Counter[tuple[str, str, str]] = Counter()
        self.per_life: Counter[tuple[str, str, str]] = Counter()
        self.window = 0.0
        self.jobs = 0
        self.runners = 0
        self.error = ""


def _phases(items: list[dict[str, Any]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for r in items:
        deleting = bool((r.get("metadata") or {}).get("deletionTimestamp"))
        out["Deleting" if deleting else (r.get("status") or {}).get("phase") or "New"] += 1
    return out


def _workload(res: Results, window: float, jobs: int, timeout: float) -> Any:
    async def workload(
        opts: DemoOptions, kube: DemoKube, http: aiohttp.ClientSession, sim_url: str, say: Any, latest: dict[str, str]
    ) -> int:
        ctl = EmulatorControl(kube.client.host)
        runners_path = f"/apis/actions.github.com/v1alpha1/namespaces/{opts.namespace}/ephemeralrunners"
        deadline = time.monotonic() + timeout

        async def until(what: str, cond: Any) -> bool:
            while time.monotonic() < deadline:
                if await cond():
                    return True
                await anyio.sleep(0.5)  # polling a condition under a deadline
            res.error = f"timed out waiting for {what}"
            say(res.error)
            return False

        async def settled() -> bool:
            phases = _phases(await kube.list_items(runners_path))
            return phases.get("Running", 0) == opts.min_runners and sum(phases.values()) == opts.min_runners

        async def completed() -> bool:
            listed = await _sim(http, "GET", f"{sim_url}/_sim/jobs")
            items = listed if isinstance(listed, list) else listed.get("jobs", [])
            return sum(1 for j in items if j.get("state") == "completed") >= jobs

        if not await until(f"{opts.min_runners} idle runners Running", settled):
            return 1
        await anyio.sleep(5.0)  # let start-up writes (status, finalizers) finish before the window
        res.runners = opts.min_runners
        await anyio.to_thread.run_sync(ctl.reset_request_counts)
        started = time.monotonic()
        await anyio.sleep(window)  # the measurement window itself
        res.at_rest = _writes(await anyio.to_thread.run_sync(ctl.request_counts))
        res.window = time.monotonic() - started
        say(f"at rest: {sum(res.at_rest.values())} writes in {res.window:.0f}s")

        await anyio.to_thread.run_sync(ctl.reset_request_counts)
        await _sim(http, "POST", f"{sim_url}/_sim/jobs", {"count": jobs, "labels": ["demo-runners"], "duration": 1})
        if not await until(f"{jobs} jobs completed", completed):
            return 1
        if not await until("used runners replaced", settled):
            return 1
        res.per_life = _writes(await anyio.to_thread.run_sync(ctl.request_counts))
        res.jobs = jobs
        return 0

    return workload


def _breakdown(table: Table, writes: Counter[tuple[str, str, str]], scale: float, unit: str) -> None:
    for (verb, resource, sub), n in sorted(writes.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add(f"    {verb} {resource}{'/' + sub if sub else ''}", f"{n * scale:.1f}{unit}", "")


def run(quick: bool = False) -> Table:
    runners, window, jobs = (3, 10.0, 3) if quick else (20, 60.0, 10)
    load_before = os.getloadavg()
    res = Results()
    workdir = Path(tempfile.mkdtemp(prefix="runnerscale-bench-e2e-"))
    opts = DemoOptions(
        min_runners=runners, max_runners=runners * 2, job_seconds=1.0, timeout=600.0, workdir=str(workdir)
    )
    out = io.StringIO()
    with (workdir / "children.log").open("w") as log:
        code = anyio.run(run_demo, opts, workdir, log, out, _workload(res, window, jobs, timeout=300.0))
    load_after = os.getloadavg()
    table = Table(
        f"End to end, embedded stack ({runners} idle runners, default worker settings)",
        ["figure", "measured", "goal"],
    )
    if code != 0 or res.error:
        table.add("run failed", res.error or f"exit {code}; logs in {workdir}", "")
        print(out.getvalue(), file=sys.stderr)
        return table
    per_min = 60.0 / res.window
    rest_total = sum(res.at_rest.values())
    kubelet = sum(n for k, n in res.at_rest.items() if k in KUBELET_AT_REST)
    liveness = sum(n for k, n in res.at_rest.items() if k[1] == "leases" and k not in KUBELET_AT_REST)
    table.add(
        f"API writes at rest ({res.window:.0f} s window), per minute", f"{rest_total * per_min:.0f}", GOAL_AT_REST
    )
    table.add(
        "  runnerscale liveness (its Lease writes), per minute",
        f"{liveness * per_min:.0f}",
        "<= 30 (1 replica per worker)",
    )
    table.add("  node-sim's kubelet heartbeat, per minute", f"{kubelet * per_min:.0f}", "(not runnerscale)")
    table.add("  anything else, per minute", f"{(rest_total - liveness - kubelet) * per_min:.0f}", "0")
    _breakdown(table, res.at_rest, per_min, "/min")
    controller = Counter({k: n for k, n in res.per_life.items() if (k[1], k[2]) not in NOT_CONTROLLER})
    table.add(
        f"controller API writes per runner life ({res.jobs} jobs)",
        f"{sum(controller.values()) / res.jobs:.1f}",
        GOAL_PER_RUNNER,
    )
    _breakdown(table, controller, 1.0 / res.jobs, "")
    table.add(
        "machine load (1/5/15 min) before → after",
        f"{'/'.join(f'{x:.1f}' for x in load_before)} → {'/'.join(f'{x:.1f}' for x in load_after)}"
        f" on {os.cpu_count()} cores",
        "",
    )
    return table


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv).render())
