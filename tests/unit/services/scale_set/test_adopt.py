"""Adoption of what Go ARC left (services/scale_set/adopt.py, services/runner_set/adopt.py), table
driven over objects shaped exactly as ARC 0.14.2 and the integrity-hash era write them
(tests/data/arc/takeover/)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import yaml

from services.runner_set import adopt as rs_adopt
from services.scale_set import adopt
from services.scale_set.build import BuildOptions, desired_ephemeral_runner_set
from shared.api import AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet, decode
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    ANNOTATION_INTEGRITY_HASH,
    ANNOTATION_VALUES_HASH,
    FINALIZER_EPHEMERAL_RUNNER,
    FINALIZER_EPHEMERAL_RUNNER_SET,
)
from tests.support.paths import TEST_DATA

DATA = TEST_DATA / "arc" / "takeover"
OPTIONS = BuildOptions(controller_namespace="arc-systems", listener_image="ghcr.io/example/runnerscale:1")
TARGET_UID = "00000000-0000-4000-8000-0000000000ff"
NAME = "arc-runner-set"


def load(name: str) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all((DATA / name).read_text()):
        by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def objects(name: str) -> tuple[AutoscalingRunnerSet, list[EphemeralRunnerSet], list[EphemeralRunner]]:
    docs = load(name)
    ars = decode(AutoscalingRunnerSet, docs["AutoscalingRunnerSet"][0])
    sets = [decode(EphemeralRunnerSet, d) for d in docs["EphemeralRunnerSet"]]
    runners = [decode(EphemeralRunner, d) for d in docs["EphemeralRunner"]]
    return ars, sets, runners


def created_target(ars: AutoscalingRunnerSet) -> EphemeralRunnerSet:
    """The ERS the scale-set worker creates next to ARC 0.14's sets (as the API server returns it)."""
    ers = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    ers.metadata.uid = TARGET_UID
    return ers


def moved(er: EphemeralRunner, patch: dict[str, Any] | None) -> EphemeralRunner:
    """``er`` after ``patch`` (the part of a merge patch that adoption writes)."""
    if patch is None:
        return er
    tree = msgspec.to_builtins(er)
    meta = patch.get("metadata", {})
    if "ownerReferences" in meta:
        tree["metadata"]["ownerReferences"] = meta["ownerReferences"]
    for k, v in meta.get("annotations", {}).items():
        if v is None:
            tree["metadata"]["annotations"].pop(k, None)
        else:
            tree["metadata"]["annotations"][k] = v
    tree["spec"].update(patch.get("spec", {}))
    return decode(EphemeralRunner, tree)


def freeze(ers: EphemeralRunnerSet, patch: dict[str, Any]) -> EphemeralRunnerSet:
    spec = msgspec.structs.replace(ers.spec, replicas=patch["spec"]["replicas"], patch_id=patch["spec"]["patchID"])
    return msgspec.structs.replace(ers, spec=spec)


@pytest.mark.parametrize(
    ("replicas", "patch_id", "deleting", "expected"),
    [
        (2, 3, False, {"spec": {"replicas": 0, "patchID": 3}}),
        (2, 0, False, {"spec": {"replicas": 0, "patchID": 1}}),  # 0 would scale the idle runners down
        (0, 0, False, {"spec": {"replicas": 0, "patchID": 1}}),
        (0, 3, False, None),
        (2, 3, True, None),
    ],
)
def test_freeze_patch(replicas: int, patch_id: int, deleting: bool, expected: dict[str, Any] | None) -> None:
    _, sets, _ = objects("arc-0.14.yaml")
    ers = sets[1]
    spec = msgspec.structs.replace(ers.spec, replicas=replicas, patch_id=patch_id)
    meta = ers.metadata if deleting else msgspec.structs.replace(ers.metadata, deletion_timestamp=None)
    if deleting:
        meta = sets[0].metadata
    assert adopt.freeze_patch(msgspec.structs.replace(ers, spec=spec, metadata=meta)) == expected


def steps_by_name(plan: adopt.AdoptionPlan) -> dict[str, tuple[str, str]]:
    return {s.runner.metadata.name: (s.action, s.why) for s in plan.runners}


# --- recognising ARC's shapes -----------------------------------------------------------------------


