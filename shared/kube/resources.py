"""Resource descriptors: where a kind lives in the API and which struct its objects decode into.

A :class:`Resource` is a value (frozen, hashable): group, version, plural, kind, whether it is
namespaced, whether it has a ``/status`` subresource and whether it is a custom resource (custom
resources do not accept strategic merge patches). Paths are built by pure functions.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar
from urllib.parse import quote

import msgspec

from shared.api import AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet
from shared.api.constants import GROUP, VERSION
from shared.kube.objects import (
    ConfigMap,
    Event,
    Lease,
    Namespace,
    Pod,
    PodCacheView,
    Role,
    RoleBinding,
    Secret,
    ServiceAccount,
)

T = TypeVar("T")


class InvalidKey(ValueError):
    """A value is not a ``namespace/name`` key."""


class ObjectKey(NamedTuple):
    """The identity of a namespaced object within one resource: ``namespace/name``.

    Work queues, caches and wake-up streams all use this key; ``str(key)`` is ``ns/name``
    (just ``name`` for cluster-scoped objects).
    """

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def parse(cls, text: str) -> ObjectKey:
        """``"ns/name"`` → key; ``"name"`` → cluster-scoped key. Raises :class:`InvalidKey`."""
        if not isinstance(text, str) or not text or text.count("/") > 1:
            raise InvalidKey(f"not a namespace/name key: {text!r}")
        namespace, _, name = text.rpartition("/")
        if not name or (text.count("/") == 1 and not namespace):
            raise InvalidKey(f"not a namespace/name key: {text!r}")
        return cls(namespace, name)

    @classmethod
    def of(cls, value: ObjectKey | str | tuple[str, str]) -> ObjectKey:
        if isinstance(value, ObjectKey):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return cls(value[0], value[1])
        raise InvalidKey(f"not a namespace/name key: {value!r}")


@dataclass(frozen=True)
class Resource(Generic[T]):
    """One API resource (a plural under a group/version) and the struct its objects decode into."""

    group: str
    version: str
    plural: str
    kind: str
    type: type[T]
    namespaced: bool = True
    has_status: bool = False
    custom: bool = False
    #: What an informer's cache decodes instead of ``type`` (None: all of it): a struct with a
    #: subset of ``type``'s fields under the same names; each cached object is ``type`` built from
    #: it, the other fields left at their defaults (issue 10: memory per cached object).
    cache_view: builtins.type[Any] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` or ``ephemeralrunners.actions.github.com`` (how the server names it in messages)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def _prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection_path(self, namespace: str | None) -> str:
        """The list/watch/create path; ``namespace=None`` (or "") lists across all namespaces."""
        if self.namespaced and namespace:
            return f"{self._prefix()}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{self._prefix()}/{self.plural}"

    def object_path(self, key: ObjectKey, subresource: str = "") -> str:
        if self.namespaced and not key.namespace:
            raise InvalidKey(f"{self.qualified} is namespaced: key {key.name!r} needs a namespace")
        path = f"{self.collection_path(key.namespace if self.namespaced else None)}/{quote(key.name, safe='')}"
        return f"{path}/{subresource}" if subresource else path

    def describe(
        self, verb: str, key: ObjectKey | None = None, subresource: str = "", namespace: str | None = None
    ) -> str:
        """``PATCH ephemeralrunners.actions.github.com ns/name/status`` for error messages and logs."""
        target = str(key) if key is not None else (f"{namespace}/*" if namespace else "*")
        return f"{verb} {self.qualified} {target}{'/' + subresource if subresource else ''}"

    def from_cache_view(self, view: Any) -> T:
        """The ``type`` object made of a decoded ``cache_view`` (its fields, the rest defaults)."""
        return self.type(**msgspec.structs.asdict(view))

    def key_of(self, obj: Any) -> ObjectKey:
        meta = obj.metadata
        return ObjectKey(meta.namespace if self.namespaced else "", meta.name)

    def __repr__(self) -> str:
        return f"Resource({self.qualified})"


def _custom(cls: type[T]) -> Resource[T]:
    return Resource(GROUP, VERSION, cls.PLURAL, cls.KIND, cls, namespaced=True, has_status=True, custom=True)  # type: ignore[attr-defined]


AUTOSCALING_RUNNER_SETS: Resource[AutoscalingRunnerSet] = _custom(AutoscalingRunnerSet)
EPHEMERAL_RUNNER_SETS: Resource[EphemeralRunnerSet] = _custom(EphemeralRunnerSet)
EPHEMERAL_RUNNERS: Resource[EphemeralRunner] = _custom(EphemeralRunner)
AUTOSCALING_LISTENERS: Resource[AutoscalingListener] = _custom(AutoscalingListener)

PODS: Resource[Pod] = Resource("", "v1", "pods", "Pod", Pod, has_status=True, cache_view=PodCacheView)
SECRETS: Resource[Secret] = Resource("", "v1", "secrets", "Secret", Secret)
SERVICE_ACCOUNTS: Resource[ServiceAccount] = Resource("", "v1", "serviceaccounts", "ServiceAccount", ServiceAccount)
CONFIG_MAPS: Resource[ConfigMap] = Resource("", "v1", "configmaps", "ConfigMap", ConfigMap)
EVENTS: Resource[Event] = Resource("", "v1", "events", "Event", Event)
NAMESPACES: Resource[Namespace] = Resource(
    "", "v1", "namespaces", "Namespace", Namespace, namespaced=False, has_status=True
)
ROLES: Resource[Role] = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", Role)
ROLE_BINDINGS: Resource[RoleBinding] = Resource(
    "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", RoleBinding
)
LEASES: Resource[Lease] = Resource("coordination.k8s.io", "v1", "leases", "Lease", Lease)

ALL_RESOURCES: tuple[Resource[Any], ...] = (
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    AUTOSCALING_LISTENERS,
    PODS,
    SECRETS,
    SERVICE_ACCOUNTS,
    EVENTS,
    NAMESPACES,
    ROLES,
    ROLE_BINDINGS,
    LEASES,
)
RESOURCE_BY_KIND: dict[str, Resource[Any]] = {r.kind: r for r in ALL_RESOURCES}
