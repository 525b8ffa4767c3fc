"""The node simulator's Node: registered like a kubelet registers, kept alive like a kubelet does.

On a real control plane, kube-controller-manager's pod garbage collector force-deletes pods bound
to a node that does not exist, and its node lifecycle controller taints and evicts pods of a node
whose heartbeats stop. So wherever the server serves ``nodes``, the node sim creates its Node
(Ready condition, capacity/allocatable, addresses), renews the node Lease in ``kube-node-lease``
every ``heartbeat_interval`` and refreshes the Node's condition heartbeats every
``status_interval``. On a clean stop it removes both: a simulator leaves nothing behind.

Pure builders decide what is written; :class:`NodeHeartbeat` is the thin async shell.
"""

from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass
from typing import Any

import anyio

from shared.log import get_logger

from .kube import TRANSIENT_ERRORS, KubeError, KubeRest

log = get_logger(__name__)

Obj = dict[str, Any]
LEASE_NAMESPACE = "kube-node-lease"
NODES = "/api/v1/nodes"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
KUBELET_VERSION = "v1.37.2-node-sim"
# What the simulated node offers; the node sim does not account for resources, so generous.
CAPACITY = {"cpu": "64", "memory": "256Gi", "pods": "500", "ephemeral-storage": "1Ti"}
_PRESSURE = (
    ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
)


@dataclass(frozen=True)
class NodeIdentity:
    name: str
    labels: dict[str, str]
    host_ip: str