def test_legacy_sets_are_the_generate_named_ones_the_ars_controls_oldest_first() -> None:
    ars, sets, _ = objects("arc-0.14.yaml")
    foreign = msgspec.structs.replace(sets[1], metadata=msgspec.structs.replace(sets[1].metadata, owner_references=[]))
    assert [e.metadata.name for e in adopt.legacy_runner_sets(ars, reversed(sets))] == [
        "arc-runner-set-7xk2q",
        "arc-runner-set-m4n8p",
    ]
    assert [e.metadata.name for e in adopt.legacy_runner_sets(ars, [sets[0], foreign])] == ["arc-runner-set-7xk2q"]
    # The set named like the ARS (integrity-hash era, or runnerscale's own) is never "legacy".
    ars2, sets2, _ = objects("arc-integrity.yaml")
    assert adopt.legacy_runner_sets(ars2, sets2) == []


@pytest.mark.parametrize(
    ("fixture", "index", "arc"),
    [("arc-0.14.yaml", 0, True), ("arc-0.14.yaml", 1, True), ("arc-integrity.yaml", 0, True)],
)
def test_a_set_without_a_revision_is_arcs(fixture: str, index: int, arc: bool) -> None:
    _, sets, _ = objects(fixture)
    assert adopt.is_arc_runner_set(sets[index]) is arc
    ars, _, _ = objects(fixture)
    assert adopt.is_arc_runner_set(created_target(ars)) is False


def test_a_new_set_next_to_legacy_ones_neither_creates_nor_removes_runners() -> None:
    ars, sets, _ = objects("arc-0.14.yaml")
    assert adopt.seed_spec_for_new_set(adopt.legacy_runner_sets(ars, sets)) == {"replicas": 0, "patchID": 1}
    assert adopt.seed_spec_for_new_set([]) == {"replicas": 0, "patchID": 0}


@pytest.mark.parametrize(
    ("fixture", "removed"),
    [("arc-0.14.yaml", ["actions.github.com/change-hash"]), ("arc-integrity.yaml", [ANNOTATION_INTEGRITY_HASH])],
)
def test_ars_loses_arcs_controller_fingerprints_but_keeps_the_charts_values_hash(
    fixture: str, removed: list[str]
) -> None:
    ars, _, _ = objects(fixture)
    patch = adopt.ars_cleanup_patch(ars)
    assert patch == {"metadata": {"annotations": dict.fromkeys(removed)}}
    assert ANNOTATION_VALUES_HASH in ars.metadata.annotations  # stays: the chart writes it


# --- ARC 0.14: a set mid-rollout, runners mid-job ---------------------------------------------------


