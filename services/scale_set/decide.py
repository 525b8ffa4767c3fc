"""The scale-set worker's decisions, as pure functions of what was read (no I/O).

Each function answers one question the reconciler asks before a write: must the scale set be
registered, has the runner group or name drifted, what patch brings the ERS / the listener to the
desired state (and does it bump the actionable revision), may the Outdated teardown act, and what
is the next status. The reconciler re-reads before calling these and writes with that read's
resourceVersion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import msgspec

from services.scale_set.build import BuildOptions, effective_scale_set_name, merge_patch_diff, scale_set_id_of
from shared.actions import parse_config_url
from shared.actions.errors import ConfigURLError
from shared.api import (
    AutoscalingListener,
    AutoscalingRunnerSet,
    AutoscalingRunnerSetPhase,
    AutoscalingRunnerSetStatus,
    EphemeralRunnerSet,
    EphemeralRunnerSetPhase,
    Problem,
    StatusCondition,
    validate,
)
from shared.api import status_patch as full_status_patch
from shared.api.constants import (
    ANNOTATION_RUNNER_GROUP_NAME,
    ANNOTATION_RUNNER_SCALE_SET_ID,
    ANNOTATION_RUNNER_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
)
from shared.api.names import MAX_LABEL_VALUE
from shared.kube.names import is_valid_label_value
from shared.semantic import first_difference, semantic_equal
from shared.settings import InvalidSetting, option

# --- settings --------------------------------------------------------------------------------------


class ScaleSetSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The scale-set worker's own settings (README "scale-set worker"). Environment fallbacks:
    runnerscale's names first, then the ones ARC's chart sets on its controller."""

    settings_title: ClassVar[str] = "scale-set"

    controller_namespace: Annotated[
        str,
        option(
            "--controller-namespace",
            ("RUNNERSCALE_CONTROLLER_NAMESPACE", "CONTROLLER_MANAGER_POD_NAMESPACE"),
            "namespace of the AutoscalingListeners (ARC's controller namespace)",
        ),
    ] = ""
    listener_image: Annotated[
        str,
        option(
            "--listener-image",
            ("RUNNERSCALE_LISTENER_IMAGE", "CONTROLLER_MANAGER_CONTAINER_IMAGE"),
            "container image of the listener pods",
        ),
    ] = ""
    image_pull_secrets: Annotated[
        tuple[str, ...],
        option(
            "--listener-image-pull-secret",
            help="image pull Secret for listener pods (repeatable; ARC: --auto-scaler-image-pull-secrets)",
            metavar="NAME",
        ),
    ] = ()
    exclude_label_prefixes: Annotated[
        tuple[str, ...],
        option(
            "--exclude-label-propagation-prefix",
            help="ARS labels with this prefix are not copied to the ERS and listener (repeatable)",
            metavar="PREFIX",
        ),
    ] = ()
    # Seconds between checks that the registered scale set still exists at the Actions service.
    verify_interval: Annotated[
        float,
        option(
            "--scale-set-verify-interval",
            help="how often to check that the registered scale set still exists at the Actions service",
            metavar="SECONDS",
        ),
    ] = 600.0
    #: Requeue while children are going away (deletion chain, a deleting ERS or listener).
    deletion_requeue: float = 2.0
    #: Requeue after a problem the user fixes outside the ARS (Secret, runner group, a 422).
    credentials_requeue: float = 30.0

    def validate(self) -> None:
        if not self.controller_namespace or "/" in self.controller_namespace:
            raise InvalidSetting("controller_namespace", "is required and must be a namespace name")
        if not self.listener_image:
            raise InvalidSetting("listener_image", "is required")
        if self.verify_interval <= 0:
            raise InvalidSetting("verify_interval", f"must be > 0, got {self.verify_interval}")

    @property
    def build(self) -> BuildOptions:
        """The builders' inputs."""
        return BuildOptions(
            controller_namespace=self.controller_namespace,
            listener_image=self.listener_image,
            image_pull_secrets=self.image_pull_secrets,
            exclude_label_prefixes=self.exclude_label_prefixes,
        )


def _tree(value: Any) -> Any:
    return msgspec.to_builtins(value) if value is not None else None


