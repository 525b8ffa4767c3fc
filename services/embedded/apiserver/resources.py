"""The resource registry: what each served kind is and which server rules apply to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .patch import MergeRule, smp_rules_for

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

_BASE_FIELDS = ("metadata.name", "metadata.namespace")
_POD_FIELDS = (
    *_BASE_FIELDS,
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    has_generation: bool = False
    allow_unconditional_update: bool = True
    return_deleted_object: bool = False
    graceful_delete: bool = False
    is_custom: bool = False
    schema: dict[str, Any] | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    selectable_fields: tuple[str, ...] = _BASE_FIELDS
    smp_rules: dict[str, MergeRule] = field(default_factory=dict)
    crd_name: str = ""

    @property
    def key(self) -> str:
        return f"{self.group}/{self.plural}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def verbs(self) -> list[str]:
        return ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

    def patch_types(self) -> list[str]:
        """Patch media types accepted (apply as YAML only: CBOR bodies are not decoded)."""
        if self.is_custom:
            return [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
        return [JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH]


def _builtin(group: str, version: str, plural: str, kind: str, namespaced: bool, **kw: Any) -> ResourceType:
    singular = kw.pop("singular", kind.lower())
    rt = ResourceType(
        group=group, version=version, plural=plural, singular=singular, kind=kind, namespaced=namespaced, **kw
    )
    rt.smp_rules = smp_rules_for(kind)
    return rt


def builtin_types() -> list[ResourceType]:
    """The built-in kinds the emulator serves (Kubernetes 1.37 behaviour)."""
    return [
        _builtin("", "v1", "namespaces", "Namespace", False, short_names=("ns",), status_subresource=True),
        _builtin(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            short_names=("po",),
            categories=("all",),
            status_subresource=True,
            has_generation=True,
            return_deleted_object=True,
            graceful_delete=True,
            selectable_fields=_POD_FIELDS,
        ),
        # Cluster-scoped like a real server's; the node simulator registers and heartbeats its Node.
        _builtin(
            "",
            "v1",
            "nodes",
            "Node",
            False,
            short_names=("no",),
            status_subresource=True,
            selectable_fields=("metadata.name", "spec.unschedulable"),
        ),
        _builtin("", "v1", "secrets", "Secret", True, selectable_fields=(*_BASE_FIELDS, "type")),
        _builtin("", "v1", "configmaps", "ConfigMap", True, short_names=("cm",)),
        _builtin("", "v1", "serviceaccounts", "ServiceAccount", True, short_names=("sa",), return_deleted_object=True),
        _builtin(
            "",
            "v1",
            "events",
            "Event",
            True,
            short_names=("ev",),
            selectable_fields=(
                *_BASE_FIELDS,
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ),
        ),
        _builtin("events.k8s.io", "v1", "events", "Event", True, short_names=("ev",)),
        _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
        _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
        _builtin("coordination.k8s.io", "v1", "leases", "Lease", True),
        _builtin(
            "scheduling.k8s.io",
            "v1",
            "priorityclasses",
            "PriorityClass",
            False,
            short_names=("pc",),
            has_generation=True,
        ),
        _builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            short_names=("crd", "crds"),
            status_subresource=True,
            has_generation=True,
        ),
    ]


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CRD object."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for v in spec.get("versions") or []:
        if not v.get("served", True):
            continue
        schema = ((v.get("schema") or {}).get("openAPIV3Schema")) or None
        subres = v.get("subresources") or spec.get("subresources") or {}
        columns = v.get("additionalPrinterColumns") or spec.get("additionalPrinterColumns") or []
        selectable = tuple(f.get("jsonPath", "").lstrip(".") for f in v.get("selectableFields") or [])
        out.append(
            ResourceType(
                group=spec.get("group", ""),
                version=v.get("name", ""),
                plural=names.get("plural", ""),
                singular=names.get("singular") or names.get("kind", "").lower(),
                kind=names.get("kind", ""),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status_subresource="status" in subres,
                has_generation=True,
                allow_unconditional_update=False,
                is_custom=True,
                schema=schema,
                printer_columns=list(columns),
                selectable_fields=_BASE_FIELDS + selectable,
                crd_name=(crd.get("metadata") or {}).get("name", ""),
            )
        )
    return out


class Registry:
    """Served resource types, addressable by (group, version, plural) and by storage key."""

    def __init__(self) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        for rt in builtin_types():
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._by_gvr[(rt.group, rt.version, rt.plural)] = rt

    def remove_crd(self, crd_name: str) -> list[ResourceType]:
        gone = [rt for rt in self._by_gvr.values() if rt.is_custom and rt.crd_name == crd_name]
        for rt in gone:
            del self._by_gvr[(rt.group, rt.version, rt.plural)]
        return gone

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self._by_gvr.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        return None

    def all(self) -> list[ResourceType]:
        return list(self._by_gvr.values())

    def group_versions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for rt in self._by_gvr.values():
            vs = out.setdefault(rt.group, [])
            if rt.version not in vs:
                vs.append(rt.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return sorted(
            (rt for rt in self._by_gvr.values() if rt.group == group and rt.version == version), key=lambda r: r.plural
        )
