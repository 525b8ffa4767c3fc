"""`runnerscale demo`: the embedded default, everything local, a demo workload scaling up and down.

It starts, as separate processes: nats-server (JetStream), the Kubernetes API emulator, the
Actions service simulator, the node simulator and the four workers. Then it does what a user
does with ARC — creates a namespace, a GitHub token Secret and an AutoscalingRunnerSet — and
queues waves of jobs at the simulator. It prints one status line per tick (jobs, desired
runners, runners by phase) and checks that the set scales up for the jobs and back down to
``minRunners`` when they are done, then prints a summary (summary.py: jobs run, p50/p99 job
queued → runner Running and job finished → runner removed, API writes per runner). Exit code 0
when it did; 1 when it did not within the time.

With ``--kubeconfig FILE`` it uses that cluster instead of starting the emulator (node-sim is its
scheduler and kubelet there): it installs the CRDs, works in its own namespaces, and at the end
deletes the AutoscalingRunnerSet while the workers run, then everything else it created.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import anyio
import msgspec
import nats

from services.embedded.demo.cluster import CRDS, DemoKube, crd_documents
from services.embedded.demo.summary import JobTimes, RequestCount, summarize
from services.embedded.demo.supervisor import ChildSpec, free_port, supervised
from shared.api import EphemeralRunner
from shared.bus import messages as bus_messages
from shared.bus import permissions as bus_permissions
from shared.bus import subjects
from shared.kube import EPHEMERAL_RUNNERS, Change, ChangeType, Informer, KubeClient
from shared.kube.client import user_agent_for

DEMO_NAMESPACE = "arc-runners"
CONTROLLER_NAMESPACE = "arc-systems"
SCALE_SET = "demo-runners"
CRD_DIR = Path(__file__).resolve().parents[3] / "deploy" / "crds"


class DemoOptions(msgspec.Struct, frozen=True):
    waves: tuple[int, ...] = (4, 2)
    job_seconds: float = 6.0
    min_runners: int = 1
    max_runners: int = 5
    timeout: float = 240.0
    workdir: str = ""
    verbose: bool = False
    kubeconfig: str = ""  # an existing cluster; "" = start the API emulator
    namespace: str = DEMO_NAMESPACE
    controller_namespace: str = CONTROLLER_NAMESPACE


def parse_args(argv: list[str]) -> DemoOptions:
    p = argparse.ArgumentParser(prog="runnerscale demo", description=__doc__.splitlines()[0])
    p.add_argument("--waves", default="4,2", help="jobs queued per wave, comma-separated (default 4,2)")
    p.add_argument("--job-seconds", type=float, default=6.0, help="how long each job runs (default 6)")
    p.add_argument("--min-runners", type=int, default=1, help="idle runners kept (default 1)")
    p.add_argument("--max-runners", type=int, default=5)
    p.add_argument("--timeout", type=float, default=240.0, help="give up after this many seconds")
    p.add_argument("--workdir", default="", help="where state and logs go (default: a temp dir)")
    p.add_argument("--verbose", action="store_true", help="forward every child's log lines")
    p.add_argument(
        "--kubeconfig",
        default="",
        help="run against this cluster instead of starting the API emulator (node-sim schedules and runs the pods; "
        "what the demo creates is removed at the end)",
    )
    p.add_argument("--namespace", default=DEMO_NAMESPACE, help=f"namespace of the runners (default {DEMO_NAMESPACE})")
    p.add_argument(
        "--controller-namespace",
        default=CONTROLLER_NAMESPACE,
        help=f"namespace of the listener and the workers' leases (default {CONTROLLER_NAMESPACE})",
    )
    a = p.parse_args(argv)
    try:
        waves = tuple(int(x) for x in a.waves.split(",") if x.strip())
    except ValueError:
        p.error(f"--waves must be comma-separated integers, got {a.waves!r}")
    if not waves or any(w < 0 for w in waves):
        p.error("--waves needs at least one non-negative count")
    if a.min_runners < 0 or a.max_runners < max(a.min_runners, 1):
        p.error("need 0 <= --min-runners <= --max-runners and --max-runners >= 1")
    if a.kubeconfig and not Path(a.kubeconfig).is_file():
        p.error(f"--kubeconfig {a.kubeconfig}: no such file")
    if a.namespace == a.controller_namespace:
        p.error("--namespace and --controller-namespace must differ")
    return DemoOptions(
        waves,
        a.job_seconds,
        a.min_runners,
        a.max_runners,
        a.timeout,
        a.workdir,
        a.verbose,
        str(Path(a.kubeconfig).resolve()) if a.kubeconfig else "",
        a.namespace,
        a.controller_namespace,
    )


Say = Callable[[str], None]  # prints one line of the demo's own output


def _bin(name: str) -> str:
    """A console script or the nats-server binary beside this interpreter (the venv's bin/)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def _ars_manifest(config_url: str, opts: DemoOptions) -> dict[str, Any]:
    return {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": SCALE_SET, "namespace": opts.namespace},
        "spec": {
            "githubConfigUrl": config_url,
            "githubConfigSecret": "github-token",
            "runnerScaleSetName": SCALE_SET,
            "minRunners": opts.min_runners,
            "maxRunners": opts.max_runners,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "runner",
                            "image": "ghcr.io/actions/actions-runner:latest",
                            "command": ["/home/runner/run.sh"],
                        }
                    ],
                }
            },
        },
    }


