"""What an informer keeps of an object (issue 10, memory per cached runner): a Pod without its
spec, metadata without ``managedFields`` and with its repeated strings shared, and nothing else
lost: a cached object equals the full decode of the same JSON minus exactly those parts."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from shared.api import EphemeralRunner, decode
from shared.kube import EPHEMERAL_RUNNERS, PODS, Informer
from shared.kube.objects import Pod
from shared.kube.resources import ObjectKey

NS = "arc-runners"
ER_UID = "4230f92a-f090-4a2a-a914-993d5cec2402"
LABELS = {
    "actions.github.com/organization": "octo-org",
    "actions.github.com/scale-set-name": "demo-runners",
    "actions.github.com/scale-set-namespace": NS,
    "app.kubernetes.io/component": "runner",
    "actions-ephemeral-runner": "True",
}
ANNOTATIONS = {
    "actions.github.com/runner-group-name": "Default",
    "actions.github.com/patch-id": "35",
    "actions.github.com/actionable-revision": "1",
    "runnerscale.example/long": "x" * 200,
}
MANAGED = [
    {
        "manager": "runnerscale",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-12-03T12:53:44Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:actions-ephemeral-runner": {}}}},
    }
]


def _pod(name: str) -> dict[str, Any]:
    """A runner pod as a real API server sends it (the shape the emulator and kube-apiserver
    answer: spec defaults filled in, status written by a kubelet), its runner container ended."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": dict(LABELS),
            "annotations": dict(ANNOTATIONS),
            "ownerReferences": [
                {
                    "apiVersion": "actions.github.com/v1alpha1",
                    "kind": "EphemeralRunner",
                    "name": name,
                    "uid": ER_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["example.com/keep"],
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-12-03T12:53:44Z",
            "deletionTimestamp": "2026-12-03T12:55:00Z",
            "deletionGracePeriodSeconds": 30,
            "generation": 1,
            "resourceVersion": "1144",
            "managedFields": MANAGED,
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "runner",
                    "image": "ghcr.io/actions/actions-runner:2.321.0",
                    "command": ["/home/runner/run.sh", "--once"],
                    "env": [
                        {
                            "name": "ACTIONS_RUNNER_INPUT_JITCONFIG",
                            "valueFrom": {"secretKeyRef": {"name": name, "key": "jitToken"}},
                        }
                    ],
                    "volumeMounts": [{"name": "kube-api-access", "readOnly": True, "mountPath": "/var/run/secrets"}],
                }
            ],
            "volumes": [
                {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
            ],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
            "nodeName": "node-sim",
        },
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "podIP": "10.244.123.59",
            "startTime": "2026-12-03T12:53:44Z",
            "qosClass": "BestEffort",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodFailed", "message": "m", "lastProbeTime": None},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-03T12:53:44Z"},
            ],
            "initContainerStatuses": [
                {
                    "name": "init",
                    "ready": False,
                    "restartCount": 0,
                    "image": "busybox",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
            ],
            "containerStatuses": [
                {
                    "name": "runner",
                    "ready": False,
                    "restartCount": 1,
                    "image": "ghcr.io/actions/actions-runner:2.321.0",
                    "imageID": "ghcr.io/actions/actions-runner@sha256:f101",
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": 7,
                            "reason": "Error",
                            "message": "boom",
                            "startedAt": "2026-12-03T12:53:45Z",
                            "finishedAt": "2026-12-03T12:54:45Z",
                        }
                    },
                    "lastState": {"waiting": {"reason": "ContainerCreating", "message": "pulling"}},
                }
            ],
        },
    }


def _er(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunner",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": dict(LABELS),
            "annotations": dict(ANNOTATIONS),
            "finalizers": [
                "ephemeralrunner.actions.github.com/finalizer",
                "ephemeralrunner.actions.github.com/runner-registration-finalizer",
            ],
            "ownerReferences": [
                {
                    "apiVersion": "actions.github.com/v1alpha1",
                    "kind": "EphemeralRunnerSet",
                    "name": "demo-runners",
                    "uid": "ers-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-12-03T12:53:30Z",
            "generation": 1,
            "resourceVersion": "233",
            "managedFields": MANAGED,
        },
        "spec": {
            "githubConfigUrl": "https://github.com/octo-org",
            "githubConfigSecret": "github-token",
            "runnerScaleSetId": 1,
            "metadata": {"labels": {"team": "x"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "runner", "image": "runner:latest"}]},
        },
        "status": {"phase": "Running", "ready": True, "runnerId": 12, "runnerName": name, "jobId": "j-1"},
    }


class _NoClient:
    """The informer's reads below never reach the client (events are fed as watch lines)."""


