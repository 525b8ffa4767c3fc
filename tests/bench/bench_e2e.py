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

- **Latency, cold** (README "End-to-end benchmark"): ``minRunners`` set to 0, the set empties, then
  ``cold_jobs`` one-second jobs (30; quick: 6) are queued one every second. Per job, from the
  simulator's job record (queued, handed to a runner, finished) and the benchmark's own watch of
  EphemeralRunners and Pods (when each was added, its pod first Running, when it was deleted):
  job queued → the pod of the runner that takes it Running, and job finished → its
  EphemeralRunner gone; with the stages in between and the listener's desired-state publishes
  (seen on the bus by the demo) to split the service's long poll from runnerscale's part.
- **Sustained throughput**: ``maxRunners`` = ``slots`` (50; quick: 10), a queue of one-second jobs
  kept at twice that; after a warm-up of ``slots`` completions, jobs completed in a window (30 s;
  quick: 15 s) give jobs/s and the per-runner overhead ``slots·window/completed − 1 s``; job end →
  replacement runner's pod Running is measured directly as well (``e2e_figures.replacement_gaps``).
- **RSS per worker process**: ``VmRSS`` from ``/proc/<pid>/status`` of the four workers the demo
  started, at the idle runners of the first phase, at ``slots`` runners, and at ``large`` idle
  runners (1,000; quick: 100), extrapolated linearly to 10,000.

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
import msgspec

from services.embedded.apiserver.control import EmulatorControl
from services.embedded.demo.__main__ import SCALE_SET, DemoOptions, Workload, run_demo
from services.embedded.demo.cluster import DemoKube
from shared.kube import KubeError
from tests.bench import e2e_figures as fig
from tests.bench.agents import by_component, split
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
GOAL_START = "<= 0.5 s p50"
GOAL_TEARDOWN = "<= 0.5 s / <= 1 s"
GOAL_RSS = "<= 300 MB at 10,000 runners"
GOAL_OVERHEAD = "<= 1 s"
WORKERS = ("scale-set", "listener-pod", "runner-set", "runner")
RSS_TARGET = 10_000


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
        # The same windows by component (User-Agent): writes at rest, writes and requests per life.
        self.at_rest_by: Counter[str] = Counter()
        self.writes_by: Counter[str] = Counter()
        self.requests_by: Counter[str] = Counter()
        self.window = 0.0
        self.jobs = 0
        self.runners = 0
        self.error = ""
        # Latency, throughput and RSS phases (filled only when the workload runs them).
        self.timeline = Timeline()
        self.desired_at: list[float] = []  # when the demo saw a new desired state on the bus
        self.cold_jobs: list[fig.Job] = []
        self.slots = 0
        self.tput_window = 0.0
        self.tput_completed = 0
        self.tput_gaps: list[float] = []
        self.tput_jobs: list[fig.Job] = []  # finished in the window
        self.tput_chain: list[fig.Replacement] = []  # replaced runners gone in the window
        self.rss: dict[int, dict[str, float]] = {}  # runners → worker → MB
        self.large_reached = 0  # pods Running in the large-N phase
        self.large_seconds = 0.0


class Phases(msgspec.Struct, frozen=True):
    """Sizes of the latency, throughput and RSS phases (README "End-to-end benchmark")."""

    cold_jobs: int = 30
    cold_gap: float = 1.0
    slots: int = 50
    tput_window: float = 30.0
    large: int = 1000
    large_timeout: float = 600.0


