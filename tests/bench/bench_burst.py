"""Burst on the embedded stack (issue 10): N jobs queued at once → time until N runner pods Running.

The stack is the demo's (``runnerscale demo``, as in ``bench_e2e``): nats-server, the API emulator,
the Actions simulator (poll wait 2 s), node-sim and the four workers, every one a separate process,
default worker settings, ``minRunners`` 0 and ``maxRunners`` N. Once the listener's session is
open, N long jobs are queued in one call; the clock runs from that call until N runner pods
(pods owned by an EphemeralRunner) report phase Running, seen through a watch (an informer: the
observer costs the API server what it is sent, not a list of every pod per sample). A fresh stack
per N. The demo's own runner tracker (for the demo's summary, which a custom workload does not
print) is not run: it was a LIST of every EphemeralRunner every 0.2 s, at N = 3,000 an O(N × time)
load of its own; it is a watch now, but this process need not decode every runner twice. The runner-set and runner
workers' RSS is read at the end of each burst, and each component's CPU seconds during it (less
disturbed by the shared machine's load than wall time).

Issue 10's goal: the burst time grows no worse than linearly from 300 to 3,000 (it measured
t ≈ 0.065·N + 4.5e-5·N² s). Linear growth is a flat cost per extra runner: the milliseconds per
runner added from one N to the next (``burst_figures.marginal_ms``), the last interval's against the
one from 300 (≤ 1.0: no worse than linear; the issue's fit gives 1.98). Beside it, the ratio t(N)/N to
t(300)/300, which is 1.0 only for a burst proportional to N: a fixed part moves it, and the workers'
client-side request-rate limit is one (its burst allowance of 400 requests carries most of a 300
burst, then the runner worker goes at its steady rate: t(N) ≈ 12.7 ms·N − 2.2 s, ratio ≈ 2.2 at
3,000 with the same cost per extra runner). With ``RUNNERSCALE_KUBE_QPS=0`` in the environment
(limit off, printed in the title) the stack's own work is measured. The machine's load average is printed with the
results: the machine is shared. Beside it, the same ratio on the stack's CPU seconds per runner
(what the processes spent, far less disturbed by the other sessions' load than wall time) and the
burst's shape: the first pod Running (the fixed latency, which weighs 10× more per runner at 300
than at 3,000) and the steady rate from the 10th to the 90th percentile pod.

Every N measures the same thing: the clock starts when the jobs are queued, the stack's CPU is
counted from the same moment, and the burst starts only once the stack is quiet (its processes
together below a fifth of a core for a second, at most 30 s after the listener's session opened):
the workers' start-up (initial lists, lease acquisition) is not counted at one N and not at
another (figures in tests/bench/burst_figures.py). The stack's CPU is also read once it is quiet again
after the burst: the work still done for the runners after the last pod is Running (status writes,
events, desired-state rounds) is cut from the burst's own figure, a larger share at 300 than at
3,000. The request counts (Actions simulator by route and status, API server by verb, resource and
status, watch traffic by resource) are read then too: every request of the burst, per runner.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import anyio

from services.embedded.demo import __main__ as demo
from services.embedded.demo.__main__ import DemoOptions, run_demo
from services.embedded.demo.cluster import DemoKube
from shared.kube import PODS, Change, ChangeType, Informer
from shared.kube.client import DEFAULT_QPS
from shared.kube.objects import Pod
from tests.bench import burst_figures as fig
from tests.bench.agents import by_component, split
from tests.bench.bench_e2e import _sim
from tests.bench.table import Table

GOAL_1000 = 15.0  # seconds for 1,000 (issue 10)
JOB_SECONDS = 3600.0  # jobs outlast the measurement: no runner finishes during it
QUIET_CORES = 0.2  # the stack is quiet below this share of a core ...
QUIET_SECONDS = 1.0  # ... over this long
QUIET_WAIT = 30.0  # at most this long after the listener's session opened
GROWTH_LABEL = f"{fig.GROWTH_BASE:,}+"  # the first interval of the linearity check: 300 → the next N


class RunningPods:
    """Informer handler: the runner pods seen Running (pods owned by an EphemeralRunner)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.names: set[str] = set()
        self.reached = anyio.Event()
        self.started = 0.0  # monotonic time the jobs were queued
        self.running_at: list[float] = []  # seconds after ``started`` each pod was first seen Running

    def __call__(self, change: Change[Pod]) -> None:
        pod = change.obj
        meta = pod.metadata
        if change.type is ChangeType.DELETED or meta.is_deleting:
            return
        if not any(ref.kind == "EphemeralRunner" for ref in meta.owner_references):
            return
        if pod.status is not None and pod.status.phase == "Running" and meta.name not in self.names:
            self.names.add(meta.name)
            self.running_at.append(time.monotonic() - self.started)
            if len(self.names) >= self.n:
                self.reached.set()


