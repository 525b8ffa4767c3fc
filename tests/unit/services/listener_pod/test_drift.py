"""Listener pod drift: compare the pod semantically, as a derivative, never by a hash."""

from __future__ import annotations

import copy
from typing import Any

from services.listener_pod import build, decide
from shared.api import decode
from shared.api.constants import ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION
from shared.backoff import Backoff
from shared.kube.objects import Pod
from shared.semantic import semantic_equal
from tests.unit.services.listener_pod.test_desired import SETTINGS, make_al

RV = "101"


def server_defaulted(pod: dict[str, Any]) -> dict[str, Any]:
    """What a real API server + admission + scheduler return for a created pod."""
    live = copy.deepcopy(pod)
    spec = live["spec"]
    spec.update(
        nodeName="worker-node-3",
        dnsPolicy="ClusterFirst",
        schedulerName="default-scheduler",
        securityContext=spec.get("securityContext") or {},
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
        serviceAccount=spec["serviceAccountName"],
        tolerations=[
            *(spec.get("tolerations") or []),
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    )
    spec["volumes"] = [
        *({**v, "secret": {**v["secret"], "defaultMode": 420}} if "secret" in v else v for v in spec["volumes"]),
        {
            "name": "kube-api-access-x7k2p",
            "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]},
        },
    ]
    for c in spec["containers"]:
        c.setdefault("imagePullPolicy", "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})
        for p in c.get("ports") or []:
            p.setdefault("protocol", "TCP")
        for e in c.get("env") or []:
            if "valueFrom" in e and "fieldRef" in e["valueFrom"]:
                e["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        for probe in ("livenessProbe", "readinessProbe"):
            if probe in c:
                c[probe]["httpGet"]["scheme"] = "HTTP"
                c[probe].setdefault("successThreshold", 1)
                c[probe].setdefault("initialDelaySeconds", 0)
        c["volumeMounts"] = [
            *c.get("volumeMounts", []),
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            },
        ]
    live["metadata"].update(uid="pod-uid", resourceVersion="9000", creationTimestamp="2026-11-29T10:00:00Z")
    live["status"] = {"phase": "Running", "qosClass": "BestEffort"}
    return live


def drift(want: dict[str, Any], live: dict[str, Any]) -> str | None:
    return decide.pod_drift(want, live["spec"], live["metadata"].get("annotations") or {})


def fixture(template: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    al = make_al(template=template) if template else make_al()
    want = build.desired_listener_pod(al, SETTINGS, RV)
    return want, server_defaulted(want)


def test_server_defaulted_pod_is_not_drift() -> None:
    want, live = fixture()
    assert drift(want, live) is None


def test_guard_the_comparison_is_a_derivative_not_equality() -> None:
    """If this comparison were tightened to DeepEqual, every healthy listener would be deleted and
    recreated on every reconcile: the live pod is NOT equal to the desired one."""
    want, live = fixture()
    assert not semantic_equal(want["spec"], live["spec"])
    assert drift(want, live) is None


def test_quantities_respelled_by_the_server_are_not_drift() -> None:
    want, live = fixture(
        {"spec": {"containers": [{"name": "listener", "resources": {"limits": {"memory": "256Mi", "cpu": "0.5"}}}]}}
    )
    live["spec"]["containers"][0]["resources"] = {"limits": {"memory": "268435456", "cpu": "500m"}}
    assert drift(want, live) is None


def test_changed_image_is_drift() -> None:
    want, live = fixture()
    live["spec"]["containers"][0]["image"] = "example.com/runnerscale:0.9"
    assert drift(want, live) == "pod spec drifted at $.containers[0].image"


def test_changed_env_is_drift() -> None:
    want, live = fixture()
    live["spec"]["containers"][0]["env"][0]["value"] = "/elsewhere.json"
    assert drift(want, live) is not None


def test_changed_resources_is_drift() -> None:
    want, live = fixture({"spec": {"containers": [{"name": "listener", "resources": {"limits": {"memory": "256Mi"}}}]}})
    live["spec"]["containers"][0]["resources"]["limits"]["memory"] = "512Mi"
    assert "resources" in (drift(want, live) or "")


def test_added_container_is_drift() -> None:
    base, live = fixture()
    want = build.desired_listener_pod(
        make_al(template={"spec": {"containers": [{"name": "sidecar", "image": "busybox"}]}}), SETTINGS, RV
    )
    assert drift(want, live) is not None
    assert drift(base, live) is None


def test_removed_metrics_port_is_drift() -> None:
    """Ports come from a flag: turning metrics off must not leave the port on the pod forever."""
    _, live = fixture()
    no_ports = decide.ListenerPodSettings(image=SETTINGS.image, metrics_addr="0", health_addr="0")
    want = build.desired_listener_pod(make_al(), no_ports, RV)
    assert drift(want, live) == "container ports changed", "the derivative alone cannot see a removed port"
    metrics_off = build.desired_listener_pod(
        make_al(), decide.ListenerPodSettings(image=SETTINGS.image, metrics_addr="0"), RV
    )
    assert drift(metrics_off, live) is not None


def test_config_secret_revision_change_is_drift() -> None:
    want, live = fixture()
    newer = copy.deepcopy(want)
    newer["metadata"]["annotations"][ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION] = "102"
    assert drift(newer, live).startswith("config secret changed")  # type: ignore[union-attr]


def test_live_pod_without_revision_annotation_is_recreated_once() -> None:
    """Seed 004: a pod from before the annotation existed counts as drift; ignoring it would let
    the metadata merge record a config the listener never read."""
    want, live = fixture()
    del live["metadata"]["annotations"][ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION]
    assert drift(want, live) == "config secret changed (pod started with resourceVersion none, now 101)"


def test_empty_desired_revision_is_not_compared() -> None:
    want, live = fixture()
    del want["metadata"]["annotations"][ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION]
    live["metadata"]["annotations"][ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION] = "55"
    assert drift(want, live) is None


def test_metadata_patch_never_writes_the_config_revision() -> None:
    want, live = fixture()
    want["metadata"]["labels"]["new"] = "label"
    want["metadata"]["annotations"][ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION] = "999"
    patch = decide.pod_metadata_patch(want, live["metadata"]["labels"], live["metadata"]["annotations"])
    assert patch == {"metadata": {"labels": {"new": "label"}}}
    want2, live2 = fixture()
    live2["metadata"]["labels"]["added-by-webhook"] = "x"
    assert decide.pod_metadata_patch(want2, live2["metadata"]["labels"], live2["metadata"]["annotations"]) is None


# --- pod state -----------------------------------------------------------------------------------------


def pod(status: dict[str, Any], **meta: Any) -> Pod:
    return decode(Pod, {"metadata": {"name": "p", "namespace": "n", **meta}, "spec": {}, "status": status})


def test_pod_verdicts() -> None:
    running = {
        "phase": "Running",
        "containerStatuses": [{"name": "listener", "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}}],
    }
    assert decide.pod_verdict(pod(running)).state is decide.PodState.RUNNING
    assert decide.pod_verdict(pod({"phase": "Pending"})).state is decide.PodState.STARTING
    assert (
        decide.pod_verdict(pod(running, deletionTimestamp="2026-11-29T10:00:00Z")).state is decide.PodState.TERMINATING
    )
    evicted = decide.pod_verdict(
        pod({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."})
    )
    assert (evicted.state, evicted.reason) == (decide.PodState.FAILED, "evicted")
    exited = decide.pod_verdict(
        pod(
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "listener", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
                ],
            }
        )
    )
    assert (exited.state, exited.reason) == (decide.PodState.FAILED, "terminated")
    assert "code 1" in exited.detail
    exit0 = decide.pod_verdict(
        pod(
            {
                "phase": "Succeeded",
                "containerStatuses": [{"name": "listener", "state": {"terminated": {"exitCode": 0}}}],
            }
        )
    )
    assert exit0.state is decide.PodState.FAILED, "ARC: a listener container terminated with any exit code is recreated"
    assert decide.pod_verdict(pod({"phase": "Failed"})).reason == "pod-failed"
    sidecar_only = {
        "phase": "Running",
        "containerStatuses": [{"name": "sidecar", "state": {"terminated": {"exitCode": 1}}}],
    }
    assert decide.pod_verdict(pod(sidecar_only)).state is decide.PodState.STARTING


def test_backoff() -> None:
    b = Backoff(base=1.0, cap=8.0)
    assert [decide.restart_delay(n, b) for n in range(1, 7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert decide.next_create_at(None, b) == 0.0
    assert decide.next_create_at(decide.RestartRecord(failures=3, last_failure=100.0), b) == 102.0
