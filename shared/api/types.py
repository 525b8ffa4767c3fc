"""The four ARC custom resources (actions.github.com/v1alpha1) as msgspec structs.

JSON names, optionality and nesting follow ARC's Go types field for field, and a decoded object
encodes back to exactly its input: nothing lost, nothing invented (see :mod:`shared.api.presence`):

* A decoded struct encodes the fields its input had, including zero values (``labels: {}``,
  ``replicas: 0``, ``status: {}`` stays ``{}``), plus any field changed since to a non-default value.
* A struct built in Python follows its class rules: Go ``omitempty`` scalars default to their zero
  value and are omitted when zero; Go pointers are ``X | None`` and omitted when ``None``; status
  structs encode *every* field.
* Pod templates stay JSON trees (``dict``); runnerscale never rewrites what it does not own.
* Status writers build their merge patch with :func:`shared.api.status_patch`, which sets every
  field, so a count that dropped to 0 is written and no stale value survives.

Plus the typed state that replaces ARC's ``integrity-hash`` annotation:
``AutoscalingRunnerSetStatus.observed_generation``, ``EphemeralRunnerSetSpec.actionable_revision``,
``EphemeralRunnerSetStatus.applied_actionable_revision`` and
``EphemeralRunnerSetStatus.finished_runner_cleanup_patch_id``.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

import msgspec

from shared.api import presence
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    API_VERSION,
    DEFAULT_MAX_RUNNERS,
    ENV_RUNNER_CONTAINER_HOOKS,
    KIND_AUTOSCALING_LISTENER,
    KIND_AUTOSCALING_RUNNER_SET,
    KIND_EPHEMERAL_RUNNER,
    KIND_EPHEMERAL_RUNNER_SET,
    RUNNER_CONTAINER_NAME,
)
from shared.api.meta import ListMeta, LocalObjectReference, ObjectMeta

# A pod template or pod spec: an opaque JSON tree (the CRD marks it x-kubernetes-preserve-unknown-fields).
JsonTree = dict[str, Any]
PodTemplateTree = Annotated[
    JsonTree, msgspec.Meta(description="A core/v1 PodTemplateSpec (metadata, spec), stored verbatim.")
]
PodSpecTree = Annotated[JsonTree, msgspec.Meta(description="A core/v1 PodSpec, stored verbatim.")]
PodMetadataTree = Annotated[
    JsonTree, msgspec.Meta(description="Labels and annotations for the runner pod, stored verbatim.")
]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
# A runner count: every component (listener config, Actions service X-ScaleSetMaxCapacity) takes
# an int32. The CRD schema gets ``maximum``; decoding does not enforce it, so an object stored
# before the bound existed still decodes (and is reported by ``validate``, never stuck).
RunnerCount = Annotated[int, msgspec.Meta(ge=0, extra_json_schema={"maximum": DEFAULT_MAX_RUNNERS})]


def _doc(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class _Spec(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel", dict=True):
    """Spec-side structs: zero values are omitted, like Go's omitempty (unless the decoded input had them)."""

    __copy__ = presence.copy_struct
    __deepcopy__ = presence.deepcopy_struct


class _Status(msgspec.Struct, kw_only=True, omit_defaults=False, rename="camel", dict=True):
    """Status structs: a struct built in Python encodes every field; a decoded one exactly its input (see module doc)."""

    __copy__ = presence.copy_struct
    __deepcopy__ = presence.deepcopy_struct


# --- phases --------------------------------------------------------------------------------------
# NONE is the phase of an object no controller has written a phase for yet (Go's "" zero value).


class AutoscalingRunnerSetPhase(enum.StrEnum):
    NONE = ""
    PENDING = "Pending"
    RUNNING = "Running"
    OUTDATED = "Outdated"
    #: runnerscale: the spec passed the CRD schema but cannot work; see the SpecValid condition.
    INVALID = "Invalid"


class EphemeralRunnerSetPhase(enum.StrEnum):
    NONE = ""
    RUNNING = "Running"
    OUTDATED = "Outdated"


class EphemeralRunnerPhase(enum.StrEnum):
    NONE = ""  # treated as Pending
    PENDING = "Pending"
    RUNNING = "Running"  # pod running: idle or busy
    SUCCEEDED = "Succeeded"  # legacy: never written, the runner is deleted instead
    FAILED = "Failed"
    OUTDATED = "Outdated"  # runner exited with the "version deprecated" code


# --- shared sub-types ----------------------------------------------------------------------------


class ResourceMeta(_Spec, kw_only=True):
    """Labels and annotations to put on an object the controllers create."""

    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class ProxyServerConfig(_Spec, kw_only=True):
    url: str = ""
    credential_secret_ref: str = ""  # name of a Secret with keys `username` and `password`


