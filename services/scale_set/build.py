"""What the scale-set worker wants to exist, built from an AutoscalingRunnerSet (pure functions).

Follows ARC's resource builder (names, labels, owner references, specs) minus the
``integrity-hash`` annotation: drift is detected by comparing these desired objects with what is
stored (``shared.semantic``), and revisions are explicit (``spec.actionableRevision``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.api import (
    AutoscalingListener,
    AutoscalingListenerSpec,
    AutoscalingRunnerSet,
    EphemeralRunnerSet,
    EphemeralRunnerSetSpec,
    EphemeralRunnerSpec,
    LocalObjectReference,
    ObjectMeta,
    OwnerReference,
    ResourceMeta,
)
from shared.api.constants import (
    ANNOTATION_RUNNER_GROUP_NAME,
    ANNOTATION_RUNNER_SCALE_SET_ID,
    ANNOTATION_RUNNER_SCALE_SET_NAME,
    API_VERSION,
    COMPONENT_LISTENER,
    COMPONENT_RUNNER_SET,
    DEFAULT_MAX_RUNNERS,
    KIND_AUTOSCALING_RUNNER_SET,
    LABEL_COMPONENT,
    LABEL_PART_OF,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
    LABEL_VERSION,
    PART_OF_VALUE,
)
from shared.api.names import (
    filter_and_merge_labels,
    listener_name,
    merge_annotations,
    runner_proxy_secret_name,
    url_labels,
)


@dataclass(frozen=True)
class BuildOptions:
    """Worker-level inputs of the builders (from CLI flags)."""

    controller_namespace: str
    listener_image: str
    image_pull_secrets: tuple[str, ...] = ()
    exclude_label_prefixes: tuple[str, ...] = field(default_factory=tuple)


# --- label / annotation merging (as ARC's filterAndMergeLabels) -------------------------------------------------------


def is_subset(wanted: Mapping[str, str], have: Mapping[str, str]) -> bool:
    """Every wanted key is present with the wanted value; extra (foreign) keys are fine (ARC #4533)."""
    return all(have.get(k) == v for k, v in wanted.items())


# --- the registration facts the builders read from the ARS ---------------------------------------


def scale_set_id_of(ars: AutoscalingRunnerSet) -> int:
    """The registered scale set id from the annotation; 0 when missing, unparsable or <= 0."""
    raw = ars.metadata.annotations.get(ANNOTATION_RUNNER_SCALE_SET_ID, "")
    try:
        value = int(raw)
    except ValueError:
        return 0
    return value if value > 0 else 0


def effective_scale_set_name(ars: AutoscalingRunnerSet) -> str:
    """``spec.runnerScaleSetName``, defaulting to the ARS name (not persisted into the spec)."""
    return ars.spec.runner_scale_set_name or ars.metadata.name


def ars_listener_name(ars: AutoscalingRunnerSet) -> str:
    return listener_name(ars.metadata.name, ars.metadata.namespace, ars.spec.runner_group, ars.spec.github_config_url)


def owner_reference(ars: AutoscalingRunnerSet) -> OwnerReference:
    return OwnerReference(
        api_version=API_VERSION,
        kind=KIND_AUTOSCALING_RUNNER_SET,
        name=ars.metadata.name,
        uid=ars.metadata.uid,
        controller=True,
        block_owner_deletion=True,
    )


def _common_labels(ars: AutoscalingRunnerSet, component: str) -> dict[str, str]:
    labels = {
        LABEL_SCALE_SET_NAME: ars.metadata.name,
        LABEL_SCALE_SET_NAMESPACE: ars.metadata.namespace,
        LABEL_PART_OF: PART_OF_VALUE,
        LABEL_COMPONENT: component,
    }
    version = ars.metadata.labels.get(LABEL_VERSION)
    if version:
        labels[LABEL_VERSION] = version
    labels.update(url_labels(ars.spec.github_config_url))
    return labels


# --- EphemeralRunnerSet ---------------------------------------------------------------------


def desired_runner_spec(ars: AutoscalingRunnerSet) -> EphemeralRunnerSpec:
    """The EphemeralRunnerSpec every runner of this scale set is built from."""
    spec = ars.spec
    template: dict[str, Any] = spec.template if isinstance(spec.template, dict) else {}
    found_meta, found_spec = template.get("metadata"), template.get("spec")
    pod_meta: dict[str, Any] = found_meta if isinstance(found_meta, dict) else {}
    pod_spec: dict[str, Any] = found_spec if isinstance(found_spec, dict) else {}
    return EphemeralRunnerSpec(
        github_config_url=spec.github_config_url,
        github_config_secret=spec.github_config_secret,
        github_server_tls=spec.github_server_tls,
        runner_scale_set_id=scale_set_id_of(ars),
        proxy=spec.proxy,
        proxy_secret_ref=runner_proxy_secret_name(ars.metadata.name, ars.metadata.namespace) if spec.proxy else "",
        vault_config=spec.vault_config,
        ephemeral_runner_config_secret_metadata=spec.ephemeral_runner_config_secret_metadata,
        metadata=copy.deepcopy(pod_meta),
        spec=copy.deepcopy(pod_spec),
    )


def desired_ers_labels(ars: AutoscalingRunnerSet, options: BuildOptions) -> dict[str, str]:
    own = filter_and_merge_labels(
        ars.metadata.labels, _common_labels(ars, COMPONENT_RUNNER_SET), options.exclude_label_prefixes
    )
    base = ars.spec.ephemeral_runner_set_metadata.labels if ars.spec.ephemeral_runner_set_metadata else {}
    return filter_and_merge_labels(base, own, options.exclude_label_prefixes)


def desired_ers_annotations(ars: AutoscalingRunnerSet) -> dict[str, str]:
    base = ars.spec.ephemeral_runner_set_metadata.annotations if ars.spec.ephemeral_runner_set_metadata else {}
    own: dict[str, str] = {
        k: ars.metadata.annotations[k]
        for k in (ANNOTATION_RUNNER_GROUP_NAME, ANNOTATION_RUNNER_SCALE_SET_NAME)
        if k in ars.metadata.annotations
    }
    return merge_annotations(base, own)


def desired_ephemeral_runner_set(
    ars: AutoscalingRunnerSet, options: BuildOptions, *, actionable_revision: int = 1
) -> EphemeralRunnerSet:
    """The ERS to create: named like the ARS, in its namespace, owned by it, at ``actionable_revision``."""
    return EphemeralRunnerSet(
        metadata=ObjectMeta(
            name=ars.metadata.name,
            namespace=ars.metadata.namespace,
            labels=desired_ers_labels(ars, options),
            annotations=desired_ers_annotations(ars),
            owner_references=[owner_reference(ars)],
        ),
        spec=EphemeralRunnerSetSpec(
            replicas=0,
            patch_id=0,
            ephemeral_runner_spec=desired_runner_spec(ars),
            ephemeral_runner_metadata=ars.spec.ephemeral_runner_metadata,
            actionable_revision=actionable_revision,
        ),
    )


# --- AutoscalingListener --------------------------------------------------------------------


def desired_listener_spec(ars: AutoscalingRunnerSet, options: BuildOptions) -> AutoscalingListenerSpec:
    spec = ars.spec
    return AutoscalingListenerSpec(
        github_config_url=spec.github_config_url,
        github_config_secret=spec.github_config_secret,
        runner_scale_set_id=scale_set_id_of(ars),
        autoscaling_runner_set_namespace=ars.metadata.namespace,
        autoscaling_runner_set_name=ars.metadata.name,
        ephemeral_runner_set_name=ars.metadata.name,
        max_runners=spec.max_runners if spec.max_runners is not None else DEFAULT_MAX_RUNNERS,
        min_runners=spec.min_runners if spec.min_runners is not None else 0,
        image=options.listener_image,
        image_pull_secrets=[LocalObjectReference(name=n) for n in options.image_pull_secrets],
        proxy=spec.proxy,
        github_server_tls=spec.github_server_tls,
        vault_config=spec.vault_config,
        metrics=spec.listener_metrics,
        template=copy.deepcopy(spec.listener_template) if spec.listener_template is not None else None,
        config_secret_metadata=spec.listener_config_secret_metadata,
        service_account_metadata=spec.listener_service_account_metadata,
        role_metadata=spec.listener_role_metadata,
        role_binding_metadata=spec.listener_role_binding_metadata,
    )


def desired_listener_labels(ars: AutoscalingRunnerSet, options: BuildOptions) -> dict[str, str]:
    own = filter_and_merge_labels(
        ars.metadata.labels, _common_labels(ars, COMPONENT_LISTENER), options.exclude_label_prefixes
    )
    meta = ars.spec.autoscaling_listener_metadata or ResourceMeta()
    return filter_and_merge_labels(meta.labels, own, options.exclude_label_prefixes)


def desired_listener_annotations(ars: AutoscalingRunnerSet) -> dict[str, str]:
    meta = ars.spec.autoscaling_listener_metadata or ResourceMeta()
    return dict(meta.annotations)


def desired_listener(ars: AutoscalingRunnerSet, options: BuildOptions) -> AutoscalingListener:
    """The AL in the controller namespace (no owner reference: it is cross-namespace)."""
    return AutoscalingListener(
        metadata=ObjectMeta(
            name=ars_listener_name(ars),
            namespace=options.controller_namespace,
            labels=desired_listener_labels(ars, options),
            annotations=desired_listener_annotations(ars),
        ),
        spec=desired_listener_spec(ars, options),
    )


# --- JSON merge patch (RFC 7386) -------------------------------------------------------------------


def merge_patch_diff(old: Any, new: Any) -> Any:
    """The merge patch that turns ``old`` into ``new``: changed keys, ``None`` for removed keys.

    A merge patch of a whole subtree would keep keys the new value no longer has (objects merge),
    so a field removed from a template would never be removed from the stored object.
    """
    if not isinstance(old, dict) or not isinstance(new, dict):
        return copy.deepcopy(new)
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif old[key] != value:
            if isinstance(old[key], dict) and isinstance(value, dict):
                patch[key] = merge_patch_diff(old[key], value)
            else:
                patch[key] = copy.deepcopy(value)
    return patch