def test_014_mid_rollout_keeps_matching_runners_and_leaves_the_old_spec_busy_one() -> None:
    ars, sets, runners = objects("arc-0.14.yaml")
    target = created_target(ars)
    desired = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    legacy = adopt.legacy_runner_sets(ars, sets)

    # First pass: ARC's latest set is frozen (it would replace every runner moved away); its
    # runners wait; the draining one needs no freeze (its finalizer flow creates nothing).
    first = adopt.plan_adoption(target, desired, legacy, runners)
    assert [(e.metadata.name, p) for e, p in first.freeze] == [
        ("arc-runner-set-m4n8p", {"spec": {"replicas": 0, "patchID": 3}})
    ]
    assert steps_by_name(first)["arc-runner-set-m4n8p-runner-x2k7f"] == ("wait", "its set is frozen first")
    assert first.runner_patches == [] and first.seed is None and first.delete_sets == []

    legacy = [freeze(e, p) for e, p in first.freeze] + [e for e in legacy if e.metadata.is_deleting]
    legacy = adopt.legacy_runner_sets(ars, legacy)
    plan = adopt.plan_adoption(target, desired, legacy, runners)
    assert plan.freeze == []
    assert steps_by_name(plan) == {
        "arc-runner-set-7xk2q-runner-4vq9d": ("leave", "busy, spec differs: finishes its job, then goes"),
        "arc-runner-set-m4n8p-runner-x2k7f": ("keep", "idle, spec matches: kept at revision 1"),
        "arc-runner-set-m4n8p-runner-p8w3z": ("keep", "busy, spec matches: kept at revision 1"),
    }
    idle = next(s for s in plan.runners if s.runner.metadata.name.endswith("x2k7f"))
    assert idle.patch == {
        "metadata": {
            "ownerReferences": [
                {
                    "apiVersion": "actions.github.com/v1alpha1",
                    "kind": "EphemeralRunnerSet",
                    "name": "arc-runner-set",
                    "uid": TARGET_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "annotations": {"actions.github.com/runner-spec-hash": None, ANNOTATION_ACTIONABLE_REVISION: "1"},
        }
    }
    # Nothing is seeded or retired while a kept runner still has to move.
    assert plan.seed is None and plan.delete_sets == []

    # Second pass, after the moves: the latest legacy set is retired; the draining one is left to
    # its finalizer flow (it is already being deleted) and keeps its busy old-spec runner.
    after = [moved(s.runner, s.patch) for s in plan.runners]
    again = adopt.plan_adoption(target, desired, legacy, after)
    assert again.runner_patches == []
    assert [e.metadata.name for e in again.delete_sets] == ["arc-runner-set-m4n8p"]
    assert again.seed is None  # created by runnerscale at revision 1: nothing to seed


def test_014_runner_with_a_proxy_gets_the_new_sets_proxy_secret() -> None:
    ars, sets, runners = objects("arc-0.14.yaml")
    proxy = {"https": {"url": "http://proxy.example.com:3128"}}
    ars = decode(
        AutoscalingRunnerSet, {**msgspec.to_builtins(ars), "spec": {**msgspec.to_builtins(ars.spec), "proxy": proxy}}
    )
    er_tree = msgspec.to_builtins(runners[1])
    er_tree["spec"].update(proxy=proxy, proxySecretRef="arc-runner-set-m4n8p-754b578d-runner-proxy")
    er = decode(EphemeralRunner, er_tree)
    desired = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    legacy = [freeze(e, {"spec": {"replicas": 0, "patchID": 3}}) for e in adopt.legacy_runner_sets(ars, sets)]
    plan = adopt.plan_adoption(created_target(ars), desired, legacy, [er])
    assert plan.runners[0].action == "keep"
    assert plan.runners[0].patch is not None
    assert plan.runners[0].patch["spec"] == {"proxySecretRef": "arc-runner-set-754b578d-runner-proxy"}


# --- the integrity-hash era: the set named like the ARS, no revision ------------------------------


def test_integrity_era_runners_are_stamped_before_the_revision_is_seeded() -> None:
    ars, sets, runners = objects("arc-integrity.yaml")
    target = sets[0]
    desired = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    plan = adopt.plan_adoption(target, desired, [], runners)
    assert steps_by_name(plan) == {
        "arc-runner-set-runner-h7c2k": ("keep", "idle, spec matches: kept at revision 1"),
        "arc-runner-set-runner-q4n6t": ("keep", "busy, spec matches: kept at revision 1"),
    }
    for step in plan.runners:  # same owner; stamp + fingerprint gone
        assert step.patch == {
            "metadata": {"annotations": {ANNOTATION_INTEGRITY_HASH: None, ANNOTATION_ACTIONABLE_REVISION: "1"}}
        }
    assert plan.seed is None  # first the runners, or the rollout would remove the idle one

    after = [moved(s.runner, s.patch) for s in plan.runners]
    again = adopt.plan_adoption(target, desired, [], after)
    assert again.runner_patches == []
    # Seeded from the live state: revision 1, no spec change (Go's `creationTimestamp: null` and
    # `resources: {}` mean nothing), ARC's fingerprint dropped.
    assert again.seed == {
        "metadata": {"annotations": {ANNOTATION_INTEGRITY_HASH: None}},
        "spec": {"actionableRevision": 1},
    }


def test_integrity_era_with_a_spec_changed_while_arc_was_stopped() -> None:
    ars, sets, runners = objects("arc-integrity.yaml")
    tree = msgspec.to_builtins(ars)
    tree["spec"]["template"]["spec"]["containers"][0]["image"] = "ghcr.io/actions/actions-runner:2.331.0"
    ars = decode(AutoscalingRunnerSet, tree)
    desired = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    plan = adopt.plan_adoption(sets[0], desired, [], runners)
    assert steps_by_name(plan) == {
        "arc-runner-set-runner-h7c2k": ("leave", "idle, spec differs: replaced by a runner of the current spec"),
        "arc-runner-set-runner-q4n6t": ("leave", "busy, spec differs: finishes its job, then goes"),
    }
    assert plan.seed is not None
    assert plan.seed["spec"]["actionableRevision"] == 1
    patch = plan.seed["spec"]["ephemeralRunnerSpec"]  # the ARS's new template, in the same locked patch
    assert patch["spec"]["containers"][0]["image"] == "ghcr.io/actions/actions-runner:2.331.0"


def test_terminated_and_deleting_runners_are_left_alone() -> None:
    ars, sets, runners = objects("arc-integrity.yaml")
    done = msgspec.to_builtins(runners[0])
    done["status"]["phase"] = "Failed"
    gone = msgspec.to_builtins(runners[1])
    gone["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    desired = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    plan = adopt.plan_adoption(sets[0], desired, [], [decode(EphemeralRunner, done), decode(EphemeralRunner, gone)])
    assert steps_by_name(plan) == {"arc-runner-set-runner-h7c2k": ("leave", "terminated: removed by its set")}
    assert plan.seed is not None


def test_nothing_to_do_for_runnerscales_own_set() -> None:
    ars, _, runners = objects("arc-integrity.yaml")
    target = created_target(ars)
    desired = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    plan = adopt.plan_adoption(target, desired, [], runners)  # runners belong to another set uid
    assert plan.runners == [] and plan.seed is None and plan.delete_sets == []
    assert not plan.pending_writes


# --- the runner-set worker: ARC 0.14's finalizer on sets ---------------------------------------------


@pytest.mark.parametrize(
    ("finalizers", "live", "released", "owns"),
    [
        ([FINALIZER_EPHEMERAL_RUNNER], [FINALIZER_EPHEMERAL_RUNNER_SET], [], True),
        ([FINALIZER_EPHEMERAL_RUNNER_SET], None, [], True),
        ([FINALIZER_EPHEMERAL_RUNNER, FINALIZER_EPHEMERAL_RUNNER_SET], [FINALIZER_EPHEMERAL_RUNNER_SET], [], True),
        (
            ["example.com/keep", FINALIZER_EPHEMERAL_RUNNER],
            ["example.com/keep", FINALIZER_EPHEMERAL_RUNNER_SET],
            ["example.com/keep"],
            True,
        ),
        ([], [FINALIZER_EPHEMERAL_RUNNER_SET], None, False),
        (["example.com/keep"], ["example.com/keep", FINALIZER_EPHEMERAL_RUNNER_SET], None, False),
    ],
)
def test_runner_set_finalizers(
    finalizers: list[str], live: list[str] | None, released: list[str] | None, owns: bool
) -> None:
    assert rs_adopt.live_finalizers(finalizers) == live
    assert rs_adopt.released_finalizers(finalizers) == released
    assert rs_adopt.owns_finalizer(finalizers) is owns


def test_runners_wait_while_an_arc_listener_feeds_a_legacy_set() -> None:
    ars, sets, runners = objects("arc-0.14.yaml")
    al = decode(AutoscalingListener, load("arc-0.14.yaml")["AutoscalingListener"][0])
    legacy = [freeze(e, {"spec": {"replicas": 0, "patchID": 3}}) for e in adopt.legacy_runner_sets(ars, sets)]
    assert adopt.feeding_listeners([al], legacy) == [al]  # it points at arc-runner-set-m4n8p
    runnerscales = msgspec.structs.replace(al, spec=msgspec.structs.replace(al.spec, ephemeral_runner_set_name=NAME))
    assert adopt.feeding_listeners([runnerscales], legacy) == []

    desired = desired_ephemeral_runner_set(ars, OPTIONS, actionable_revision=1)
    plan = adopt.plan_adoption(created_target(ars), desired, legacy, runners, legacy_listener=True)
    assert steps_by_name(plan)["arc-runner-set-m4n8p-runner-x2k7f"] == ("wait", "ARC's listener still feeds its set")
    assert plan.runner_patches == [] and plan.delete_sets == [] and plan.seed is None
    assert plan.pending_writes  # requeued until the listener is gone