class ProxyConfig(_Spec, kw_only=True):
    http: ProxyServerConfig | None = None
    https: ProxyServerConfig | None = None
    no_proxy: list[str] = []


class ConfigMapKeySelector(_Spec, kw_only=True):
    key: str
    name: str = ""
    optional: bool | None = None


class TLSCertificateSource(_Spec, kw_only=True):
    config_map_key_ref: ConfigMapKeySelector | None = None


class TLSConfig(_Spec, kw_only=True):
    certificate_from: TLSCertificateSource | None = None


class AzureKeyVaultConfig(_Spec, kw_only=True):
    url: str
    tenant_id: str
    client_id: str
    certificate_path: str


class VaultConfig(_Spec, kw_only=True):
    type: str = ""  # only "azure_key_vault" is valid (see validation)
    azure_key_vault: AzureKeyVaultConfig | None = None
    proxy: ProxyConfig | None = None


class CounterMetric(_Spec, kw_only=True):
    labels: list[str]


class GaugeMetric(_Spec, kw_only=True):
    labels: list[str]


class HistogramMetric(_Spec, kw_only=True):
    labels: list[str]
    buckets: list[int | float] = []  # int | float: a bucket written as `1` comes back as `1`, not `1.0`


class MetricsConfig(_Spec, kw_only=True):
    """Which listener metrics to expose, and with which labels."""

    counters: dict[str, CounterMetric] = {}
    gauges: dict[str, GaugeMetric] = {}
    histograms: dict[str, HistogramMetric] = {}


# --- top-level object base -----------------------------------------------------------------------