async def _sim(session: aiohttp.ClientSession, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    with anyio.fail_after(15):
        async with session.request(method, url, json=body) as r:
            r.raise_for_status()
            return await r.json(content_type=None)


def _phase_counts(runners: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in runners:
        phase = (r.get("status") or {}).get("phase") or "New"
        if (r.get("metadata") or {}).get("deletionTimestamp"):
            phase = "Deleting"
        counts[phase] = counts.get(phase, 0) + 1
    return counts


def prepare_workdir(opts: DemoOptions) -> Path:
    workdir = Path(opts.workdir or tempfile.mkdtemp(prefix="runnerscale-demo-")).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


#: What runs once the stack is up: (options, kube, http session, simulator URL, say, latest desired
#: state line) -> exit code. The demo's waves by default; the end-to-end benchmark passes its own.
Workload = Callable[
    [DemoOptions, DemoKube, aiohttp.ClientSession, str, Callable[[str], None], dict[str, str]], Awaitable[int]
]


async def run_demo(opts: DemoOptions, workdir: Path, log: TextIO, out: TextIO, workload: Workload | None = None) -> int:
    """The demo; ``log`` receives the children's output, ``out`` the demo's own lines."""

    def say(msg: str) -> None:
        print(msg, file=out, flush=True)

    external = bool(opts.kubeconfig)
    kubeconfig = Path(opts.kubeconfig) if external else workdir / "kubeconfig"
    creds = workdir / "actions-sim.json"
    nats_port, kube_port, sim_port = free_port(), free_port(), free_port()
    nats_url = f"nats://127.0.0.1:{nats_port}"
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "RUNNERSCALE_NATS_URL": nats_url,
        "RUNNERSCALE_LOG_LEVEL": "info" if opts.verbose else "warning",
    }
    # An authenticated bus (README "Authentication and permissions"): a fresh password per
    # component at every start, each process connecting as its own user with only its permissions.
    passwords = bus_permissions.generate_passwords()
    nats_conf = workdir / "nats.conf"
    nats_conf.touch(mode=0o600)
    nats_conf.write_text(bus_permissions.render_authorization(passwords))

    # Listener pods connect as the listener's own user: the listener-pod worker reads its password
    # from a file and writes it into each listener's config Secret (never the pod spec).
    listener_password = workdir / "nats-listener.password"
    listener_password.touch(mode=0o600)
    listener_password.write_text(passwords["listener"] + "\n")

    def bus_env(component: str) -> dict[str, str]:
        out = {**env, "RUNNERSCALE_NATS_USER": component, "RUNNERSCALE_NATS_PASSWORD": passwords[component]}
        if component == "listener-pod":
            out |= {
                "RUNNERSCALE_LISTENER_NATS_USER": "listener",
                "RUNNERSCALE_LISTENER_NATS_PASSWORD_FILE": str(listener_password),
            }
        return out

    say(f"runnerscale demo: state and logs in {workdir}")
    namespaces = [opts.namespace, opts.controller_namespace]
    created = Created()
    async with supervised(out=log) as sup, aiohttp.ClientSession() as http:
        await sup.start(
            ChildSpec(
                "nats",
                [
                    _bin("nats-server"),
                    "-c",
                    str(nats_conf),
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(nats_port),
                    "-js",
                    "-sd",
                    str(workdir / "jetstream"),
                ],
                ready_port=nats_port,
                env=env,
            )
        )
        if not external:
            kube_args = [
                _bin("runnerscale"),
                "apiserver",
                "--port",
                str(kube_port),
                "--kubeconfig-out",
                str(kubeconfig),
            ]
            if CRD_DIR.is_dir():
                kube_args += ["--crds", str(CRD_DIR)]
            await sup.start(ChildSpec("apiserver", kube_args, ready_port=kube_port, env=env))
            # The emulator listens first, then writes its kubeconfig (whole, by rename).
            await _wait_for_file(anyio.Path(kubeconfig))
        client = await KubeClient.from_kubeconfig(kubeconfig, request_timeout=15, user_agent=user_agent_for("demo"))
        async with client:
            kube = DemoKube(client)
            if external:
                created.crds = await kube.install_crds(crd_documents(CRD_DIR))
                say(f"installed the CRDs ({len(created.crds)} new) in the cluster of {kubeconfig}")
            await sup.start(
                ChildSpec(
                    "actions-sim",
                    [
                        _bin("runnerscale"),
                        "actions-sim",
                        "--port",
                        str(sim_port),
                        "--credentials-out",
                        str(creds),
                        "--poll-wait",
                        "2",
                    ],
                    ready_port=sim_port,
                    env=env,
                )
            )
            sim = await _read_credentials(anyio.Path(creds))
            sim_url = sim["url"].rstrip("/")
            common = [
                "--kubeconfig",
                str(kubeconfig),
                "--nats-url",
                nats_url,
                "--metrics-addr",
                "0",
                "--health-addr",
                "0",
            ]
            if external:
                # A shared cluster: the workers look at the demo's namespaces only, and keep their
                # shard leases in the controller namespace (removed with it).
                common += ["--watch-namespace", ",".join(namespaces), "--lease-namespace", opts.controller_namespace]
            node_args = [_bin("runnerscale"), "node-sim", "--kubeconfig", str(kubeconfig), "--actions-url", sim_url]
            node_args += ["--state-dir", str(workdir / "node")]
            if external:
                node_args += [arg for ns in namespaces for arg in ("--namespace", ns)]
            await sup.start(ChildSpec("node-sim", node_args, env=env))
            await sup.start(
                ChildSpec(
                    "scale-set",
                    [
                        _bin("runnerscale"),
                        "scale-set",
                        *common,
                        "--controller-namespace",
                        opts.controller_namespace,
                        "--listener-image",
                        "ghcr.io/runnerscale/runnerscale:demo",
                    ],
                    env=bus_env("scale-set"),
                )
            )
            await sup.start(
                ChildSpec(
                    "listener-pod",
                    [
                        _bin("runnerscale"),
                        "listener-pod",
                        *common,
                        # listener pods run as local processes here: give each free ports
                        "--listener-metrics-addr",
                        "127.0.0.1:0",
                        "--listener-health-addr",
                        "127.0.0.1:0",
                    ],
                    env=bus_env("listener-pod"),
                )
            )
            await sup.start(
                ChildSpec("runner-set", [_bin("runnerscale"), "runner-set", *common], env=bus_env("runner-set"))
            )
            await sup.start(ChildSpec("runner", [_bin("runnerscale"), "runner", *common], env=bus_env("runner")))
            where = (
                f"the cluster of {kubeconfig}" if external else f"Kubernetes API emulator http://127.0.0.1:{kube_port}"
            )
            say(f"started: nats {nats_url}, {where}, Actions simulator {sim_url}")
            say(
                f"  try: kubectl --kubeconfig {kubeconfig} get autoscalingrunnersets,ephemeralrunnersets,ephemeralrunners,pods -A"
            )
            for ns in namespaces:
                if await kube.ensure(
                    "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                ):
                    created.namespaces.append(ns)
            try:
                await kube.ensure(
                    f"/api/v1/namespaces/{opts.namespace}/secrets",
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {"name": "github-token"},
                        "stringData": {"github_token": sim["pat"]},
                    },
                )
                config_url = f"{sim_url}/{sim['org']}"
                await kube.ensure(
                    f"/apis/actions.github.com/v1alpha1/namespaces/{opts.namespace}/autoscalingrunnersets",
                    _ars_manifest(config_url, opts),
                )
                say(
                    f"created AutoscalingRunnerSet {opts.namespace}/{SCALE_SET} (minRunners={opts.min_runners}, maxRunners={opts.max_runners}) for {config_url}"
                )

                # Watch the desired state the listener publishes, as `nats sub 'runnerscale.desired.>'` would.
                latest: dict[str, str] = {}
                nc = await nats.connect(
                    nats_url,
                    user="observer",
                    password=passwords["observer"],
                    connect_timeout=5,
                    max_reconnect_attempts=-1,
                )
                try:

                    async def on_desired(msg: Any) -> None:
                        try:
                            state = bus_messages.decode(msg.subject, msg.data)
                        except Exception as exc:
                            latest["desired"] = f"undecodable desired state: {exc}"
                            return
                        if isinstance(state, bus_messages.DesiredState):
                            latest["desired"] = f"desired={state.replicas} patchId={state.patch_id}"

                    await nc.subscribe(f"{subjects.PREFIX}.desired.>", cb=on_desired)
                    tracker = RunnerTracker(kube, opts.namespace)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(tracker.run)
                        result = await (workload or _workload)(opts, kube, http, sim_url, say, latest)
                        if result == 0 and workload is None:  # the demo's own workload ends with the summary
                            for line in await _summary(kube, http, sim_url, tracker):
                                say(line)
                        tg.cancel_scope.cancel()
                finally:
                    await nc.close()
            finally:
                if external:
                    with anyio.CancelScope(shield=True):
                        await _delete_scale_set(kube, opts, say)
    if external:
        async with await KubeClient.from_kubeconfig(
            kubeconfig, request_timeout=15, user_agent=user_agent_for("demo")
        ) as client:
            if not await _remove_created(DemoKube(client), created, say):
                return 1
    return result


class RunnerTracker:
    """When each EphemeralRunner was first seen Running and when it was seen gone (for the
    summary's latencies), from a watch of the namespace's EphemeralRunners (an informer: the
    API server sends each change once, instead of a list of every runner every 0.2 s, a load that
    grew with runners × time; issue 10)."""

    def __init__(self, kube: DemoKube | None, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.running_at: dict[str, float] = {}
        self.removed_at: dict[str, float] = {}
        self.seen: set[str] = set()

    def record(self, name: str, phase: str, gone: bool, now: float) -> None:
        """One observed state of runner ``name`` at ``now`` (pure bookkeeping)."""
        self.seen.add(name)
        if gone:
            self.removed_at.setdefault(name, now)
        elif phase == "Running":
            self.running_at.setdefault(name, now)

    def on_change(self, change: Change[EphemeralRunner]) -> None:
        er = change.obj
        phase = er.status.phase if er.status is not None else ""
        self.record(change.key.name, str(phase or ""), change.type is ChangeType.DELETED, time.time())

    async def run(self) -> None:
        assert self.kube is not None
        informer = Informer(self.kube.client, EPHEMERAL_RUNNERS, namespace=self.namespace)
        informer.add_handler(self.on_change)
        await informer.run()


async def _summary(kube: DemoKube, http: aiohttp.ClientSession, sim_url: str, tracker: RunnerTracker) -> list[str]:
    """Jobs from the simulator (its clock is this host's), runners from the tracker; waits up to
    15 s for the runners of finished jobs to be gone."""
    deadline = time.monotonic() + 15
    while True:
        raw = await _sim(http, "GET", f"{sim_url}/_sim/jobs")
        jobs = [
            JobTimes(j.get("runner_name", ""), float(j.get("queue_time") or 0.0), j.get("finish_time"))
            for j in (raw if isinstance(raw, list) else [])
        ]
        pending = [
            j for j in jobs if j.finished is not None and j.runner_name and j.runner_name not in tracker.removed_at
        ]
        if not pending or time.monotonic() > deadline:
            break
        await anyio.sleep(0.5)  # display tick while the last runners go
    counts = await kube.request_counts()
    requests = None if counts is None else [msgspec.convert(c, RequestCount) for c in counts]
    return summarize(jobs, tracker.running_at, tracker.removed_at, requests, len(tracker.seen)).lines()


async def _wait_for_file(path: anyio.Path, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while True:
            if await path.exists():
                return
            await anyio.sleep(0.05)  # bounded poll for a file another process writes


async def _read_credentials(path: anyio.Path, timeout: float = 20.0) -> dict[str, Any]:
    """The simulator writes its credentials file right after it listens."""
    with anyio.fail_after(timeout):
        while True:
            if await path.exists() and (await path.stat()).st_size:
                return msgspec.json.decode(await path.read_bytes(), type=dict[str, Any])
            await anyio.sleep(0.1)  # bounded poll for a file another process writes


class Created(msgspec.Struct):
    """What the demo created on an existing cluster (and so removes at the end)."""

    crds: list[str] = msgspec.field(default_factory=list)
    namespaces: list[str] = msgspec.field(default_factory=list)


async def _delete_scale_set(kube: DemoKube, opts: DemoOptions, say: Say) -> None:
    """Delete the AutoscalingRunnerSet while the workers still run: they remove the listener,
    runner sets, runners and pods, and their finalizers, as they would in production."""
    say(f"deleting AutoscalingRunnerSet {opts.namespace}/{SCALE_SET} ...")
    await kube.delete(
        f"/apis/actions.github.com/v1alpha1/namespaces/{opts.namespace}/autoscalingrunnersets/{SCALE_SET}"
    )
    namespaces = [opts.namespace, opts.controller_namespace]

    async def all_gone() -> bool:
        return await kube.arc_objects(namespaces) == 0

    if await kube.wait_until(all_gone, timeout=90):
        say("ok: the workers removed the scale set and everything it owned")
    else:
        say(f"the workers left {await kube.arc_objects(namespaces)} object(s) after 90 s; removing them directly")


async def _remove_created(kube: DemoKube, created: Created, say: Say) -> bool:
    """With the workers stopped: release what is left, delete the namespaces and CRDs the demo
    created, and wait until they are gone."""
    for ns in created.namespaces:
        released = await kube.release(ns)
        if released:
            say(f"released the finalizers of {released} leftover object(s) in {ns}")
    ok = await kube.delete_and_wait([f"/api/v1/namespaces/{ns}" for ns in created.namespaces], timeout=120)
    ok = await kube.delete_and_wait([f"{CRDS}/{name}" for name in created.crds], timeout=60) and ok
    say("ok: cleaned up the cluster" if ok else "FAILED: clean-up of the cluster did not finish in time")
    return ok


async def _workload(
    opts: DemoOptions, kube: DemoKube, http: aiohttp.ClientSession, sim_url: str, say: Say, latest: dict[str, str]
) -> int:
    deadline = time.monotonic() + opts.timeout
    ers_path = f"/apis/actions.github.com/v1alpha1/namespaces/{opts.namespace}/ephemeralrunners"
    ars_path = f"/apis/actions.github.com/v1alpha1/namespaces/{opts.namespace}/autoscalingrunnersets/{SCALE_SET}"

    async def snapshot() -> tuple[dict[str, int], dict[str, int], int]:
        jobs = await _sim(http, "GET", f"{sim_url}/_sim/jobs")
        by_state: dict[str, int] = {}
        for j in jobs if isinstance(jobs, list) else jobs.get("jobs", []):
            by_state[j.get("state", "?")] = by_state.get(j.get("state", "?"), 0) + 1
        runners = await kube.list_items(ers_path)
        ars = await kube.get(ars_path) or {}
        current = int((ars.get("status") or {}).get("currentRunners") or 0)
        return by_state, _phase_counts(runners), current

    async def wait_for(what: str, cond: Cond) -> bool:
        last = ""
        while time.monotonic() < deadline:
            jobs, phases, current = await snapshot()
            line = (
                f"  jobs {dict(sorted(jobs.items()))}  {latest.get('desired', 'desired=?')}"
                f"  runners {dict(sorted(phases.items()))}  ARS.currentRunners={current}"
            )
            if line != last:
                say(line)
                last = line
            if cond(jobs, phases, current):
                say(f"ok: {what}")
                return True
            await anyio.sleep(1.0)  # a demo's display tick, not synchronisation
        say(f"FAILED: {what} (timed out)")
        return False

    say("waiting for the scale set to be registered and its listener to open a message session ...")
    while True:
        sessions = await _sim(http, "GET", f"{sim_url}/_sim/sessions")
        if sessions:
            say(f"ok: listener session open ({len(sessions)} session)")
            break
        if time.monotonic() > deadline:
            say("FAILED: no listener session (timed out)")
            return 1
        await anyio.sleep(1.0)  # display tick
    total = 0
    for n, count in enumerate(opts.waves, 1):
        await _sim(
            http, "POST", f"{sim_url}/_sim/jobs", {"count": count, "labels": [SCALE_SET], "duration": opts.job_seconds}
        )
        total += count
        say(f"wave {n}: queued {count} job(s) of {opts.job_seconds:g}s")
        want_up = min(opts.max_runners, opts.min_runners + count)
        if count and not await wait_for(
            f"scaled up (>= {want_up} runner(s) for wave {n}) or done",
            _scaled_up_or_done(want_up, total),
        ):
            return 1
        if not await wait_for(f"wave {n} completed", _completed(total)):
            return 1
    if not await wait_for(
        f"scaled back down to minRunners={opts.min_runners}",
        lambda j, p, c: sum(v for k, v in p.items() if k != "Deleting") <= opts.min_runners,
    ):
        return 1
    say(f"demo finished: {total} job(s) ran on ephemeral runners; the set scaled up and back down")
    return 0


Cond = Callable[[dict[str, int], dict[str, int], int], bool]  # (jobs by state, runners by phase, currentRunners)


def _scaled_up_or_done(want_up: int, total: int) -> Cond:
    return lambda jobs, phases, _: sum(phases.values()) >= want_up or jobs.get("completed", 0) >= total


def _completed(total: int) -> Cond:
    return lambda jobs, _phases, _current: jobs.get("completed", 0) >= total


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    workdir = prepare_workdir(opts)
    try:
        if opts.verbose:
            return anyio.run(run_demo, opts, workdir, sys.stdout, sys.stdout)
        with (workdir / "children.log").open("w") as log:
            return anyio.run(run_demo, opts, workdir, log, sys.stdout)
    except KeyboardInterrupt:
        return 130