# --- validation ------------------------------------------------------------------------------------


def spec_problems(ars: AutoscalingRunnerSet) -> list[Problem]:
    """Everything wrong with the ARS that no service call or retry can fix (the user must edit it)."""
    problems = list(validate(ars))
    if len(ars.metadata.name) > MAX_LABEL_VALUE:
        # The name becomes the scale-set-name label of the ERS, the listener and every runner.
        problems.append(
            Problem("$.metadata.name", f"must be at most {MAX_LABEL_VALUE} characters (it is used as a label value)")
        )
    if not any(p.path == "$.spec.githubConfigUrl" for p in problems):
        try:
            parse_config_url(ars.spec.github_config_url)
        except ConfigURLError as exc:
            problems.append(Problem("$.spec.githubConfigUrl", str(exc)))
    return problems


def problems_message(problems: list[Problem], limit: int = 10) -> str:
    text = "; ".join(str(p) for p in problems[:limit])
    if len(problems) > limit:
        text += f"; and {len(problems) - limit} more"
    return text


# --- registration with the Actions service ---------------------------------------------------------


def needs_registration(ars: AutoscalingRunnerSet) -> bool:
    """No usable ``runner-scale-set-id`` annotation (missing, not an int, or <= 0)."""
    return scale_set_id_of(ars) == 0


def runner_group_drifted(ars: AutoscalingRunnerSet) -> bool:
    """ARC step 8: the group annotation is missing, or a non-empty spec group differs (any case).

    An empty ``spec.runnerGroup`` never moves an existing scale set back to the default group.
    """
    current = ars.metadata.annotations.get(ANNOTATION_RUNNER_GROUP_NAME)
    if current is None:
        return True
    wanted = ars.spec.runner_group
    return bool(wanted) and wanted.casefold() != current.casefold()


def scale_set_name_drifted(ars: AutoscalingRunnerSet) -> bool:
    """ARC step 9, with the name defaulting to the ARS name instead of being written into the spec."""
    current = ars.metadata.annotations.get(ANNOTATION_RUNNER_SCALE_SET_NAME)
    return current is None or current.casefold() != effective_scale_set_name(ars).casefold()


def registration_annotations(scale_set_id: int, scale_set_name: str, runner_group_name: str) -> dict[str, str]:
    return {
        ANNOTATION_RUNNER_SCALE_SET_ID: str(scale_set_id),
        ANNOTATION_RUNNER_SCALE_SET_NAME: scale_set_name,
        ANNOTATION_RUNNER_GROUP_NAME: runner_group_name,
    }


# --- EphemeralRunnerSet drift ----------------------------------------------------------------------


@dataclass(frozen=True)
class ErsPlan:
    """How to bring an existing ERS to the desired one: a merge patch (None: nothing to do) and,
    when the runner spec changed semantically, the new actionable revision."""

    patch: dict[str, Any] | None
    new_revision: int | None = None
    spec_drift_path: str | None = None


def runner_spec_changed(existing: EphemeralRunnerSet, desired: EphemeralRunnerSet) -> str | None:
    """The JSON path of the first semantic difference of the runner spec, or None when unchanged.

    ``proxySecretRef`` is derived from the ERS name and owned by the runner-set worker's proxy
    Secret, so it is not part of the user's runner spec.
    """
    have = _tree(existing.spec.ephemeral_runner_spec)
    want = _tree(desired.spec.ephemeral_runner_spec)
    have.pop("proxySecretRef", None)
    want.pop("proxySecretRef", None)
    if semantic_equal(have, want):
        return None
    return first_difference(have, want) or "$"


