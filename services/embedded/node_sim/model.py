"""Pure decisions of the node simulator: which pods it takes, what each container is, and the
pod status a kubelet would report for the node sim's in-memory view of a pod.

Nothing here does I/O. The async shells (:mod:`services.embedded.node_sim.node`) keep a
:class:`PodRuntime` per pod, change it as containers start and stop, and write
``render_status(pod, runtime, now)`` through ``pods/status``.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import time
from typing import Any, Literal

import msgspec

Obj = dict[str, Any]

RUNNER_CONTAINER = "runner"
JIT_ENV = "ACTIONS_RUNNER_INPUT_JITCONFIG"
EXEC_ANNOTATION = "runnerscale.dev/node-sim-exec"
DEFAULT_SCHEDULER = "default-scheduler"

# Exit code and words a kubelet reports for a container that vanished with its node/runtime.
LOST_EXIT_CODE = 137
LOST_REASON = "ContainerStatusUnknown"
LOST_MESSAGE = "The container could not be located when the pod was terminated"

PodKind = Literal["runner", "process", "plain"]


_formatted_second: list[tuple[int, str]] = [(-1, "")]  # the last second formatted (timestamps are whole seconds)


def now_rfc3339(now: float | None = None) -> str:
    second = int(time.time() if now is None else now)
    last = _formatted_second[0]
    if last[0] == second:
        return last[1]
    text = dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _formatted_second[0] = (second, text)
    return text


# --- which pods, which kind ---------------------------------------------------------------------


def meta(pod: Obj) -> Obj:
    return pod.get("metadata") or {}


def spec(pod: Obj) -> Obj:
    return pod.get("spec") or {}


def pod_key(pod: Obj) -> str:
    m = meta(pod)
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def runner_container(pod: Obj) -> Obj | None:
    """The container named ``runner`` if it carries a JIT config env var (ARC's runner pod)."""
    for c in spec(pod).get("containers") or []:
        if (
            isinstance(c, dict)
            and c.get("name") == RUNNER_CONTAINER
            and any(isinstance(e, dict) and e.get("name") == JIT_ENV for e in c.get("env") or [])
        ):
            return c
    return None


def pod_kind(pod: Obj, exec_images: list[str]) -> PodKind:
    """``runner`` (played by the Actions runner agent), ``process`` (first container run as a real
    subprocess: exec annotation, or an image matching one of ``exec_images`` globs) or ``plain``
    (every container simulated: runs until stopped)."""
    if runner_container(pod) is not None:
        return "runner"
    ann = meta(pod).get("annotations") or {}
    if str(ann.get(EXEC_ANNOTATION, "")).lower() == "true":
        return "process"
    containers = spec(pod).get("containers") or []
    if containers and isinstance(containers[0], dict):
        image = str(containers[0].get("image") or "")
        if any(fnmatch.fnmatchcase(image, pat) for pat in exec_images):
            return "process"
    return "plain"


def main_container_name(pod: Obj, kind: PodKind) -> str:
    """The container whose exit ends the pod (the others are sidecars to it); none for plain pods."""
    if kind == "runner":
        return RUNNER_CONTAINER
    if kind == "process":
        containers = spec(pod).get("containers") or []
        return str(containers[0].get("name", "")) if containers else ""
    return ""


def scheduling_verdict(pod: Obj, node_name: str, node_labels: dict[str, str]) -> tuple[str, str]:
    """('', '') when this node can take the pod, else (reason, message) for PodScheduled=False."""
    s = spec(pod)
    gates = s.get("schedulingGates") or []
    if gates:
        return "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"
    selector = s.get("nodeSelector") or {}
    if any(node_labels.get(k) != v for k, v in selector.items()):
        return (
            "Unschedulable",
            "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
        )
    return "", ""


def wants_this_scheduler(pod: Obj) -> bool:
    return (spec(pod).get("schedulerName") or DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER


def image_pull_fails(image: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(image, p) or p in image for p in patterns)


def crash_backoff(restart_count: int, base: float, cap: float) -> float:
    """CrashLoopBackOff delay before restart number ``restart_count + 1`` (doubling, capped)."""
    return min(cap, base * float(2 ** max(restart_count, 0)))


def should_restart(restart_policy: str, exit_code: int) -> bool:
    if restart_policy == "Always":
        return True
    if restart_policy == "OnFailure":
        return exit_code != 0
    return False


def exit_reason(exit_code: int) -> str:
    return "Completed" if exit_code == 0 else "Error"


def returncode_to_exit_code(returncode: int) -> int:
    """A process killed by signal N (Python: -N) shows as 128+N, as a container runtime reports."""
    return 128 - returncode if returncode < 0 else returncode


def pod_ip_for(uid: str) -> str:
    """A stable fake pod IP from the uid (stable across node-sim restarts, no allocator state)."""
    h = int(hashlib.sha256(uid.encode()).hexdigest(), 16)
    return f"10.244.{(h >> 8) % 250 + 1}.{h % 250 + 2}"


def container_id_for(uid: str, name: str, restart: int) -> str:
    return "containerd://" + hashlib.sha256(f"{uid}/{name}/{restart}".encode()).hexdigest()


def image_id_for(image: str) -> str:
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    if "/" not in repo:
        repo = f"docker.io/library/{repo}"
    return f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


# --- the runtime view ---------------------------------------------------------------------------


class Terminated(msgspec.Struct, kw_only=True):
    exit_code: int
    reason: str
    message: str = ""
    started_at: str = ""
    finished_at: str = ""
    container_id: str = ""


class ContainerRuntime(msgspec.Struct, kw_only=True):
    name: str
    image: str
    state: Literal["waiting", "running", "terminated"] = "waiting"
    reason: str = "ContainerCreating"  # waiting reason
    message: str = ""  # waiting message
    started_at: str = ""  # running since
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None
    restart_count: int = 0
    container_id: str = ""
    sidecar: bool = False  # an init container with restartPolicy Always (runs beside the others)
    ready: bool = True  # readiness while running (False until a readiness probe passes)

    def set_waiting(self, reason: str, message: str = "") -> None:
        if self.state == "terminated" and self.terminated is not None:
            self.last_terminated = self.terminated
        self.state, self.reason, self.message, self.terminated = "waiting", reason, message, None

    def set_running(self, uid: str, now: str) -> None:
        if self.state == "terminated" and self.terminated is not None:
            self.last_terminated = self.terminated
        self.state, self.reason, self.message, self.terminated = "running", "", "", None
        self.ready = True
        self.started_at = now
        self.container_id = container_id_for(uid, self.name, self.restart_count)

    def set_terminated(self, exit_code: int, reason: str, message: str, now: str) -> None:
        self.terminated = Terminated(
            exit_code=exit_code,
            reason=reason,
            message=message,
            started_at=self.started_at or now,
            finished_at=now,
            container_id=self.container_id,
        )
        self.state = "terminated"


class PodRuntime(msgspec.Struct, kw_only=True):
    uid: str
    namespace: str
    name: str
    kind: PodKind = "plain"
    scheduled_at: str = ""
    unschedulable_reason: str = ""
    unschedulable_message: str = ""
    start_time: str = ""
    pod_ip: str = ""
    host_ip: str = ""
    initialized: bool = False
    init_containers: list[ContainerRuntime] = msgspec.field(default_factory=list)
    containers: list[ContainerRuntime] = msgspec.field(default_factory=list)
    failed_reason: str = ""  # pod-level terminal verdict (node lost)
    failed_message: str = ""

    def container(self, name: str) -> ContainerRuntime | None:
        for c in self.containers + self.init_containers:
            if c.name == name:
                return c
        return None


def new_runtime(pod: Obj, kind: PodKind) -> PodRuntime:
    m, s = meta(pod), spec(pod)
    return PodRuntime(
        uid=str(m.get("uid", "")),
        namespace=str(m.get("namespace", "")),
        name=str(m.get("name", "")),
        kind=kind,
        init_containers=[
            ContainerRuntime(
                name=c.get("name", ""),
                image=c.get("image", ""),
                reason="PodInitializing",
                sidecar=c.get("restartPolicy") == "Always",
            )
            for c in s.get("initContainers") or []
            if isinstance(c, dict)
        ],
        containers=[
            ContainerRuntime(name=c.get("name", ""), image=c.get("image", ""))
            for c in s.get("containers") or []
            if isinstance(c, dict)
        ],
    )


def _terminated_from(doc: Obj) -> Terminated | None:
    t = doc.get("terminated") if isinstance(doc, dict) else None
    if not isinstance(t, dict):
        return None
    return Terminated(
        exit_code=int(t.get("exitCode") or 0),
        reason=str(t.get("reason") or ""),
        message=str(t.get("message") or ""),
        started_at=str(t.get("startedAt") or ""),
        finished_at=str(t.get("finishedAt") or ""),
        container_id=str(t.get("containerID") or ""),
    )


def adopt_runtime(pod: Obj, kind: PodKind, now: str) -> PodRuntime:
    """The runtime of a pod bound to this node that this node-sim process did not start (it was
    restarted, or the pod was created with ``spec.nodeName``).

    Nothing survives a node-sim restart: it is a node reboot in which the container runtime lost
    every container. So, like a kubelet that cannot find a container it had reported running,
    each running container becomes terminated with reason ContainerStatusUnknown and exit code 137;
    the supervisor then applies restartPolicy to it (Never → the pod ends Failed; Always /
    OnFailure → restarted with restartCount + 1). Waiting and terminated containers keep their
    state and counts; pod IP, start time and scheduling time are kept."""
    rt = new_runtime(pod, kind)
    st = pod.get("status") or {}
    rt.start_time = str(st.get("startTime") or "")
    rt.pod_ip = str(st.get("podIP") or "")
    rt.host_ip = str(st.get("hostIP") or "")
    conds = {c.get("type"): c for c in st.get("conditions") or [] if isinstance(c, dict)}
    sched = conds.get("PodScheduled") or {}
    rt.scheduled_at = str(sched.get("lastTransitionTime") or now) if sched.get("status") != "False" else now
    rt.initialized = (conds.get("Initialized") or {}).get("status") == "True"
    for runtimes, key in ((rt.containers, "containerStatuses"), (rt.init_containers, "initContainerStatuses")):
        by_name = {c.get("name"): c for c in st.get(key) or [] if isinstance(c, dict)}
        for c in runtimes:
            seen = by_name.get(c.name)
            if not seen:
                continue
            c.restart_count = int(seen.get("restartCount") or 0)
            c.container_id = str(seen.get("containerID") or "")
            c.last_terminated = _terminated_from(seen.get("lastState") or {})
            state = seen.get("state") or {}
            if "running" in state:
                c.started_at = str((state.get("running") or {}).get("startedAt") or "")
                c.set_terminated(LOST_EXIT_CODE, LOST_REASON, LOST_MESSAGE, now)
            elif "terminated" in state:
                c.terminated = _terminated_from(state)
                c.state = "terminated"
            elif "waiting" in state:
                w = state.get("waiting") or {}
                c.state, c.reason, c.message = (
                    "waiting",
                    str(w.get("reason") or "ContainerCreating"),
                    str(w.get("message") or ""),
                )
    return rt


def lose_runtime(rt: PodRuntime, node_name: str, now: str) -> None:
    """The node went away under the pod: every live container is lost, the pod is Failed."""
    for c in rt.containers + rt.init_containers:
        if c.state != "terminated":
            c.set_terminated(LOST_EXIT_CODE, LOST_REASON, LOST_MESSAGE, now)
    rt.failed_reason = "NodeLost"
    rt.failed_message = f"Node {node_name} which was running pod {rt.name} is unresponsive"


# --- rendering ---------------------------------------------------------------------------------


def pod_phase(rt: PodRuntime, restart_policy: str) -> str:
    """The kubelet's ``getPhase`` over the runtime view."""
    if rt.failed_reason:
        return "Failed"
    if not rt.scheduled_at or not rt.start_time or not rt.initialized:
        return "Pending"
    waiting = running = stopped = succeeded = 0
    for c in rt.containers:
        if c.state == "running":
            running += 1
        elif c.state == "terminated":
            stopped += 1
            if c.terminated is not None and c.terminated.exit_code == 0:
                succeeded += 1
        elif c.last_terminated is not None:
            stopped += 1  # waiting to restart after a crash: counts as having run
        else:
            waiting += 1
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if stopped > 0:
        if restart_policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if restart_policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


def _terminated_doc(t: Terminated) -> Obj:
    doc: Obj = {"exitCode": t.exit_code, "reason": t.reason, "startedAt": t.started_at, "finishedAt": t.finished_at}
    if t.message:
        doc["message"] = t.message
    if t.container_id:
        doc["containerID"] = t.container_id
    return {"terminated": doc}


def render_container(c: ContainerRuntime, init: bool = False) -> Obj:
    if c.state == "running":
        state: Obj = {"running": {"startedAt": c.started_at}}
    elif c.state == "terminated" and c.terminated is not None:
        state = _terminated_doc(c.terminated)
    else:
        w: Obj = {"reason": c.reason}
        if c.message:
            w["message"] = c.message
        state = {"waiting": w}
    doc: Obj = {
        "name": c.name,
        "image": c.image,
        "imageID": image_id_for(c.image) if c.container_id else "",
        "ready": c.state == "running" and c.ready,
        "restartCount": c.restart_count,
        "started": c.state == "running",
        "state": state,
        "lastState": _terminated_doc(c.last_terminated) if c.last_terminated is not None else {},
    }
    if c.container_id:
        doc["containerID"] = c.container_id
    if init and not c.sidecar:
        doc["ready"] = c.state == "terminated" and c.terminated is not None and c.terminated.exit_code == 0
        doc["started"] = c.state == "running"
    return doc


def _condition(type_: str, status: bool, now: str, old: dict[str, Obj], reason: str = "", message: str = "") -> Obj:
    value = "True" if status else "False"
    prev = old.get(type_) or {}
    since = prev.get("lastTransitionTime") if prev.get("status") == value and prev.get("lastTransitionTime") else now
    cond: Obj = {"type": type_, "status": value, "lastProbeTime": None, "lastTransitionTime": since}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


# Status fields the node sim owns; anything else (qosClass, nominatedNodeName, …) is kept.
_OWNED = (
    "phase",
    "conditions",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "containerStatuses",
    "initContainerStatuses",
    "reason",
    "message",
)


def render_status(pod: Obj, rt: PodRuntime, now: str) -> Obj:
    """The full pod status for the runtime view, keeping condition transition times that did not
    change and the status fields the node sim does not own."""
    old = pod.get("status") or {}
    old_conds: dict[str, Obj] = {str(c.get("type")): c for c in old.get("conditions") or [] if isinstance(c, dict)}
    status: Obj = {k: v for k, v in old.items() if k not in _OWNED}
    restart_policy = spec(pod).get("restartPolicy") or "Always"
    phase = pod_phase(rt, restart_policy)
    status["phase"] = phase
    if not rt.scheduled_at:
        status["conditions"] = [
            _condition(
                "PodScheduled",
                False,
                now,
                old_conds,
                rt.unschedulable_reason or "Unschedulable",
                rt.unschedulable_message,
            )
        ]
        return status
    conds: list[Obj] = []
    terminal = phase in ("Succeeded", "Failed")
    if rt.start_time:
        sandbox = not terminal
        conds.append(_condition("PodReadyToStartContainers", sandbox, now, old_conds))
    pending_init = [
        c.name
        for c in rt.init_containers
        if not c.sidecar and not (c.state == "terminated" and c.terminated and c.terminated.exit_code == 0)
    ]
    if rt.initialized or not pending_init:
        conds.append(
            _condition("Initialized", True, now, old_conds, "PodCompleted" if terminal and rt.init_containers else "")
        )
    else:
        conds.append(
            _condition(
                "Initialized",
                False,
                now,
                old_conds,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(pending_init)}]",
            )
        )
    unready = [c.name for c in rt.containers if c.state != "running" or not c.ready]
    unready += [c.name for c in rt.init_containers if c.sidecar and c.state != "running"]
    if terminal:
        ready, reason, message = False, "PodCompleted", ""
    elif unready:
        ready, reason, message = False, "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]"
    else:
        ready, reason, message = True, "", ""
    conds.append(_condition("Ready", ready, now, old_conds, reason, message))
    conds.append(_condition("ContainersReady", ready, now, old_conds, reason, message))
    conds.append(_condition("PodScheduled", True, rt.scheduled_at or now, old_conds))
    status["conditions"] = conds
    if rt.host_ip:
        status["hostIP"] = rt.host_ip
        status["hostIPs"] = [{"ip": rt.host_ip}]
    if rt.pod_ip:
        status["podIP"] = rt.pod_ip
        status["podIPs"] = [{"ip": rt.pod_ip}]
    if rt.start_time:
        status["startTime"] = rt.start_time
    if rt.init_containers:
        status["initContainerStatuses"] = [render_container(c, init=True) for c in rt.init_containers]
    status["containerStatuses"] = [render_container(c) for c in rt.containers]
    if rt.failed_reason:
        status["reason"] = rt.failed_reason
        status["message"] = rt.failed_message
    if "generation" in meta(pod):
        status["observedGeneration"] = meta(pod)["generation"]
    return status
