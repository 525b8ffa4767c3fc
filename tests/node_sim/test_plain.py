"""A plain pod is scheduled and driven to Running with the status a kubelet writes; deletion
is finalized; scheduling respects nodeSelector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.embedded.node_sim.kube import KubeRest
from tests.fixtures.apiserver import KubeApi

from .helpers import conditions, create, cstatus, node_config, phase, pod_body, running_node, wait_gone, wait_pod

pytestmark = pytest.mark.anyio


async def test_plain_pod_goes_running_with_realistic_status(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        await create(kube, namespace, "pods", pod_body("web", containers=[{"name": "web", "image": "nginx:1.27"}]))
        pod = await wait_pod(kube, namespace, "web", lambda p: phase(p) == "Running", what="Running")

        assert pod["spec"]["nodeName"] == "node-sim"
        st = pod["status"]
        assert st["startTime"] and st["hostIP"] == "127.0.0.1" and st["podIP"].startswith("10.244.")
        assert st["podIPs"] == [{"ip": st["podIP"]}]
        assert st["qosClass"] == "BestEffort"  # the server's field survives our status writes
        conds = conditions(pod)
        for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"):
            assert conds[t]["status"] == "True", t
        cs = cstatus(pod, "web")
        assert cs["ready"] is True and cs["started"] is True and cs["restartCount"] == 0
        assert cs["state"]["running"]["startedAt"]
        assert cs["containerID"].startswith("containerd://") and cs["imageID"]
        assert cs["lastState"] == {}

        events = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
        reasons = {e["reason"] for e in events["items"] if e["involvedObject"]["name"] == "web"}
        assert {"Scheduled", "Started"} <= reasons

        # A graceful delete of a running pod waits for the kubelet: the node sim stops the
        # container and finalizes with grace 0.
        deleted = await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/web")
        assert deleted["metadata"].get("deletionTimestamp")
        await wait_gone(kube, namespace, "web")


async def test_unschedulable_pod_stays_pending_until_it_fits(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        body = pod_body("picky", containers=[{"name": "c", "image": "busybox"}], nodeSelector={"disktype": "ssd"})
        await create(kube, namespace, "pods", body)
        pod = await wait_pod(
            kube, namespace, "picky", lambda p: "PodScheduled" in conditions(p), what="PodScheduled condition"
        )
        cond = conditions(pod)["PodScheduled"]
        assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
        assert not pod["spec"].get("nodeName") and phase(pod) == "Pending"

    # A node with the label takes it.
    async with running_node(
        node_config(kube_api, namespace, tmp_path, node_labels={"disktype": "ssd"}, node_name="ssd-node")
    ):
        pod = await wait_pod(kube, namespace, "picky", lambda p: phase(p) == "Running", what="Running")
        assert pod["spec"]["nodeName"] == "ssd-node"
        assert conditions(pod)["PodScheduled"]["status"] == "True"


async def test_watch_resumes_after_dropped_streams_and_relists_after_410(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    control = kube_api.require_emulator()
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        await create(kube, namespace, "pods", pod_body("one", containers=[{"name": "c", "image": "busybox"}]))
        await wait_pod(kube, namespace, "one", lambda p: phase(p) == "Running", what="Running")

        await control.cut_watches_async(abrupt=True)  # the stream breaks mid-flight: resume from the last RV
        await create(kube, namespace, "pods", pod_body("two", containers=[{"name": "c", "image": "busybox"}]))
        await wait_pod(kube, namespace, "two", lambda p: phase(p) == "Running", what="Running after a dropped watch")

        # History compacted while the watch is down (its resume is held 1 s): the resume gets 410
        # and the node sim relists, finding the pod created meanwhile.
        await control.add_fault_async(
            action="latency", verb="watch", resource="pods", namespace=namespace, delay_seconds=1.0
        )
        await control.cut_watches_async(abrupt=False)
        await create(kube, namespace, "pods", pod_body("three", containers=[{"name": "c", "image": "busybox"}]))
        await control.compact_async()
        await wait_pod(kube, namespace, "three", lambda p: phase(p) == "Running", what="Running after a relist")
        await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/one")
        await wait_gone(kube, namespace, "one")


async def test_status_conflicts_and_api_errors_are_retried(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    control = kube_api.require_emulator()
    # Two stale-write conflicts on pods/status, and one failed binding.
    await control.add_fault_async(
        action="error", verb="update", resource="pods", subresource="status", namespace=namespace, code=409, times=2
    )
    await control.add_fault_async(
        action="error", verb="create", resource="pods", subresource="binding", namespace=namespace, code=500, times=1
    )
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        await create(kube, namespace, "pods", pod_body("busy", containers=[{"name": "c", "image": "busybox"}]))
        pod = await wait_pod(kube, namespace, "busy", lambda p: phase(p) == "Running", what="Running despite conflicts")
        assert conditions(pod)["Ready"]["status"] == "True"
    # Spent rules leave the list: both fired as often as they could.
    assert [f for f in control.faults() if f.namespace == namespace] == []


async def test_client_does_not_read_the_environment_per_request(kube: KubeRest) -> None:
    """Issue 10: kubernetes-asyncio's session trusts the environment, which makes aiohttp read
    netrc and the proxy variables in a thread on every request; the node sim resolves them once."""
    session = kube._api.rest_client.pool_manager
    assert session.trust_env is False


@pytest.mark.parametrize(("bound_watch_wait", "most_reads"), [(10.0, 0), (0.0, 1)])
async def test_status_writes_are_not_preceded_by_reads(
    kube_api: KubeApi,
    namespace: str,
    kube: KubeRest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bound_watch_wait: float,
    most_reads: int,
) -> None:
    """Issue 10: a status write is decided on the pod as the watch (or the last write) left it;
    the pod is read only where its copy is known to be old (after the binding, when the watch
    does not bring the bound pod within ``bound_watch_wait``) or after a 409."""
    reads: list[str] = []
    async with running_node(node_config(kube_api, namespace, tmp_path, bound_watch_wait=bound_watch_wait)) as node:
        assert node.kube is not None
        real_get = node.kube.get

        async def get(kind: str, ns: str, name: str) -> Any:
            if kind == "pods" and name == "web":
                reads.append(name)
            return await real_get(kind, ns, name)

        monkeypatch.setattr(node.kube, "get", get)  # the node's client only, not this test's
        await create(kube, namespace, "pods", pod_body("web", containers=[{"name": "web", "image": "nginx:1.27"}]))
        await wait_pod(
            kube, namespace, "web", lambda p: conditions(p).get("Ready", {}).get("status") == "True", what="Ready"
        )
        # The watch brings the bound pod (a GET before every status write made 4 here); without
        # waiting for it, one read after the binding.
        assert len(reads) <= most_reads, reads
