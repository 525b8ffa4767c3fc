"""The node simulator's pure decisions: pod kinds, phases, rendered status, adoption after a
restart, env/volume resolution and command rewriting."""

from __future__ import annotations

import base64
import sys
from typing import Any

import pytest

from services.embedded.node_sim import model
from services.embedded.node_sim.podspec import (
    ConfigError,
    MountError,
    StartError,
    build_command,
    container_mounts,
    resolve_env,
    rewrite_path,
    volume_files,
)

NOW = "2026-01-01T00:00:00Z"


def _pod(**spec: object) -> dict[str, Any]:
    base: dict[str, object] = {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Always"}
    base.update(spec)
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
        "spec": base,
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def _secret(**data: str) -> dict[str, Any]:
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_pod_kind() -> None:
    runner = _pod(containers=[{"name": "runner", "image": "x", "env": [{"name": model.JIT_ENV, "value": "j"}]}])
    assert model.pod_kind(runner, ["*runnerscale*"]) == "runner"
    assert (
        model.pod_kind(_pod(containers=[{"name": "c", "image": "ghcr.io/o/runnerscale:1"}]), ["*runnerscale*"])
        == "process"
    )
    annotated = _pod()
    annotated["metadata"]["annotations"] = {model.EXEC_ANNOTATION: "true"}
    assert model.pod_kind(annotated, []) == "process"
    assert model.pod_kind(_pod(), ["*runnerscale*"]) == "plain"
    # A container named runner without the JIT env is not a runner.
    assert model.pod_kind(_pod(containers=[{"name": "runner", "image": "x"}]), []) == "plain"


@pytest.mark.parametrize(
    ("policy", "exits", "phase"),
    [
        ("Never", [0], "Succeeded"),
        ("Never", [0, 1], "Failed"),
        ("OnFailure", [0], "Succeeded"),
        ("OnFailure", [2], "Running"),
        ("Always", [0], "Running"),
    ],
)
def test_phase_of_terminated_containers(policy: str, exits: list[int], phase: str) -> None:
    rt = model.PodRuntime(uid="u", namespace="ns", name="p", scheduled_at=NOW, start_time=NOW, initialized=True)
    for i, code in enumerate(exits):
        c = model.ContainerRuntime(name=f"c{i}", image="i")
        c.set_running("u", NOW)
        c.set_terminated(code, model.exit_reason(code), "", NOW)
        rt.containers.append(c)
    assert model.pod_phase(rt, policy) == phase


def test_phase_pending_until_every_container_started_and_running_in_crash_loop() -> None:
    rt = model.PodRuntime(uid="u", namespace="ns", name="p", scheduled_at=NOW, start_time=NOW, initialized=True)
    a, b = model.ContainerRuntime(name="a", image="i"), model.ContainerRuntime(name="b", image="i")
    rt.containers = [a, b]
    a.set_running("u", NOW)
    assert model.pod_phase(rt, "Always") == "Pending"
    b.set_running("u", NOW)
    b.set_terminated(1, "Error", "", NOW)
    b.set_waiting("CrashLoopBackOff")
    assert model.pod_phase(rt, "Always") == "Running"


def test_render_keeps_unowned_fields_and_transition_times() -> None:
    pod = _pod()
    rt = model.new_runtime(pod, "plain")
    rt.scheduled_at, rt.start_time, rt.initialized, rt.pod_ip, rt.host_ip = NOW, NOW, True, "10.244.1.2", "127.0.0.1"
    rt.containers[0].set_running("u-1", NOW)
    status = model.render_status(pod, rt, NOW)
    assert status["phase"] == "Running" and status["qosClass"] == "BestEffort"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    pod["status"] = status
    later = model.render_status(pod, rt, "2026-01-01T00:05:00Z")
    assert later == status  # nothing changed: same transition times, so no write is needed

    rt.containers[0].set_terminated(1, "Error", "", "2026-01-01T00:06:00Z")
    rt.containers[0].set_waiting("CrashLoopBackOff", "back-off")
    after = model.render_status(pod, rt, "2026-01-01T00:06:00Z")
    ready = next(c for c in after["conditions"] if c["type"] == "Ready")
    assert (
        ready["status"] == "False"
        and ready["lastTransitionTime"] == "2026-01-01T00:06:00Z"
        and ready["reason"] == "ContainersNotReady"
    )
    cs = after["containerStatuses"][0]
    assert cs["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}
    assert cs["lastState"]["terminated"]["exitCode"] == 1


def test_unscheduled_render() -> None:
    rt = model.new_runtime(_pod(), "plain")
    rt.unschedulable_reason, rt.unschedulable_message = "Unschedulable", "no"
    status = model.render_status(_pod(), rt, NOW)
    assert status["phase"] == "Pending"
    assert status["conditions"] == [
        {
            "type": "PodScheduled",
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": NOW,
            "reason": "Unschedulable",
            "message": "no",
        }
    ]


def test_adopt_marks_running_containers_lost() -> None:
    pod = _pod()
    pod["spec"]["nodeName"] = "node-sim"
    pod["status"] = {
        "phase": "Running",
        "startTime": NOW,
        "podIP": "10.244.1.2",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": NOW},
            {"type": "Initialized", "status": "True"},
        ],
        "containerStatuses": [
            {"name": "c", "restartCount": 2, "state": {"running": {"startedAt": NOW}}, "lastState": {}}
        ],
    }
    rt = model.adopt_runtime(pod, "plain", "2026-01-01T01:00:00Z")
    c = rt.containers[0]
    assert c.state == "terminated" and c.terminated is not None
    assert (c.terminated.exit_code, c.terminated.reason, c.restart_count) == (137, "ContainerStatusUnknown", 2)
    assert rt.pod_ip == "10.244.1.2" and rt.scheduled_at == NOW and rt.initialized
    assert model.pod_phase(rt, "Never") == "Failed"


def test_scheduling_verdict() -> None:
    labels = {"kubernetes.io/os": "linux"}
    assert model.scheduling_verdict(_pod(nodeSelector={"kubernetes.io/os": "linux"}), "n", labels) == ("", "")
    assert model.scheduling_verdict(_pod(nodeSelector={"disk": "ssd"}), "n", labels)[0] == "Unschedulable"
    assert model.scheduling_verdict(_pod(schedulingGates=[{"name": "g"}]), "n", labels)[0] == "SchedulingGated"


def test_backoff_and_restart_policy() -> None:
    assert [model.crash_backoff(n, 1, 10) for n in range(6)] == [1, 2, 4, 8, 10, 10]
    assert model.should_restart("Always", 0) and model.should_restart("OnFailure", 1)
    assert not model.should_restart("OnFailure", 0) and not model.should_restart("Never", 1)
    assert model.returncode_to_exit_code(-15) == 143 and model.returncode_to_exit_code(3) == 3


def test_resolve_env_refs_and_errors() -> None:
    pod = _pod()
    container = {
        "env": [
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)-b-$$(A)-$(NOPE)"},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": True}}},
        ],
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
    }
    objects = {("secrets", "s"): _secret(k="v"), ("configmaps", "cm"): {"data": {"x": "1"}}, ("secrets", "gone"): None}
    env = resolve_env(pod, container, objects, "10.0.0.1", "127.0.0.1")
    assert env == {"CM_x": "1", "A": "a", "B": "a-b-$(A)-$(NOPE)", "NAME": "p", "APP": "x", "S": "v"}

    with pytest.raises(ConfigError, match='secret "s" not found'):
        resolve_env(
            pod,
            {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            {("secrets", "s"): None},
        )
    with pytest.raises(ConfigError, match="couldn't find key other in Secret ns/s"):
        resolve_env(
            pod, {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "other"}}}]}, objects
        )