COMPONENTS = ("apiserver", "runner-set", "runner", "node-sim", "listener", "scale-set", "listener-pod", "actions-sim")
TICK = os.sysconf("SC_CLK_TCK")


def _cpu(workdir: Path) -> dict[str, float]:
    return {k: v[0] for k, v in _stack(workdir).items()}


async def _quiet(workdir: Path) -> float:
    """Wait until the stack is quiet (see the module's docstring); the seconds waited, negative if
    it never was within ``QUIET_WAIT`` (the burst then starts anyway)."""
    began = time.monotonic()
    before = _cpu(workdir)
    while True:
        await anyio.sleep(QUIET_SECONDS)  # the sampling interval of a condition polled under a deadline
        after = _cpu(workdir)
        if fig.is_quiet(before, after, QUIET_SECONDS, QUIET_CORES):
            return time.monotonic() - began
        if time.monotonic() - began > QUIET_WAIT:
            return -(time.monotonic() - began)
        before = after


def _stack(workdir: Path) -> dict[str, tuple[float, float]]:
    """This stack's processes (found by their workdir in argv) → (CPU seconds so far, RSS MB)."""
    out: dict[str, tuple[float, float]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
            stat = (proc / "stat").read_text().rpartition(")")[2].split()
            status = (proc / "status").read_text()
        except OSError:
            continue
        if not any(str(workdir) in a for a in args):
            continue
        name = next((c for c in COMPONENTS if c in args), None)
        rss = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")), "0")
        if name:
            out[name] = ((int(stat[11]) + int(stat[12])) / TICK, int(rss) / 1024)
    return out


class Outcome:
    def __init__(self) -> None:
        self.seconds: float | None = None
        self.reached = 0
        self.error = ""
        self.rss: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # CPU seconds per component during the burst
        self.requests: dict[str, int] = {}  # API server requests during the burst, "verb resource[/sub]" → count
        self.statuses: dict[str, int] = {}  # the same by answer, "verb resource[/sub] status" (not 2xx only)
        self.watches: dict[str, tuple[int, int, int, int]] = {}  # resource → watches opened, events, writes, bytes
        self.actions: dict[str, int] = {}  # Actions simulator requests during the burst, "METHOD endpoint status"
        self.components: dict[str, int] = {}  # API server requests by component (User-Agent), until quiet
        self.components_burst: dict[str, int] = {}  # the same from the jobs' arrival to the last pod Running
        self.shape: fig.Shape | None = None
        self.settled = 0.0  # seconds waited for a quiet stack (negative: it never was)
        self.cpu_settled: dict[str, float] = {}  # CPU seconds per component until quiet again after the burst
        self.settled_after = 0.0  # seconds from the last pod Running to a quiet stack (negative: never)


def _workload(n: int, out: Outcome, timeout: float) -> Any:
    async def workload(
        opts: DemoOptions, kube: DemoKube, http: aiohttp.ClientSession, sim_url: str, say: Any, latest: dict[str, str]
    ) -> int:
        deadline = time.monotonic() + 120.0
        while not await _sim(http, "GET", f"{sim_url}/_sim/sessions"):
            if time.monotonic() > deadline:
                out.error = "the listener opened no session"
                return 1
            await anyio.sleep(0.5)  # polling a condition under a deadline
        running = RunningPods(n)
        pods = Informer(kube.client, PODS, namespace=opts.namespace)
        pods.add_handler(running)
        async with anyio.create_task_group() as tg:
            await tg.start(pods.run)
            out.settled = await _quiet(Path(opts.workdir))
            emulator = f"{kube.client.host.rstrip('/')}/_emulator/requests" if not opts.kubeconfig else ""
            if emulator:
                await _sim(http, "DELETE", emulator)
                await _sim(http, "DELETE", emulator.replace("/requests", "/watch-counts"))
            await _sim(http, "DELETE", f"{sim_url}/_sim/request-counts")
            before = _stack(Path(opts.workdir))
            started = running.started = time.monotonic()
            await _sim(
                http, "POST", f"{sim_url}/_sim/jobs", {"count": n, "labels": ["demo-runners"], "duration": JOB_SECONDS}
            )
            with anyio.move_on_after(timeout):
                await running.reached.wait()
                out.seconds = time.monotonic() - started
            if emulator:  # what each process sent during the burst itself: its rate beside its limit
                out.components_burst = dict(by_component(await _sim(http, "GET", emulator)))
            tg.cancel_scope.cancel()
        out.reached = len(running.names)
        if running.running_at:
            out.shape = fig.shape(running.running_at)
        after = _stack(Path(opts.workdir))
        out.rss = {k: v[1] for k, v in after.items()}
        out.cpu = {k: v[0] - before.get(k, (0.0, 0.0))[0] for k, v in after.items()}
        # The burst's whole work: what the stack still does for these runners once they are Running
        # (status writes, events, desired-state rounds) is cut from ``cpu``, a larger share at 300.
        out.settled_after = await _quiet(Path(opts.workdir))
        out.cpu_settled = {k: v[0] - before.get(k, (0.0, 0.0))[0] for k, v in _stack(Path(opts.workdir)).items()}
        if emulator:
            rows = await _sim(http, "GET", emulator)
            out.components = dict(by_component(rows))
            for row in rows:
                what = f"{row['verb']} {row['resource']}" + (f"/{row['subresource']}" if row["subresource"] else "")
                out.requests[what] = out.requests.get(what, 0) + int(row["count"])
                for code, c in row.get("statuses", {}).items():
                    if not code.startswith("2"):
                        out.statuses[f"{what} {code}"] = out.statuses.get(f"{what} {code}", 0) + int(c)
            for row in await _sim(http, "GET", emulator.replace("/requests", "/watch-counts")):
                out.watches[row["resource"]] = (row["watches"], row["events"], row["writes"], row["bytes"])
        for row in await _sim(http, "GET", f"{sim_url}/_sim/request-counts"):
            out.actions[f"{row['method']} {row['endpoint']} {row['status']}"] = int(row["count"])
        if out.seconds is None:
            out.error = f"{out.reached}/{n} pods Running after {timeout:.0f}s"
            return 1
        say(f"burst {n}: {out.seconds:.1f}s")
        return 0

    return workload


async def _no_tracker(self: Any) -> None:
    await anyio.sleep_forever()  # stands in for the demo's tracker until the workload ends


def burst(n: int, timeout: float) -> Outcome:
    res = Outcome()
    workdir = Path(tempfile.mkdtemp(prefix=f"runnerscale-bench-burst-{n}-"))
    opts = DemoOptions(min_runners=0, max_runners=n, job_seconds=JOB_SECONDS, timeout=timeout, workdir=str(workdir))
    out = io.StringIO()
    with (workdir / "children.log").open("w") as log, mock.patch.object(demo.RunnerTracker, "run", _no_tracker):
        code = anyio.run(run_demo, opts, workdir, log, out, _workload(n, res, timeout))
    if code != 0 and not res.error:
        res.error = f"exit {code}; logs in {workdir}"
    if res.error:
        print(out.getvalue(), file=sys.stderr)
    return res


def run(quick: bool = False, sizes: tuple[int, ...] | None = None) -> Table:
    sizes = sizes or ((100, 300, 1000) if quick else (100, 300, 1000, 3000))
    load_before = os.getloadavg()
    results = {n: burst(n, timeout=max(120.0, n * 0.6)) for n in sizes}
    load_after = os.getloadavg()
    times = {n: r.seconds for n, r in results.items() if r.seconds is not None}
    ratio = fig.growth(times)
    cpu_ratio = fig.growth({n: sum(r.cpu.values()) for n, r in results.items() if r.seconds is not None and r.cpu})
    whole = {n: sum(r.cpu_settled.values()) for n, r in results.items() if r.seconds is not None and r.cpu_settled}
    whole_ratio = fig.growth(whole)
    marginal, bend = fig.marginal_ms(times), fig.marginal_growth(times)
    table = Table(
        f"Burst, embedded stack (N jobs queued at once → N runner pods Running; {_settings()})",
        [
            "N",
            "seconds",
            "per runner (ms)",
            "growth vs 300",
            "ms per extra runner since the previous N",
            "first Running / steady rate (10-90 %)",
            "CPU ms per runner (growth vs 300) on cores used",
            "CPU ms per runner until quiet (growth), quiet after",
            "RSS runner-set / runner (MB)",
            "CPU s during burst",
            "API requests per runner",
            "goal",
        ],
    )
    for n, r in results.items():
        goal = f"<= {GOAL_1000:g} s" if n == 1000 else ""
        if n == max(sizes) and n > fig.GROWTH_BASE:
            goal += ("; " if goal else "") + f"ms per extra runner <= 1.0× the {GROWTH_LABEL} interval's"
        if r.seconds is None:
            table.add(str(n), f"failed: {r.error}", "", "", "", "", "", "", "", "", "", goal)
            continue
        g = f"{ratio[n]:.2f}" if n in ratio else ""
        rss = f"{r.rss.get('runner-set', 0):.0f} / {r.rss.get('runner', 0):.0f}" if r.rss else "?"
        cpu = " ".join(f"{k} {v:.1f}" for k, v in sorted(r.cpu.items(), key=lambda kv: -kv[1]) if v >= 0.05)
        total = sum(r.requests.values())
        top = sorted(r.requests.items(), key=lambda kv: -kv[1])[:6]
        reqs = f"{total / n:.1f}: " + ", ".join(f"{k} {c / n:.1f}" for k, c in top) if r.requests else ""
        sh = f"{r.shape.first:.2f} s / {r.shape.steady_rate(n):.0f} pods/s" if r.shape else ""
        if r.settled < 0:
            sh += f" (stack not quiet after {-r.settled:.0f} s)"
        per = f"{fig.cpu_ms_per_runner(r.cpu, n):.1f}" + (f" ({cpu_ratio[n]:.2f})" if n in cpu_ratio else "")
        per += f" on {fig.cores_used(r.cpu, r.seconds):.2f} cores" if r.cpu and r.seconds > 0 else ""
        settled = ""
        if n in whole:
            settled = f"{whole[n] * 1000 / n:.1f}" + (f" ({whole_ratio[n]:.2f})" if n in whole_ratio else "")
            settled += f", {r.settled_after:.0f} s" if r.settled_after >= 0 else f", not after {-r.settled_after:.0f} s"
            settled += ": " + " ".join(
                f"{k} {v * 1000 / n:.2f}" for k, v in sorted(r.cpu_settled.items(), key=lambda kv: -kv[1]) if v >= 0.05
            )
        extra = f"{marginal[n]:.1f}" if n in marginal else ""
        if n == max(times) and bend is not None:
            extra += f" ({bend:.2f}× the {GROWTH_LABEL} interval's)"
        table.add(
            str(n), f"{r.seconds:.1f}", f"{r.seconds / n * 1000:.0f}", g, extra, sh, per, settled, rss, cpu, reqs, goal
        )
    table.add(
        "load (1/5/15 min) before → after",
        f"{'/'.join(f'{x:.1f}' for x in load_before)} → {'/'.join(f'{x:.1f}' for x in load_after)}"
        f" on {os.cpu_count()} cores",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
    )
    print(_requests_table(results).render())
    print()
    return table


def _settings() -> str:
    """The worker settings the stack runs with: the defaults, or the request-rate limit given in
    the environment (the workers read RUNNERSCALE_KUBE_QPS / _BURST; 0 = no client-side limit)."""
    given = [f"{k}={os.environ[k]}" for k in ("RUNNERSCALE_KUBE_QPS", "RUNNERSCALE_KUBE_BURST") if k in os.environ]
    return ", ".join(given) if given else "default worker settings"


def _per_runner(counts: dict[str, int], n: int) -> str:
    total = sum(counts.values())
    rows = sorted(counts.items(), key=lambda kv: -kv[1])
    return f"{total / n:.2f}: " + ", ".join(f"{k} {c / n:.2f}" for k, c in rows) if counts else ""


def _requests_table(results: dict[int, Outcome]) -> Table:
    """Every request during each burst, per runner: what grows with N shows as a count (issue 10)."""
    table = Table(
        "Burst: requests per runner during the burst (all of them)",
        [
            "N",
            "Actions simulator (method endpoint status)",
            "API server not 2xx (verb resource status)",
            "watch streams: resource watches opened, events / writes / kB per runner",
            "API server",
            "API server by component (User-Agent)",
            "req/s per component during the burst / its client-side limit",
        ],
    )
    for n, r in results.items():
        watches = ", ".join(
            f"{k} {w} {e / n:.2f} / {c / n:.2f} / {b / n / 1000:.1f}"
            for k, (w, e, c, b) in sorted(r.watches.items(), key=lambda kv: -kv[1][3])
        )
        table.add(
            str(n),
            _per_runner(r.actions, n),
            _per_runner(r.statuses, n),
            watches,
            _per_runner(r.requests, n),
            split(r.components, 1 / n, 2),
            _rates(r.components_burst, r.seconds),
        )
    return table


def _rates(counts: dict[str, int], seconds: float | None) -> str:
    """``runner 79/200``: requests per second of each process from the jobs' arrival to the last pod
    Running, beside the client-side limit it runs with (node-sim's client has none)."""
    if not seconds:
        return ""
    qps = os.environ.get("RUNNERSCALE_KUBE_QPS", f"{DEFAULT_QPS:g}")  # what the workers read
    limit = {"node-sim": "-", "demo": f"{DEFAULT_QPS:g}"}  # the bench's own client: the default
    return ", ".join(
        f"{k} {c / seconds:.0f}/{limit.get(k, qps)}" for k, c in sorted(counts.items(), key=lambda kv: -kv[1])
    )


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--quick"]
    print(run(quick="--quick" in sys.argv, sizes=tuple(int(a) for a in args) or None).render())
