"""API structs: ARC manifests round-trip unchanged; malformed input gives path-naming errors."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
import yaml

from shared.api import (
    ALL_KINDS,
    KIND_BY_NAME,
    KIND_BY_PLURAL,
    ApiDecodeError,
    ApiError,
    AutoscalingListener,
    AutoscalingRunnerSet,
    AutoscalingRunnerSetPhase,
    AutoscalingRunnerSetStatus,
    EphemeralRunner,
    EphemeralRunnerPhase,
    EphemeralRunnerSet,
    EphemeralRunnerSetPhase,
    EphemeralRunnerSetSpec,
    EphemeralRunnerSetStatus,
    EphemeralRunnerSpec,
    ObjectMeta,
    constants,
    decode,
    encode,
    runner_revision,
    to_dict,
)
from tests.support.paths import TEST_DATA

ARC_DATA = TEST_DATA / "arc"
# The ARC objects among the sample files (the others are pod trees for the semantic tests).
SAMPLES = sorted(
    p.name
    for p in ARC_DATA.glob("*.yaml")
    if str(yaml.safe_load(p.read_text()).get("apiVersion", "")).startswith("actions.github.com/")
)


def load(name: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((ARC_DATA / name).read_text())
    return manifest


def test_samples_cover_every_kind() -> None:
    kinds = {load(name)["kind"] for name in SAMPLES}
    assert kinds == {cls.KIND for cls in ALL_KINDS}


@pytest.mark.parametrize("name", SAMPLES)
def test_arc_manifest_round_trips_through_tree_unchanged(name: str) -> None:
    manifest = load(name)
    obj = decode(KIND_BY_NAME[manifest["kind"]], copy.deepcopy(manifest))
    assert to_dict(obj) == manifest


@pytest.mark.parametrize("name", SAMPLES)
def test_arc_manifest_round_trips_through_json_bytes_unchanged(name: str) -> None:
    manifest = load(name)
    cls = KIND_BY_NAME[manifest["kind"]]
    obj = decode(cls, json.dumps(manifest).encode())
    assert json.loads(encode(obj)) == manifest
    assert decode(cls, encode(obj)) == obj


def test_decoded_fields_are_typed() -> None:
    ars = decode(AutoscalingRunnerSet, load("ars-dind.yaml"))
    assert ars.metadata.name == "arc-runner-set"
    assert ars.spec.min_runners == 1 and ars.spec.max_runners == 10
    assert ars.spec.github_server_tls is not None
    assert ars.spec.github_server_tls.certificate_from is not None
    assert ars.spec.github_server_tls.certificate_from.config_map_key_ref is not None
    assert ars.spec.github_server_tls.certificate_from.config_map_key_ref.key == "ca.crt"
    assert ars.spec.proxy is not None
    assert ars.spec.proxy.https is not None
    assert ars.spec.proxy.https.credential_secret_ref == "proxy-auth"
    assert ars.spec.listener_metrics is not None
    assert ars.spec.listener_metrics.histograms["gha_job_startup_duration_seconds"].buckets[0] == 0.01
    assert ars.spec.autoscaling_listener_metadata is not None
    assert ars.spec.autoscaling_listener_metadata.labels == {"listener-label": "listener"}
    # The pod template is kept as a JSON tree, with YAML's int `cpu: 1` intact.
    runner = ars.spec.template["spec"]["containers"][0]
    assert runner["resources"]["requests"]["cpu"] == 1


def test_explicit_zero_min_runners_survives_round_trip() -> None:
    # Go's *int: an explicit 0 is a setting ("scale to zero"), not an absent field.
    manifest = load("ars-kubernetes.yaml")
    ars = decode(AutoscalingRunnerSet, manifest)
    assert ars.spec.min_runners == 0
    assert to_dict(ars)["spec"]["minRunners"] == 0
    del manifest["spec"]["minRunners"]
    ars = decode(AutoscalingRunnerSet, manifest)
    assert ars.spec.min_runners is None
    assert "minRunners" not in to_dict(ars)["spec"]


def test_typed_state_fields_have_arc_style_json_names() -> None:
    ers = decode(EphemeralRunnerSet, load("ers.yaml"))
    assert ers.spec.patch_id == 42
    assert ers.spec.actionable_revision == 4
    assert ers.status is not None
    assert ers.status.applied_actionable_revision == 4
    assert ers.status.finished_runner_cleanup_patch_id == 41
    assert ers.status.phase is EphemeralRunnerSetPhase.RUNNING
    tree = to_dict(ers)
    assert tree["spec"]["patchID"] == 42
    assert tree["spec"]["actionableRevision"] == 4
    assert tree["status"]["appliedActionableRevision"] == 4
    assert tree["status"]["finishedRunnerCleanupPatchID"] == 41

    ars = AutoscalingRunnerSet(status=AutoscalingRunnerSetStatus(observed_generation=3))
    assert to_dict(ars)["status"]["observedGeneration"] == 3


def test_status_encodes_every_field_so_a_merge_patch_resets_stale_counts() -> None:
    status = EphemeralRunnerSetStatus(current_replicas=0, phase=EphemeralRunnerSetPhase.RUNNING)
    tree = to_dict(status)
    assert tree == {
        "currentReplicas": 0,
        "pendingEphemeralRunners": 0,
        "runningEphemeralRunners": 0,
        "failedEphemeralRunners": 0,
        "phase": "Running",
        "appliedActionableRevision": 0,
        # null in a merge patch deletes the field: "no cleanup marker".
        "finishedRunnerCleanupPatchID": None,
    }


def test_patch_id_zero_is_always_encoded() -> None:
    # patchID 0 means "authoritative" to the runner-set worker: it must never be dropped.
    ers = EphemeralRunnerSet(
        spec=EphemeralRunnerSetSpec(
            patch_id=0,
            ephemeral_runner_spec=EphemeralRunnerSpec(
                github_config_url="https://github.com/o/r", github_config_secret="s", runner_scale_set_id=1
            ),
        )
    )
    assert to_dict(ers)["spec"]["patchID"] == 0
    assert "replicas" not in to_dict(ers)["spec"]  # Go omitempty: 0 replicas is omitted


def test_new_objects_carry_api_version_and_kind() -> None:
    for cls in (AutoscalingRunnerSet, AutoscalingListener):
        tree = to_dict(cls(metadata=ObjectMeta(name="x", namespace="ns")))
        assert tree["apiVersion"] == "actions.github.com/v1alpha1"
        assert tree["kind"] == cls.KIND
        assert tree["metadata"] == {"name": "x", "namespace": "ns"}
        assert "status" not in tree


def test_kind_registry() -> None:
    assert KIND_BY_PLURAL["ephemeralrunners"] is EphemeralRunner
    assert {cls.PLURAL for cls in ALL_KINDS} == {
        "autoscalingrunnersets",
        "ephemeralrunnersets",
        "ephemeralrunners",
        "autoscalinglisteners",
    }


# --- malformed input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda m: m["spec"].__setitem__("minRunners", "two"), "$.spec.minRunners"),
        (lambda m: m["spec"].__setitem__("maxRunners", -1), "$.spec.maxRunners"),
        (lambda m: m["spec"].__setitem__("runnerScaleSetLabels", "linux"), "$.spec.runnerScaleSetLabels"),
        (lambda m: m["spec"]["proxy"]["http"].__setitem__("url", 3128), "$.spec.proxy.http.url"),
        (lambda m: m["spec"].__setitem__("template", ["not", "a", "map"]), "$.spec.template"),
        # msgspec names a map value by [...] rather than by its key.
        (lambda m: m["metadata"]["labels"].__setitem__("team", 7), "$.metadata.labels[...]"),
        (
            lambda m: m["spec"]["githubServerTLS"]["certificateFrom"]["configMapKeyRef"].pop("key"),
            "$.spec.githubServerTLS.certificateFrom.configMapKeyRef",
        ),
        (
            lambda m: m["spec"]["listenerMetrics"]["counters"]["gha_started_jobs_total"].pop("labels"),
            "$.spec.listenerMetrics.counters[...]",
        ),
        (lambda m: m.__setitem__("status", {"phase": "Sleeping"}), "$.status.phase"),
        (lambda m: m.__setitem__("kind", "EphemeralRunnerSet"), "$.kind"),
        (lambda m: m.__setitem__("apiVersion", "actions.summerwind.dev/v1alpha1"), "$.apiVersion"),
    ],
)
def test_malformed_ars_names_the_field_path(mutate: Callable[[dict[str, Any]], object], path: str) -> None:
    manifest = load("ars-dind.yaml")
    mutate(manifest)
    with pytest.raises(ApiDecodeError) as info:
        decode(AutoscalingRunnerSet, manifest)
    err = info.value
    assert err.path == path
    assert err.type_name == "AutoscalingRunnerSet"
    assert path in str(err)
    assert isinstance(err, ApiError)
    assert err.__cause__ is None  # no msgspec exception chained on


def test_missing_required_fields_are_named() -> None:
    manifest = load("ers.yaml")
    del manifest["spec"]["patchID"]
    with pytest.raises(ApiDecodeError, match=r"\$\.spec: .*patchID"):
        decode(EphemeralRunnerSet, manifest)
    manifest = load("er.yaml")
    del manifest["spec"]["runnerScaleSetId"]
    with pytest.raises(ApiDecodeError, match=r"\$\.spec: .*runnerScaleSetId"):
        decode(EphemeralRunner, manifest)


@pytest.mark.parametrize("body", [b"{", b"[]", b"null", b"\xff\xfe", "not json", 42])
def test_garbage_is_an_api_decode_error_not_a_traceback(body: Any) -> None:  # 42 is outside the signature
    with pytest.raises(ApiDecodeError) as info:
        decode(AutoscalingRunnerSet, body)
    assert info.value.path.startswith("$")


def test_decode_error_does_not_echo_template_contents() -> None:
    manifest = load("ars-dind.yaml")
    manifest["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "TOKEN", "value": "ghp_supersecret"})
    manifest["spec"]["minRunners"] = "x"
    with pytest.raises(ApiDecodeError) as info:
        decode(AutoscalingRunnerSet, manifest)
    assert "ghp_supersecret" not in str(info.value)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    # A newer CRD may add fields; an older worker must still read the object.
    manifest = load("ars-minimal.yaml")
    manifest["spec"]["futureField"] = {"x": 1}
    ars = decode(AutoscalingRunnerSet, manifest)
    assert ars.spec.github_config_secret == "github-token"


# --- helpers on the types -------------------------------------------------------------------------


def test_ephemeral_runner_helpers() -> None:
    er = decode(EphemeralRunner, load("er.yaml"))
    assert er.status is not None
    assert er.status.phase is EphemeralRunnerPhase.RUNNING
    assert er.status.has_job() and not er.status.is_done() and not er.status.is_pending()
    assert er.status.last_failure() == datetime(2026, 11, 2, 9, 21, 40, tzinfo=UTC)
    container = er.spec.runner_container()
    assert container is not None and container["name"] == "runner"
    assert not er.spec.has_container_hook_configured()
    assert runner_revision(er.metadata) == 4
    owner = er.metadata.controller_reference()
    assert owner is not None and owner.kind == "EphemeralRunnerSet"
    assert not er.metadata.is_deleting

    for phase, done in [("Failed", True), ("Outdated", True), ("Succeeded", True), ("Pending", False), ("", False)]:
        status = msgspec.structs.replace(er.status, phase=EphemeralRunnerPhase(phase))
        assert status is not None
        assert status.is_done() is done
    assert msgspec.structs.replace(er.status, phase=EphemeralRunnerPhase.NONE).is_pending()


def test_container_hook_detection() -> None:
    ars = decode(AutoscalingRunnerSet, load("ars-kubernetes.yaml"))
    spec = EphemeralRunnerSpec(
        github_config_url=ars.spec.github_config_url,
        github_config_secret=ars.spec.github_config_secret,
        runner_scale_set_id=1,
        spec=ars.spec.template["spec"],
    )
    assert spec.has_container_hook_configured()


@pytest.mark.parametrize(
    ("annotations", "revision"),
    [
        ({}, 0),
        ({"actions.github.com/actionable-revision": "12"}, 12),
        ({"actions.github.com/actionable-revision": "garbage"}, 0),
        ({"actions.github.com/actionable-revision": "-3"}, 0),
    ],
)
def test_runner_revision_annotation(annotations: dict[str, str], revision: int) -> None:
    # Runners created before the annotation existed parse to revision 0 (treated as current).
    assert runner_revision(ObjectMeta(annotations=annotations)) == revision


def test_constants_match_arc() -> None:
    assert constants.API_VERSION == "actions.github.com/v1alpha1"
    assert constants.ANNOTATION_ACTIONABLE_REVISION == "actions.github.com/actionable-revision"
    assert constants.FINALIZER_EPHEMERAL_RUNNER_SET == "ephemeralrunnerset.actions.github.com/finalizer"
    assert constants.ANNOTATION_RUNNER_SCALE_SET_ID == "runner-scale-set-id"
    assert constants.LABEL_SCALE_SET_NAME == "actions.github.com/scale-set-name"
    assert AutoscalingRunnerSetPhase("Outdated") is AutoscalingRunnerSetPhase.OUTDATED


def test_list_and_watch_event_envelopes() -> None:
    from shared.api import ObjectList, WatchEvent

    runner = load("er.yaml")
    body: dict[str, Any] = {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunnerList",
        "metadata": {"resourceVersion": "48400", "continue": "token"},
        "items": [runner, runner],
    }
    listed = decode(ObjectList[EphemeralRunner], json.dumps(body).encode())
    assert listed.metadata.resource_version == "48400" and listed.metadata.continue_ == "token"
    assert [r.status.runner_id if r.status else None for r in listed.items] == [1207, 1207]

    body["items"][1] = {**runner, "spec": {**runner["spec"], "runnerScaleSetId": "17"}}
    with pytest.raises(ApiDecodeError) as info:
        decode(ObjectList[EphemeralRunner], body)
    assert info.value.path == "$.items[1].spec.runnerScaleSetId"
    assert info.value.type_name == "ObjectList[EphemeralRunner]"

    event = decode(WatchEvent[EphemeralRunner], json.dumps({"type": "MODIFIED", "object": runner}))
    assert event.type == "MODIFIED" and event.object.metadata.name == "arc-runner-set-runner-x7k2p"
    with pytest.raises(ApiDecodeError, match=r"\$\.type"):
        decode(WatchEvent[EphemeralRunner], {"type": "RENAMED", "object": runner})


def test_any_kind_decodes_by_its_kind_field() -> None:
    from shared.api import ApiObject

    for name in SAMPLES:
        manifest = load(name)
        # decode() takes a union of kinds too (msgspec picks by the kind tag); its signature says type[T].
        obj: object = decode(ApiObject, manifest)  # type: ignore[arg-type]
        assert type(obj) is KIND_BY_NAME[manifest["kind"]]
    with pytest.raises(ApiDecodeError) as info:
        decode(ApiObject, {"kind": "Runner", "spec": {}})  # type: ignore[arg-type]  # a union, as above
    assert info.value.path == "$.kind"
    assert "AutoscalingRunnerSet | EphemeralRunnerSet" in str(info.value)
    with pytest.raises(ApiDecodeError, match="kind"):
        decode(ApiObject, {"spec": {}})  # type: ignore[arg-type]  # a union, as above
