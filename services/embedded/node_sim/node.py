"""The node simulator: scheduler + kubelet for the API emulator.

``NodeSim.run()`` list+watches pods and keeps one :class:`PodWorker` per pod it schedules or finds
bound to its node. A worker binds the pod, "runs" its containers (a real subprocess, the Actions
runner agent, or a simulated container), and writes the status a kubelet would through
``pods/status`` (read → render → PUT with that resourceVersion; 409 → read again). All tasks
live in the node sim's task group; a worker ends when its pod is gone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
from anyio.abc import ByteReceiveStream, Process

from services.embedded.actions_sim.runner_agent import DEFAULT_RUNNER_VERSION, run_runner
from shared.log import get_logger

from . import model
from .heartbeat import NodeHeartbeat, NodeIdentity
from .kube import TRANSIENT_ERRORS, KubeError, KubeRest, PodHandler, run_pod_informer
from .model import JIT_ENV, ContainerRuntime, Obj, PodRuntime
from .podspec import (
    ConfigError,
    MountError,
    StartError,
    build_command,
    container_mounts,
    in_cluster_env,
    referenced_objects,
    resolve_env,
    rewrite_env,
    rewrite_path,
    token_request_body,
    token_sources,
    volume_files,
)
from .probes import check, probe_plan

log = get_logger(__name__)

LOG_TAIL_LINES = 200
_TERMINATION_MESSAGE_BYTES = 2048


class NodeSimConfig(msgspec.Struct, kw_only=True):
    kubeconfig: str
    actions_url: str | None = None  # overrides the serverUrl inside runners' JIT configs
    node_name: str = "node-sim"
    namespace: str | None = None  # None: every namespace; "a,b": only pods of these namespaces
    exec_images: list[str] = msgspec.field(default_factory=lambda: ["*runnerscale*"])
    fail_image_pulls: list[str] = msgspec.field(default_factory=list)
    max_grace_seconds: float = 30.0
    restart_backoff_base: float = 1.0
    restart_backoff_max: float = 10.0
    retry_interval: float = 1.0  # re-check of a missing secret / failing image pull
    host_ip: str = "127.0.0.1"
    state_dir: str = ""  # per-pod volume dirs; default: a fresh temp dir
    runner_version: str = DEFAULT_RUNNER_VERSION
    request_timeout: float = 10.0
    # A pod's start is reported in one status write: after the binding, the status waits for its
    # first container to start (or to fail, or anything else worth reporting) at most this long
    # (issue 10: scheduled, IP and running were up to three writes per pod in a burst).
    start_status_delay: float = 1.0
    # After the binding, the first status write waits this long for the watch to bring the bound
    # pod (the version to write on) before reading it with a GET (issue 10: a GET per pod in a burst).
    bound_watch_wait: float = 1.0
    watch_timeout: int = 300
    node_labels: dict[str, str] = msgspec.field(default_factory=dict)
    # The Node object and its heartbeats (wherever the server serves nodes); see heartbeat.py.
    register_node: bool = True
    heartbeat_interval: float = 10.0  # node Lease renewals, as a kubelet's
    node_status_interval: float = 60.0  # Node condition heartbeats
    node_lease_seconds: int = 40


class ContainerHandle:
    """How a supervisor asks a running container to stop, and with what outcome."""

    def __init__(self) -> None:
        self.stop_requested = anyio.Event()
        self.grace = 0.0
        self.kill = False
        self.exit_code = 143  # what a simulated container reports when stopped (SIGTERM)
        self.override: tuple[int, str, str] | None = None  # forced (exit, reason, message)
        self.pid: int | None = None

    def stop(
        self, *, grace: float, exit_code: int = 143, kill: bool = False, override: tuple[int, str, str] | None = None
    ) -> None:
        if self.stop_requested.is_set():
            return
        self.grace, self.exit_code, self.kill, self.override = grace, exit_code, kill, override
        self.stop_requested.set()


class NodeSim(PodHandler):
    def __init__(self, config: NodeSimConfig, *, output: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.node_name = config.node_name
        self.node_labels = {
            "kubernetes.io/hostname": config.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **config.node_labels,
        }
        self.fail_image_pulls: list[str] = list(config.fail_image_pulls)
        self.workers: dict[str, PodWorker] = {}
        self.synced = anyio.Event()
        self.kube: KubeRest | None = None
        self._output = output or _stderr_line
        self._tg: anyio.abc.TaskGroup | None = None
        self._state_dir = Path(config.state_dir) if config.state_dir else None
        self._own_state_dir = False
        self.heartbeat: NodeHeartbeat | None = None
        # One connection pool for every runner agent's calls to the Actions service (issue 10:
        # a session and a new connection per runner); unlimited, as each runner long-polls.
        self.runner_connector: aiohttp.TCPConnector | None = None
        self._namespaces = tuple(n.strip() for n in (config.namespace or "").split(",") if n.strip())

    # --- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self._state_dir is None:
            self._state_dir = Path(tempfile.mkdtemp(prefix="runnerscale-node-sim-"))
            self._own_state_dir = True
        self.kube = await KubeRest.from_kubeconfig(self.config.kubeconfig, self.config.request_timeout)
        self.runner_connector = aiohttp.TCPConnector(limit=0)
        log.info("node simulator starting", node=self.node_name, namespace=self.config.namespace or "*")
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self.config.register_node:
                    self.heartbeat = NodeHeartbeat(
                        self.kube,
                        NodeIdentity(self.node_name, self.node_labels, self.config.host_ip),
                        heartbeat_interval=self.config.heartbeat_interval,
                        status_interval=self.config.node_status_interval,
                        lease_duration_seconds=self.config.node_lease_seconds,
                    )
                    tg.start_soon(self.heartbeat.run, name="node heartbeat")
                tg.start_soon(self._informer)
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True):
                await self.kube.close()
                await self.runner_connector.close()
                if self._own_state_dir:
                    shutil.rmtree(self._state_dir, ignore_errors=True)

    async def _informer(self) -> None:
        assert self.kube is not None

        async def synced() -> None:
            if not self.synced.is_set():
                log.info("node simulator synced", node=self.node_name, pods=len(self.workers))
            self.synced.set()

        # One namespace: watch just it; several: watch all and keep to those (``_manages``).
        only = self._namespaces[0] if len(self._namespaces) == 1 else None
        await run_pod_informer(self.kube, only, self, watch_timeout=self.config.watch_timeout, on_synced=synced)

    def output(self, line: str) -> None:
        self._output(line)

    def pod_dir(self, rt: PodRuntime) -> Path:
        assert self._state_dir is not None
        return self._state_dir / rt.namespace / f"{rt.name}-{rt.uid[:8]}"

    # --- informer callbacks ------------------------------------------------------------------

    def _manages(self, pod: Obj) -> bool:
        if self._namespaces and model.meta(pod).get("namespace") not in self._namespaces:
            return False
        node = model.spec(pod).get("nodeName") or ""
        if node == self.node_name:
            # A finished pod needs nothing more from a kubelet unless it is being deleted.
            return not model.is_terminal(pod) or bool(model.meta(pod).get("deletionTimestamp"))
        if node:
            return False
        return (
            model.wants_this_scheduler(pod)
            and not model.meta(pod).get("deletionTimestamp")
            and not model.is_terminal(pod)
        )

    async def on_sync(self, pods: list[Obj]) -> None:
        uids = {str(model.meta(p).get("uid", "")) for p in pods}
        for uid, w in list(self.workers.items()):
            if uid not in uids:
                w.mark_gone()
        for p in pods:
            await self.on_upsert(p)

    async def on_upsert(self, pod: Obj) -> None:
        uid = str(model.meta(pod).get("uid", ""))
        w = self.workers.get(uid)
        if w is not None:
            w.update(pod)
            return
        if not uid or not self._manages(pod) or self._tg is None:
            return
        w = PodWorker(self, pod)
        self.workers[uid] = w
        self._tg.start_soon(w.run, name=f"pod {model.pod_key(pod)}")

    async def on_delete(self, pod: Obj) -> None:
        w = self.workers.get(str(model.meta(pod).get("uid", "")))
        if w is not None:
            w.update(pod)
            w.mark_gone()

    # --- fault knobs and inspection ----------------------------------------------------------

    def add_image_pull_failure(self, pattern: str) -> None:
        if pattern not in self.fail_image_pulls:
            self.fail_image_pulls.append(pattern)

    def clear_image_pull_failures(self) -> None:
        self.fail_image_pulls.clear()

    def find(self, namespace: str, name: str) -> PodWorker | None:
        for w in self.workers.values():
            if w.rt.namespace == namespace and w.rt.name == name and not w.gone.is_set():
                return w
        return None

    def crash(self, namespace: str, name: str, container: str | None = None, exit_code: int = 137) -> bool:
        """Kill a running container (a process gets SIGKILL); restartPolicy then applies."""
        w = self.find(namespace, name)
        return w.crash(container, exit_code) if w is not None else False

    def lose_node(self) -> int:
        """The node vanishes under its pods: every container is killed and every pod on the node
        ends Failed (reason NodeLost, containers ContainerStatusUnknown / 137). The node sim then
        carries on as a fresh node of the same name (new pods are scheduled again)."""
        n = 0
        for w in list(self.workers.values()):
            if w.bound and not w.gone.is_set() and not model.is_terminal(w.pod):
                w.lose()
                n += 1
        log.warning("node lost", node=self.node_name, pods=n)
        return n

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {
                "namespace": w.rt.namespace,
                "name": w.rt.name,
                "uid": w.rt.uid,
                "kind": w.rt.kind,
                "runtime": msgspec.to_builtins(w.rt),
                "pids": w.pids(),
            }
            for w in self.workers.values()
        ]

    def logs(self, namespace: str, name: str, container: str | None = None) -> list[str]:
        w = self.find(namespace, name)
        if w is None:
            return []
        return list(w.log_tail(container))


def _stderr_line(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _Prepared(msgspec.Struct):
    env: dict[str, str]
    argv: list[str] = msgspec.field(default_factory=list)
    cwd: str = ""
    start_error: str = ""


class PodWorker:
    """Everything the node does for one pod, from binding to the final delete."""

    def __init__(self, node: NodeSim, pod: Obj) -> None:
        self.node = node
        self.cfg = node.config
        self.pod = pod
        kind = model.pod_kind(pod, self.cfg.exec_images)
        now = model.now_rfc3339()
        if (model.spec(pod).get("nodeName") or "") == node.node_name:
            # Bound before this node-sim process saw it: a restart, or spec.nodeName set directly.
            self.rt = model.adopt_runtime(pod, kind, now)
        else:
            self.rt = model.new_runtime(pod, kind)
        self.kind = kind
        self.main = model.main_container_name(pod, kind)
        self.log = log.bind(namespace=self.rt.namespace, name=self.rt.name, uid=self.rt.uid)
        self.deleting = anyio.Event()
        self.gone = anyio.Event()
        self.stopping = anyio.Event()
        self._changed = anyio.Event()
        self._dirty = anyio.Event()
        self._start_reported = anyio.Event()  # the start's status may be written (see start_status_delay)
        self._prefetched: dict[tuple[str, str], Obj | None] = {}  # read for the volumes, used by the first start
        self._write_lock = anyio.Lock()
        self.handles: dict[str, ContainerHandle] = {}
        self._tails: dict[str, deque[str]] = {}
        self._last_event: tuple[str, str] | None = None
        self._lost = False
        self._read_before_write = False  # self.pod's version is known to be old (after the binding)
        self.main_done = anyio.Event()
        self._volume_dirs: dict[str, str] = {}
        self.update(pod)

    # --- state from the watch --------------------------------------------------------------

    @property
    def bound(self) -> bool:
        return bool(self.rt.scheduled_at)

    def update(self, pod: Obj) -> None:
        if str(model.meta(pod).get("uid", "")) != self.rt.uid:
            return
        if _older(pod, self.pod):
            return  # a watch event from before this worker's own last write: keep the newer copy
        self.pod = pod
        self._read_before_write = False
        if model.meta(pod).get("deletionTimestamp"):
            self.deleting.set()
        self._changed.set()

    def mark_gone(self) -> None:
        self.gone.set()
        self.deleting.set()
        self._changed.set()

    def mark(self, *, starting: bool = False) -> None:
        """The runtime changed: the status syncer writes it. ``starting``: an ordinary step of the
        pod's start (scheduled, IP, init containers), written with what follows it."""
        if not starting:
            self._start_reported.set()
        self._dirty.set()

    def _arm(self) -> anyio.Event:
        """A fresh change event, taken before reading ``self.pod`` so no update is missed."""
        self._changed = anyio.Event()
        return self._changed

    @staticmethod
    async def _wait(event: anyio.Event, timeout: float | None = None) -> None:
        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            await event.wait()

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Wait ``seconds``; True when the pod must stop meanwhile (then stop waiting)."""
        with anyio.move_on_after(seconds):
            await self.stopping.wait()
        return self.stopping.is_set()

    # --- run -----------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._status_syncer)
                await self._lifecycle()
                tg.cancel_scope.cancel()
        except Exception:  # a bug must not take the node down; the next relist adopts the pod
            self.log.exception("pod worker failed")
        finally:
            if self.node.workers.get(self.rt.uid) is self:
                del self.node.workers[self.rt.uid]
            if self.rt.scheduled_at and self.node._state_dir is not None:
                shutil.rmtree(self.node.pod_dir(self.rt), ignore_errors=True)

    async def _lifecycle(self) -> None:
        if not self.bound and not await self._schedule():
            return
        if not model.is_terminal(self.pod):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._run_pod)
                await self.deleting.wait()
                await self._stop_for_deletion()
        else:
            await self.deleting.wait()  # a finished pod only waits for its deletion
        if not self.gone.is_set():
            # The kubelet's part of a graceful delete: report the stopped containers, then remove
            # the pod with grace 0 (the emulator keeps bound, running pods until then).
            await self._flush()
            await self._finalize_delete()
        await self.gone.wait()

    async def _stop_for_deletion(self) -> None:
        m, s = model.meta(self.pod), model.spec(self.pod)
        grace = m.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = s.get("terminationGracePeriodSeconds", 30)
        grace = max(0.0, min(float(grace or 0), self.cfg.max_grace_seconds))
        if self.gone.is_set():
            grace = min(grace, 2.0)  # force-deleted: nobody waits for a graceful stop
        if self.handles:
            await self._event("Normal", "Killing", f"Stopping container {' '.join(self.handles)}")
        self.stopping.set()
        for h in list(self.handles.values()):
            h.stop(grace=grace)

    async def _finalize_delete(self) -> None:
        assert self.node.kube is not None
        for attempt in range(5):
            try:
                await self.node.kube.delete_pod_now(self.rt.namespace, self.rt.name, self.rt.uid)
                return
            except TRANSIENT_ERRORS as exc:
                self.log.warning("final delete failed", error=str(exc), attempt=attempt)
                if await self._gone_within(0.5 * (attempt + 1)):
                    return

    async def _gone_within(self, seconds: float) -> bool:
        with anyio.move_on_after(seconds):
            await self.gone.wait()
        return self.gone.is_set()

    # --- scheduling ------------------------------------------------------------------------

    async def _schedule(self) -> bool:
        assert self.node.kube is not None
        while not self.gone.is_set():
            changed = self._arm()
            node = model.spec(self.pod).get("nodeName") or ""
            if node:
                if node != self.node.node_name:
                    return False
                break
            if self.deleting.is_set():
                return False
            reason, message = model.scheduling_verdict(self.pod, self.node.node_name, self.node.node_labels)
            if reason:
                if (self.rt.unschedulable_reason, self.rt.unschedulable_message) != (reason, message):
                    self.rt.unschedulable_reason, self.rt.unschedulable_message = reason, message
                    self.mark()
                    await self._event("Warning", "FailedScheduling", message)
                await self._wait(changed)
                continue
            try:
                await self.node.kube.bind_pod(self.rt.namespace, self.rt.name, self.rt.uid, self.node.node_name)
            except KubeError as exc:
                if exc.status == 404:
                    return False
                if exc.status == 409:
                    # Bound meanwhile (by another node sim?) or being deleted: look again.
                    try:
                        fresh = await self._read()
                    except TRANSIENT_ERRORS:
                        fresh = self.pod
                        await self._wait(changed, self.cfg.retry_interval)
                    if fresh is None:
                        return False
                    self.update(fresh)
                    continue
                self.log.warning("binding failed", error=str(exc))
                await self._wait(changed, self.cfg.retry_interval)
                continue
            except TRANSIENT_ERRORS as exc:
                self.log.warning("binding failed", error=str(exc))
                await self._wait(changed, self.cfg.retry_interval)
                continue
            if model.spec(self.pod).get("nodeName") != self.node.node_name:  # the watch has not brought it yet
                self.pod = {**self.pod, "spec": {**model.spec(self.pod), "nodeName": self.node.node_name}}
                self._read_before_write = True  # the binding changed the pod: this copy's version is old
            await self._event(
                "Normal",
                "Scheduled",
                f"Successfully assigned {self.rt.namespace}/{self.rt.name} to {self.node.node_name}",
            )
            break
        if self.gone.is_set():
            return False
        self.rt.scheduled_at = model.now_rfc3339()
        self.rt.unschedulable_reason = self.rt.unschedulable_message = ""
        self.mark(starting=True)
        return True

    async def _read(self) -> Obj | None:
        assert self.node.kube is not None
        pod = await self.node.kube.get("pods", self.rt.namespace, self.rt.name)
        if pod is None or str(model.meta(pod).get("uid", "")) != self.rt.uid:
            self.mark_gone()
            return None
        return pod

    # --- the pod's containers ----------------------------------------------------------------

    async def _run_pod(self) -> None:
        rt = self.rt
        if not rt.start_time:
            rt.start_time = model.now_rfc3339()
        rt.host_ip = rt.host_ip or self.cfg.host_ip
        if not rt.pod_ip:
            # Process pods really listen on this host, so their IP is the host's (like hostNetwork).
            host_net = self.kind == "process" or model.spec(self.pod).get("hostNetwork")
            rt.pod_ip = rt.host_ip if host_net else model.pod_ip_for(rt.uid)
        self.mark(starting=True)
        if not await self._setup_volumes():
            return
        if not rt.initialized:
            for ic in rt.init_containers:
                if not await self._pull(ic):
                    return
                now = model.now_rfc3339()
                ic.set_running(rt.uid, now)
                if not ic.sidecar:
                    ic.set_terminated(0, "Completed", "", now)  # init containers are simulated: done at once
            rt.initialized = True
            self.mark(starting=True)
        else:
            for ic in rt.init_containers:
                if ic.sidecar and ic.state != "running":
                    if ic.state == "terminated":
                        ic.restart_count += 1
                    ic.set_running(rt.uid, model.now_rfc3339())
            self.mark()
        async with anyio.create_task_group() as tg:
            for c in rt.containers:
                tg.start_soon(self._supervise, c)
        for ic in rt.init_containers:
            if ic.sidecar and ic.state == "running":
                ic.set_terminated(0, "Completed", "", model.now_rfc3339())
        self.mark()

    async def _setup_volumes(self) -> bool:
        """Fetch and (for process pods) write the pod's volumes; FailedMount until they exist."""
        while not self.stopping.is_set():
            try:
                objects = await self._fetch(referenced_objects(self.pod))
                self._prefetched = objects
                tokens = await self._service_account_tokens() if self.kind == "process" else None
                files = volume_files(self.pod, objects, tokens)
            except MountError as exc:
                await self._event("Warning", "FailedMount", str(exc))
                if await self._sleep_or_stop(self.cfg.retry_interval):
                    return False
                continue
            except TRANSIENT_ERRORS as exc:
                self.log.warning("reading volume sources failed", error=str(exc))
                if await self._sleep_or_stop(self.cfg.retry_interval):
                    return False
                continue
            if self.kind == "process":
                try:
                    self.node.pod_dir(self.rt).mkdir(parents=True, exist_ok=True)
                    self._volume_dirs = _materialise(self.node.pod_dir(self.rt) / "volumes", files)
                except OSError as exc:  # the state dir is unwritable: say so on the pod, retry
                    await self._event("Warning", "FailedMount", f"MountVolume.SetUp failed: {exc}")
                    if await self._sleep_or_stop(self.cfg.retry_interval):
                        return False
                    continue
            return True
        return False

    async def _service_account_tokens(self) -> dict[tuple[str, str], bytes]:
        """A TokenRequest per projected token file, as the kubelet makes (not rotated here)."""
        assert self.node.kube is not None
        sa = model.spec(self.pod).get("serviceAccountName") or "default"
        out = {}
        for src in token_sources(self.pod):
            try:
                answer = await self.node.kube.request(
                    "POST",
                    f"/api/v1/namespaces/{self.rt.namespace}/serviceaccounts/{sa}/token",
                    body=token_request_body(src),
                )
            except KubeError as exc:
                if exc.status >= 500:
                    raise
                raise MountError(
                    f'MountVolume.SetUp failed for volume "{src.volume}" : failed to fetch token: {exc.message}'
                ) from None
            out[(src.volume, src.path)] = str((answer.get("status") or {}).get("token", "")).encode()
        return out

    async def _fetch(self, refs: set[tuple[str, str]]) -> dict[tuple[str, str], Obj | None]:
        assert self.node.kube is not None
        return {ref: await self.node.kube.get(ref[0], self.rt.namespace, ref[1]) for ref in sorted(refs)}

    def _container_spec(self, name: str) -> Obj:
        for c in model.spec(self.pod).get("containers") or []:
            if isinstance(c, dict) and c.get("name") == name:
                return c
        return {}

    async def _supervise(self, c: ContainerRuntime) -> None:
        cspec = self._container_spec(c.name)
        policy = model.spec(self.pod).get("restartPolicy") or "Always"
        is_main = c.name == self.main
        try:
            while not self.stopping.is_set():
                if not is_main and self.main_done.is_set():
                    # The main container finished for good: a sidecar not running ends with it.
                    if c.state != "terminated":
                        c.set_terminated(0, "Completed", "", model.now_rfc3339())
                        self.mark()
                    return
                if c.state == "terminated" and c.terminated is not None:
                    if not model.should_restart(policy, c.terminated.exit_code):
                        return
                    delay = model.crash_backoff(
                        c.restart_count, self.cfg.restart_backoff_base, self.cfg.restart_backoff_max
                    )
                    c.set_waiting(
                        "CrashLoopBackOff",
                        f"back-off {delay:g}s restarting failed container={c.name} pod={self.rt.name}_{self.rt.namespace}({self.rt.uid})",
                    )
                    self.mark()
                    await self._event(
                        "Warning",
                        "BackOff",
                        f"Back-off restarting failed container {c.name} in pod {self.rt.name}_{self.rt.namespace}({self.rt.uid})",
                    )
                    if await self._sleep_or_stop(delay):
                        return
                    c.restart_count += 1
                if not await self._pull(c):
                    return
                prepared = await self._prepare(c, cspec, is_main)
                if prepared is None:
                    return
                if not is_main and self.main_done.is_set():
                    continue
                now = model.now_rfc3339()
                if prepared.start_error:
                    c.set_running(self.rt.uid, now)
                    c.started_at = "1970-01-01T00:00:00Z"  # what a kubelet shows for a container that never started
                    c.set_terminated(128, "StartError", prepared.start_error, now)
                    self.mark()
                    await self._event("Warning", "Failed", f"Error: {prepared.start_error}")
                    continue
                handle = ContainerHandle()
                self.handles[c.name] = handle
                self._tails.pop(c.name, None)  # a new run has its own log (like `kubectl logs`)
                c.set_running(self.rt.uid, now)
                if is_main and self.kind == "process" and isinstance(cspec.get("readinessProbe"), dict):
                    c.ready = False  # not ready until the probe passes (only processes are probed)
                self.mark()
                await self._event("Normal", "Started", f"Started container {c.name}")
                try:
                    code, reason, message = await self._execute(c, cspec, prepared, handle, is_main)
                finally:
                    self.handles.pop(c.name, None)
                if handle.override is not None:
                    code, reason, message = handle.override
                c.set_terminated(code, reason, message, model.now_rfc3339())
                self.mark()
                self.log.info("container exited", container=c.name, exit_code=code, reason=reason)
        finally:
            if is_main and not self.stopping.is_set() and c.state == "terminated":
                # The main container is done for good: its sidecars exit with it.
                self.main_done.set()
                for name, h in list(self.handles.items()):
                    if name != c.name:
                        h.stop(grace=0, exit_code=0)

    async def _pull(self, c: ContainerRuntime) -> bool:
        """Image pull, failing while a fault pattern matches (ErrImagePull ↔ ImagePullBackOff)."""
        backoff = self.cfg.retry_interval
        while model.image_pull_fails(c.image, self.node.fail_image_pulls):
            c.set_waiting(
                "ErrImagePull", f'failed to pull and unpack image "{c.image}": simulated pull failure (node-sim fault)'
            )
            self.mark()
            await self._event(
                "Warning", "Failed", f'Failed to pull image "{c.image}": simulated pull failure (node-sim fault)'
            )
            if await self._sleep_or_stop(self.cfg.retry_interval / 2):
                return False
            c.set_waiting("ImagePullBackOff", f'Back-off pulling image "{c.image}"')
            self.mark()
            await self._event("Normal", "BackOff", f'Back-off pulling image "{c.image}"')
            if await self._sleep_or_stop(backoff):
                return False
            backoff = min(backoff * 2, self.cfg.restart_backoff_max)
        return not self.stopping.is_set()

    async def _prepare(self, c: ContainerRuntime, cspec: Obj, is_main: bool) -> _Prepared | None:
        """Resolve env (and, for a process, the command); CreateContainerConfigError until it works."""
        # The first start uses what the volume setup read a moment ago (one read per object);
        # a retry or a restart reads again.
        prefetched, self._prefetched = self._prefetched, {}
        while not self.stopping.is_set():
            try:
                refs = _container_refs(self.pod, cspec)
                if prefetched and c.restart_count == 0 and refs <= prefetched.keys():
                    objects = {ref: prefetched[ref] for ref in refs}
                else:
                    objects = await self._fetch(refs)
                prefetched = {}
                env = resolve_env(self.pod, cspec, objects, self.rt.pod_ip, self.rt.host_ip)
                if is_main and self.kind == "runner" and not env.get(JIT_ENV):
                    raise ConfigError(f"{JIT_ENV} is empty")
                if not (is_main and self.kind == "process"):
                    return _Prepared(env=env)
                mounts = container_mounts(cspec, self._volume_dirs)
                assert self.node.kube is not None
                # The kubelet's service variables come first; the container's own env wins.
                env = {**in_cluster_env(self.node.kube.host, mounts), **rewrite_env(env, mounts)}
                cwd = str(self.node.pod_dir(self.rt))
                if cspec.get("workingDir"):
                    wd = rewrite_path(str(cspec["workingDir"]), mounts)
                    if await anyio.Path(wd).is_dir():
                        cwd = wd
                try:
                    argv = build_command(cspec, env, mounts)
                except StartError as exc:
                    return _Prepared(env=env, start_error=str(exc))
                return _Prepared(env=env, argv=argv, cwd=cwd)
            except ConfigError as exc:
                if (c.reason, c.message) != ("CreateContainerConfigError", str(exc)) or c.state != "waiting":
                    c.set_waiting("CreateContainerConfigError", str(exc))
                    self.mark()
                    self.log.warning("container config error", container=c.name, error=str(exc))
                await self._event("Warning", "Failed", f"Error: {exc}")
            except TRANSIENT_ERRORS as exc:
                self.log.warning("reading container config failed", container=c.name, error=str(exc))
            if await self._sleep_or_stop(self.cfg.retry_interval):
                return None
        return None

    async def _execute(
        self, c: ContainerRuntime, cspec: Obj, prepared: _Prepared, handle: ContainerHandle, is_main: bool
    ) -> tuple[int, str, str]:
        if is_main and self.kind == "runner":
            return await self._run_runner(c, prepared.env[JIT_ENV], handle)
        if is_main and self.kind == "process":
            return await self._run_process(c, cspec, prepared, handle)
        await handle.stop_requested.wait()  # a simulated container runs until stopped
        return handle.exit_code, model.exit_reason(handle.exit_code), ""

    async def _run_runner(self, c: ContainerRuntime, jit: str, handle: ContainerHandle) -> tuple[int, str, str]:
        outcome: list[tuple[int, str]] = []

        async def play(scope: anyio.CancelScope) -> None:
            try:
                res = await run_runner(
                    self.cfg.actions_url,
                    jit,
                    version=self.cfg.runner_version,
                    request_timeout=self.cfg.request_timeout,
                    connector=self.node.runner_connector,
                )
                outcome.append(
                    (
                        res.exit_code,
                        f"runner {res.runner_name}: {res.reason}"
                        + (f" (job {res.job_id} {res.result})" if res.job_id else ""),
                    )
                )
            except Exception as exc:  # the agent must not take the worker down: the container errs
                outcome.append((1, f"runner failed: {type(exc).__name__}: {exc}"))
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(play, tg.cancel_scope)
            await handle.stop_requested.wait()
            tg.cancel_scope.cancel()
        if outcome and not handle.stop_requested.is_set():
            code, line = outcome[0]
            self._append_log(c.name, line)
            return code, model.exit_reason(code), self._termination_message(c.name, code)
        return handle.exit_code, model.exit_reason(handle.exit_code), ""

    async def _run_process(
        self, c: ContainerRuntime, cspec: Obj, prepared: _Prepared, handle: ContainerHandle
    ) -> tuple[int, str, str]:
        env = {**os.environ, "HOSTNAME": self.rt.name, **prepared.env}
        cmd = [sys.executable, "-m", "services.embedded.node_sim.launch", str(os.getpid()), "--", *prepared.argv]
        self.log.info("starting process", container=c.name, argv=prepared.argv)
        try:
            proc = await anyio.open_process(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=prepared.cwd or None,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return 128, "StartError", str(exc)
        handle.pid = proc.pid
        try:
            async with anyio.create_task_group() as tg:
                assert proc.stdout is not None and proc.stderr is not None
                tg.start_soon(self._pump, proc.stdout, c.name)
                tg.start_soon(self._pump, proc.stderr, c.name)

                async def on_stop() -> None:
                    await handle.stop_requested.wait()
                    await _terminate(proc, handle.grace, handle.kill)

                tg.start_soon(on_stop)
                for which in ("readiness", "liveness"):
                    probe = cspec.get(f"{which}Probe")
                    if isinstance(probe, dict):
                        tg.start_soon(self._probe_loop, which, probe, c, cspec, handle)
                await proc.wait()
                tg.cancel_scope.cancel()
        finally:
            if proc.returncode is None:  # cancelled (node sim shutting down): do not leak it
                with anyio.CancelScope(shield=True):
                    await _terminate(proc, 2.0, False)
        code = model.returncode_to_exit_code(proc.returncode or 0)
        return code, model.exit_reason(code), self._termination_message(c.name, code)

    async def _probe_loop(
        self, which: str, probe: Obj, c: ContainerRuntime, cspec: Obj, handle: ContainerHandle
    ) -> None:
        """Probe the running process like a kubelet: readiness flips ``ready`` after the success /
        failure thresholds; liveness failing ``failureThreshold`` times in a row stops the
        container (SIGTERM, the pod's grace) so that restartPolicy applies."""
        plan = probe_plan(probe, cspec, self.rt.pod_ip)
        if plan.error:
            self.log.warning("probe cannot be checked", container=c.name, probe=which, error=plan.error)
        title = which.capitalize()

        async def pause(seconds: float) -> bool:
            with anyio.move_on_after(seconds):
                await handle.stop_requested.wait()
            return handle.stop_requested.is_set()

        if await pause(plan.initial_delay):
            return
        successes = failures = 0
        async with aiohttp.ClientSession() as http:
            while True:
                ok, message = await check(plan, http)
                successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
                if handle.stop_requested.is_set():
                    return
                if not ok:
                    await self._event("Warning", "Unhealthy", f"{title} probe failed: {message}")
                if which == "readiness":
                    if ok and successes >= plan.success_threshold and not c.ready:
                        c.ready = True
                        self.mark()
                    elif not ok and failures >= plan.failure_threshold and c.ready:
                        c.ready = False
                        self.mark()
                elif failures >= plan.failure_threshold:
                    await self._event(
                        "Normal", "Killing", f"Container {c.name} failed liveness probe, will be restarted"
                    )
                    grace = model.spec(self.pod).get("terminationGracePeriodSeconds", 30)
                    handle.stop(grace=max(0.0, min(float(grace or 0), self.cfg.max_grace_seconds)))
                    return
                if await pause(plan.period):
                    return

    async def _pump(self, stream: ByteReceiveStream, container: str) -> None:
        buf = b""
        try:
            async for chunk in stream:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._emit(container, line)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        if buf:
            self._emit(container, buf)

    def _emit(self, container: str, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        self._append_log(container, line)
        self.node.output(f"[{self.rt.name}] {line}")

    def _append_log(self, container: str, line: str) -> None:
        self._tails.setdefault(container, deque(maxlen=LOG_TAIL_LINES)).append(line)

    def log_tail(self, container: str | None = None) -> list[str]:
        return list(
            self._tails.get(container or self.main or (self.rt.containers[0].name if self.rt.containers else ""), ())
        )

    def _termination_message(self, container: str, code: int) -> str:
        """``terminationMessagePolicy: FallbackToLogsOnError``: the log tail of a failed container."""
        if code == 0 or self._container_spec(container).get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return ""
        text = "\n".join(list(self._tails.get(container, ()))[-80:])
        return text[-_TERMINATION_MESSAGE_BYTES:]

    def pids(self) -> dict[str, int]:
        return {name: h.pid for name, h in self.handles.items() if h.pid is not None}

    # --- faults ------------------------------------------------------------------------------

    def crash(self, container: str | None, exit_code: int) -> bool:
        name = container or self.main or (self.rt.containers[0].name if self.rt.containers else "")
        h = self.handles.get(name)
        if h is None:
            return False
        self.log.warning("crashing container (fault)", container=name, exit_code=exit_code)
        # A process is SIGKILLed and reports what it really exited with (137); others report exit_code.
        h.stop(
            grace=0,
            exit_code=exit_code,
            kill=True,
            override=None if h.pid is not None else (exit_code, model.exit_reason(exit_code), ""),
        )
        return True

    def lose(self) -> None:
        self._lost = True
        self.stopping.set()
        lost = (model.LOST_EXIT_CODE, model.LOST_REASON, model.LOST_MESSAGE)
        for h in list(self.handles.values()):
            h.stop(grace=0, exit_code=model.LOST_EXIT_CODE, kill=True, override=lost)
        model.lose_runtime(self.rt, self.node.node_name, model.now_rfc3339())
        self.mark()

    # --- status and events -------------------------------------------------------------------

    async def _status_syncer(self) -> None:
        while not self.gone.is_set():
            await self._dirty.wait()
            if not self._start_reported.is_set():
                with anyio.move_on_after(self.cfg.start_status_delay):
                    await self._start_reported.wait()
                self._start_reported.set()  # held once: later changes are written as they come
            await self._flush()

    async def _flush(self) -> None:
        """Write the rendered runtime until the server has it (or the pod is gone).

        The write is a PUT of the whole pod with its resourceVersion, so it is decided on the pod
        as the watch (or this worker's last write) left it, without a GET first (issue 10: a GET
        per status write was a tenth of node-sim's time in a burst); a 409 reads the pod and
        decides again."""
        assert self.node.kube is not None
        async with self._write_lock:
            backoff = 0.2
            if self._read_before_write:
                # The watch brings the bound pod shortly (update() clears the flag): wait for it.
                with anyio.move_on_after(self.cfg.bound_watch_wait):
                    while self._read_before_write and not self.gone.is_set():
                        await self._arm().wait()
            read_first = self._read_before_write
            while self._dirty.is_set() and not self.gone.is_set():
                self._dirty = anyio.Event()
                if self._lost:
                    # Containers killed by the loss may have reported ordinary exits meanwhile.
                    model.lose_runtime(self.rt, self.node.node_name, model.now_rfc3339())
                try:
                    live = await self._read() if read_first else self.pod
                    read_first = self._read_before_write = False
                    if live is None:
                        return
                    if (model.spec(live).get("nodeName") or "") not in ("", self.node.node_name):
                        return  # another node took it (the scheduling loop sees that and lets go)
                    self.pod = live
                    if model.meta(live).get("deletionTimestamp"):
                        self.deleting.set()
                    status = model.render_status(live, self.rt, model.now_rfc3339())
                    if live.get("status") == status:
                        continue
                    written = await self.node.kube.replace_pod_status({**live, "status": status})
                    if str(model.meta(written).get("uid", "")) == self.rt.uid:
                        self.pod = written  # the newest this worker knows: the next write's base
                    backoff = 0.2
                except KubeError as exc:
                    self._dirty.set()
                    if exc.status == 409:
                        read_first = True  # decided on a stale copy: read the pod and decide again
                        continue
                    if exc.status == 404:
                        self.mark_gone()
                        return
                    self.log.warning("status write failed", error=str(exc))
                    await anyio.sleep(backoff)  # backoff before retrying the write
                    backoff = min(backoff * 2, 5.0)
                except TRANSIENT_ERRORS as exc:
                    self._dirty.set()
                    self.log.warning("status write failed", error=f"{type(exc).__name__}: {exc}")
                    await anyio.sleep(backoff)  # backoff before retrying the write
                    backoff = min(backoff * 2, 5.0)

    async def _event(self, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about the pod, as a kubelet records it; best effort, repeats dropped."""
        if self._last_event == (reason, message) or self.node.kube is None:
            return
        self._last_event = (reason, message)
        now = model.now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.rt.name}.{secrets.token_hex(8)}", "namespace": self.rt.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": self.rt.namespace,
                "name": self.rt.name,
                "uid": self.rt.uid,
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {
                "component": "kubelet" if reason != "Scheduled" else "default-scheduler",
                "host": self.node.node_name,
            },
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "kubelet" if reason != "Scheduled" else "default-scheduler",
            "reportingInstance": self.node.node_name,
        }
        try:
            await self.node.kube.create_event(self.rt.namespace, event)
        except TRANSIENT_ERRORS as exc:
            self.log.debug("event not recorded", reason=reason, error=str(exc))


def _older(pod: Obj, than: Obj) -> bool:
    """``pod`` is an older version than ``than`` (resourceVersions compared as integers, as etcd
    and the emulator issue them; opaque versions are never judged older)."""
    try:
        return int(model.meta(pod).get("resourceVersion", "")) < int(model.meta(than).get("resourceVersion", ""))
    except (TypeError, ValueError):
        return False


def _container_refs(pod: Obj, cspec: Obj) -> set[tuple[str, str]]:
    return referenced_objects({"metadata": model.meta(pod), "spec": {"containers": [cspec]}})


def _materialise(root: Path, files: dict[str, list[tuple[str, bytes, int]]]) -> dict[str, str]:
    """Write each volume's files under ``root/<volume>``; returns volume name → directory."""
    dirs: dict[str, str] = {}
    for vname, items in files.items():
        vdir = root / vname
        if vdir.exists():
            shutil.rmtree(vdir)  # a re-run (restart, adoption) writes the current content afresh
        vdir.mkdir(parents=True, exist_ok=True)
        for rel, content, mode in items:
            path = vdir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            os.chmod(path, mode & 0o777 or 0o644)
        dirs[vname] = str(vdir)
    return dirs


async def _terminate(proc: Process, grace: float, kill: bool) -> None:
    """SIGTERM the process group (SIGKILL when ``kill``), SIGKILL after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
    with anyio.move_on_after(grace):
        await proc.wait()
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
