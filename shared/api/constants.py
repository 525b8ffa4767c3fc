"""ARC's group/version, label, annotation and finalizer keys, plus runnerscale's own keys.

Values are ARC's (actions-runner-controller, gha-runner-scale-set mode) so that objects written by
either controller are recognised by the other. Keys that ARC does not have are marked "runnerscale".
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "actions.github.com"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

KIND_AUTOSCALING_RUNNER_SET: Final = "AutoscalingRunnerSet"
KIND_EPHEMERAL_RUNNER_SET: Final = "EphemeralRunnerSet"
KIND_EPHEMERAL_RUNNER: Final = "EphemeralRunner"
KIND_AUTOSCALING_LISTENER: Final = "AutoscalingListener"

# --- container names -----------------------------------------------------------------------------
RUNNER_CONTAINER_NAME: Final = "runner"
LISTENER_CONTAINER_NAME: Final = "listener"

# --- labels --------------------------------------------------------------------------------------
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_VERSION: Final = "app.kubernetes.io/version"
LABEL_SCALE_SET_NAME: Final = "actions.github.com/scale-set-name"
LABEL_SCALE_SET_NAMESPACE: Final = "actions.github.com/scale-set-namespace"
LABEL_ENTERPRISE: Final = "actions.github.com/enterprise"
LABEL_ORGANIZATION: Final = "actions.github.com/organization"
LABEL_REPOSITORY: Final = "actions.github.com/repository"
LABEL_OS: Final = "kubernetes.io/os"
LABEL_LISTENER_NAME: Final = "auto-scaling-listener-name"
LABEL_LISTENER_NAMESPACE: Final = "auto-scaling-listener-namespace"
LABEL_EPHEMERAL_RUNNER: Final = "actions-ephemeral-runner"
LABEL_POD_TEMPLATE_HASH: Final = "pod-template-hash"
LABEL_RUNNER_TEMPLATE_HASH: Final = "runner-template-hash"
LABEL_RUNNER_POD: Final = "runner-pod"

# Label values.
PART_OF_VALUE: Final = "gha-runner-scale-set"
COMPONENT_RUNNER_SET: Final = "runner-set"
COMPONENT_RUNNER: Final = "runner"
COMPONENT_LISTENER: Final = "runner-scale-set-listener"
COMPONENT_AUTOSCALING_RUNNER_SET: Final = "autoscaling-runner-set"  # set by the chart on the ARS

# --- annotations ---------------------------------------------------------------------------------
ANNOTATION_RUNNER_SCALE_SET_ID: Final = "runner-scale-set-id"  # no prefix, as in ARC
ANNOTATION_RUNNER_GROUP_NAME: Final = "actions.github.com/runner-group-name"
ANNOTATION_RUNNER_SCALE_SET_NAME: Final = "actions.github.com/runner-scale-set-name"
ANNOTATION_PATCH_ID: Final = "actions.github.com/patch-id"
# ARC's opaque drift fingerprint. runnerscale never writes or reads it (the typed revision fields
# replace it); the key is kept so that tooling can strip it from objects taken over from Go ARC.
ANNOTATION_INTEGRITY_HASH: Final = "actions.github.com/integrity-hash"
ANNOTATION_VALUES_HASH: Final = "actions.github.com/values-hash"
ANNOTATION_CLEANUP_MANAGER_ROLE_BINDING: Final = "actions.github.com/cleanup-manager-role-binding"
ANNOTATION_CLEANUP_MANAGER_ROLE_NAME: Final = "actions.github.com/cleanup-manager-role-name"
ANNOTATION_CLEANUP_KUBERNETES_MODE_ROLE_NAME: Final = "actions.github.com/cleanup-kubernetes-mode-role-name"
ANNOTATION_CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME: Final = (
    "actions.github.com/cleanup-kubernetes-mode-role-binding-name"
)
ANNOTATION_CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME: Final = (
    "actions.github.com/cleanup-kubernetes-mode-service-account-name"
)
ANNOTATION_CLEANUP_GITHUB_SECRET_NAME: Final = "actions.github.com/cleanup-github-secret-name"
ANNOTATION_CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME: Final = (
    "actions.github.com/cleanup-no-permission-service-account-name"
)
CLEANUP_ANNOTATION_PREFIX: Final = "actions.github.com/cleanup-"

# runnerscale: the EphemeralRunnerSet `spec.actionableRevision` an EphemeralRunner (and its pod) was
# built from, as a decimal string. Absent or unparsable means revision 0, so runners created before
# the field existed count as current until a revision is actually applied.
ANNOTATION_ACTIONABLE_REVISION: Final = "actions.github.com/actionable-revision"
# When a runner failed (ISO 8601), written on the ER by the runner worker right before its status
# becomes Failed; the runner-set worker counts the Failed runner's age (--failed-runner-ttl) and
# its failure budget from it.
ANNOTATION_FAILED_AT: Final = "actions.github.com/failed-at"
# runnerscale: the resourceVersion of the listener config Secret a listener pod was started with.
# The pod spec does not change when only the Secret's data does, so this is the restart signal.
ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION: Final = "actions.github.com/listener-config-resource-version"
# runnerscale: set on an EphemeralRunner when the service reported its job completed (runner worker,
# from the listener's JobCompleted): "job=<job key>;result=<result>;at=<event time>;epoch=<listener
# epoch>". Written once, never removed. The runner-set worker compares it with the applied desired
# state to know whether the listener has accounted for the completion (README "Typed state (new fields)").
ANNOTATION_JOB_COMPLETED: Final = "actions.github.com/job-completed"
# runnerscale: when the runner worker saw the runner finish its job (ISO 8601), written right before
# the ER's status becomes Succeeded; it bounds how long the runner-set worker holds a finished runner.
ANNOTATION_FINISHED_AT: Final = "actions.github.com/finished-at"

# --- finalizers ----------------------------------------------------------------------------------
FINALIZER_AUTOSCALING_RUNNER_SET: Final = "autoscalingrunnerset.actions.github.com/finalizer"
FINALIZER_EPHEMERAL_RUNNER_SET: Final = "ephemeralrunnerset.actions.github.com/finalizer"
FINALIZER_EPHEMERAL_RUNNER: Final = "ephemeralrunner.actions.github.com/finalizer"
FINALIZER_RUNNER_REGISTRATION: Final = "ephemeralrunner.actions.github.com/runner-registration-finalizer"
FINALIZER_AUTOSCALING_LISTENER: Final = "autoscalinglistener.actions.github.com/finalizer"
FINALIZER_CLEANUP_PROTECTION: Final = "actions.github.com/cleanup-protection"

# --- EphemeralRunner failure reasons -------------------------------------------------------------
REASON_INVALID_POD: Final = "InvalidPod"
REASON_TOO_MANY_POD_FAILURES: Final = "TooManyPodFailures"
REASON_OUTDATED: Final = "Outdated"

# --- environment variables put into the runner container -----------------------------------------
ENV_RUNNER_JIT_CONFIG: Final = "ACTIONS_RUNNER_INPUT_JITCONFIG"
ENV_RUNNER_EXTRA_USER_AGENT: Final = "GITHUB_ACTIONS_RUNNER_EXTRA_USER_AGENT"
ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE: Final = "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE"
ENV_RUNNER_CONTAINER_HOOKS: Final = "ACTIONS_RUNNER_CONTAINER_HOOKS"
# Exit code of a runner whose version the service no longer accepts (with the env var above set).
RUNNER_EXIT_CODE_VERSION_DEPRECATED: Final = 7

# A listener's maxRunners when the AutoscalingRunnerSet leaves it unset (Go's MaxInt32).
DEFAULT_MAX_RUNNERS: Final = 2147483647
VAULT_TYPE_AZURE_KEY_VAULT: Final = "azure_key_vault"
