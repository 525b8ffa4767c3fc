"""Runner pods: the JIT config comes from the pod's env (a Secret ref, as ARC builds it) and the
Actions simulator's runner agent plays the runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.embedded.node_sim.kube import KubeRest
from shared.actions import ActionsClient, PersonalAccessToken
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi

from .helpers import (
    create,
    create_secret,
    cstatus,
    node_config,
    phase,
    pod_body,
    running_node,
    wait_gone,
    wait_pod,
    wait_until,
)

pytestmark = pytest.mark.anyio

SCALE_SET = "node-sim-runners"


async def _jit_config(actions_sim: ActionsSim, runner_name: str) -> str:
    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        scale_set = await client.get_scale_set_by_name(SCALE_SET) or await client.create_scale_set(SCALE_SET)
        jit = await client.generate_jit_config(scale_set.id, runner_name)
    return jit.encoded_jit_config


def _runner_pod(name: str, secret: str, *, dind: bool = False) -> dict[str, Any]:
    env = [
        {"name": "ACTIONS_RUNNER_INPUT_JITCONFIG", "valueFrom": {"secretKeyRef": {"name": secret, "key": "jitToken"}}},
        {"name": "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE", "value": "1"},
    ]
    runner = {
        "name": "runner",
        "image": "ghcr.io/actions/actions-runner:latest",
        "command": ["/home/runner/run.sh"],
        "env": env,
    }
    if not dind:
        return pod_body(name, containers=[runner], restart_policy="Never")
    # ARC's dind mode: an init container copying externals and a docker sidecar.
    init = {"name": "init-dind-externals", "image": "ghcr.io/actions/actions-runner:latest", "command": ["cp"]}
    docker = {"name": "dind", "image": "docker:dind", "securityContext": {"privileged": True}}
    return pod_body(name, containers=[runner, docker], restart_policy="Never", initContainers=[init])


async def test_runner_pod_runs_a_job_and_succeeds(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path, actions_sim: ActionsSim
) -> None:
    jit = await _jit_config(actions_sim, "runner-a")
    await create_secret(kube, namespace, "runner-a", {"jitToken": jit})
    await actions_sim.control.enqueue_jobs(count=1, labels=[SCALE_SET], duration=0.2)
    async with running_node(node_config(kube_api, namespace, tmp_path, actions_url=actions_sim.url)):
        await create(kube, namespace, "pods", _runner_pod("runner-a", "runner-a", dind=True))
        pod = await wait_pod(
            kube, namespace, "runner-a", lambda p: phase(p) in ("Succeeded", "Failed"), timeout=20, what="finished"
        )
        assert phase(pod) == "Succeeded"
        term = cstatus(pod, "runner")["state"]["terminated"]
        assert term["exitCode"] == 0 and term["reason"] == "Completed"
        assert term["startedAt"] <= term["finishedAt"]
        # The sidecar ends with the runner; the init container completed before both.
        assert cstatus(pod, "dind")["state"]["terminated"]["exitCode"] == 0
        init = pod["status"]["initContainerStatuses"][0]
        assert init["state"]["terminated"]["reason"] == "Completed" and init["ready"] is True

    jobs = await actions_sim.control.jobs()
    assert [(j.state, j.runner_name) for j in jobs] == [("completed", "runner-a")]


async def test_outdated_runner_fails_with_exit_7(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path, actions_sim: ActionsSim
) -> None:
    await actions_sim.control.set_min_runner_version("99.0.0")
    jit = await _jit_config(actions_sim, "runner-old")
    await create_secret(kube, namespace, "runner-old", {"jitToken": jit})
    async with running_node(node_config(kube_api, namespace, tmp_path, actions_url=actions_sim.url)):
        await create(kube, namespace, "pods", _runner_pod("runner-old", "runner-old"))
        pod = await wait_pod(
            kube, namespace, "runner-old", lambda p: phase(p) in ("Succeeded", "Failed"), timeout=20, what="finished"
        )
        assert phase(pod) == "Failed"
        term = cstatus(pod, "runner")["state"]["terminated"]
        assert term["exitCode"] == 7 and term["reason"] == "Error"


async def test_missing_jit_secret_is_a_config_error_until_it_exists(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        await create(kube, namespace, "pods", _runner_pod("runner-x", "runner-x"))

        def config_error(p: dict[str, Any]) -> bool:
            reason: object = (cstatus(p, "runner").get("state") or {}).get("waiting", {}).get("reason")
            return reason == "CreateContainerConfigError"

        pod = await wait_pod(kube, namespace, "runner-x", config_error, what="CreateContainerConfigError")
        assert cstatus(pod, "runner")["state"]["waiting"]["message"] == 'secret "runner-x" not found'
        assert phase(pod) == "Pending"
        events = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
        assert any(e["reason"] == "Failed" and "not found" in e["message"] for e in events["items"])

        # The kubelet keeps retrying: once the secret exists the runner starts. This JIT config is
        # garbage, so the runner agent exits 1 and the Never pod ends Failed.
        await create_secret(kube, namespace, "runner-x", {"jitToken": "not-a-jit-config"})
        pod = await wait_pod(kube, namespace, "runner-x", lambda p: phase(p) == "Failed", what="Failed")
        assert cstatus(pod, "runner")["state"]["terminated"]["exitCode"] == 1


async def test_deleting_an_idle_runner_pod_disconnects_the_runner(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path, actions_sim: ActionsSim
) -> None:
    jit = await _jit_config(actions_sim, "runner-idle")
    await create_secret(kube, namespace, "runner-idle", {"jitToken": jit})
    async with running_node(node_config(kube_api, namespace, tmp_path, actions_url=actions_sim.url)):
        await create(kube, namespace, "pods", _runner_pod("runner-idle", "runner-idle"))
        await wait_pod(kube, namespace, "runner-idle", lambda p: phase(p) == "Running", what="Running")

        async def idle() -> bool:
            return [r.status for r in await actions_sim.control.runners()] == ["idle"]

        await wait_until(idle, what="runner connected and idle")
        await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/runner-idle")
        await wait_gone(kube, namespace, "runner-idle")

    runners = await actions_sim.control.runners()
    assert [(r.name, r.status) for r in runners] == [("runner-idle", "offline")]


async def test_a_runner_pod_start_is_one_status_write_and_one_secret_read(
    kube_api: KubeApi,
    namespace: str,
    kube: KubeRest,
    tmp_path: Path,
    actions_sim: ActionsSim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 10: binding, IP and the running container are reported together (the status waits
    ``start_status_delay`` at most for the first container to start), and the JIT Secret read for
    the pod's volumes serves its first container start (before: three writes, two reads)."""
    jit = await _jit_config(actions_sim, "runner-one")
    await create_secret(kube, namespace, "runner-one", {"jitToken": jit})
    written: list[str] = []
    secret_reads: list[str] = []
    config = node_config(kube_api, namespace, tmp_path, actions_url=actions_sim.url, start_status_delay=10.0)
    async with running_node(config) as node:
        assert node.kube is not None
        real_write, real_get = node.kube.replace_pod_status, node.kube.get

        async def write(pod: dict[str, Any]) -> dict[str, Any]:
            written.append(str((pod.get("status") or {}).get("phase")))
            return await real_write(pod)

        async def get(kind: str, ns: str, name: str) -> Any:
            if kind == "secrets":
                secret_reads.append(name)
            return await real_get(kind, ns, name)

        monkeypatch.setattr(node.kube, "replace_pod_status", write)  # the node's client only, not this test's
        monkeypatch.setattr(node.kube, "get", get)
        await create(kube, namespace, "pods", _runner_pod("runner-one", "runner-one"))
        pod = await wait_pod(kube, namespace, "runner-one", lambda p: phase(p) == "Running", what="Running")
        assert cstatus(pod, "runner")["state"].get("running")
        assert written[:1] == ["Running"], written  # the first write already reports the running runner
        assert secret_reads == ["runner-one"]
