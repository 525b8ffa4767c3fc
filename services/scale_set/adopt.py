"""Taking over what Go ARC left behind (README "Switching from ARC"): pure decisions, no I/O.

The scale-set worker adopts ARC's objects itself, on every pass, so a switch needs no separate
migration step and a crash half-way simply resumes. ARC's shapes are recognised by facts ARC
writes and runnerscale never does:

- an EphemeralRunnerSet at ``spec.actionableRevision`` 0 (runnerscale creates every ERS at 1);
- an EphemeralRunnerSet controlled by the ARS but not named like it: ARC 0.12–0.14 created them
  with ``generateName: <ARS>-`` (several during a rollout), each with ARC's *runner* finalizer;
- ARC's drift fingerprints (``integrity-hash``, ``runner-spec-hash``, ``change-hash``) on the ERS,
  its runners and the listener; ``values-hash`` on the ERS, runners and listener (the chart's copy
  on the ARS belongs to the chart and stays).

What adoption does (the reconciler applies it in this order, one locked write at a time):

1. ERS named like the ARS missing while legacy sets exist → create it at revision 1 with
   ``replicas: 0`` and a non-zero ``patchID`` (scale **up** only, by nothing): the runner-set
   worker neither creates nor removes a runner before the listener publishes the real level.
2. Legacy sets are frozen (``replicas: 0``, non-zero ``patchID``), so a runner moved away is not
   replaced there, and ARC's listeners that patch them must be gone (the scale-set worker deletes
   them, the listener-pod worker stops their pods). Then every live runner (not deleting, not
   terminated) whose spec means the desired runner spec is kept: controller owner reference moved to the ERS named like the ARS, stamped with its
   actionable revision, ARC's fingerprints dropped, ``proxySecretRef`` renamed. Busy or idle, it
   is the same runner: same pod, same registration, no churn.
3. Runners whose spec differs are left as they are: unstamped (revision 0) on the ERS named like
   the ARS, the runner-set's revision rollout removes the idle ones and lets busy ones finish;
   on a legacy set, that set's deletion drains them the same way.
4. Once no runner is left to stamp, an ERS at revision 0 is seeded to revision 1 (with the
   desired runner spec, if it differs), so the typed fields describe the live state; legacy sets
   are deleted (the runner-set worker drains them, then removes its finalizer and the one ARC
   0.12–0.14 put on them: ``services/runner_set/adopt.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.scale_set.build import merge_patch_diff
from services.scale_set.decide import plan_listener_update
from shared.api import (
    AutoscalingListener,
    AutoscalingRunnerSet,
    EphemeralRunner,
    EphemeralRunnerPhase,
    EphemeralRunnerSet,
    EphemeralRunnerSpec,
    ObjectMeta,
)
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    ANNOTATION_INTEGRITY_HASH,
    ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION,
    ANNOTATION_VALUES_HASH,
    API_VERSION,
    KIND_EPHEMERAL_RUNNER_SET,
)
from shared.semantic import semantic_equal

#: ARC 0.12–0.14: fingerprint of the runner spec on ERSs (copied onto their runners) and of the
#: whole ARS spec on listeners.
ANNOTATION_RUNNER_SPEC_HASH = "actions.github.com/runner-spec-hash"
#: ARC 0.12–0.14: the ARS spec+labels fingerprint.
ANNOTATION_CHANGE_HASH = "actions.github.com/change-hash"

#: Annotations only ARC's controllers write on the ERS, its runners and the listener.
ARC_CHILD_ANNOTATIONS = (
    ANNOTATION_INTEGRITY_HASH,
    ANNOTATION_RUNNER_SPEC_HASH,
    ANNOTATION_CHANGE_HASH,
    ANNOTATION_VALUES_HASH,
)
#: Annotations ARC's controller writes on the ARS (``values-hash`` there is the chart's).
ARC_ARS_ANNOTATIONS = (ANNOTATION_INTEGRITY_HASH, ANNOTATION_CHANGE_HASH)

#: The patch ID a set created during adoption starts at: not 0 (authoritative: would scale the
#: adopted idle runners down to ``replicas``), so "scale up only" until the listener speaks.
ADOPTION_PATCH_ID = 1

_TERMINATED = (EphemeralRunnerPhase.SUCCEEDED, EphemeralRunnerPhase.FAILED, EphemeralRunnerPhase.OUTDATED)


def _tree(value: Any) -> Any:
    return msgspec.to_builtins(value) if value is not None else None


# --- recognising ARC's shapes ----------------------------------------------------------------------


def is_arc_runner_set(ers: EphemeralRunnerSet) -> bool:
    """Written by ARC, never by runnerscale: runnerscale creates every ERS at revision 1."""
    return ers.spec.actionable_revision <= 0


def controlled_by(meta: ObjectMeta, uid: str) -> bool:
    ref = meta.controller_reference()
    return ref is not None and bool(uid) and ref.uid == uid


def legacy_runner_sets(ars: AutoscalingRunnerSet, sets: Iterable[EphemeralRunnerSet]) -> list[EphemeralRunnerSet]:
    """ERSs this ARS controls under another name (ARC 0.12–0.14's ``<ARS>-<random>``), oldest first."""
    found = [
        ers for ers in sets if ers.metadata.name != ars.metadata.name and controlled_by(ers.metadata, ars.metadata.uid)
    ]

    def age(e: EphemeralRunnerSet) -> tuple[str, str]:
        created = e.metadata.creation_timestamp
        return (created.isoformat() if created is not None else "", e.metadata.name)

    return sorted(found, key=age)


def arc_annotation_removals(meta: ObjectMeta, keys: Sequence[str] = ARC_CHILD_ANNOTATIONS) -> dict[str, None]:
    """The merge-patch entries that drop ARC's fingerprints present on ``meta``."""
    return {k: None for k in keys if k in meta.annotations}


# --- runners -------------------------------------------------------------------------------------------


def _comparable(spec: EphemeralRunnerSpec) -> Any:
    tree = _tree(spec)
    tree.pop("proxySecretRef", None)  # named after the set (ARC: after the legacy set); derived
    return tree


def runner_matches(er: EphemeralRunner, desired: EphemeralRunnerSpec) -> bool:
    """The runner was built from what the ARS asks for now (semantically: absent = empty)."""
    return semantic_equal(_comparable(er.spec), _comparable(desired))


def is_terminated(er: EphemeralRunner) -> bool:
    return er.status is not None and er.status.phase in _TERMINATED


def is_busy(er: EphemeralRunner) -> bool:
    return er.status is not None and bool(er.status.job_id)


def _set_owner_ref(target: EphemeralRunnerSet) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_EPHEMERAL_RUNNER_SET,
        "name": target.metadata.name,
        "uid": target.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def keep_runner_patch(
    er: EphemeralRunner, target: EphemeralRunnerSet, revision: int, desired: EphemeralRunnerSpec
) -> dict[str, Any] | None:
    """The merge patch that makes a kept ARC runner look as runnerscale writes it: controlled by
    ``target``, stamped with ``revision``, no ARC fingerprints, proxy Secret named after ``target``.
    None when it already is."""
    meta: dict[str, Any] = {}
    if not controlled_by(er.metadata, target.metadata.uid):
        others = [
            _tree(ref) for ref in er.metadata.owner_references if not ref.controller and ref.uid != target.metadata.uid
        ]
        meta["ownerReferences"] = [_set_owner_ref(target), *others]
    annotations: dict[str, Any] = dict(arc_annotation_removals(er.metadata))
    if er.metadata.annotations.get(ANNOTATION_ACTIONABLE_REVISION) != str(revision):
        annotations[ANNOTATION_ACTIONABLE_REVISION] = str(revision)
    if annotations:
        meta["annotations"] = annotations
    patch: dict[str, Any] = {"metadata": meta} if meta else {}
    if desired.proxy_secret_ref and er.spec.proxy_secret_ref and er.spec.proxy_secret_ref != desired.proxy_secret_ref:
        patch["spec"] = {"proxySecretRef": desired.proxy_secret_ref}
    return patch or None


# --- the plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerStep:
    """One runner's fate: ``keep`` (patch it onto the set named like the ARS), ``leave`` (its
    spec differs: drained by the revision rollout or the legacy set's deletion) or ``wait`` (its
    legacy set is frozen first)."""

    runner: EphemeralRunner
    action: str  # "keep" | "leave" | "wait"
    patch: dict[str, Any] | None
    why: str


@dataclass(frozen=True)
class AdoptionPlan:
    """What adoption still has to do for one ARS; empty when nothing of ARC's is left."""

    runners: list[RunnerStep] = field(default_factory=list)
    #: Merge patch for the ERS named like the ARS (revision seed, ARC annotations, finalizers);
    #: only once no runner patch is pending.
    seed: dict[str, Any] | None = None
    #: Legacy sets to delete (only once their kept runners moved).
    delete_sets: list[EphemeralRunnerSet] = field(default_factory=list)
    #: Legacy sets to freeze first (merge patches): no runner created or removed any more, so a
    #: runner moved away is not replaced there.
    freeze: list[tuple[EphemeralRunnerSet, dict[str, Any]]] = field(default_factory=list)

    @property
    def runner_patches(self) -> list[RunnerStep]:
        return [s for s in self.runners if s.patch is not None]

    @property
    def pending_writes(self) -> bool:
        return bool(
            self.runner_patches
            or self.seed
            or self.delete_sets
            or self.freeze
            or any(s.action == "wait" for s in self.runners)
        )


def seed_spec_for_new_set(legacy: Sequence[EphemeralRunnerSet]) -> dict[str, int]:
    """``replicas``/``patchID`` of the ERS created to replace legacy sets (see module docstring)."""
    return {"replicas": 0, "patchID": ADOPTION_PATCH_ID} if legacy else {"replicas": 0, "patchID": 0}


def freeze_patch(ers: EphemeralRunnerSet) -> dict[str, Any] | None:
    """``replicas: 0`` with a non-zero patch ID: the runner-set worker then neither creates runners
    (nothing is missing) nor removes idle ones (only patch ID 0 scales down). None: frozen already,
    or being deleted (its finalizer flow no longer creates runners)."""
    if ers.metadata.is_deleting or (ers.spec.replicas == 0 and ers.spec.patch_id != 0):
        return None
    return {"spec": {"replicas": 0, "patchID": ers.spec.patch_id or ADOPTION_PATCH_ID}}


def feeding_listeners(
    listeners: Iterable[AutoscalingListener], legacy: Sequence[EphemeralRunnerSet]
) -> list[AutoscalingListener]:
    """ARC's listeners (deleting or not: their pod may still run) that patch a legacy set. While
    one lives it can scale a frozen set up again, so runners are moved only once they are gone."""
    names = {e.metadata.name for e in legacy}
    return [al for al in listeners if al.spec.ephemeral_runner_set_name in names]


def plan_adoption(
    target: EphemeralRunnerSet,
    desired: EphemeralRunnerSet,
    legacy: Sequence[EphemeralRunnerSet],
    runners: Sequence[EphemeralRunner],
    *,
    legacy_listener: bool = False,
) -> AdoptionPlan:
    """Everything still to do to take over ``target`` (the ERS named like the ARS) and ``legacy``.

    ``desired`` is the ERS the scale-set worker builds from the ARS now; ``runners`` every
    EphemeralRunner in the namespace (those of other sets are ignored); ``legacy_listener``: an
    ARC listener still feeds a legacy set (:func:`feeding_listeners`): freeze only, move nothing.
    """
    adopting = is_arc_runner_set(target)
    revision = target.spec.actionable_revision if not adopting else 1
    freeze = [(ers, p) for ers in legacy if (p := freeze_patch(ers)) is not None]
    frozen = {e.metadata.uid for e, _ in freeze}
    legacy_uids = {e.metadata.uid for e in legacy}
    want = desired.spec.ephemeral_runner_spec
    steps: list[RunnerStep] = []
    moving: set[str] = set()  # legacy set uids that still have a runner to move
    for er in sorted(runners, key=lambda r: r.metadata.name):
        ref = er.metadata.controller_reference()
        on_target = ref is not None and ref.uid == target.metadata.uid
        on_legacy = ref is not None and ref.uid in legacy_uids
        if not (on_legacy or (on_target and adopting)):
            continue
        if er.metadata.is_deleting:
            continue
        if on_legacy and ref is not None and (ref.uid in frozen or legacy_listener):
            why = "its set is frozen first" if ref.uid in frozen else "ARC's listener still feeds its set"
            steps.append(RunnerStep(er, "wait", None, why))
            moving.add(ref.uid)
            continue
        if is_terminated(er):
            steps.append(RunnerStep(er, "leave", None, "terminated: removed by its set"))
            continue
        state = "busy" if is_busy(er) else "idle"
        if runner_matches(er, want):
            patch = keep_runner_patch(er, target, revision, want)
            steps.append(RunnerStep(er, "keep", patch, f"{state}, spec matches: kept at revision {revision}"))
            if patch is not None and on_legacy and ref is not None:
                moving.add(ref.uid)
        else:
            what = "finishes its job, then goes" if state == "busy" else "replaced by a runner of the current spec"
            steps.append(RunnerStep(er, "leave", None, f"{state}, spec differs: {what}"))

    seed: dict[str, Any] | None = None
    if not freeze and not any(s.patch is not None or s.action == "wait" for s in steps):
        seed = _seed_patch(target, desired, adopting)

    delete_sets = [ers for ers in legacy if not ers.metadata.is_deleting and ers.metadata.uid not in moving]
    return AdoptionPlan(steps, seed, delete_sets, freeze)


def _seed_patch(target: EphemeralRunnerSet, desired: EphemeralRunnerSet, adopting: bool) -> dict[str, Any] | None:
    meta: dict[str, Any] = {}
    annotations = arc_annotation_removals(target.metadata)
    if annotations:
        meta["annotations"] = annotations
    patch: dict[str, Any] = {"metadata": meta} if meta else {}
    if adopting:
        spec: dict[str, Any] = {"actionableRevision": 1}
        have, want = _comparable(target.spec.ephemeral_runner_spec), _comparable(desired.spec.ephemeral_runner_spec)
        if not semantic_equal(have, want):
            spec["ephemeralRunnerSpec"] = merge_patch_diff(
                _tree(target.spec.ephemeral_runner_spec), _tree(desired.spec.ephemeral_runner_spec)
            )
        patch["spec"] = spec
    return patch or None


def ars_cleanup_patch(ars: AutoscalingRunnerSet) -> dict[str, Any] | None:
    """Drop the fingerprints ARC's controller wrote on the ARS (never the chart's ``values-hash``)."""
    removals = arc_annotation_removals(ars.metadata, ARC_ARS_ANNOTATIONS)
    return {"metadata": {"annotations": removals}} if removals else None


# --- the dry run: every pass at once, object by object ---------------------------------------------


@dataclass(frozen=True)
class Change:
    """One thing a switch to runnerscale changes (or deliberately leaves), for ``adopt --dry-run``."""

    action: str
    kind: str
    name: str  # namespace/name
    detail: str

    def line(self) -> str:
        return f"  {self.action:<9} {self.kind} {self.name}: {self.detail}"


def _key(meta: ObjectMeta) -> str:
    return f"{meta.namespace}/{meta.name}"


def _apply_runner_patch(er: EphemeralRunner, patch: dict[str, Any] | None) -> EphemeralRunner:
    if patch is None:
        return er
    tree = msgspec.to_builtins(er)
    meta = patch.get("metadata", {})
    if "ownerReferences" in meta:
        tree["metadata"]["ownerReferences"] = meta["ownerReferences"]
    annotations = tree["metadata"].setdefault("annotations", {})
    for k, v in meta.get("annotations", {}).items():
        if v is None:
            annotations.pop(k, None)
        else:
            annotations[k] = v
    tree["spec"].update(patch.get("spec", {}))
    return msgspec.convert(tree, EphemeralRunner)


def _annotation_text(removals: dict[str, None]) -> str:
    return "drop ARC annotation(s) " + ", ".join(sorted(removals))


def preview_runner_sets(
    ars: AutoscalingRunnerSet,
    desired: EphemeralRunnerSet,
    sets: Sequence[EphemeralRunnerSet],
    runners: Sequence[EphemeralRunner],
) -> list[Change]:
    """What the scale-set and runner-set workers will do to this ARS's sets and runners, all
    passes of :func:`plan_adoption` folded into one list (the dry run)."""
    out: list[Change] = []
    removals = arc_annotation_removals(ars.metadata, ARC_ARS_ANNOTATIONS)
    if removals:
        out.append(Change("patch", "AutoscalingRunnerSet", _key(ars.metadata), _annotation_text(removals)))
    legacy = legacy_runner_sets(ars, sets)
    target = next((e for e in sets if e.metadata.name == ars.metadata.name), None)
    ns = ars.metadata.namespace
    if target is None:
        seed = seed_spec_for_new_set(legacy)
        spec = msgspec.structs.replace(desired.spec, replicas=seed["replicas"], patch_id=seed["patchID"])
        meta = msgspec.structs.replace(desired.metadata, uid="(new)")
        target = msgspec.structs.replace(desired, spec=spec, metadata=meta)
        why = f"replaces ARC's {', '.join(e.metadata.name for e in legacy)}; " if legacy else ""
        out.append(
            Change(
                "create",
                "EphemeralRunnerSet",
                f"{ns}/{ars.metadata.name}",
                f"{why}actionableRevision 1, replicas {seed['replicas']}, patchID {seed['patchID']}"
                " until the listener publishes",
            )
        )
    elif not is_arc_runner_set(target) and not legacy:
        return out
    for ers, patch in plan_adoption(target, desired, legacy, runners).freeze:
        out.append(
            Change(
                "freeze",
                "EphemeralRunnerSet",
                _key(ers.metadata),
                f"replicas {ers.spec.replicas}→0, patchID {ers.spec.patch_id}→{patch['spec']['patchID']}"
                " (creates and removes no runner any more)",
            )
        )
    legacy = [
        msgspec.structs.replace(e, spec=msgspec.structs.replace(e.spec, replicas=0, patch_id=e.spec.patch_id or 1))
        for e in legacy
    ]
    plan = plan_adoption(target, desired, legacy, runners)
    for step in plan.runners:
        where = ""
        ref = step.runner.metadata.controller_reference()
        if step.action == "keep" and ref is not None and ref.uid != target.metadata.uid:
            where = f" (moves from {ref.name} to {target.metadata.name})"
        out.append(Change(step.action, "EphemeralRunner", _key(step.runner.metadata), step.why + where))
    moved = [_apply_runner_patch(s.runner, s.patch) for s in plan.runners]
    others = [r for r in runners if r.metadata.uid not in {m.metadata.uid for m in moved}]
    final = plan_adoption(target, desired, legacy, [*moved, *others])
    if final.seed is not None:
        seed_patch = final.seed
        parts = []
        if "spec" in seed_patch:
            parts.append("actionableRevision 0→1 (seeded from the live state, no churn)")
            if "ephemeralRunnerSpec" in seed_patch["spec"]:
                parts.append("runner spec replaced by the ARS's (runners left above are rolled)")
        if "annotations" in seed_patch.get("metadata", {}):
            parts.append(_annotation_text(seed_patch["metadata"]["annotations"]))
        out.append(Change("seed", "EphemeralRunnerSet", _key(target.metadata), "; ".join(parts)))
    for ers in final.delete_sets:
        out.append(
            Change(
                "delete",
                "EphemeralRunnerSet",
                _key(ers.metadata),
                "ARC's set, once its matching runners moved; the runner-set worker drains the rest"
                " (idle ones removed at the service first, busy ones finish) and removes ARC's finalizer",
            )
        )
    for ers in legacy:
        if ers.metadata.is_deleting:
            out.append(
                Change(
                    "drain",
                    "EphemeralRunnerSet",
                    _key(ers.metadata),
                    "ARC was deleting it: the runner-set worker finishes the drain and removes ARC's finalizer",
                )
            )
    return out


def preview_listener(
    ars: AutoscalingRunnerSet,
    desired: AutoscalingListener,
    listeners: Sequence[AutoscalingListener],
    pod_annotations: dict[str, dict[str, str]],
) -> list[Change]:
    """The listener side of the dry run. ``listeners``: the ALs of this ARS (by labels or spec);
    ``pod_annotations``: listener pod name → its annotations (pods in the controller namespace)."""
    out: list[Change] = []
    objects_note = "pod, Role, RoleBinding, ServiceAccount and config Secret"
    found = {al.metadata.name: al for al in listeners}
    current = found.get(desired.metadata.name)
    for al in listeners:
        if al.metadata.name != desired.metadata.name and not al.metadata.is_deleting:
            out.append(
                Change(
                    "delete",
                    "AutoscalingListener",
                    _key(al.metadata),
                    f"named as ARC 0.12-0.14 named it; the listener-pod worker removes its {objects_note}"
                    " (the listener ends its Actions session on SIGTERM)",
                )
            )
    if current is None:
        out.append(
            Change(
                "create",
                "AutoscalingListener",
                _key(desired.metadata),
                f"in the same pass as the delete; the listener-pod worker creates its {objects_note}",
            )
        )
        return out
    patch = plan_listener_update(current, desired) or {}
    parts = []
    if patch.get("spec"):
        parts.append("spec fields " + ", ".join(sorted(patch["spec"])))
    removals = arc_annotation_removals(current.metadata)
    if removals:
        parts.append(_annotation_text(removals))
    if parts:
        out.append(Change("patch", "AutoscalingListener", _key(current.metadata), "in place; " + "; ".join(parts)))
    annotations = pod_annotations.get(current.metadata.name)
    if annotations is not None and ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION not in annotations:
        out.append(
            Change(
                "replace",
                "Pod",
                f"{current.metadata.namespace}/{current.metadata.name}",
                "ARC's listener pod: deleted and created as runnerscale's by the listener-pod worker"
                " (Role, RoleBinding, ServiceAccount updated in place, config Secret rewritten)",
            )
        )
    return out


def preview_listeners_elsewhere(
    ars: AutoscalingRunnerSet, elsewhere: Sequence[AutoscalingListener], controller_namespace: str
) -> list[Change]:
    """ARC's listeners of this ARS outside runnerscale's controller namespace (``elsewhere``: the
    ALs found in other namespaces that belong to it). The workers never see them (their RBAC on
    listeners is namespaced) and a live one keeps feeding the set, so the switch waits for the
    user to delete them (README "Switching from ARC", step 3)."""
    return [
        Change(
            "stray",
            "AutoscalingListener",
            _key(al.metadata),
            f"ARC's listener outside the controller namespace {controller_namespace}: runnerscale cannot see it;"
            " delete it by hand before starting runnerscale",
        )
        for al in elsewhere
        if al.metadata.namespace != controller_namespace
    ]


__all__ = [
    "ADOPTION_PATCH_ID",
    "ARC_CHILD_ANNOTATIONS",
    "AdoptionPlan",
    "Change",
    "RunnerStep",
    "arc_annotation_removals",
    "ars_cleanup_patch",
    "feeding_listeners",
    "freeze_patch",
    "is_arc_runner_set",
    "keep_runner_patch",
    "legacy_runner_sets",
    "plan_adoption",
    "preview_listener",
    "preview_listeners_elsewhere",
    "preview_runner_sets",
    "runner_matches",
    "seed_spec_for_new_set",
]
