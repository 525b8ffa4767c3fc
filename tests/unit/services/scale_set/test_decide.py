"""Pure decisions of the scale-set worker (seeds 000-002: every sentence is a case here)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import pytest

from services.scale_set import decide
from services.scale_set.build import BuildOptions, desired_ephemeral_runner_set, desired_listener
from shared.api import (
    AutoscalingRunnerSet,
    AutoscalingRunnerSetPhase,
    AutoscalingRunnerSetStatus,
    CustomObject,
    EphemeralRunnerSet,
    EphemeralRunnerSetPhase,
    EphemeralRunnerSetStatus,
    decode,
    to_dict,
)
from shared.api.constants import (
    ANNOTATION_RUNNER_GROUP_NAME,
    ANNOTATION_RUNNER_SCALE_SET_ID,
    ANNOTATION_RUNNER_SCALE_SET_NAME,
)
from tests.unit.services.scale_set.test_build import OPTIONS, load_ars

Obj = TypeVar("Obj", bound=CustomObject)

REGISTERED = {
    ANNOTATION_RUNNER_SCALE_SET_ID: "17",
    ANNOTATION_RUNNER_GROUP_NAME: "build-farm",
    ANNOTATION_RUNNER_SCALE_SET_NAME: "arc-runner-set",
}


def stored(obj: Obj, **status: Any) -> Obj:
    """What the API server hands back: a JSON round trip, plus server metadata and a status."""
    tree = to_dict(obj)
    tree["metadata"].update(resourceVersion="42", uid="uid-ers", generation=1)
    if status:
        tree["status"] = status
    return decode(type(obj), tree)


def ars_with(
    mutate: Callable[[dict[str, Any]], object] | None = None, /, base: str = "ars-dind.yaml", **annotations: str
) -> AutoscalingRunnerSet:
    ars = load_ars(base, **{**REGISTERED, **annotations})
    if mutate is not None:
        tree = to_dict(ars)
        mutate(tree)
        ars = decode(AutoscalingRunnerSet, tree)
    return ars


def runner(tree: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = next(c for c in tree["spec"]["template"]["spec"]["containers"] if c["name"] == "runner")
    return container


# --- runner spec drift -> actionable revision ---------------------------------------------------


def test_unchanged_spec_plans_nothing() -> None:
    ars = ars_with()
    existing = stored(desired_ephemeral_runner_set(ars, OPTIONS))
    plan = decide.plan_ers_update(existing, desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1))
    assert plan.patch is None and plan.new_revision is None


@pytest.mark.parametrize(
    "respell",
    [
        pytest.param(lambda t: runner(t).__setitem__("env", []), id="env: [] (dropped by omitempty elsewhere)"),
        pytest.param(
            lambda t: runner(t).__setitem__("volumeMounts", runner(t).get("volumeMounts") or []), id="same mounts"
        ),
        pytest.param(lambda t: t["spec"]["template"]["spec"].__setitem__("nodeSelector", {}), id="nodeSelector: {}"),
        pytest.param(lambda t: runner(t).__setitem__("resources", {"limits": {}}), id="empty limits"),
    ],
)
def test_semantic_no_op_reencodings_do_not_bump(respell: Callable[[dict[str, Any]], object]) -> None:
    """A strict comparison would bump the revision on every reconcile and delete every idle runner."""
    minimal = "ars-minimal.yaml"  # a runner container without env, mounts or resources
    existing = stored(desired_ephemeral_runner_set(ars_with(base=minimal), OPTIONS), phase="Running", currentReplicas=0)
    plan = decide.plan_ers_update(
        existing, desired_ephemeral_runner_set(ars_with(respell, base=minimal), OPTIONS, actionable_revision=1)
    )
    assert plan.new_revision is None
    assert plan.patch is None


def test_quantities_compare_by_value() -> None:
    def base(t: dict[str, Any]) -> None:
        runner(t)["resources"] = {"requests": {"memory": "1Gi", "cpu": "1"}}

    def respelled(t: dict[str, Any]) -> None:
        runner(t)["resources"] = {"requests": {"memory": "1024Mi", "cpu": "1000m"}}

    existing = stored(desired_ephemeral_runner_set(ars_with(base), OPTIONS))
    assert decide.plan_ers_update(existing, desired_ephemeral_runner_set(ars_with(respelled), OPTIONS)).patch is None


def test_image_change_bumps_revision_by_exactly_one() -> None:
    existing = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS, actionable_revision=4))
    changed = ars_with(lambda t: runner(t).__setitem__("image", "ghcr.io/actions/actions-runner:2.330.0"))
    plan = decide.plan_ers_update(existing, desired_ephemeral_runner_set(changed, OPTIONS, actionable_revision=4))
    assert plan.new_revision == 5
    assert plan.patch is not None
    assert plan.patch["spec"]["actionableRevision"] == 5
    assert (
        "replicas" not in plan.patch["spec"] and "patchID" not in plan.patch["spec"]
    )  # the desired-state flow's fields
    containers = plan.patch["spec"]["ephemeralRunnerSpec"]["spec"]["containers"]
    assert any(c["image"] == "ghcr.io/actions/actions-runner:2.330.0" for c in containers)
    assert plan.spec_drift_path is not None
    assert "containers" in plan.spec_drift_path


def test_removed_template_field_is_removed_from_the_ers() -> None:
    def with_selector(t: dict[str, Any]) -> None:
        t["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "ci"}

    def without_selector(t: dict[str, Any]) -> None:
        t["spec"]["template"]["spec"].pop("nodeSelector", None)

    existing = stored(desired_ephemeral_runner_set(ars_with(with_selector), OPTIONS))
    plan = decide.plan_ers_update(existing, desired_ephemeral_runner_set(ars_with(without_selector), OPTIONS))
    assert plan.new_revision == 2
    assert plan.patch is not None
    assert plan.patch["spec"]["ephemeralRunnerSpec"]["spec"]["nodeSelector"] is None  # merge patch: null deletes


def test_re_registration_reaches_the_ers() -> None:
    """Seed 000: a new scale set id arrives through an annotation, not a generation bump."""
    existing = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS))
    plan = decide.plan_ers_update(
        existing, desired_ephemeral_runner_set(ars_with(**{ANNOTATION_RUNNER_SCALE_SET_ID: "99"}), OPTIONS)
    )
    assert plan.patch is not None
    assert plan.patch["spec"]["ephemeralRunnerSpec"]["runnerScaleSetId"] == 99
    assert plan.new_revision == 2


def test_proxy_secret_ref_is_not_runner_spec_drift() -> None:
    existing = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS))
    existing.spec.ephemeral_runner_spec.proxy_secret_ref = "written-by-another-worker"
    assert decide.plan_ers_update(existing, desired_ephemeral_runner_set(ars_with(), OPTIONS)).new_revision is None


def test_legacy_ers_without_revision_starts_at_one() -> None:
    existing = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS, actionable_revision=0))
    changed = ars_with(lambda t: runner(t).__setitem__("image", "new"))
    assert decide.plan_ers_update(existing, desired_ephemeral_runner_set(changed, OPTIONS)).new_revision == 1


# --- metadata drift: subset check (ARC #4533) ---------------------------------------------------


def test_foreign_labels_and_annotations_never_cause_a_patch() -> None:
    existing = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS))
    existing.metadata.labels["webhook.example.com/injected"] = "yes"
    existing.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    assert decide.plan_ers_update(existing, desired_ephemeral_runner_set(ars_with(), OPTIONS)).patch is None


def test_changed_ars_label_patches_only_that_label_without_a_bump() -> None:
    existing = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS))
    existing.metadata.labels["foreign"] = "keep"
    changed = ars_with(lambda t: t["metadata"]["labels"].__setitem__("team", "infra"))
    plan = decide.plan_ers_update(existing, desired_ephemeral_runner_set(changed, OPTIONS))
    assert plan.patch == {"metadata": {"labels": {"team": "infra"}}}
    assert plan.new_revision is None


def test_runner_metadata_change_is_not_a_revision() -> None:
    existing = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS))
    changed = ars_with(lambda t: t["spec"].__setitem__("ephemeralRunnerMetadata", {"labels": {"x": "y"}}))
    plan = decide.plan_ers_update(existing, desired_ephemeral_runner_set(changed, OPTIONS))
    assert plan.patch is not None
    assert plan.patch["spec"]["ephemeralRunnerMetadata"]["labels"]["x"] == "y"
    assert existing.spec.ephemeral_runner_metadata is not None
    assert "runner-label" in existing.spec.ephemeral_runner_metadata.labels
    assert plan.patch["spec"]["ephemeralRunnerMetadata"]["labels"]["runner-label"] is None  # removed -> null
    assert plan.new_revision is None


# --- the Outdated guard ----------------------------------------------------------------


def ers_state(phase: str, spec_revision: int, applied: int) -> EphemeralRunnerSet:
    return stored(
        desired_ephemeral_runner_set(ars_with(), OPTIONS, actionable_revision=spec_revision),
        phase=phase,
        appliedActionableRevision=applied,
        currentReplicas=1,
    )


def test_guard_holds_while_the_applied_revision_lags() -> None:
    """The Outdated verdict may be about a spec the user already replaced: do not tear down."""
    assert not decide.outdated_teardown_allowed(ers_state("Outdated", 3, 2))


def test_guard_acts_once_the_applied_revision_caught_up() -> None:
    assert decide.outdated_teardown_allowed(ers_state("Outdated", 3, 3))


def test_guard_ignores_running_sets_and_missing_status() -> None:
    assert not decide.outdated_teardown_allowed(ers_state("Running", 3, 3))
    assert not decide.outdated_teardown_allowed(None)
    assert not decide.outdated_teardown_allowed(stored(desired_ephemeral_runner_set(ars_with(), OPTIONS)))


def test_drain_patch() -> None:
    ers = ers_state("Outdated", 1, 1)
    ers.spec.replicas, ers.spec.patch_id = 3, 12
    assert decide.drain_patch(ers) == {"spec": {"replicas": 0, "patchID": 0}}
    ers.spec.replicas, ers.spec.patch_id = 0, 0
    assert decide.drain_patch(ers) is None


# --- listener ------------------------------------------------------------------------------------


def test_listener_built_from_same_inputs_is_never_patched() -> None:
    """ARC compared with imagePullSecrets=nil and recreated the listener forever."""
    ars = ars_with()
    existing = stored(desired_listener(ars, OPTIONS))
    existing.metadata.labels["foreign"] = "x"
    assert decide.plan_listener_update(existing, desired_listener(ars, OPTIONS)) is None


def test_listener_max_runners_change_is_patched_in_place() -> None:
    existing = stored(desired_listener(ars_with(), OPTIONS))
    patch = decide.plan_listener_update(
        existing, desired_listener(ars_with(lambda t: t["spec"].__setitem__("maxRunners", 20)), OPTIONS)
    )
    assert patch == {"spec": {"maxRunners": 20}}


def test_listener_image_flag_change_is_patched() -> None:
    existing = stored(desired_listener(ars_with(), OPTIONS))
    new_opts = BuildOptions(
        controller_namespace="arc-systems", listener_image="img:2", image_pull_secrets=("ghcr-pull",)
    )
    assert decide.plan_listener_update(existing, desired_listener(ars_with(), new_opts)) == {"spec": {"image": "img:2"}}


def test_orphan_listeners() -> None:
    ars = ars_with()
    current = stored(desired_listener(ars, OPTIONS))
    old = stored(desired_listener(ars_with(lambda t: t["spec"].__setitem__("runnerGroup", "other")), OPTIONS))
    assert old.metadata.name != current.metadata.name
    assert [a.metadata.name for a in decide.orphan_listeners([current, old], ars, current.metadata.name)] == [
        old.metadata.name
    ]
    assert len(decide.orphan_listeners([current, old], ars, None)) == 2


# --- registration drift ----------------------------------------------------------------------------


def test_needs_registration() -> None:
    assert decide.needs_registration(load_ars())
    assert not decide.needs_registration(ars_with())


def test_runner_group_drift() -> None:
    assert not decide.runner_group_drifted(ars_with())
    assert not decide.runner_group_drifted(ars_with(**{ANNOTATION_RUNNER_GROUP_NAME: "BUILD-farm"}))  # any case
    assert decide.runner_group_drifted(ars_with(lambda t: t["spec"].__setitem__("runnerGroup", "other")))
    missing = ars_with()
    del missing.metadata.annotations[ANNOTATION_RUNNER_GROUP_NAME]
    assert decide.runner_group_drifted(missing)
    # An empty spec group never moves an existing scale set back to the default group.
    assert not decide.runner_group_drifted(ars_with(lambda t: t["spec"].pop("runnerGroup")))


def test_scale_set_name_drift() -> None:
    assert not decide.scale_set_name_drifted(ars_with())
    assert decide.scale_set_name_drifted(ars_with(lambda t: t["spec"].__setitem__("runnerScaleSetName", "renamed")))
    assert not decide.scale_set_name_drifted(
        ars_with(lambda t: t["spec"].pop("runnerScaleSetName"))
    )  # defaults to the ARS name


# --- validation ----------------------------------------------------------------------------------


def test_spec_problems() -> None:
    assert decide.spec_problems(ars_with()) == []
    bad = ars_with(
        lambda t: t["spec"].update(
            githubConfigUrl="https://github.com/a/b/c/d", githubConfigSecret="", minRunners=5, maxRunners=1
        )
    )
    paths = {p.path for p in decide.spec_problems(bad)}
    assert {"$.spec.githubConfigUrl", "$.spec.githubConfigSecret", "$.spec.minRunners"} <= paths
    assert "githubConfigSecret" in decide.problems_message(decide.spec_problems(bad))


# --- status -------------------------------------------------------------------------


def test_status_is_pending_until_the_generation_is_acted_upon() -> None:
    ars = ars_with()
    ars.metadata.generation = 3
    ars.status = AutoscalingRunnerSetStatus(phase=AutoscalingRunnerSetPhase.RUNNING, observed_generation=2)
    assert decide.generation_pending(ars)
    pending = decide.pending_status(ars)
    assert pending.phase == "Pending" and pending.observed_generation == 2
    ers = ers_state("Running", 1, 1)
    ers.status = EphemeralRunnerSetStatus(
        current_replicas=6,
        pending_ephemeral_runners=3,
        running_ephemeral_runners=2,
        failed_ephemeral_runners=1,
        phase=EphemeralRunnerSetPhase.RUNNING,
    )
    done = decide.next_status(ars, ers, acted=True)
    assert (done.phase, done.observed_generation) == ("Running", 3)
    assert (
        done.current_runners,
        done.pending_ephemeral_runners,
        done.running_ephemeral_runners,
        done.failed_ephemeral_runners,
    ) == (6, 3, 2, 1)
    assert decide.next_status(ars, ers, acted=False).phase == "Pending"
    assert decide.next_status(ars, ers, acted=True, outdated=True).phase == "Outdated"


def test_status_patch_only_when_different() -> None:
    ars = ars_with()
    ars.metadata.generation = 1
    status = decide.next_status(ars, None, acted=True)
    patch = decide.status_patch(ars, status)
    assert patch is not None
    assert patch["status"]["observedGeneration"] == 1 and patch["status"]["phase"] == "Running"
    ars.status = msgspec.convert(patch["status"], AutoscalingRunnerSetStatus)
    assert decide.status_patch(ars, decide.next_status(ars, None, acted=True)) is None
    # a changed count with an unchanged total is still propagated (ARC only compared currentRunners)
    ers = ers_state("Running", 1, 1)
    ers.status = EphemeralRunnerSetStatus(
        current_replicas=0, failed_ephemeral_runners=0, pending_ephemeral_runners=0, running_ephemeral_runners=0
    )
    assert decide.status_patch(ars, decide.next_status(ars, ers, acted=True)) is None
    ers.status.pending_ephemeral_runners = 1
    assert decide.status_patch(ars, decide.next_status(ars, ers, acted=True)) is not None


def test_stored_copies_are_independent() -> None:
    a = stored(desired_ephemeral_runner_set(ars_with(), OPTIONS))
    b = copy.deepcopy(a)
    b.metadata.labels["x"] = "y"
    assert "x" not in a.metadata.labels


def test_ars_name_must_fit_a_label_value() -> None:
    long = ars_with(lambda t: t["metadata"].__setitem__("name", "x" * 64))
    assert any(p.path == "$.metadata.name" for p in decide.spec_problems(long))
    ok = ars_with(lambda t: t["metadata"].__setitem__("name", "x" * 63))
    assert decide.spec_problems(ok) == []


# --- invalid specs and over-long names ------------------------------------------------------------


def test_listener_selector_is_none_when_the_name_cannot_be_a_label_value() -> None:
    ok = ars_with()
    assert decide.listener_selector(ok) is not None

    def rename(tree: dict[str, Any]) -> None:
        tree["metadata"]["name"] = "bad-" + "x" * 60

    long_name = ars_with(rename)
    assert decide.listener_selector(long_name) is None
    mine = desired_listener(long_name, OPTIONS)
    other = desired_listener(ok, OPTIONS)
    assert decide.listeners_of([mine, other], long_name) == [mine]


def test_invalid_status_sets_phase_and_condition_and_keeps_its_transition_time() -> None:
    ars = ars_with()
    first = decide.invalid_status(ars, "$.spec.minRunners: bad", "2026-01-01T00:00:00Z")
    assert first.phase == "Invalid"
    assert first.conditions is not None
    [condition] = first.conditions
    assert (condition.type, condition.status, condition.reason) == ("SpecValid", "False", "InvalidSpec")
    assert condition.message == "$.spec.minRunners: bad"
    again = decide.invalid_status(msgspec.structs.replace(ars, status=first), "$.spec.minRunners: bad", "later")
    assert again == first  # nothing to write on a re-pass
    fixed = decide.pending_status(msgspec.structs.replace(ars, status=first))
    assert fixed.phase == "Pending" and fixed.conditions is None
