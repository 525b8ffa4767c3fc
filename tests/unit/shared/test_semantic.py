"""semantic_equal / semantic_derivative: the cases issue 2 lists, plus the reasoning of seeds 000/004."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from shared.api import EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSpec, decode, to_dict
from shared.semantic import (
    container_port_counts_differ,
    first_difference,
    first_drift,
    is_empty,
    semantic_derivative,
    semantic_equal,
)
from tests.support.paths import TEST_DATA

ARC_DATA = TEST_DATA / "arc"


def load(name: str) -> dict[str, Any]:
    tree: dict[str, Any] = yaml.safe_load((ARC_DATA / name).read_text())
    return tree


def store_like_server(tree: Any) -> Any:
    """What a write + read through a Kubernetes API server does to empty collections and nulls.

    PodSpec collection fields are ``omitempty`` and null fields are pruned, so ``env: []``,
    ``volumes: []``, ``nodeSelector: {}`` and ``x: null`` come back absent.
    """
    if isinstance(tree, dict):
        out = {}
        for k, child in tree.items():
            v = store_like_server(child)
            if v is None or v in ([], {}):
                continue
            out[k] = v
        return out
    if isinstance(tree, list):
        return [store_like_server(v) for v in tree]
    return tree


@pytest.fixture
def template() -> dict[str, Any]:
    return load("runner-template.yaml")


@pytest.fixture
def desired_pod() -> dict[str, Any]:
    return load("listener-pod-desired.yaml")


@pytest.fixture
def live_pod() -> dict[str, Any]:
    return load("listener-pod-live.yaml")


def runner(tree: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = tree["spec"]["containers"][0]
    return container


# --- issue 2: empty collections through "server storage" -----------------------------------------


def test_explicit_empties_round_trip_through_server_storage_compare_equal(template: dict[str, Any]) -> None:
    template["spec"]["volumes"] = []
    template["spec"]["nodeSelector"] = {}
    runner(template)["env"] = []
    runner(template)["args"] = None
    desired = EphemeralRunnerSetSpec(
        patch_id=0,
        ephemeral_runner_spec=EphemeralRunnerSpec(
            github_config_url="https://github.com/octo-org/octo-repo",
            github_config_secret="pre-defined-secret",
            runner_scale_set_id=17,
            metadata=template["metadata"],
            spec=template["spec"],
        ),
    )
    body = to_dict(EphemeralRunnerSet(spec=desired))
    stored = store_like_server(json.loads(json.dumps(body)))
    read_back = decode(EphemeralRunnerSet, stored).spec

    desired_tree = to_dict(desired.ephemeral_runner_spec)
    read_back_tree = to_dict(read_back.ephemeral_runner_spec)
    assert desired_tree != read_back_tree  # strict: a revision bump on every reconcile, forever
    assert semantic_equal(desired_tree, read_back_tree)  # semantic: no revision is ever bumped
    assert semantic_equal(read_back_tree, desired_tree)
    assert first_difference(desired_tree, read_back_tree) is None


@pytest.mark.parametrize("empty", [None, [], {}, ""])
def test_absent_null_and_empty_are_all_the_same(empty: Any) -> None:
    others: tuple[object, ...] = (None, [], {}, "")
    for other in others:
        assert semantic_equal({"x": empty}, {"x": other})
    assert semantic_equal({"x": empty}, {})
    assert semantic_equal({}, {"x": empty})
    assert semantic_equal(empty, None)
    assert is_empty(empty)


def test_zero_and_false_are_values_not_empties() -> None:
    assert not semantic_equal({"replicas": 0}, {})
    assert not semantic_equal({"readOnly": False}, {})
    assert not is_empty(0) and not is_empty(False)


def test_nested_empties_vanish_but_non_empty_siblings_count() -> None:
    assert semantic_equal({"a": {"b": [], "c": {}}}, {"a": {}})
    assert not semantic_equal({"a": {"b": [], "c": 1}}, {"a": {}})


# --- issue 2: server defaults on the live listener pod --------------------------------------------


def test_server_defaulted_live_pod_is_not_drift(desired_pod: dict[str, Any], live_pod: dict[str, Any]) -> None:
    assert semantic_derivative(desired_pod, live_pod)
    assert first_drift(desired_pod, live_pod) is None


def test_guard_server_defaulted_live_pod_is_unequal_under_strict_comparisons(
    desired_pod: dict[str, Any], live_pod: dict[str, Any]
) -> None:
    # Guard: tightening the listener comparison to equality must make a test fail, because
    # equality here means deleting and recreating every healthy listener on every reconcile.
    assert desired_pod != live_pod
    assert desired_pod["spec"] != live_pod["spec"]
    assert not semantic_equal(desired_pod, live_pod)
    assert not semantic_equal(desired_pod["spec"], live_pod["spec"])


@pytest.mark.parametrize(
    "default",
    [
        "nodeName",
        "dnsPolicy",
        "schedulerName",
        "tolerations",
        "securityContext",
        "enableServiceLinks",
        "preemptionPolicy",
        "serviceAccount",
    ],
)
def test_each_pod_level_server_default_alone_is_not_drift_but_is_inequality(
    desired_pod: dict[str, Any], live_pod: dict[str, Any], default: str
) -> None:
    live = copy.deepcopy(desired_pod)
    live["spec"][default] = live_pod["spec"][default]
    assert semantic_derivative(desired_pod, live)
    if not is_empty(live_pod["spec"][default]):
        assert not semantic_equal(desired_pod, live)


@pytest.mark.parametrize("default", ["imagePullPolicy", "terminationMessagePath", "terminationMessagePolicy"])
def test_each_container_server_default_alone_is_not_drift(
    desired_pod: dict[str, Any], live_pod: dict[str, Any], default: str
) -> None:
    live = copy.deepcopy(desired_pod)
    runner(live)[default] = runner(live_pod)[default]
    assert semantic_derivative(desired_pod, live)
    assert not semantic_equal(desired_pod, live)


def test_kube_api_access_volume_and_mount_appended_is_not_drift(
    desired_pod: dict[str, Any], live_pod: dict[str, Any]
) -> None:
    live = copy.deepcopy(desired_pod)
    live["spec"]["volumes"].append(live_pod["spec"]["volumes"][1])
    runner(live)["volumeMounts"].append(runner(live_pod)["volumeMounts"][1])
    assert semantic_derivative(desired_pod, live)
    assert not semantic_equal(desired_pod, live)


def test_secret_default_mode_and_port_protocol_defaults_are_not_drift(desired_pod: dict[str, Any]) -> None:
    live = copy.deepcopy(desired_pod)
    live["spec"]["volumes"][0]["secret"]["defaultMode"] = 420
    runner(live)["ports"][0]["protocol"] = "TCP"
    assert semantic_derivative(desired_pod, live)


# --- issue 2: real changes are drift under both ---------------------------------------------------


def _change_image(pod: dict[str, Any]) -> None:
    runner(pod)["image"] = "ghcr.io/actions/gha-runner-scale-set-controller:0.14.3"


def _change_env_value(pod: dict[str, Any]) -> None:
    runner(pod)["env"][0]["value"] = "/etc/other/config.json"


def _change_quantity(pod: dict[str, Any]) -> None:
    runner(pod)["resources"]["limits"]["memory"] = "512Mi"


def _add_container(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox:1.36"})


def _change_config_version(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"]["actions.github.com/listener-config-resource-version"] = "102"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (_change_image, "$.spec.containers[0].image"),
        (_change_env_value, "$.spec.containers[0].env[0].value"),
        (_change_quantity, "$.spec.containers[0].resources.limits.memory"),
        (_add_container, "$.spec.containers"),
        (_change_config_version, "$.metadata.annotations.actions.github.com/listener-config-resource-version"),
    ],
)
def test_real_changes_are_drift_under_both(
    desired_pod: dict[str, Any], live_pod: dict[str, Any], change: Callable[[dict[str, Any]], object], where: str
) -> None:
    changed = copy.deepcopy(desired_pod)
    change(changed)
    # Derivative: the new desired pod against the live pod built from the old one.
    assert not semantic_derivative(changed, live_pod)
    assert first_drift(changed, live_pod) == where
    # Equality: the new desired spec against the old desired spec.
    assert not semantic_equal(changed, desired_pod)
    assert first_difference(changed, desired_pod) == where


@pytest.mark.parametrize(
    "change",
    [
        lambda t: runner(t).__setitem__("image", "ghcr.io/actions/actions-runner:2.322.0"),
        lambda t: runner(t)["env"][5].__setitem__("value", "http://other-proxy:3128"),
        lambda t: runner(t)["resources"]["requests"].__setitem__("memory", "6Gi"),
        lambda t: t["spec"]["containers"].append({"name": "cache", "image": "redis:7"}),
        lambda t: t["spec"]["volumes"][3]["emptyDir"].__setitem__("sizeLimit", "60Gi"),
        lambda t: t["spec"]["initContainers"][1]["env"].append({"name": "DOCKER_OPTS", "value": "--mtu=1400"}),
    ],
)
def test_runner_template_changes_are_inequality_and_drift(
    template: dict[str, Any], change: Callable[[dict[str, Any]], object]
) -> None:
    changed = copy.deepcopy(template)
    change(changed)
    assert not semantic_equal(template, changed)
    assert not semantic_equal(changed, template)
    assert not semantic_derivative(changed, template)


# --- quantities -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [("1Gi", "1024Mi"), ("500m", "0.5"), ("1", 1), ("1000m", 1), ("2", 2.0), ("1e3", "1k"), ("0.5", 0.5)],
)
def test_resource_quantities_compare_by_value(a: str | int | float, b: str | int | float) -> None:
    assert semantic_equal({"resources": {"limits": {"cpu": a}}}, {"resources": {"limits": {"cpu": b}}})
    assert semantic_equal({"resources": {"requests": {"memory": a}}}, {"resources": {"requests": {"memory": b}}})
    assert semantic_equal({"overhead": {"cpu": a}}, {"overhead": {"cpu": b}})
    assert semantic_equal({"emptyDir": {"sizeLimit": a}}, {"emptyDir": {"sizeLimit": b}})
    assert semantic_derivative({"resources": {"limits": {"cpu": a}}}, {"resources": {"limits": {"cpu": b}}})


def test_quantities_in_the_realistic_template(template: dict[str, Any]) -> None:
    changed = copy.deepcopy(template)
    runner(changed)["resources"]["limits"]["memory"] = "8192Mi"
    runner(changed)["resources"]["requests"]["cpu"] = 2
    runner(changed)["env"][19]["valueFrom"]["resourceFieldRef"]["divisor"] = "1024Ki"
    changed["spec"]["volumes"][3]["emptyDir"]["sizeLimit"] = "51200Mi"
    changed["spec"]["initContainers"][1]["resources"]["requests"]["cpu"] = "0.5"
    assert changed != template
    assert semantic_equal(template, changed)


def test_pvc_storage_request_in_ephemeral_volume_is_a_quantity() -> None:
    a = load("ars-kubernetes.yaml")["spec"]["template"]
    b = copy.deepcopy(a)
    b["spec"]["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] = "1024Mi"
    assert semantic_equal(a, b)


@pytest.mark.parametrize(
    ("field", "a", "b"),
    [
        ("image", "runner:1", "runner:1.0"),
        ("tag", "1", "1.0"),
        ("value", "1Gi", "1024Mi"),  # an env value: the program reads the text
        ("value", "500m", "0.5"),
        ("name", "1k", "1000"),
    ],
)
def test_quantity_like_strings_outside_quantity_fields_compare_exactly(field: str, a: str, b: str) -> None:
    assert not semantic_equal({field: a}, {field: b})
    assert not semantic_equal({"env": [{"name": "X", field: a}]}, {"env": [{"name": "X", field: b}]})


def test_unparsable_quantity_falls_back_to_exact_comparison() -> None:
    assert semantic_equal({"resources": {"limits": {"cpu": "lots"}}}, {"resources": {"limits": {"cpu": "lots"}}})
    assert not semantic_equal({"resources": {"limits": {"cpu": "lots"}}}, {"resources": {"limits": {"cpu": "1"}}})
    assert not semantic_equal({"resources": {"limits": {"cpu": True}}}, {"resources": {"limits": {"cpu": 1}}})


def test_limits_outside_resources_are_not_quantities() -> None:
    # e.g. a LimitRange-like map someone put in an annotation tree: only resources.limits counts.
    assert not semantic_equal({"limits": {"cpu": "1"}}, {"limits": {"cpu": "1000m"}})


# --- numbers and booleans -------------------------------------------------------------------------


def test_int_and_whole_float_are_equal_because_the_server_reencodes_them() -> None:
    assert semantic_equal({"terminationGracePeriodSeconds": 60}, {"terminationGracePeriodSeconds": 60.0})
    assert semantic_derivative({"priority": 1.0}, {"priority": 1})
    assert not semantic_equal({"x": 1}, {"x": 1.5})


@pytest.mark.parametrize(("a", "b"), [(True, 1), (False, 0), (1, True), (True, 1.0), (True, "true"), (1, "1")])
def test_booleans_and_numbers_and_strings_are_strict(a: object, b: object) -> None:
    assert not semantic_equal({"x": a}, {"x": b})
    assert not semantic_derivative({"x": a}, {"x": b})


def test_type_mismatches_never_raise() -> None:
    shapes = [{"a": 1}, [1], "s", 1, 1.5, True, None, [], {}, [{"a": [1, {"b": None}]}]]
    for a in shapes:
        for b in shapes:
            assert isinstance(semantic_equal(a, b), bool)
            assert isinstance(semantic_derivative(a, b), bool)
    assert not semantic_equal({"a": [1]}, {"a": {"0": 1}})
    assert not semantic_derivative({"a": "x"}, {"a": ["x"]})


def test_key_order_and_serialisation_details_do_not_matter(template: dict[str, Any]) -> None:
    # Seed 000: a hash changes "whenever unrelated serialization details change"; this must not.
    reordered = json.loads(json.dumps(template, sort_keys=True))
    reordered["spec"] = dict(reversed(list(reordered["spec"].items())))
    assert semantic_equal(template, reordered)


# --- semantic_derivative specifics ----------------------------------------------------------------


def test_fields_only_live_has_are_ignored() -> None:
    assert semantic_derivative({"a": 1}, {"a": 1, "b": 2})
    assert not semantic_derivative({"a": 1, "b": 2}, {"a": 1})


def test_desired_list_longer_than_live_is_drift() -> None:
    assert not semantic_derivative({"l": [1, 2, 3]}, {"l": [1, 2]})
    assert semantic_derivative({"l": [1, 2]}, {"l": [1, 2, 3]})


def test_list_elements_compare_pairwise_in_order() -> None:
    assert semantic_derivative({"l": [{"name": "a"}, {"name": "b"}]}, {"l": [{"name": "a", "x": 1}, {"name": "b"}]})
    assert not semantic_derivative({"l": [{"name": "a"}, {"name": "b"}]}, {"l": [{"name": "b"}, {"name": "a"}]})
    assert not semantic_equal({"l": [1, 2]}, {"l": [2, 1]})


def test_empty_desired_fields_are_ignored_even_when_live_has_values() -> None:
    assert semantic_derivative(
        {"nodeSelector": {}, "env": [], "image": "", "x": None},
        {"nodeSelector": {"a": "b"}, "env": [1], "image": "i", "x": 1},
    )
    assert semantic_derivative([], [1, 2])
    assert semantic_derivative({}, {"anything": True})


def test_removing_a_field_from_desired_is_invisible_to_the_derivative(
    desired_pod: dict[str, Any], live_pod: dict[str, Any]
) -> None:
    # Seed 004: "DeepDerivative ignores empty values on the desired side, so a field being removed is
    # invisible to it" — harmless for template fields, because the scale-set worker compares the whole
    # listener spec with semantic_equal and replaces the listener when it changes.
    fewer = copy.deepcopy(desired_pod)
    del runner(fewer)["resources"]
    runner(fewer)["env"] = []
    assert semantic_derivative(fewer, live_pod)
    assert not semantic_equal(fewer, desired_pod)


def test_removed_metrics_port_needs_the_separate_count_check(
    desired_pod: dict[str, Any], live_pod: dict[str, Any]
) -> None:
    # Seed 000/004: ports come from a controller flag, not from a resource; with metrics turned off
    # the desired pod has no port, the derivative cannot see that, and only the count check can.
    no_metrics = copy.deepcopy(desired_pod)
    del runner(no_metrics)["ports"]
    assert semantic_derivative(no_metrics, live_pod)
    assert container_port_counts_differ(no_metrics["spec"], live_pod["spec"])


def test_port_count_check_ignores_server_defaulted_protocol(
    desired_pod: dict[str, Any], live_pod: dict[str, Any]
) -> None:
    # "comparing contents would reintroduce the loop, since the API server defaults protocol to TCP"
    assert runner(desired_pod)["ports"] != runner(live_pod)["ports"]
    assert not container_port_counts_differ(desired_pod["spec"], live_pod["spec"])
    added = copy.deepcopy(desired_pod)
    runner(added)["ports"].append({"name": "debug", "containerPort": 6060})
    assert container_port_counts_differ(added["spec"], live_pod["spec"])


def test_prepopulating_defaults_would_not_make_equality_work(
    desired_pod: dict[str, Any], live_pod: dict[str, Any]
) -> None:
    # Seed 004: nodeName is scheduler-assigned and the access-token volume has a generated name.
    padded = copy.deepcopy(desired_pod)
    for key in (
        "dnsPolicy",
        "schedulerName",
        "securityContext",
        "enableServiceLinks",
        "tolerations",
        "preemptionPolicy",
        "priority",
        "serviceAccount",
    ):
        padded["spec"][key] = live_pod["spec"][key]
    assert not semantic_equal(padded["spec"], live_pod["spec"])
    assert first_difference(padded["spec"], live_pod["spec"]) is not None


def test_missing_config_version_annotation_on_live_pod_is_drift(
    desired_pod: dict[str, Any], live_pod: dict[str, Any]
) -> None:
    # Seed 004: a live pod predating the annotation is recreated once; an absent desired one is ignored.
    legacy = copy.deepcopy(live_pod)
    del legacy["metadata"]["annotations"]
    assert not semantic_derivative(desired_pod["metadata"], legacy["metadata"])
    no_desired = copy.deepcopy(desired_pod)
    del no_desired["metadata"]["annotations"]
    assert semantic_derivative(no_desired["metadata"], live_pod["metadata"])


def test_foreign_metadata_keys_do_not_cause_a_patch_loop() -> None:
    # Seed 000: labels and annotations are merged, so admission's keys stay on the object; drift is
    # judged against the merge result, where desired keys are a subset.
    desired = {"labels": {"app": "x"}, "annotations": {"a": "1"}}
    merged_live = {
        "labels": {"app": "x", "admission.example.com/injected": "true"},
        "annotations": {"a": "1", "b": "2"},
    }
    assert semantic_derivative(desired, merged_live)
    assert not semantic_derivative({"labels": {"app": "y"}}, merged_live)


def test_identical_trees_short_circuit(template: dict[str, Any]) -> None:
    assert semantic_equal(template, template)
    assert semantic_equal(template, copy.deepcopy(template))
    assert semantic_derivative(template, copy.deepcopy(template))


def test_first_difference_reports_extra_keys_on_either_side() -> None:
    assert first_difference({"a": 1}, {"a": 1, "b": [1]}) == "$.b"
    assert first_difference({"a": {"b": [0, {"c": 2}]}}, {"a": {"b": [0, {"c": 3}]}}) == "$.a.b[1].c"
    assert first_drift({"a": {"b": 1}}, {"a": {}}) == "$.a.b"


def test_api_structs_compare_as_their_json(template: dict[str, Any]) -> None:
    def spec(pod_spec: dict[str, Any]) -> EphemeralRunnerSpec:
        return EphemeralRunnerSpec(
            github_config_url="https://github.com/o/r", github_config_secret="s", runner_scale_set_id=1, spec=pod_spec
        )

    with_empties = copy.deepcopy(template["spec"])
    with_empties["volumes"] = []
    with_empties["nodeSelector"] = {}
    assert semantic_equal(spec(template["spec"]), spec(copy.deepcopy(template["spec"])))
    stripped = copy.deepcopy(with_empties)
    del stripped["volumes"], stripped["nodeSelector"]
    assert semantic_equal(spec(with_empties), spec(stripped))
    changed = copy.deepcopy(template["spec"])
    runner({"spec": changed})["image"] = "other"
    assert not semantic_equal(spec(template["spec"]), spec(changed))
    assert first_difference(spec(template["spec"]), spec(changed)) == "$.spec.containers[0].image"
    assert semantic_derivative(spec(template["spec"]), to_dict(spec(template["spec"])))