def test_volume_files_and_mount_errors() -> None:
    pod = _pod(
        volumes=[
            {"name": "cfg", "secret": {"secretName": "s", "items": [{"key": "k", "path": "sub/../conf.json"}]}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "host", "hostPath": {"path": "/"}},
        ]
    )
    files = volume_files(pod, {("secrets", "s"): _secret(k="{}")})
    assert files == {"cfg": [("sub/conf.json", b"{}", 0o644)], "scratch": []}
    with pytest.raises(MountError, match='volume "cfg" : secret "s" not found'):
        volume_files(pod, {("secrets", "s"): None})


def test_path_rewriting_and_command() -> None:
    container = {
        "volumeMounts": [
            {"name": "cfg", "mountPath": "/etc/gha-listener"},
            {"name": "deep", "mountPath": "/etc/gha-listener/extra/"},
        ]
    }
    mounts = container_mounts(container, {"cfg": "/tmp/v/cfg", "deep": "/tmp/v/deep"})
    assert rewrite_path("/etc/gha-listener/config.json", mounts) == "/tmp/v/cfg/config.json"
    assert rewrite_path("/etc/gha-listener/extra/x", mounts) == "/tmp/v/deep/x"
    assert rewrite_path("/etc/gha-listener", mounts) == "/tmp/v/cfg"
    assert rewrite_path("/etc/gha-listener-other/x", mounts) == "/etc/gha-listener-other/x"  # whole components only

    argv = build_command(
        {"command": ["runnerscale", "listener"], "args": ["--config", "$(CFG)"]},
        {"CFG": "/etc/gha-listener/config.json"},
        mounts,
    )
    assert argv == [sys.executable, "-m", "shared.cli", "listener", "--config", "/tmp/v/cfg/config.json"]
    with pytest.raises(StartError):
        build_command({"args": ["x"], "image": "img"}, {}, mounts)


def test_arc_listener_command_runs_our_listener() -> None:
    argv = build_command({"command": ["/ghalistener"]}, {}, [])
    assert argv == [sys.executable, "-m", "shared.cli", "listener"]


def test_probe_plan_defaults_and_named_ports() -> None:
    from services.embedded.node_sim.probes import probe_plan

    container = {"ports": [{"name": "health", "containerPort": 8081}]}
    plan = probe_plan({"httpGet": {"path": "/healthz", "port": "health"}}, container, "127.0.0.1")
    assert (plan.kind, plan.host, plan.port, plan.path, plan.period, plan.timeout, plan.failure_threshold) == (
        "http",
        "127.0.0.1",
        8081,
        "/healthz",
        10.0,
        1.0,
        3,
    )
    assert probe_plan({"tcpSocket": {"port": "nope"}}, container, "h").error == "unknown port 'nope'"
    assert probe_plan({"exec": {"command": ["true"]}}, container, "h").kind == "unsupported"
