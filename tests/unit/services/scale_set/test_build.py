"""Pure builders of the scale-set worker: names, labels, the desired ERS and AutoscalingListener."""

from __future__ import annotations

import yaml

from services.scale_set.build import (
    BuildOptions,
    desired_ephemeral_runner_set,
    desired_listener,
    effective_scale_set_name,
    merge_patch_diff,
    scale_set_id_of,
)
from shared.api import AutoscalingRunnerSet, decode, to_dict
from shared.api.constants import (
    ANNOTATION_RUNNER_GROUP_NAME,
    ANNOTATION_RUNNER_SCALE_SET_ID,
    ANNOTATION_RUNNER_SCALE_SET_NAME,
    COMPONENT_LISTENER,
    COMPONENT_RUNNER_SET,
    DEFAULT_MAX_RUNNERS,
    LABEL_COMPONENT,
    LABEL_ORGANIZATION,
    LABEL_PART_OF,
    LABEL_REPOSITORY,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
    LABEL_VERSION,
)
from shared.api.names import (
    filter_and_merge_labels,
    fnv_hash_string,
    listener_name,
    runner_proxy_secret_name,
    trim_label_value,
    url_labels,
)
from tests.support.paths import TEST_DATA

DATA = TEST_DATA / "arc"
OPTIONS = BuildOptions(
    controller_namespace="arc-systems", listener_image="ghcr.io/example/listener:1", image_pull_secrets=("ghcr-pull",)
)


def load_ars(name: str = "ars-dind.yaml", **annotations: str) -> AutoscalingRunnerSet:
    tree = yaml.safe_load((DATA / name).read_text())
    tree["metadata"].setdefault("annotations", {}).update(annotations)
    tree["metadata"]["uid"] = "uid-ars"
    return decode(AutoscalingRunnerSet, tree)


def test_listener_name_matches_arcs_worked_example() -> None:
    # ARC's name hash: hash input "arc-runners@@https://github.com/org/repo".
    assert listener_name("my-set", "arc-runners", "", "https://github.com/org/repo") == "my-set-7f984dc6-listener"


def test_runner_proxy_secret_name_matches_arc() -> None:
    assert runner_proxy_secret_name("arc-runner-set", "arc-runners") == "arc-runner-set-754b578d-runner-proxy"


def test_safe_encoded_digits() -> None:
    assert set(fnv_hash_string("anything")) <= set("456789bdf")


def test_label_values_are_trimmed_like_arc() -> None:
    assert trim_label_value("-org_.") == "org"
    long = "o" * 70
    assert trim_label_value(long) == "o" * 58 + "-trim"
    assert len(trim_label_value(long)) == 63


def test_url_labels() -> None:
    assert url_labels("https://github.com/owner/repo") == {LABEL_ORGANIZATION: "owner", LABEL_REPOSITORY: "repo"}
    assert url_labels("https://github.com/owner") == {LABEL_ORGANIZATION: "owner"}
    assert url_labels("https://github.com/enterprises/ent") == {"actions.github.com/enterprise": "ent"}
    assert url_labels("not a url") == {}


def test_scale_set_id_annotation_parsing() -> None:
    assert scale_set_id_of(load_ars()) == 0
    assert scale_set_id_of(load_ars(**{ANNOTATION_RUNNER_SCALE_SET_ID: "17"})) == 17
    assert scale_set_id_of(load_ars(**{ANNOTATION_RUNNER_SCALE_SET_ID: "x"})) == 0
    assert scale_set_id_of(load_ars(**{ANNOTATION_RUNNER_SCALE_SET_ID: "-3"})) == 0


def test_scale_set_name_defaults_to_the_ars_name() -> None:
    ars = load_ars("ars-minimal.yaml")
    assert effective_scale_set_name(ars) == "minimal"
    assert effective_scale_set_name(load_ars()) == "arc-runner-set"