def _fed(resource: Any, objects: list[dict[str, Any]]) -> Informer[Any]:
    informer: Informer[Any] = Informer(_NoClient(), resource)  # type: ignore[arg-type]
    for obj in objects:
        informer._handle_line(msgspec.json.encode({"type": "ADDED", "object": obj}))
    return informer


def _without_managed_fields(obj: Any) -> Any:
    return msgspec.structs.replace(obj, metadata=msgspec.structs.replace(obj.metadata, managed_fields=[]))


def test_a_cached_pod_is_the_full_pod_without_spec_and_managed_fields() -> None:
    informer = _fed(PODS, [_pod("runner-a")])
    full = decode(Pod, msgspec.json.encode(_pod("runner-a")), presence_record=False)
    assert full.spec and full.metadata.managed_fields  # the input has both
    want = msgspec.structs.replace(_without_managed_fields(full), spec={})

    for cached in (
        informer.get_cached(ObjectKey(NS, "runner-a")),
        informer.get_cached("arc-runners/runner-a", copy=False),
    ):
        assert isinstance(cached, Pod)
        assert cached == want  # every metadata and status field the workers read, unchanged
    # The fields the runner worker decides on, spelled out.
    cached = informer.list_owned_by(ER_UID)[0]
    assert cached.metadata.is_deleting and cached.metadata.uid == "uid-runner-a"
    assert cached.metadata.controller_reference() is not None
    assert cached.status.phase == "Failed" and cached.status.reason == "Evicted"
    assert [c.type for c in cached.status.conditions] == ["Ready", "PodScheduled"]
    runner = cached.status.container("runner")
    assert runner is not None and runner.state.terminated is not None
    assert (runner.state.terminated.exit_code, runner.state.terminated.reason) == (7, "Error")
    assert cached.status.init_container_statuses[0].state.terminated is not None
    assert cached.spec == {}


def test_a_cached_runner_keeps_its_whole_spec_and_status() -> None:
    informer = _fed(EPHEMERAL_RUNNERS, [_er("runner-a")])
    full = decode(EphemeralRunner, msgspec.json.encode(_er("runner-a")), presence_record=False)
    cached = informer.get_cached("arc-runners/runner-a")
    assert cached == _without_managed_fields(full)
    assert cached.spec.spec["containers"][0]["image"] == "runner:latest"  # the runner worker builds its pod from it
    assert informer.list_cached("actions-ephemeral-runner=True") == [cached]  # labels still select


def test_cached_objects_share_their_repeated_strings() -> None:
    informer = _fed(PODS, [_pod("runner-a"), _pod("runner-b")])
    a = informer.get_cached("arc-runners/runner-a", copy=False)
    b = informer.get_cached("arc-runners/runner-b", copy=False)
    assert a is not None and b is not None
    for key, value in LABELS.items():
        ka = next(k for k in a.metadata.labels if k == key)
        kb = next(k for k in b.metadata.labels if k == key)
        assert ka is kb and a.metadata.labels[key] is b.metadata.labels[key] is sys.intern(value)
    assert (
        a.metadata.annotations["actions.github.com/patch-id"] is b.metadata.annotations["actions.github.com/patch-id"]
    )
    long_a = a.metadata.annotations["runnerscale.example/long"]
    assert long_a == b.metadata.annotations["runnerscale.example/long"]  # kept, not interned
    assert long_a is not b.metadata.annotations["runnerscale.example/long"]
    ref_a, ref_b = a.metadata.owner_references[0], b.metadata.owner_references[0]
    assert ref_a.kind is ref_b.kind and ref_a.api_version is ref_b.api_version
    assert a.metadata.namespace is b.metadata.namespace
    assert a.metadata.finalizers[0] is b.metadata.finalizers[0]
    assert a.status.phase is b.status.phase
    assert a.status.conditions[0].type is b.status.conditions[0].type
    assert a.status.conditions[0].status is b.status.conditions[0].status
    assert a.status.container_statuses[0].image is b.status.container_statuses[0].image
    assert a.status.init_container_statuses[0].name is b.status.init_container_statuses[0].name


def test_a_deleted_pod_event_hands_handlers_the_slim_last_state() -> None:
    informer = _fed(PODS, [_pod("runner-a")])
    seen: list[Any] = []
    informer.add_handler(seen.append, replay=False)
    informer._handle_line(
        msgspec.json.encode(
            {
                "type": "DELETED",
                "object": {**_pod("runner-a"), "metadata": {**_pod("runner-a")["metadata"], "resourceVersion": "1200"}},
            }
        )
    )
    assert len(informer) == 0
    assert seen[0].obj.spec == {} and seen[0].obj.metadata.managed_fields == []
    assert seen[0].obj.metadata.resource_version == "1200"