class Timeline:
    """When each EphemeralRunner and Pod of the runner namespace was added, first Running (pods)
    and deleted, from the benchmark's own watches (this host's clock, as the simulator's)."""

    def __init__(self) -> None:
        self.er_added: dict[str, float] = {}
        self.er_gone: dict[str, float] = {}
        self.pod_added: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.pod_gone: dict[str, float] = {}
        self.er_succeeded: dict[str, float] = {}  # the runner worker set status Succeeded (job done)
        self.er_deleting: dict[str, float] = {}  # deletionTimestamp first seen (the delete call)
        self.er_marked: dict[str, float] = {}  # job-completed mark first seen (the listener's JobCompleted)
        self._uids: dict[tuple[str, str], str] = {}  # (plural, name) → uid of the object the times are of

    def observe(self, plural: str, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        name, uid = meta.get("name") or "", meta.get("uid") or ""
        if not name:
            return
        added, gone = (self.er_added, self.er_gone) if plural == "ephemeralrunners" else (self.pod_added, self.pod_gone)
        known = self._uids.setdefault((plural, name), uid)
        if uid and known != uid:
            if kind == "DELETED":
                return  # the end of an older object of this name, seen late
            # A generated name used again (5 random characters): a new object, new times.
            self._uids[(plural, name)] = uid
            for times in (added, gone, self.pod_running if plural == "pods" else self.er_succeeded):
                times.pop(name, None)
            self.er_deleting.pop(name, None)
            self.er_marked.pop(name, None)
        if kind == "DELETED":
            gone.setdefault(name, now)
            return
        added.setdefault(name, now)
        phase = (obj.get("status") or {}).get("phase")
        if plural == "pods" and phase == "Running":
            self.pod_running.setdefault(name, now)
        if plural == "ephemeralrunners" and phase == "Succeeded":
            self.er_succeeded.setdefault(name, now)
        if plural == "ephemeralrunners" and meta.get("deletionTimestamp"):
            self.er_deleting.setdefault(name, now)
        if plural == "ephemeralrunners" and (meta.get("annotations") or {}).get("actions.github.com/job-completed"):
            self.er_marked.setdefault(name, now)

    def relisted(self, plural: str, names: set[str], now: float) -> None:
        """A relist: whatever was present and is no longer listed went away meanwhile."""
        added, gone = (self.er_added, self.er_gone) if plural == "ephemeralrunners" else (self.pod_added, self.pod_gone)
        for name in added.keys() - gone.keys() - names:
            gone[name] = now

    def ers_present(self) -> int:
        return len(self.er_added.keys() - self.er_gone.keys())

    def pods_running(self) -> int:
        return len(self.pod_running.keys() - self.pod_gone.keys())


async def _watch(kube: DemoKube, path: str, plural: str, timeline: Timeline) -> None:
    """List, then watch from the list's resourceVersion, re-watching from the last one seen when a
    watch ends; relist after an error (what vanished meanwhile is marked gone at the relist)."""
    while True:
        try:
            listed = msgspec.json.decode(await kube.client.request("GET", path, what=f"list {plural}"))
            now = time.time()
            items = listed.get("items") or []
            timeline.relisted(plural, {(i.get("metadata") or {}).get("name") or "" for i in items}, now)
            for item in items:
                timeline.observe(plural, "ADDED", item, now)
            rv = (listed.get("metadata") or {}).get("resourceVersion", "")
            while rv:
                query = (
                    ("watch", "true"),
                    ("resourceVersion", rv),
                    ("allowWatchBookmarks", "true"),
                    ("timeoutSeconds", "50"),
                )
                async with kube.client.stream(path, what=f"watch {plural}", query=query, read_timeout=70) as lines:
                    async for line in lines:
                        event = msgspec.json.decode(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            rv = ""  # expired: relist
                            break
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            timeline.observe(plural, event["type"], obj, time.time())
        except KubeError:
            await anyio.sleep(0.2)  # back off before relisting after a broken watch


def worker_pids(marker: str) -> dict[str, int]:
    """The demo's worker processes: ``runnerscale <worker> ...`` whose command line mentions
    ``marker`` (the run's working directory, in every child's ``--kubeconfig``)."""
    out: dict[str, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(marker in a for a in argv):
            continue
        for i, arg in enumerate(argv[:-1]):
            if Path(arg).name == "runnerscale" and argv[i + 1] in WORKERS:
                out[argv[i + 1]] = int(proc.name)
    return out


def rss_of(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for worker, pid in pids.items():
        try:
            mb = fig.vm_rss_mb(Path(f"/proc/{pid}/status").read_text())
        except OSError:
            continue
        if mb is not None:
            out[worker] = mb
    return out


def _phases(items: list[dict[str, Any]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for r in items:
        deleting = bool((r.get("metadata") or {}).get("deletionTimestamp"))
        out["Deleting" if deleting else (r.get("status") or {}).get("phase") or "New"] += 1
    return out


def _workload(res: Results, window: float, jobs: int, timeout: float, phases: Phases | None = None) -> Any:
    async def workload(
        opts: DemoOptions, kube: DemoKube, http: aiohttp.ClientSession, sim_url: str, say: Any, latest: dict[str, str]
    ) -> int:
        if phases is None:
            return await writes(opts, kube, http, sim_url, say)
        async with anyio.create_task_group() as tg:
            base = f"/namespaces/{opts.namespace}"
            tg.start_soon(
                _watch,
                kube,
                f"/apis/actions.github.com/v1alpha1{base}/ephemeralrunners",
                "ephemeralrunners",
                res.timeline,
            )
            tg.start_soon(_watch, kube, f"/api/v1{base}/pods", "pods", res.timeline)
            tg.start_soon(_sample_desired, latest, res.desired_at)
            code = await writes(opts, kube, http, sim_url, say)
            if code == 0:
                code = await _latency_phases(res, phases, opts, kube, http, sim_url, say, timeout)
            tg.cancel_scope.cancel()
        return code

    async def writes(opts: DemoOptions, kube: DemoKube, http: aiohttp.ClientSession, sim_url: str, say: Any) -> int:
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
        rows = await anyio.to_thread.run_sync(ctl.request_counts)
        res.at_rest, res.at_rest_by = _writes(rows), by_component(rows, WRITE_VERBS)
        res.window = time.monotonic() - started
        res.rss[opts.min_runners] = rss_of(worker_pids(opts.workdir))
        say(f"at rest: {sum(res.at_rest.values())} writes in {res.window:.0f}s")

        await anyio.to_thread.run_sync(ctl.reset_request_counts)
        await _sim(http, "POST", f"{sim_url}/_sim/jobs", {"count": jobs, "labels": ["demo-runners"], "duration": 1})
        if not await until(f"{jobs} jobs completed", completed):
            return 1
        if not await until("used runners replaced", settled):
            return 1
        rows = await anyio.to_thread.run_sync(ctl.request_counts)
        res.per_life, res.writes_by, res.requests_by = (
            _writes(rows),
            by_component(rows, WRITE_VERBS),
            by_component(rows),
        )
        res.jobs = jobs
        return 0

    return workload


async def _sample_desired(latest: dict[str, str], out: list[float]) -> None:
    """When the demo's bus subscription saw a new desired state (sampled every 10 ms)."""
    last = latest.get("desired")
    while True:
        now = latest.get("desired")
        if now != last:
            out.append(time.time())
            last = now
        await anyio.sleep(0.01)  # the sampling period of a measurement, not synchronisation


async def _scale(kube: DemoKube, opts: DemoOptions, min_runners: int, max_runners: int) -> None:
    path = f"/apis/actions.github.com/v1alpha1/namespaces/{opts.namespace}/autoscalingrunnersets/{SCALE_SET}"
    body = {"spec": {"minRunners": min_runners, "maxRunners": max_runners}}
    await kube.client.request(
        "PATCH", path, what=f"PATCH {SCALE_SET}", body=body, content_type="application/merge-patch+json"
    )


async def _sim_jobs(http: aiohttp.ClientSession, sim_url: str) -> list[dict[str, Any]]:
    listed = await _sim(http, "GET", f"{sim_url}/_sim/jobs")
    return listed if isinstance(listed, list) else listed.get("jobs", [])


async def _latency_phases(
    res: Results,
    ph: Phases,
    opts: DemoOptions,
    kube: DemoKube,
    http: aiohttp.ClientSession,
    sim_url: str,
    say: Any,
    timeout: float,
) -> int:
    tl = res.timeline

    async def until(what: str, cond: Any, limit: float = timeout) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if await cond():
                return True
            await anyio.sleep(0.2)  # polling a condition under a deadline
        res.error = f"timed out waiting for {what}"
        say(res.error)
        return False

    async def empty() -> bool:
        return tl.ers_present() == 0

    async def all_done() -> bool:
        return all(j.get("state") == "completed" for j in await _sim_jobs(http, sim_url))

    # Cold starts: no idle runner, so every job waits for a runner created for it.
    await _scale(kube, opts, 0, ph.slots)
    if not await until("the set to empty", empty):
        return 1
    began = time.time()
    for _ in range(ph.cold_jobs):
        await _sim(http, "POST", f"{sim_url}/_sim/jobs", {"count": 1, "labels": [SCALE_SET], "duration": 1})
        await anyio.sleep(ph.cold_gap)  # the workload's arrival rate: one job every cold_gap seconds
    if not await until("cold jobs completed", all_done) or not await until("the set to empty again", empty):
        return 1
    res.cold_jobs = [j for j in fig.jobs_from_sim(await _sim_jobs(http, sim_url)) if j.queued >= began]
    say(f"cold: {len(res.cold_jobs)} jobs")

    # Sustained: a queue of one-second jobs kept at twice the runners.
    began = time.time()
    done_before = len(await _sim_jobs(http, sim_url))
    stop = anyio.Event()

    async def top_up() -> None:
        while not stop.is_set():
            open_jobs = sum(1 for j in await _sim_jobs(http, sim_url) if j.get("state") != "completed")
            if open_jobs < 2 * ph.slots:
                body = {"count": 2 * ph.slots - open_jobs, "labels": [SCALE_SET], "duration": 1}
                await _sim(http, "POST", f"{sim_url}/_sim/jobs", body)
            await anyio.sleep(0.5)  # the workload's refill period

    async with anyio.create_task_group() as tg:
        tg.start_soon(top_up)

        async def warm() -> bool:
            jobs = (await _sim_jobs(http, sim_url))[done_before:]
            return sum(1 for j in jobs if j.get("state") == "completed") >= ph.slots

        ok = await until("throughput warm-up", warm)
        if ok:
            start = time.time()
            await anyio.sleep(ph.tput_window)  # the measurement window itself
            end = time.time()
            res.rss[ph.slots] = rss_of(worker_pids(opts.workdir))
        stop.set()
        tg.cancel_scope.cancel()
    await _scale(kube, opts, 0, ph.slots)
    if not ok:
        return 1
    jobs = [j for j in fig.jobs_from_sim(await _sim_jobs(http, sim_url)) if j.queued >= began]
    res.tput_jobs = [j for j in jobs if j.finished is not None and start <= j.finished < end]
    res.slots, res.tput_window, res.tput_completed = ph.slots, end - start, len(res.tput_jobs)
    new_runners = [
        (t, tl.pod_running[name]) for name, t in tl.er_added.items() if t >= began and name in tl.pod_running
    ]
    all_finishes = [j.finished for j in jobs if j.finished is not None]
    res.tput_gaps = [g for f, g in fig.replacement_gaps(all_finishes, new_runners) if start <= f < end]
    handed = {j.runner_name: j.assigned for j in jobs if j.runner_name and j.assigned is not None}
    chain = fig.replacement_chain(
        [t for t in tl.er_gone.values() if t >= began],
        {name: t for name, t in tl.er_added.items() if t >= began},
        tl.pod_added,
        tl.pod_running,
        handed,
    )
    res.tput_chain = [r for r in chain if start <= r.gone < end]
    say(f"sustained: {res.tput_completed} jobs in {res.tput_window:.0f}s")
    if not await until("backlog drained", all_done) or not await until("the set to empty again", empty):
        return 1

    # Memory at a larger fleet: `large` idle runners.
    await _scale(kube, opts, ph.large, ph.large)
    began = time.time()

    async def large() -> bool:
        res.large_reached = tl.pods_running()
        return res.large_reached >= ph.large

    with anyio.move_on_after(ph.large_timeout):  # a shortfall is reported with the RSS, not failed
        while True:
            if await large():
                break
            await anyio.sleep(0.5)  # polling a condition under a deadline
    res.large_seconds = time.time() - began
    await anyio.sleep(5.0)  # let the last status writes and caches settle before sampling
    res.rss[res.large_reached] = rss_of(worker_pids(opts.workdir))
    say(f"large: {res.large_reached} runners Running after {res.large_seconds:.0f}s")
    return 0


def _breakdown(table: Table, writes: Counter[tuple[str, str, str]], scale: float, unit: str) -> None:
    for (verb, resource, sub), n in sorted(writes.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add(f"    {verb} {resource}{'/' + sub if sub else ''}", f"{n * scale:.1f}{unit}", "")


def run_stack(opts: DemoOptions, workload: Workload) -> tuple[int, str]:
    """Start the demo's stack with ``opts`` (``opts.workdir`` must be set: state and the children's
    log go there), run ``workload`` on it, stop it; returns (exit code, the demo's own output)."""
    workdir = Path(opts.workdir)
    out = io.StringIO()
    with (workdir / "children.log").open("w") as log:
        code = anyio.run(run_demo, opts, workdir, log, out, workload)
    return code, out.getvalue()


def _raw(res: Results) -> dict[str, Any]:
    """Every timestamp behind the latency and overhead rows (``timings.json`` in the run's directory)."""
    tl = res.timeline
    return {
        "er_added": tl.er_added,
        "er_gone": tl.er_gone,
        "pod_added": tl.pod_added,
        "pod_running": tl.pod_running,
        "pod_gone": tl.pod_gone,
        "er_succeeded": tl.er_succeeded,
        "er_deleting": tl.er_deleting,
        "er_marked": tl.er_marked,
        "desired_at": res.desired_at,
        "cold_jobs": res.cold_jobs,
        "sustained_jobs": res.tput_jobs,
        "sustained_replacements": res.tput_chain,
        "rss_mb": {str(n): v for n, v in res.rss.items()},
    }


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def run(quick: bool = False) -> Table:
    runners, window, jobs = (3, 10.0, 3) if quick else (20, 60.0, 10)
    phases = Phases(cold_jobs=6, slots=10, tput_window=15.0, large=100, large_timeout=180.0) if quick else Phases()
    load_before = os.getloadavg()
    res = Results()
    workdir = Path(tempfile.mkdtemp(prefix="runnerscale-bench-e2e-"))
    opts = DemoOptions(
        min_runners=runners, max_runners=runners * 2, job_seconds=1.0, timeout=600.0, workdir=str(workdir)
    )
    code, out = run_stack(opts, _workload(res, window, jobs, timeout=300.0, phases=phases))
    load_after = os.getloadavg()
    (workdir / "timings.json").write_bytes(msgspec.json.encode(_raw(res)))
    table = Table(
        f"End to end, embedded stack ({runners} idle runners, default worker settings)",
        ["figure", "measured", "goal"],
    )
    if code != 0 or res.error:
        table.add("run failed", res.error or f"exit {code}; logs in {workdir}", "")
        print(out, file=sys.stderr)
        return table
    _writes_rows(table, res)
    _latency_rows(table, res, phases)
    _overhead_rows(table, res)
    _rss_rows(table, res)
    table.add("raw timestamps", str(workdir / "timings.json"), "")
    table.add(
        "machine load (1/5/15 min) before → after",
        f"{_load(load_before)} → {_load(load_after)} on {os.cpu_count()} cores",
        "",
    )
    return table


def _writes_rows(table: Table, res: Results) -> None:
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
    table.add("  by component (User-Agent), per minute", split(res.at_rest_by, per_min, 0), "")
    _breakdown(table, res.at_rest, per_min, "/min")
    controller = Counter({k: n for k, n in res.per_life.items() if (k[1], k[2]) not in NOT_CONTROLLER})
    table.add(
        f"controller API writes per runner life ({res.jobs} jobs)",
        f"{sum(controller.values()) / res.jobs:.1f}",
        GOAL_PER_RUNNER,
    )
    _breakdown(table, controller, 1.0 / res.jobs, "")
    life = 1.0 / res.jobs
    table.add("  all API writes per runner life by component (User-Agent)", split(res.writes_by, life), "")
    table.add("  all API requests per runner life by component (User-Agent)", split(res.requests_by, life), "")


def _latency_rows(table: Table, res: Results, ph: Phases) -> None:
    tl, jobs = res.timeline, res.cold_jobs
    taken = [j for j in jobs if j.runner_name]
    names = {j.runner_name for j in taken}
    fresh = [j for j in taken if tl.er_added.get(j.runner_name, 0.0) >= j.queued]  # runner made after it was queued

    def of(d: dict[str, float]) -> dict[str, float]:
        return {n: t for n, t in d.items() if n in names}

    table.add(
        f"job queued → runner pod Running, p50 / p99 (cold: minRunners 0, {ph.cold_jobs} jobs {ph.cold_gap:g} s apart)",
        fig.p50_p99(fig.queued_to_running(taken, tl.pod_running)),
        GOAL_START,
    )
    table.add(
        "  queued → listener's desired state on the bus (service long poll + listener)",
        fig.p50_p99(fig.first_after(res.desired_at, jobs)),
        "",
    )
    table.add(
        "  queued → EphemeralRunner created (listener + runner-set)",
        fig.p50_p99([tl.er_added[j.runner_name] - j.queued for j in fresh]),
        "",
    )
    table.add(
        "  EphemeralRunner created → pod created (runner worker)",
        fig.p50_p99(fig.stage(of(tl.er_added), tl.pod_added)),
        "",
    )
    table.add(
        "  pod created → pod Running (node-sim: scheduler + kubelet)",
        fig.p50_p99(fig.stage(of(tl.pod_added), tl.pod_running)),
        "",
    )
    table.add(
        "  queued → job handed to the runner (the service's view)",
        fig.p50_p99(fig.queued_to_assigned(taken)),
        "",
    )
    table.add(
        "job finished → EphemeralRunner gone, p50 / p99 (same jobs)",
        fig.p50_p99(fig.finished_to_gone(jobs, tl.er_gone)),
        GOAL_TEARDOWN,
    )
    table.add(
        "  job finished → EphemeralRunner Succeeded (runner worker)",
        fig.p50_p99(fig.finished_to_gone(jobs, tl.er_succeeded)),
        "",
    )
    table.add(
        "  Succeeded → gone (runner-set, once the listener's state accounts for the job)",
        fig.p50_p99(fig.stage(of(tl.er_succeeded), tl.er_gone)),
        "",
    )


def _overhead_rows(table: Table, res: Results) -> None:
    rate = res.tput_completed / res.tput_window if res.tput_window else 0.0
    overhead = fig.cycle_overhead(res.slots, res.tput_completed, res.tput_window, 1.0)
    table.add(
        f"sustained jobs/s, {res.slots} runners, 1 s jobs ({res.tput_window:.0f} s window)",
        f"{rate:.2f} jobs/s → {overhead:.2f} s overhead per runner cycle",
        f">= {res.slots / 2:g} jobs/s (overhead {GOAL_OVERHEAD})",
    )
    table.add(
        "per-runner overhead: job end → replacement runner pod Running, p50 / p99",
        fig.p50_p99(res.tput_gaps),
        GOAL_OVERHEAD,
    )
    tl = res.timeline
    table.add(
        "  job finished → its EphemeralRunner gone (under this load)",
        fig.p50_p99(fig.finished_to_gone(res.tput_jobs, tl.er_gone)),
        "",
    )
    table.add(
        "    job finished → EphemeralRunner Succeeded (runner worker)",
        fig.p50_p99(fig.finished_to_gone(res.tput_jobs, tl.er_succeeded)),
        "",
    )
    names = {j.runner_name for j in res.tput_jobs}
    table.add(
        "    Succeeded → gone (runner-set, once the listener's state accounts for the job)",
        fig.p50_p99(fig.stage({n: t for n, t in tl.er_succeeded.items() if n in names}, tl.er_gone)),
        "",
    )
    stages = fig.chain_stages(res.tput_chain)
    for label, name in (
        ("  replaced EphemeralRunner gone → replacement's pod Running", "gone→running"),
        ("    gone → replacement EphemeralRunner created (runner-set)", "gone→created"),
        ("    ER created → pod created (runner worker: JIT config, Secret, pod)", "created→pod"),
        ("    pod created → pod Running (node-sim: scheduler + kubelet)", "pod→running"),
        ("    pod Running → the service hands it a job", "running→handed"),
    ):
        table.add(label, fig.p50_p99(stages[name]), "")
    table.add(
        "  runner pod Running → the service hands it a job (queue never empty)",
        fig.p50_p99(fig.job_wait(res.tput_jobs, tl.pod_running)),
        "",
    )


def _rss_rows(table: Table, res: Results) -> None:
    counts = sorted(res.rss)
    table.add(
        f"RSS per worker process (MB) at {' / '.join(f'{n:,}' for n in counts)} runners",
        "VmRSS at each count; then linear through the two largest",
        GOAL_RSS,
    )
    low, high = (counts[-2], counts[-1]) if len(counts) >= 2 else (0, 0)
    for worker in WORKERS:
        values = [res.rss[n].get(worker) for n in counts]
        shown = " / ".join("?" if v is None else f"{v:.0f}" for v in values)
        a, b = res.rss.get(low, {}).get(worker), res.rss.get(high, {}).get(worker)
        guess = fig.extrapolate(low, a, high, b, RSS_TARGET) if a is not None and b is not None else None
        more = ""
        if guess is not None and a is not None and b is not None:
            per_runner_kb = (b - a) / (high - low) * 1000
            more = f"; {per_runner_kb:.0f} kB/runner → {RSS_TARGET:,}: ≈ {guess:.0f}"
        table.add(f"  {worker}", shown + more, "")
    table.add(
        "  largest fleet reached",
        f"{res.large_reached:,} runners' pods Running after {res.large_seconds:.0f} s",
        "",
    )


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv).render())