def rfc3339(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(now: datetime.datetime) -> str:
    """A Lease's MicroTime: exactly six fractional digits, as the real server requires."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_conditions(now: datetime.datetime, since: dict[str, str] | None = None) -> list[Obj]:
    """Ready plus the three pressure conditions; ``since`` keeps each condition's transition time."""
    since = since or {}
    stamp = rfc3339(now)
    rows = [(t, "False", reason, msg) for t, reason, msg in _PRESSURE]
    rows.append(("Ready", "True", "KubeletReady", "kubelet is posting ready status"))
    return [
        {
            "type": t,
            "status": status,
            "reason": reason,
            "message": msg,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": since.get(t, stamp),
        }
        for t, status, reason, msg in rows
    ]


def node_status(identity: NodeIdentity, now: datetime.datetime, since: dict[str, str] | None = None) -> Obj:
    return {
        "capacity": dict(CAPACITY),
        "allocatable": dict(CAPACITY),
        "conditions": node_conditions(now, since),
        "addresses": [
            {"type": "InternalIP", "address": identity.host_ip},
            {"type": "Hostname", "address": identity.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": platform.release(),
            "osImage": "runnerscale node simulator",
            "containerRuntimeVersion": "node-sim://1",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def node_object(identity: NodeIdentity, now: datetime.datetime) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": identity.name, "labels": dict(identity.labels)},
        "spec": {},
        "status": node_status(identity, now),
    }


def transition_times(node: Obj) -> dict[str, str]:
    """The stored conditions' transition times of those already in the state we report."""
    ours = {c["type"]: c["status"] for c in node_conditions(datetime.datetime.now(datetime.UTC))}
    out = {}
    for c in (node.get("status") or {}).get("conditions") or []:
        if ours.get(c.get("type")) == c.get("status") and c.get("lastTransitionTime"):
            out[c["type"]] = c["lastTransitionTime"]
    return out


def refreshed_node(node: Obj, identity: NodeIdentity, now: datetime.datetime) -> Obj:
    """``node`` (as read) with our status and fresh heartbeats; its resourceVersion is kept."""
    return {**node, "status": node_status(identity, now, transition_times(node))}


def lease_object(identity: NodeIdentity, node_uid: str, duration_seconds: int, now: datetime.datetime) -> Obj:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": identity.name,
            "namespace": LEASE_NAMESPACE,
            # As the kubelet does: the Lease goes with its Node.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": identity.name, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": identity.name,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": micro_time(now),
        },
    }


def renewed_lease(lease: Obj, identity: NodeIdentity, duration_seconds: int, now: datetime.datetime) -> Obj:
    spec = {**(lease.get("spec") or {}), "holderIdentity": identity.name}
    spec.update(leaseDurationSeconds=duration_seconds, renewTime=micro_time(now))
    return {**lease, "spec": spec}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class NodeHeartbeat:
    """Registers the Node, renews its Lease and status, and unregisters on a clean stop."""

    def __init__(
        self,
        kube: KubeRest,
        identity: NodeIdentity,
        *,
        heartbeat_interval: float,
        status_interval: float,
        lease_duration_seconds: int,
    ) -> None:
        self.kube = kube
        self.identity = identity
        self.heartbeat_interval = heartbeat_interval
        self.status_interval = status_interval
        self.lease_duration_seconds = lease_duration_seconds
        self.renewals = 0  # lease renewals written (for inspection)
        self.node_uid = ""

    async def serves_nodes(self) -> bool:
        try:
            await self.kube.request("GET", NODES, query=[("limit", "1")])
        except KubeError as exc:
            if exc.status in (404, 405):
                return False
            raise
        return True

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register (retrying transient errors), report started, then heartbeat until cancelled."""
        registered = False
        try:
            while True:
                try:
                    if not await self.serves_nodes():
                        log.info("the API server serves no nodes; no node registration", node=self.identity.name)
                        task_status.started()
                        return
                    await self.register()
                    break
                except TRANSIENT_ERRORS as exc:
                    log.warning("node registration failed, retrying", node=self.identity.name, error=str(exc))
                    await anyio.sleep(1.0)  # retry backoff, not synchronisation
            registered = True
            task_status.started()
            await self._beat()
        finally:
            if registered:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.kube.timeout + 2):
                    await self.unregister()

    async def register(self) -> None:
        name = self.identity.name
        try:
            node = await self.kube.request("POST", NODES, body=node_object(self.identity, _now()))
            if not (node.get("status") or {}).get("conditions"):
                node = await self._put_status(node)  # a server that drops status on create
            log.info("node registered", node=name)
        except KubeError as exc:
            if exc.status != 409:
                raise
            node = await self.kube.request("GET", f"{NODES}/{name}")
            node = await self._put_status(node)
            log.info("node re-registered", node=name)
        self.node_uid = str(node["metadata"]["uid"])
        await self.renew_lease()

    async def _put_status(self, node: Obj) -> Obj:
        body = refreshed_node(node, self.identity, _now())
        return await self.kube.request("PUT", f"{NODES}/{self.identity.name}/status", body=body)

    async def renew_lease(self) -> None:
        path = f"{LEASES}/{self.identity.name}"
        try:
            lease = await self.kube.request("GET", path)
        except KubeError as exc:
            if exc.status != 404:
                raise
            body = lease_object(self.identity, self.node_uid, self.lease_duration_seconds, _now())
            await self.kube.request("POST", LEASES, body=body)
        else:
            body = renewed_lease(lease, self.identity, self.lease_duration_seconds, _now())
            await self.kube.request("PUT", path, body=body)  # carries the read's resourceVersion
        self.renewals += 1

    async def refresh_status(self) -> None:
        try:
            node = await self.kube.request("GET", f"{NODES}/{self.identity.name}")
        except KubeError as exc:
            if exc.status != 404:
                raise
            await self.register()  # someone deleted our Node: register again, as a kubelet would
            return
        await self._put_status(node)

    async def _beat(self) -> None:
        since_status = 0.0
        while True:
            await anyio.sleep(self.heartbeat_interval)  # the heartbeat period itself
            since_status += self.heartbeat_interval
            try:
                if since_status >= self.status_interval:
                    await self.refresh_status()
                    since_status = 0.0
                await self.renew_lease()
            except TRANSIENT_ERRORS as exc:
                # A conflict or outage: the next beat reads again; the lease has slack for that.
                log.warning("node heartbeat failed", node=self.identity.name, error=str(exc))

    async def unregister(self) -> None:
        for path in (f"{LEASES}/{self.identity.name}", f"{NODES}/{self.identity.name}"):
            try:
                await self.kube.request("DELETE", path)
            except KubeError as exc:
                if exc.status != 404:
                    log.warning("node unregistration failed", path=path, error=str(exc))
            except TRANSIENT_ERRORS as exc:
                log.warning("node unregistration failed", path=path, error=str(exc))
        log.info("node unregistered", node=self.identity.name)