def plan_ers_update(existing: EphemeralRunnerSet, desired: EphemeralRunnerSet) -> ErsPlan:
    """Spec drift bumps ``actionableRevision`` by one; metadata uses a subset check, so labels and
    annotations other writers (webhooks, users) put on the ERS never cause a patch loop.

    ``replicas`` and ``patchID`` belong to the desired-state flow and are never touched here.
    """
    spec_patch: dict[str, Any] = {}
    new_revision = None
    drift_path = runner_spec_changed(existing, desired)
    if drift_path is not None:
        new_revision = max(existing.spec.actionable_revision, 0) + 1
        spec_patch["ephemeralRunnerSpec"] = merge_patch_diff(
            _tree(existing.spec.ephemeral_runner_spec), _tree(desired.spec.ephemeral_runner_spec)
        )
        spec_patch["actionableRevision"] = new_revision
    have_meta, want_meta = _tree(existing.spec.ephemeral_runner_metadata), _tree(desired.spec.ephemeral_runner_metadata)
    if not semantic_equal(have_meta, want_meta):
        spec_patch["ephemeralRunnerMetadata"] = merge_patch_diff(have_meta or {}, want_meta) if want_meta else None
    meta_patch: dict[str, Any] = {}
    labels = {k: v for k, v in desired.metadata.labels.items() if existing.metadata.labels.get(k) != v}
    annotations = {k: v for k, v in desired.metadata.annotations.items() if existing.metadata.annotations.get(k) != v}
    if labels:
        meta_patch["labels"] = labels
    if annotations:
        meta_patch["annotations"] = annotations
    patch: dict[str, Any] = {}
    if spec_patch:
        patch["spec"] = spec_patch
    if meta_patch:
        patch["metadata"] = meta_patch
    return ErsPlan(patch or None, new_revision, drift_path)


# --- the Outdated guard (README "scale-set worker") -----------------------------------------------------------------


def outdated_teardown_allowed(ers: EphemeralRunnerSet | None) -> bool:
    """Act on an Outdated ERS only once it has applied its current actionable revision.

    Before that, the Outdated verdict may be about a runner spec that has already been replaced
    (the user fixed the image), and tearing the listener down would discard the fix.
    """
    if ers is None or ers.status is None:
        return False
    return (
        ers.status.phase == EphemeralRunnerSetPhase.OUTDATED
        and ers.status.applied_actionable_revision >= ers.spec.actionable_revision
    )


def drain_patch(ers: EphemeralRunnerSet) -> dict[str, Any] | None:
    """Scale a parked (Outdated) ERS to zero with an authoritative patch ID, unless it already is."""
    if ers.spec.replicas == 0 and ers.spec.patch_id == 0:
        return None
    return {"spec": {"replicas": 0, "patchID": 0}}


# --- AutoscalingListener drift ---------------------------------------------------------------------


def plan_listener_update(existing: AutoscalingListener, desired: AutoscalingListener) -> dict[str, Any] | None:
    """Patch the AL in place (never delete-and-recreate): the spec is compared semantically with
    the same inputs it is created from, so a flag such as image pull secrets cannot cause a loop."""
    patch: dict[str, Any] = {}
    have, want = _tree(existing.spec), _tree(desired.spec)
    if not semantic_equal(have, want):
        patch["spec"] = merge_patch_diff(have, want)
    labels = {k: v for k, v in desired.metadata.labels.items() if existing.metadata.labels.get(k) != v}
    annotations = {k: v for k, v in desired.metadata.annotations.items() if existing.metadata.annotations.get(k) != v}
    if labels or annotations:
        patch["metadata"] = {
            **({"labels": labels} if labels else {}),
            **({"annotations": annotations} if annotations else {}),
        }
    return patch or None


def listener_selector(ars: AutoscalingRunnerSet) -> str | None:
    """The label selector of this ARS's listeners, or None when its name or namespace cannot be a
    label value (the API server refuses such a selector with 400, so cleanup must list without one
    and filter with :func:`listeners_of`; README "scale-set worker", deletion chain)."""
    name, namespace = ars.metadata.name, ars.metadata.namespace
    if is_valid_label_value(name) or is_valid_label_value(namespace):
        return None
    return f"{LABEL_SCALE_SET_NAME}={name},{LABEL_SCALE_SET_NAMESPACE}={namespace}"


def listeners_of(listeners: list[AutoscalingListener], ars: AutoscalingRunnerSet) -> list[AutoscalingListener]:
    """The listeners that belong to this ARS, by spec or by labels."""
    out = []
    for al in listeners:
        spec = al.spec
        mine = (
            spec.autoscaling_runner_set_namespace == ars.metadata.namespace
            and spec.autoscaling_runner_set_name == ars.metadata.name
        ) or (
            al.metadata.labels.get(LABEL_SCALE_SET_NAMESPACE) == ars.metadata.namespace
            and al.metadata.labels.get(LABEL_SCALE_SET_NAME) == ars.metadata.name
        )
        if mine:
            out.append(al)
    return out


