"""The node sim registers its Node and keeps it alive like a kubelet, so a real control plane's
controllers (pod GC, node lifecycle) leave the pods it runs alone; on a clean stop it removes both."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from services.embedded.node_sim import heartbeat
from services.embedded.node_sim.kube import KubeError, KubeRest
from tests.fixtures.apiserver import KubeApi

from .helpers import create, node_config, phase, pod_body, running_node, wait_pod, wait_until

pytestmark = pytest.mark.anyio

NOW = datetime.datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=datetime.UTC)
IDENTITY = heartbeat.NodeIdentity("n1", {"kubernetes.io/hostname": "n1"}, "127.0.0.1")


def test_lease_times_have_six_fractional_digits() -> None:
    lease = heartbeat.lease_object(IDENTITY, "uid-1", 40, NOW)
    assert lease["spec"] == {
        "holderIdentity": "n1",
        "leaseDurationSeconds": 40,
        "renewTime": "2026-11-29T12:00:00.123456Z",
    }
    assert lease["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}]
    renewed = heartbeat.renewed_lease(
        {**lease, "metadata": {**lease["metadata"], "resourceVersion": "7"}}, IDENTITY, 40, NOW.replace(second=10)
    )
    assert renewed["metadata"]["resourceVersion"] == "7"  # the write carries the read's version
    assert renewed["spec"]["renewTime"] == "2026-11-29T12:00:10.123456Z"


def test_refresh_keeps_transition_times_and_moves_heartbeats() -> None:
    node = heartbeat.node_object(IDENTITY, NOW)
    later = NOW + datetime.timedelta(minutes=5)
    refreshed = heartbeat.refreshed_node({**node, "metadata": {"name": "n1", "resourceVersion": "3"}}, IDENTITY, later)
    ready = next(c for c in refreshed["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["lastTransitionTime"] == "2026-11-29T12:00:00Z"
    assert ready["lastHeartbeatTime"] == "2026-11-29T12:05:00Z"
    assert refreshed["metadata"]["resourceVersion"] == "3"
    # A condition stored in another state (say Ready=False) transitions now.
    stale = {
        "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    }
    ready = next(
        c for c in heartbeat.refreshed_node(stale, IDENTITY, later)["status"]["conditions"] if c["type"] == "Ready"
    )
    assert ready["lastTransitionTime"] == "2026-11-29T12:05:00Z"


def _condition(node: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (node.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


async def _get(kube: KubeRest, path: str) -> dict[str, Any] | None:
    try:
        return await kube.request("GET", path)
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


async def test_node_is_registered_kept_alive_and_removed(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    name = f"node-sim-{namespace}"
    node_path, lease_path = f"/api/v1/nodes/{name}", f"{heartbeat.LEASES}/{name}"
    cfg = node_config(kube_api, namespace, tmp_path, node_name=name, heartbeat_interval=0.5, node_status_interval=1.0)
    async with running_node(cfg) as sim:
        await create(kube, namespace, "pods", pod_body("web", containers=[{"name": "web", "image": "nginx:1.27"}]))
        await wait_pod(kube, namespace, "web", lambda p: phase(p) == "Running", what="Running")

        node = await wait_until(lambda: _get(kube, node_path), what="the Node registered")
        assert _condition(node, "Ready")["status"] == "True"
        assert node["status"]["capacity"]["pods"] == node["status"]["allocatable"]["pods"] == "500"
        assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name

        # Lease renewals move renewTime forward, each one a write with the read's version.
        seen: list[str] = []

        async def renewed_three_times() -> bool:
            lease = await _get(kube, lease_path)
            if lease is not None and lease["spec"]["renewTime"] not in seen:
                seen.append(lease["spec"]["renewTime"])
                assert lease["spec"]["holderIdentity"] == name and lease["spec"]["leaseDurationSeconds"] == 40
            # The server shows a write before the node-sim has counted its answer: wait for both.
            return len(seen) >= 4 and sim.heartbeat is not None and sim.heartbeat.renewals >= 4

        await wait_until(renewed_three_times, timeout=30, what="three lease renewals")
        assert seen == sorted(seen)

        if not kube_api.is_emulator:
            # kube-controller-manager's node lifecycle controller judged the node healthy: it removed
            # the not-ready taint the API server puts on every new Node (TaintNodesByCondition).
            async def untainted() -> bool:
                current = await _get(kube, node_path) or {}
                taints = (current.get("spec") or {}).get("taints") or []
                return not any(t["key"].startswith("node.kubernetes.io/") for t in taints)

            await wait_until(untainted, timeout=60, what="the node lifecycle controller clearing the not-ready taint")

        node = await _get(kube, node_path)
        assert node is not None and _condition(node, "Ready")["status"] == "True"
        pod = await kube.get("pods", namespace, "web")
        assert pod is not None and not pod["metadata"].get("deletionTimestamp") and phase(pod) == "Running"
        assert pod["spec"]["nodeName"] == name

    assert await _get(kube, node_path) is None and await _get(kube, lease_path) is None