def test_desired_ers_is_named_owned_and_at_revision_one() -> None:
    ars = load_ars(
        **{
            ANNOTATION_RUNNER_SCALE_SET_ID: "17",
            ANNOTATION_RUNNER_GROUP_NAME: "build-farm",
            ANNOTATION_RUNNER_SCALE_SET_NAME: "arc-runner-set",
        }
    )
    ers = desired_ephemeral_runner_set(ars, OPTIONS)
    assert (ers.metadata.name, ers.metadata.namespace) == ("arc-runner-set", "arc-runners")
    ref = ers.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.uid, ref.controller, ref.block_owner_deletion) == (
        "AutoscalingRunnerSet",
        "arc-runner-set",
        "uid-ars",
        True,
        True,
    )
    assert ers.spec.actionable_revision == 1
    assert (ers.spec.replicas, ers.spec.patch_id) == (0, 0)
    rs = ers.spec.ephemeral_runner_spec
    assert rs.runner_scale_set_id == 17
    assert rs.github_config_url == ars.spec.github_config_url
    assert rs.github_config_secret == "pre-defined-secret"
    assert rs.proxy == ars.spec.proxy and rs.github_server_tls == ars.spec.github_server_tls
    assert rs.proxy_secret_ref == "arc-runner-set-754b578d-runner-proxy"
    assert rs.spec == ars.spec.template["spec"]
    labels = ers.metadata.labels
    assert labels[LABEL_PART_OF] == "gha-runner-scale-set"  # overrides the chart's gha-rs
    assert labels[LABEL_COMPONENT] == COMPONENT_RUNNER_SET
    assert labels[LABEL_VERSION] == "0.14.2"
    assert (labels[LABEL_SCALE_SET_NAME], labels[LABEL_SCALE_SET_NAMESPACE]) == ("arc-runner-set", "arc-runners")
    assert (labels[LABEL_ORGANIZATION], labels[LABEL_REPOSITORY]) == ("octo-org", "octo-repo")
    assert labels["team"] == "platform"  # ARS labels propagate
    assert ers.metadata.annotations[ANNOTATION_RUNNER_GROUP_NAME] == "build-farm"
    assert ers.metadata.annotations[ANNOTATION_RUNNER_SCALE_SET_NAME] == "arc-runner-set"


def test_template_is_copied_not_shared() -> None:
    ars = load_ars()
    ers = desired_ephemeral_runner_set(ars, OPTIONS)
    ers.spec.ephemeral_runner_spec.spec["containers"][0]["image"] = "mutated"
    assert ars.spec.template["spec"]["containers"][0]["image"] != "mutated"


def test_excluded_label_prefixes_do_not_propagate() -> None:
    opts = BuildOptions(
        controller_namespace="arc-systems", listener_image="img", exclude_label_prefixes=("helm.sh/", "team")
    )
    ers = desired_ephemeral_runner_set(load_ars(), opts)
    assert "helm.sh/chart" not in ers.metadata.labels and "team" not in ers.metadata.labels
    assert filter_and_merge_labels(None, None) == {}


def test_desired_listener_spec() -> None:
    ars = load_ars(**{ANNOTATION_RUNNER_SCALE_SET_ID: "17"})
    al = desired_listener(ars, OPTIONS)
    assert al.metadata.namespace == "arc-systems"
    assert al.metadata.owner_references == []  # cross-namespace: no owner reference
    assert al.metadata.name == listener_name("arc-runner-set", "arc-runners", "build-farm", ars.spec.github_config_url)
    s = al.spec
    assert (s.autoscaling_runner_set_namespace, s.autoscaling_runner_set_name, s.ephemeral_runner_set_name) == (
        "arc-runners",
        "arc-runner-set",
        "arc-runner-set",
    )
    assert (s.min_runners, s.max_runners, s.runner_scale_set_id) == (1, 10, 17)
    assert s.image == "ghcr.io/example/listener:1"
    assert [r.name for r in s.image_pull_secrets] == ["ghcr-pull"]
    assert s.proxy == ars.spec.proxy and s.github_server_tls == ars.spec.github_server_tls
    assert s.metrics == ars.spec.listener_metrics and s.template == ars.spec.listener_template
    assert al.metadata.labels[LABEL_COMPONENT] == COMPONENT_LISTENER


def test_listener_defaults_min_max() -> None:
    al = desired_listener(load_ars("ars-minimal.yaml"), OPTIONS)
    assert (al.spec.min_runners, al.spec.max_runners) == (0, DEFAULT_MAX_RUNNERS)


def test_merge_patch_diff_removes_dropped_keys() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]}
    new = {"a": 1, "b": {"c": 2}, "l": [1], "e": "x"}
    assert merge_patch_diff(old, new) == {"b": {"d": None}, "l": [1], "e": "x"}
    assert merge_patch_diff(old, old) == {}


def test_desired_ers_round_trips_through_json() -> None:
    ers = desired_ephemeral_runner_set(load_ars(), OPTIONS)
    tree = to_dict(ers)
    assert tree["spec"]["actionableRevision"] == 1 and tree["spec"]["patchID"] == 0