class CustomObject(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel", tag_field="kind", dict=True):
    """Base of the four kinds: a namespaced actions.github.com/v1alpha1 object (``kind`` is the msgspec tag)."""

    __copy__ = presence.copy_struct
    __deepcopy__ = presence.deepcopy_struct

    KIND: ClassVar[str]
    PLURAL: ClassVar[str]
    SINGULAR: ClassVar[str]

    api_version: str = API_VERSION
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


# --- AutoscalingRunnerSet ------------------------------------------------------------------------


class StatusCondition(_Spec, kw_only=True):
    """A status condition (the fields of metav1.Condition)."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    observed_generation: int = 0
    last_transition_time: str = ""


class AutoscalingRunnerSetSpec(_Spec, kw_only=True):
    """AutoscalingRunnerSetSpec defines the desired state of an AutoscalingRunnerSet."""

    github_config_url: str = ""
    github_config_secret: str = ""  # name of a Secret (or a vault key)
    runner_group: str = ""
    runner_scale_set_name: str = ""
    runner_scale_set_labels: list[str] = []
    proxy: ProxyConfig | None = None
    github_server_tls: TLSConfig | None = msgspec.field(default=None, name="githubServerTLS")
    vault_config: VaultConfig | None = None
    template: PodTemplateTree = {}  # the runner pods
    autoscaling_listener_metadata: ResourceMeta | None = msgspec.field(default=None, name="autoscalingListener")
    listener_metrics: MetricsConfig | None = None
    listener_template: PodTemplateTree | None = None  # merged into the listener pod
    listener_service_account_metadata: ResourceMeta | None = None
    listener_role_metadata: ResourceMeta | None = None
    listener_role_binding_metadata: ResourceMeta | None = None
    listener_config_secret_metadata: ResourceMeta | None = None
    ephemeral_runner_set_metadata: ResourceMeta | None = None
    ephemeral_runner_metadata: ResourceMeta | None = None
    ephemeral_runner_config_secret_metadata: ResourceMeta | None = None
    max_runners: RunnerCount | None = None
    min_runners: RunnerCount | None = None


class AutoscalingRunnerSetStatus(_Status, kw_only=True):
    """AutoscalingRunnerSetStatus defines the observed state of an AutoscalingRunnerSet."""

    current_runners: int = 0
    phase: AutoscalingRunnerSetPhase = AutoscalingRunnerSetPhase.NONE
    pending_ephemeral_runners: int = 0
    running_ephemeral_runners: int = 0
    failed_ephemeral_runners: int = 0
    observed_generation: Annotated[
        int, _doc("runnerscale: the metadata.generation the scale-set worker has fully acted on.")
    ] = 0
    conditions: Annotated[
        list[StatusCondition] | None,
        _doc("runnerscale: SpecValid=False (reason InvalidSpec) while the spec cannot work."),
    ] = None


class AutoscalingRunnerSet(CustomObject, tag=KIND_AUTOSCALING_RUNNER_SET, kw_only=True):
    """AutoscalingRunnerSet is one runner scale set: registration, listener and runners."""

    KIND: ClassVar[str] = KIND_AUTOSCALING_RUNNER_SET
    PLURAL: ClassVar[str] = "autoscalingrunnersets"
    SINGULAR: ClassVar[str] = "autoscalingrunnerset"

    spec: AutoscalingRunnerSetSpec = msgspec.field(default_factory=AutoscalingRunnerSetSpec)
    status: AutoscalingRunnerSetStatus | None = None


# --- EphemeralRunner -----------------------------------------------------------------------------


class EphemeralRunnerSpec(_Spec, kw_only=True):
    """EphemeralRunnerSpec defines one runner: where it registers, and its pod template (inlined)."""

    github_config_url: str
    github_config_secret: str
    github_server_tls: TLSConfig | None = msgspec.field(default=None, name="githubServerTLS")
    runner_scale_set_id: int
    proxy: ProxyConfig | None = None
    proxy_secret_ref: str = ""
    vault_config: VaultConfig | None = None
    ephemeral_runner_config_secret_metadata: ResourceMeta | None = None
    # The inlined PodTemplateSpec: pod metadata and pod spec as JSON trees.
    metadata: PodMetadataTree = {}
    spec: PodSpecTree = {}

    def runner_container(self) -> JsonTree | None:
        """The container named ``runner`` in the pod spec, if there is one."""
        for container in self.spec.get("containers") or ():
            if isinstance(container, dict) and container.get("name") == RUNNER_CONTAINER_NAME:
                return container
        return None

    def has_container_hook_configured(self) -> bool:
        container = self.runner_container() or {}
        return any(
            isinstance(env, dict) and env.get("name") == ENV_RUNNER_CONTAINER_HOOKS
            for env in container.get("env") or ()
        )


class EphemeralRunnerStatus(_Status, kw_only=True):
    """EphemeralRunnerStatus is the observed state of one runner and the job it runs."""

    ready: bool = False
    phase: EphemeralRunnerPhase = EphemeralRunnerPhase.NONE
    reason: str = ""
    message: str = ""
    runner_id: int = 0
    runner_name: str = ""
    failures: dict[str, datetime] = {}  # pod UID -> time the pod failed
    job_request_id: int = 0
    job_id: str = ""
    job_repository_name: str = ""
    job_workflow_ref: str = ""
    workflow_run_id: int = 0
    job_display_name: str = ""
    finished_at: Annotated[
        datetime | None,
        _doc(
            "runnerscale: when the runner worker saw the runner end after its job; written with phase"
            " Succeeded in one status patch. Null/absent: read the older finished-at annotation."
        ),
    ] = None

    def is_done(self) -> bool:
        return self.phase in (
            EphemeralRunnerPhase.SUCCEEDED,
            EphemeralRunnerPhase.FAILED,
            EphemeralRunnerPhase.OUTDATED,
        )

    def is_pending(self) -> bool:
        return self.phase in (EphemeralRunnerPhase.NONE, EphemeralRunnerPhase.PENDING)

    def has_job(self) -> bool:
        return self.job_id != ""

    def last_failure(self) -> datetime | None:
        return max(self.failures.values(), default=None)


class EphemeralRunner(CustomObject, tag=KIND_EPHEMERAL_RUNNER, kw_only=True):
    """EphemeralRunner is one single-job runner and its pod."""

    KIND: ClassVar[str] = KIND_EPHEMERAL_RUNNER
    PLURAL: ClassVar[str] = "ephemeralrunners"
    SINGULAR: ClassVar[str] = "ephemeralrunner"

    spec: EphemeralRunnerSpec
    status: EphemeralRunnerStatus | None = None


# --- EphemeralRunnerSet --------------------------------------------------------------------------


class EphemeralRunnerSetSpec(_Spec, kw_only=True):
    """EphemeralRunnerSetSpec is the desired runner count and the spec every runner is built from."""

    replicas: int = 0
    patch_id: int = msgspec.field(name="patchID")
    ephemeral_runner_spec: EphemeralRunnerSpec
    ephemeral_runner_metadata: ResourceMeta | None = None
    actionable_revision: Annotated[
        int,
        _doc(
            "runnerscale: bumped by the scale-set worker each time ephemeralRunnerSpec changes"
            " semantically; runners carry the revision they were built from in an annotation."
        ),
    ] = 0


class EphemeralRunnerSetStatus(_Status, kw_only=True):
    """EphemeralRunnerSetStatus is the observed state of a runner set."""

    current_replicas: int = 0
    pending_ephemeral_runners: int = 0
    running_ephemeral_runners: int = 0
    failed_ephemeral_runners: int = 0
    phase: EphemeralRunnerSetPhase = EphemeralRunnerSetPhase.NONE
    applied_actionable_revision: Annotated[
        int,
        _doc(
            "runnerscale: the spec.actionableRevision whose idle and pending runners of older"
            " revisions are gone; only ever advances."
        ),
    ] = 0
    finished_runner_cleanup_patch_id: Annotated[
        int | None,
        _doc(
            "runnerscale: the spec.patchID whose finished runners were just reaped; scale-up is"
            " suppressed while spec.patchID equals it. Null when no cleanup is pending."
        ),
    ] = msgspec.field(default=None, name="finishedRunnerCleanupPatchID")


class EphemeralRunnerSet(CustomObject, tag=KIND_EPHEMERAL_RUNNER_SET, kw_only=True):
    """EphemeralRunnerSet keeps spec.replicas EphemeralRunners of one spec alive."""

    KIND: ClassVar[str] = KIND_EPHEMERAL_RUNNER_SET
    PLURAL: ClassVar[str] = "ephemeralrunnersets"
    SINGULAR: ClassVar[str] = "ephemeralrunnerset"

    spec: EphemeralRunnerSetSpec
    status: EphemeralRunnerSetStatus | None = None


# --- AutoscalingListener -------------------------------------------------------------------------


class AutoscalingListenerSpec(_Spec, kw_only=True):
    """AutoscalingListenerSpec describes the listener pod of one scale set."""

    github_config_url: str = ""
    github_config_secret: str = ""
    runner_scale_set_id: int = 0
    autoscaling_runner_set_namespace: str = ""
    autoscaling_runner_set_name: str = ""
    ephemeral_runner_set_name: str = ""
    max_runners: RunnerCount = 0
    min_runners: RunnerCount = 0
    image: str = ""
    image_pull_secrets: list[LocalObjectReference] = []
    proxy: ProxyConfig | None = None
    github_server_tls: TLSConfig | None = msgspec.field(default=None, name="githubServerTLS")
    vault_config: VaultConfig | None = None
    metrics: MetricsConfig | None = None
    template: PodTemplateTree | None = None  # merged into the listener pod
    config_secret_metadata: ResourceMeta | None = None
    service_account_metadata: ResourceMeta | None = None
    role_metadata: ResourceMeta | None = None
    role_binding_metadata: ResourceMeta | None = None


class AutoscalingListenerStatus(_Status, kw_only=True):
    """AutoscalingListenerStatus is empty, as in ARC."""


class AutoscalingListener(CustomObject, tag=KIND_AUTOSCALING_LISTENER, kw_only=True):
    """AutoscalingListener is the listener of one scale set (lives in the controller namespace)."""

    KIND: ClassVar[str] = KIND_AUTOSCALING_LISTENER
    PLURAL: ClassVar[str] = "autoscalinglisteners"
    SINGULAR: ClassVar[str] = "autoscalinglistener"

    spec: AutoscalingListenerSpec = msgspec.field(default_factory=AutoscalingListenerSpec)
    status: AutoscalingListenerStatus | None = None


ObjectT = TypeVar("ObjectT")


class ObjectList(msgspec.Struct, Generic[ObjectT], kw_only=True, omit_defaults=True, rename="camel", dict=True):
    """A list response: ``decode(ObjectList[EphemeralRunner], body).items``."""

    api_version: str = ""
    kind: str = ""
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[ObjectT] = []


class WatchEvent(msgspec.Struct, Generic[ObjectT], kw_only=True):
    """One line of a watch stream: ``decode(WatchEvent[EphemeralRunner], line)``.

    ``object`` is the kind for ADDED/MODIFIED/DELETED; BOOKMARK carries only metadata (decoded
    as the kind with defaults) and ERROR carries a Status, so decode those with ``WatchEvent[dict]``
    if you need their content.
    """

    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]
    object: ObjectT


ApiObject = AutoscalingRunnerSet | EphemeralRunnerSet | EphemeralRunner | AutoscalingListener
ALL_KINDS: tuple[type[CustomObject], ...] = (
    AutoscalingRunnerSet,
    EphemeralRunnerSet,
    EphemeralRunner,
    AutoscalingListener,
)
KIND_BY_NAME: dict[str, type[CustomObject]] = {cls.KIND: cls for cls in ALL_KINDS}
KIND_BY_PLURAL: dict[str, type[CustomObject]] = {cls.PLURAL: cls for cls in ALL_KINDS}


def runner_revision(meta: ObjectMeta) -> int:
    """The actionable revision an EphemeralRunner (or its pod) was built from; 0 when unstamped."""
    raw = meta.annotations.get(ANNOTATION_ACTIONABLE_REVISION, "")
    try:
        value = int(raw)
    except ValueError:
        return 0
    return value if value >= 0 else 0
