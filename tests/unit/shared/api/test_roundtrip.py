"""decode → encode gives back exactly the user's JSON: nothing lost, nothing invented (issue 2).

Trees are compared *strictly* (:func:`exact`): key sets, value types (``1`` is not ``1.0``, ``0``
is not ``False``) and values, not with Python's ``==`` (where ``1 == 1.0 == True``) and not
semantically (where absent, null and empty are the same).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import yaml

from services.runner_set import decide as runner_set_decide
from services.scale_set import decide as scale_set_decide
from shared.api import (
    KIND_BY_NAME,
    AutoscalingRunnerSet,
    AutoscalingRunnerSetPhase,
    AutoscalingRunnerSetStatus,
    EphemeralRunner,
    EphemeralRunnerSet,
    EphemeralRunnerSetPhase,
    EphemeralRunnerSetStatus,
    EphemeralRunnerStatus,
    ObjectList,
    WatchEvent,
    decode,
    encode,
    status_patch,
    to_dict,
)
from tests.support.paths import TEST_DATA

ARC_DATA = TEST_DATA / "arc"
SAMPLES = sorted(
    p.name
    for p in ARC_DATA.glob("*.yaml")
    if str(yaml.safe_load(p.read_text()).get("apiVersion", "")).startswith("actions.github.com/")
)


def load(name: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((ARC_DATA / name).read_text())
    return manifest


def exact(tree: Any) -> str:
    """A canonical text of a JSON tree in which every type difference shows."""
    return json.dumps(tree, sort_keys=True, allow_nan=False)


def assert_round_trips(manifest: dict[str, Any]) -> None:
    cls = KIND_BY_NAME[manifest["kind"]]
    want = exact(manifest)
    # From a JSON tree (yaml.safe_load / kubernetes-asyncio output) ...
    obj = decode(cls, copy.deepcopy(manifest))
    assert exact(to_dict(obj)) == want
    assert exact(json.loads(encode(obj))) == want
    # ... and from JSON bytes (what the access layer reads).
    obj = decode(cls, json.dumps(manifest).encode())
    assert exact(json.loads(encode(obj))) == want
    assert exact(to_dict(obj)) == want
    # Copies keep what was given.
    assert exact(to_dict(copy.deepcopy(obj))) == want
    assert exact(to_dict(copy.copy(obj))) == want


# --- the samples, unchanged ------------------------------------------------------------------------


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_round_trips_exactly(name: str) -> None:
    assert_round_trips(load(name))


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_with_empty_status_round_trips_exactly(name: str) -> None:
    manifest = load(name)
    manifest["status"] = {}
    assert_round_trips(manifest)


def test_issue_example() -> None:
    manifest = {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": "x", "namespace": "n"},
        "spec": {
            "githubConfigUrl": "https://github.com/o",
            "githubConfigSecret": "s",
            "listenerMetrics": {"gauges": {}},
            "listenerConfigSecretMetadata": {"labels": {}},
            "template": {"spec": {"containers": [{"name": "runner", "image": "i"}]}},
        },
        "status": {},
    }
    ars = decode(AutoscalingRunnerSet, manifest)
    assert to_dict(ars) == manifest
    assert_round_trips(manifest)
    # Typed reads are unchanged: an absent or empty field reads as its zero value.
    assert ars.status is not None and ars.status.current_runners == 0
    assert ars.spec.listener_metrics is not None and ars.spec.listener_metrics.gauges == {}
    meta = ars.spec.listener_config_secret_metadata
    assert meta is not None and meta.labels.get("x") is None


# --- variants: empty maps and lists at several depths, explicit zeros, nulls -----------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting ``path`` (dot-separated; list indexes as numbers) to ``value``."""

    def mutate(manifest: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = manifest
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[last] = copy.deepcopy(value)

    mutate.__name__ = f"{path}={value!r}"
    return mutate


VARIANTS: list[tuple[str, list[Callable[[dict[str, Any]], None]]]] = [
    # AutoscalingRunnerSet: empty maps and lists, from the top of spec down to a metric's labels.
    ("ars-minimal.yaml", [_set("spec.runnerScaleSetLabels", [])]),
    ("ars-minimal.yaml", [_set("spec.listenerMetrics", {})]),
    ("ars-minimal.yaml", [_set("spec.listenerMetrics", {"counters": {}, "gauges": {}, "histograms": {}})]),
    ("ars-minimal.yaml", [_set("spec.listenerMetrics", {"histograms": {"h": {"labels": [], "buckets": []}}})]),
    (
        "ars-minimal.yaml",
        [_set("spec.listenerMetrics", {"histograms": {"h": {"labels": ["name"], "buckets": [1, 2.5, 10.0]}}})],
    ),
    ("ars-minimal.yaml", [_set("spec.listenerMetrics", {"counters": {"c": {"labels": []}}})]),
    ("ars-minimal.yaml", [_set("spec.listenerConfigSecretMetadata", {"labels": {}, "annotations": {}})]),
    ("ars-minimal.yaml", [_set("spec.autoscalingListener", {})]),
    (
        "ars-minimal.yaml",
        [
            _set("spec.ephemeralRunnerMetadata", {"labels": {}}),
            _set("spec.ephemeralRunnerSetMetadata", {"annotations": {}}),
        ],
    ),
    ("ars-minimal.yaml", [_set("spec.proxy", {"http": {}, "noProxy": []})]),
    ("ars-minimal.yaml", [_set("spec.proxy", {"https": {"url": "", "credentialSecretRef": ""}})]),
    ("ars-minimal.yaml", [_set("spec.githubServerTLS", {})]),
    (
        "ars-minimal.yaml",
        [_set("spec.githubServerTLS", {"certificateFrom": {"configMapKeyRef": {"key": "ca.crt", "name": ""}}})],
    ),
    ("ars-minimal.yaml", [_set("spec.vaultConfig", {"type": "", "proxy": {}})]),
    ("ars-minimal.yaml", [_set("spec.listenerTemplate", {}), _set("spec.template.metadata", {})]),
    (
        "ars-minimal.yaml",
        [_set("metadata.labels", {}), _set("metadata.annotations", {}), _set("metadata.finalizers", [])],
    ),
    # ... explicit zero values and nulls
    ("ars-minimal.yaml", [_set("spec.runnerGroup", ""), _set("spec.runnerScaleSetName", "")]),
    ("ars-minimal.yaml", [_set("spec.minRunners", 0), _set("spec.maxRunners", 0)]),
    (
        "ars-minimal.yaml",
        [_set("spec.minRunners", None), _set("spec.proxy", None), _set("spec.listenerTemplate", None)],
    ),
    ("ars-minimal.yaml", [_set("metadata.generation", 0), _set("metadata.namespace", "")]),
    ("ars-minimal.yaml", [_set("status", {"currentRunners": 0})]),
    ("ars-minimal.yaml", [_set("status", {"phase": "", "observedGeneration": 0, "failedEphemeralRunners": 0})]),
    (
        "ars-dind.yaml",
        [
            _set(
                "status",
                {
                    "currentRunners": 0,
                    "phase": "Running",
                    "pendingEphemeralRunners": 0,
                    "runningEphemeralRunners": 0,
                    "failedEphemeralRunners": 0,
                    "observedGeneration": 0,
                },
            )
        ],
    ),
    # EphemeralRunnerSet
    ("ers.yaml", [_set("spec.replicas", 0), _set("spec.patchID", 0), _set("spec.actionableRevision", 0)]),
    ("ers.yaml", [_set("spec.ephemeralRunnerMetadata", {})]),
    ("ers.yaml", [_set("spec.ephemeralRunnerSpec.metadata", {}), _set("spec.ephemeralRunnerSpec.proxySecretRef", "")]),
    ("ers.yaml", [_set("spec.ephemeralRunnerSpec.proxy", {"https": {}, "noProxy": []})]),
    ("ers.yaml", [_set("status", {"finishedRunnerCleanupPatchID": None})]),
    (
        "ers.yaml",
        [_set("status", {"finishedRunnerCleanupPatchID": 0, "appliedActionableRevision": 0, "currentReplicas": 0})],
    ),
    ("ers.yaml", [_set("status", {"phase": ""})]),
    # EphemeralRunner
    ("er.yaml", [_set("spec.metadata", {}), _set("spec.spec.volumes", [])]),
    ("er.yaml", [_set("spec.ephemeralRunnerConfigSecretMetadata", {"labels": {}})]),
    ("er.yaml", [_set("status", {"failures": {}})]),
    ("er.yaml", [_set("status", {"ready": False, "runnerId": 0, "jobId": "", "jobRequestId": 0, "reason": ""})]),
    # AutoscalingListener
    ("al.yaml", [_set("spec.imagePullSecrets", []), _set("spec.metrics", {})]),
    ("al.yaml", [_set("spec.imagePullSecrets", [{}, {"name": ""}])]),
    (
        "al.yaml",
        [
            _set("spec.minRunners", 0),
            _set("spec.maxRunners", 0),
            _set("spec.runnerScaleSetId", 0),
            _set("spec.image", ""),
        ],
    ),
    ("al.yaml", [_set("spec.serviceAccountMetadata", {"labels": {}}), _set("spec.template", None)]),
]


@pytest.mark.parametrize(
    ("name", "mutations"),
    VARIANTS,
    ids=[f"{name}:{','.join(m.__name__ for m in muts)}" for name, muts in VARIANTS],
)
def test_variant_round_trips_exactly(name: str, mutations: list[Callable[[dict[str, Any]], None]]) -> None:
    manifest = load(name)
    for mutate in mutations:
        mutate(manifest)
    decode(KIND_BY_NAME[manifest["kind"]], manifest)  # a valid manifest
    assert_round_trips(manifest)


def test_list_and_watch_event_items_round_trip_exactly() -> None:
    er = load("er.yaml")
    er["status"] = {"failures": {}}
    bare = load("er.yaml")
    del bare["status"]
    body = {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunnerList",
        "metadata": {},
        "items": [er, bare],
    }
    items = decode(ObjectList[EphemeralRunner], json.dumps(body).encode()).items
    assert [exact(to_dict(i)) for i in items] == [exact(er), exact(bare)]
    event = decode(WatchEvent[EphemeralRunner], json.dumps({"type": "MODIFIED", "object": er}))
    assert exact(to_dict(event.object)) == exact(er)


# --- after decoding: changes are written, untouched fields stay as given ---------------------------


def test_a_field_changed_after_decoding_is_encoded() -> None:
    manifest = load("ers.yaml")
    manifest["status"] = {}
    ers = decode(EphemeralRunnerSet, manifest)
    assert ers.status is not None
    ers.status.current_replicas = 3
    ers.spec.ephemeral_runner_spec.spec = {}  # given, now empty: still written
    tree = to_dict(ers)
    assert tree["status"] == {"currentReplicas": 3}
    assert tree["spec"]["ephemeralRunnerSpec"]["spec"] == {}


def test_built_structs_keep_their_class_rules() -> None:
    # Not decoded: spec structs omit zero values, status structs encode every field.
    tree = to_dict(AutoscalingRunnerSet(status=AutoscalingRunnerSetStatus(observed_generation=3)))
    assert tree["status"]["currentRunners"] == 0 and tree["status"]["observedGeneration"] == 3
    assert tree["spec"] == {}
    # msgspec.structs.replace builds a new struct: the decode record is not carried over.
    decoded = decode(EphemeralRunnerSetStatus, {})
    assert to_dict(decoded) == {}
    assert len(to_dict(msgspec.structs.replace(decoded, phase=EphemeralRunnerSetPhase.RUNNING))) == 7


# --- status patches still reset stale counts -------------------------------------------------------


def test_status_patch_sets_every_field_of_a_decoded_status() -> None:
    ers = decode(EphemeralRunnerSet, {**load("ers.yaml"), "status": {}})
    assert to_dict(ers)["status"] == {}
    assert status_patch(ers.status) == {
        "status": {
            "currentReplicas": 0,
            "pendingEphemeralRunners": 0,
            "runningEphemeralRunners": 0,
            "failedEphemeralRunners": 0,
            "phase": "",
            "appliedActionableRevision": 0,
            "finishedRunnerCleanupPatchID": None,  # null: a merge patch deletes the marker
        }
    }
    er_status = decode(EphemeralRunnerStatus, {"failures": {}})
    patch = status_patch(er_status)["status"]
    assert patch["failures"] == {} and patch["runnerId"] == 0 and patch["ready"] is False
    with pytest.raises(TypeError):
        status_patch({"currentReplicas": 0})


def test_scale_set_status_patch_writes_counts_that_dropped_to_zero() -> None:
    ars = decode(
        AutoscalingRunnerSet,
        {
            **load("ars-minimal.yaml"),
            "metadata": {"name": "x", "namespace": "n", "generation": 2},
            "status": {
                "currentRunners": 5,
                "phase": "Running",
                "pendingEphemeralRunners": 2,
                "runningEphemeralRunners": 3,
                "failedEphemeralRunners": 1,
                "observedGeneration": 2,
            },
        },
    )
    ers = decode(EphemeralRunnerSet, {**load("ers.yaml"), "status": {"phase": "Running"}})  # counts absent: 0
    status = scale_set_decide.next_status(ars, ers, acted=True)
    patch = scale_set_decide.status_patch(ars, status)
    assert patch == {
        "status": {
            "currentRunners": 0,
            "phase": "Running",
            "pendingEphemeralRunners": 0,
            "runningEphemeralRunners": 0,
            "failedEphemeralRunners": 0,
            "observedGeneration": 2,
            "conditions": None,  # clears a SpecValid=False condition left by an earlier invalid spec
        }
    }
    # A Pending patch built from the stored status also carries every field.
    pending = scale_set_decide.status_patch(ars, scale_set_decide.pending_status(ars))
    assert pending is not None and pending["status"]["phase"] == AutoscalingRunnerSetPhase.PENDING
    assert set(pending["status"]) == set(patch["status"])


def test_runner_set_status_diff_writes_counts_that_dropped_to_zero() -> None:
    stored = decode(
        EphemeralRunnerSetStatus,
        {"currentReplicas": 4, "pendingEphemeralRunners": 1, "runningEphemeralRunners": 3, "phase": "Running"},
    )
    wanted = {
        "currentReplicas": 0,
        "pendingEphemeralRunners": 0,
        "runningEphemeralRunners": 0,
        "failedEphemeralRunners": 0,
        "phase": "Running",
    }
    assert runner_set_decide.status_diff(stored, wanted) == {
        "currentReplicas": 0,
        "pendingEphemeralRunners": 0,
        "runningEphemeralRunners": 0,
    }
    # A field the stored status lacks counts as 0, as before: no write for a 0 that is already 0.
    assert runner_set_decide.status_diff(decode(EphemeralRunnerSetStatus, {"phase": "Running"}), wanted) is None
