"""Small typed views of the core kinds the workers touch (pods, secrets, RBAC, events, leases).

Decision: these are msgspec Structs of the fields workers *read*; parts that workers only build and
send (a pod's ``spec``) stay JSON trees, so nothing is lost between a template and the server.
Unknown fields are ignored on decode, so never PUT a decoded object back: write with merge
patches of the fields you own (the writer offers nothing else for these kinds).

Built-in list items carry no ``kind``/``apiVersion``, so these structs do not require them.
"""

from __future__ import annotations

import base64
import binascii
import sys
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec

from shared.api import ObjectMeta

JsonTree = dict[str, Any]


class _Obj(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    pass


# --- Pod ------------------------------------------------------------------------------------------


class ContainerStateTerminated(_Obj, kw_only=True):
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None


class ContainerStateWaiting(_Obj, kw_only=True):
    reason: str = ""
    message: str = ""


class ContainerStateRunning(_Obj, kw_only=True):
    started_at: datetime | None = None


class ContainerState(_Obj, kw_only=True):
    waiting: ContainerStateWaiting | None = None
    running: ContainerStateRunning | None = None
    terminated: ContainerStateTerminated | None = None


class ContainerStatus(_Obj, kw_only=True):
    name: str = ""
    ready: bool = False
    restart_count: int = 0
    image: str = ""
    state: ContainerState = msgspec.field(default_factory=ContainerState)
    last_state: ContainerState = msgspec.field(default_factory=ContainerState)


class PodCondition(_Obj, kw_only=True):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


class PodStatus(_Obj, kw_only=True):
    phase: str = ""  # Pending Running Succeeded Failed Unknown
    reason: str = ""
    message: str = ""
    pod_ip: str = msgspec.field(default="", name="podIP")
    start_time: datetime | None = None
    conditions: list[PodCondition] = []
    container_statuses: list[ContainerStatus] = []
    init_container_statuses: list[ContainerStatus] = []

    def container(self, name: str) -> ContainerStatus | None:
        return next((c for c in self.container_statuses if c.name == name), None)


class Pod(_Obj, kw_only=True):
    """core/v1 Pod: typed metadata and status, the spec as the JSON tree it was built from.

    A Pod from an informer's cache has an empty ``spec`` (see :class:`PodCacheView`)."""

    api_version: str = "v1"
    kind: str = "Pod"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: JsonTree = {}
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class PodCacheView(_Obj, kw_only=True):
    """What an informer keeps of a Pod (``PODS.cache_view``): metadata and status, not the spec.

    Workers build pod specs and send them; they never read one back (the runner worker decides on
    a pod's phase, conditions and container states, the listener-pod worker re-reads its pod with
    a GET before it acts). The spec (containers, env, volumes, tolerations) was ~60 % of a cached
    runner pod's memory (issue 10); msgspec skips it without building it. A cached Pod is made
    from this view with an empty ``spec``."""

    KIND: ClassVar[str] = "Pod"  # for decode errors

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: PodStatus = msgspec.field(default_factory=PodStatus)

    def __post_init__(self) -> None:
        # Every runner pod repeats the same phase, condition types and states, container names
        # and image: share one string each (~0.8 kB of a ~3.5 kB cached pod).
        status = self.status
        status.phase = sys.intern(status.phase)
        for cond in status.conditions:
            cond.type, cond.status, cond.reason = (
                sys.intern(cond.type),
                sys.intern(cond.status),
                sys.intern(cond.reason),
            )
        for cs in (*status.init_container_statuses, *status.container_statuses):
            cs.name, cs.image = sys.intern(cs.name), sys.intern(cs.image)


# --- Secret, ServiceAccount, Namespace -------------------------------------------------------------


class ConfigMap(_Obj, kw_only=True):
    """core/v1 ConfigMap (read for TLS CA bundles)."""

    api_version: str = "v1"
    kind: str = "ConfigMap"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    data: dict[str, str] = {}
    binary_data: dict[str, str] = {}


class SecretDataError(ValueError):
    """A Secret's ``data`` value is not valid base64."""


class Secret(_Obj, kw_only=True):
    """core/v1 Secret. ``data`` values are base64 as on the wire; use :meth:`decoded`."""

    api_version: str = "v1"
    kind: str = "Secret"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    type: str = ""
    data: dict[str, str] = {}
    string_data: dict[str, str] = {}  # write-only: the server folds it into data
    immutable: bool | None = None

    def decoded(self, key: str) -> bytes | None:
        raw = self.data.get(key)
        if raw is None:
            return None
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise SecretDataError(
                f"secret {self.metadata.namespace}/{self.metadata.name}: data[{key!r}] is not base64"
            ) from None


class ObjectReference(_Obj, kw_only=True):
    api_version: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    resource_version: str = ""
    field_path: str = ""


class NameRef(_Obj, kw_only=True):
    name: str = ""


class ServiceAccount(_Obj, kw_only=True):
    api_version: str = "v1"
    kind: str = "ServiceAccount"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    secrets: list[ObjectReference] = []
    image_pull_secrets: list[NameRef] = []
    automount_service_account_token: bool | None = None


class NamespaceStatus(_Obj, kw_only=True):
    phase: str = ""


class Namespace(_Obj, kw_only=True):
    api_version: str = "v1"
    kind: str = "Namespace"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: NamespaceStatus = msgspec.field(default_factory=NamespaceStatus)


# --- RBAC -----------------------------------------------------------------------------------------


class PolicyRule(_Obj, kw_only=True):
    api_groups: list[str] = []
    resources: list[str] = []
    resource_names: list[str] = []
    verbs: list[str] = []


class RoleRef(_Obj, kw_only=True):
    api_group: str = "rbac.authorization.k8s.io"
    kind: str = "Role"
    name: str = ""


class Subject(_Obj, kw_only=True):
    kind: str = ""
    name: str = ""
    namespace: str = ""
    api_group: str = ""


class Role(_Obj, kw_only=True):
    api_version: str = "rbac.authorization.k8s.io/v1"
    kind: str = "Role"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    #: None: a real API server answers ``"rules": null`` for a Role without rules (no omitempty).
    rules: list[PolicyRule] | None = []


class RoleBinding(_Obj, kw_only=True):
    api_version: str = "rbac.authorization.k8s.io/v1"
    kind: str = "RoleBinding"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    role_ref: RoleRef = msgspec.field(default_factory=RoleRef)
    subjects: list[Subject] = []


# --- Event, Lease ---------------------------------------------------------------------------------


class EventSource(_Obj, kw_only=True):
    component: str = ""
    host: str = ""


class Event(_Obj, kw_only=True):
    """core/v1 Event (the form ``kubectl describe`` shows)."""

    api_version: str = "v1"
    kind: str = "Event"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    involved_object: ObjectReference = msgspec.field(default_factory=ObjectReference)
    reason: str = ""
    message: str = ""
    type: str = ""  # Normal | Warning
    source: EventSource = msgspec.field(default_factory=EventSource)
    count: int = 0
    first_timestamp: datetime | None = None
    last_timestamp: datetime | None = None
    reporting_component: str = ""
    reporting_instance: str = ""


class LeaseSpec(_Obj, kw_only=True):
    """coordination.k8s.io/v1 LeaseSpec. Times are MicroTime text; see :func:`micro_time`."""

    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class Lease(_Obj, kw_only=True):
    api_version: str = "coordination.k8s.io/v1"
    kind: str = "Lease"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: LeaseSpec = msgspec.field(default_factory=LeaseSpec)


def micro_time(when: datetime) -> str:
    """A MicroTime as the server writes it: ``2026-11-29T12:00:00.000000Z`` (exactly six digits)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def kube_time(when: datetime) -> str:
    """A meta/v1 Time (second precision): ``2026-11-29T12:00:00Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