def orphan_listeners(
    listeners: list[AutoscalingListener], ars: AutoscalingRunnerSet, current_name: str | None
) -> list[AutoscalingListener]:
    """Listeners of this ARS other than ``current_name`` (left behind when the runner group or the
    config URL changed the listener name; ARC leaves them running) that are not already deleting."""
    return [
        al for al in listeners_of(listeners, ars) if al.metadata.name != current_name and not al.metadata.is_deleting
    ]


# --- status ----------------------------------------------------------------------------------------


def next_status(
    ars: AutoscalingRunnerSet,
    ers: EphemeralRunnerSet | None,
    *,
    acted: bool,
    outdated: bool = False,
) -> AutoscalingRunnerSetStatus:
    """The ARS status after a reconcile pass.

    ``acted``: the worker brought registration, ERS and listener in line with the current
    ``metadata.generation`` (then ``observedGeneration`` = generation). Until then the phase is
    Pending and ``observedGeneration`` keeps its previous value. ``outdated``: the scale set is
    parked because its ERS reports Outdated for the current revision.
    """
    current = ars.status or AutoscalingRunnerSetStatus()
    es = ers.status if ers is not None else None
    if outdated:
        phase = AutoscalingRunnerSetPhase.OUTDATED
    elif acted:
        phase = AutoscalingRunnerSetPhase.RUNNING
    else:
        phase = AutoscalingRunnerSetPhase.PENDING
    return AutoscalingRunnerSetStatus(
        current_runners=es.current_replicas if es else 0,
        phase=phase,
        pending_ephemeral_runners=es.pending_ephemeral_runners if es else 0,
        running_ephemeral_runners=es.running_ephemeral_runners if es else 0,
        failed_ephemeral_runners=es.failed_ephemeral_runners if es else 0,
        observed_generation=ars.metadata.generation if acted else current.observed_generation,
    )


def status_patch(ars: AutoscalingRunnerSet, status: AutoscalingRunnerSetStatus) -> dict[str, Any] | None:
    """A status merge patch setting every field (so counts that dropped to 0 are written), or None
    when the stored status already equals ``status``."""
    if ars.status is not None and ars.status == status:
        return None
    return full_status_patch(status)


def pending_status(ars: AutoscalingRunnerSet) -> AutoscalingRunnerSetStatus:
    """Phase Pending, everything else as stored (the generation is not yet acted upon); a spec
    that is valid again drops the SpecValid=False condition."""
    current = ars.status or AutoscalingRunnerSetStatus()
    return msgspec.structs.replace(current, phase=AutoscalingRunnerSetPhase.PENDING, conditions=None)


CONDITION_SPEC_VALID = "SpecValid"
REASON_INVALID_SPEC = "InvalidSpec"


def invalid_status(ars: AutoscalingRunnerSet, message: str, now: str) -> AutoscalingRunnerSetStatus:
    """Phase Invalid and the condition SpecValid=False (reason InvalidSpec, the problems as its
    message) for this generation; everything else as stored. ``now`` (RFC 3339) is the transition
    time, kept when the condition already said the same (so a re-pass writes nothing)."""
    current = ars.status or AutoscalingRunnerSetStatus()
    previous = next((c for c in current.conditions or () if c.type == CONDITION_SPEC_VALID), None)
    since = previous.last_transition_time if previous is not None and previous.status == "False" else now
    condition = StatusCondition(
        type=CONDITION_SPEC_VALID,
        status="False",
        reason=REASON_INVALID_SPEC,
        message=message,
        observed_generation=ars.metadata.generation,
        last_transition_time=since or now,
    )
    return msgspec.structs.replace(current, phase=AutoscalingRunnerSetPhase.INVALID, conditions=[condition])


def generation_pending(ars: AutoscalingRunnerSet) -> bool:
    current = ars.status or AutoscalingRunnerSetStatus()
    return current.observed_generation != ars.metadata.generation
