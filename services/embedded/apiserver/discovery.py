"""Discovery documents, /version, the OpenAPI v3 index kubectl needs, and Table output."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

import msgspec

from .resources import Registry, ResourceType

KUBE_MINOR = "37"
GIT_VERSION = f"v1.{KUBE_MINOR}.0-runnerscale-emulator"


def version_info() -> dict[str, str]:
    return {
        "major": "1",
        "minor": KUBE_MINOR,
        "emulationMajor": "1",
        "emulationMinor": KUBE_MINOR,
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": str(int(KUBE_MINOR) - 1),
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.26.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": vs, "preferredVersion": vs[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [_group_doc(g, vs) for g, vs in sorted(registry.group_versions().items()) if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    vs = registry.group_versions().get(group)
    if not vs or not group:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, vs)}


def api_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = registry.in_group_version(group, version)
    if not types:
        return None
    resources: list[dict[str, Any]] = []
    for rt in types:
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": rt.verbs,
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.kind == "Pod" and not rt.group:
            resources.append(
                {"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding", "verbs": ["create"]}
            )
        if rt.kind == "ServiceAccount" and not rt.group:
            resources.append(
                {
                    "name": "serviceaccounts/token",
                    "singularName": "",
                    "namespaced": True,
                    "group": "authentication.k8s.io",
                    "version": "v1",
                    "kind": "TokenRequest",
                    "verbs": ["create"],
                }
            )
        if rt.status_subresource:
            resources.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


# --- OpenAPI v3 ------------------------------------------------------------------------------
#
# kubectl (1.32) reads /openapi/v3 before `apply` to learn whether the server validates fields
# itself: it looks for a PATCH operation tagged with the kind's GVK that takes the
# `fieldValidation` query parameter. Only that much is served; no component schemas, so kubectl
# builds its own patches exactly as it does for kinds without a published schema.


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_index(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in sorted(registry.group_versions().items()):
        for v in versions:
            doc = openapi_group_version(registry, group, v)
            digest = hashlib.sha256(repr(sorted(doc["paths"])).encode()).hexdigest()[:32].upper()
            paths[_gv_path(group, v)] = {"serverRelativeURL": f"/openapi/v3/{_gv_path(group, v)}?hash={digest}"}
    return {"paths": paths}


def _query(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}


def openapi_group_version(registry: Registry, group: str, version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for rt in registry.in_group_version(group, version):
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        prefix = "/" + _gv_path(group, version)
        base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
        write_params = [_query("dryRun"), _query("fieldManager"), _query("fieldValidation")]
        for path, ops in (
            (base, {"get": "list", "post": "post", "delete": "deletecollection"}),
            (base + "/{name}", {"get": "get", "put": "put", "patch": "patch", "delete": "delete"}),
            *(
                ((base + "/{name}/status", {"get": "get", "put": "put", "patch": "patch"}),)
                if rt.status_subresource
                else ()
            ),
        ):
            item: dict[str, Any] = {}
            for method, action in ops.items():
                op: dict[str, Any] = {
                    "operationId": f"{action}{rt.kind}",
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": gvk,
                }
                if method in ("post", "put", "patch"):
                    op["parameters"] = list(write_params) + ([_query("force")] if method == "patch" else [])
                item[method] = op
            paths[path] = item
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }


# --- Table output (kubectl get) ---------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """Kubernetes' HumanDuration, used for AGE cells."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y{d % 365}d" if d < 365 * 8 else f"{d // 365}y"


def _age(ts: str | None) -> str:
    if not ts:
        return "<unknown>"
    try:
        then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    return human_duration((datetime.now(UTC) - then).total_seconds())


_SEGMENT = re.compile(r"\.?([^.\[\]]+)|\[(\d+|\*)\]|\['([^']+)'\]")


def jsonpath_values(obj: Any, path: str) -> list[Any]:
    """A small JSONPath subset for printer columns: ``.a.b``, ``.a[0]``, ``.a[*].b``, ``.a['x.y']``."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    path = path.lstrip("$")
    current = [obj]
    pos = 0
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if not m or m.end() == pos:
            return []
        pos = m.end()
        key, index, quoted = m.group(1), m.group(2), m.group(3)
        nxt = []
        for c in current:
            if key is not None or quoted is not None:
                k = key if key is not None else quoted
                if isinstance(c, dict) and k in c:
                    nxt.append(c[k])
            elif index == "*":
                if isinstance(c, list):
                    nxt.extend(c)
            elif isinstance(c, list) and int(index) < len(c):
                nxt.append(c[int(index)])
        current = nxt
    return current


def _cell(value: list[Any], col_type: str) -> Any:
    if not value:
        return None
    v = value[0] if len(value) == 1 else ",".join(str(x) for x in value)
    if col_type == "date" and isinstance(v, str):
        return _age(v)
    if col_type == "integer" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return int(v)
    if col_type == "boolean" and isinstance(v, bool):
        return v
    if isinstance(v, (dict, list)):
        return msgspec.json.encode(v).decode()
    return v


def _columns(rt: ResourceType) -> list[dict[str, Any]]:
    name_col = {
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name must be unique within a namespace.",
        "priority": 0,
    }
    if rt.is_custom:
        if not rt.printer_columns:
            return [
                name_col,
                {"name": "Age", "type": "date", "format": "", "description": "creation time", "priority": 0},
            ]
        cols = [name_col]
        for c in rt.printer_columns:
            cols.append(
                {
                    "name": c.get("name", ""),
                    "type": c.get("type", "string"),
                    "format": c.get("format", ""),
                    "description": c.get("description", ""),
                    "priority": c.get("priority", 0),
                }
            )
        return cols
    extra: list[tuple[str, str]] = {
        "Pod": [("Ready", "string"), ("Status", "string"), ("Restarts", "string")],
        "Namespace": [("Status", "string")],
        "ConfigMap": [("Data", "integer")],
        "Secret": [("Type", "string"), ("Data", "integer")],
        "ServiceAccount": [("Secrets", "integer")],
        "Lease": [("Holder", "string")],
        "PriorityClass": [("Value", "integer"), ("Global-Default", "boolean")],
    }.get(rt.kind, [])
    if rt.kind == "Event":
        # As the real printer: no AGE, and NAME only with -o wide (priority 1).
        names = ["Last Seen", "Type", "Reason", "Object", "Message"]
        cols = [{"name": n, "type": "string", "format": "", "description": n, "priority": 0} for n in names]
        return [*cols, {**name_col, "priority": 1}]
    cols = [name_col] + [{"name": n, "type": t, "format": "", "description": n, "priority": 0} for n, t in extra]
    cols.append({"name": "Age", "type": "string", "format": "", "description": "creation time", "priority": 0})
    return cols


def _builtin_cells(rt: ResourceType, obj: dict[str, Any]) -> list[Any]:
    meta = obj.get("metadata") or {}
    if rt.kind == "Pod":
        statuses = (obj.get("status") or {}).get("containerStatuses") or []
        total = len((obj.get("spec") or {}).get("containers") or [])
        ready = sum(1 for s in statuses if s.get("ready"))
        phase = (obj.get("status") or {}).get("phase", "")
        if meta.get("deletionTimestamp"):
            phase = "Terminating"
        restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
        cells = [f"{ready}/{total}", phase, str(restarts)]
    elif rt.kind == "Namespace":
        cells = [(obj.get("status") or {}).get("phase", "")]
    elif rt.kind == "ConfigMap":
        cells = [len(obj.get("data") or {}) + len(obj.get("binaryData") or {})]
    elif rt.kind == "Secret":
        cells = [obj.get("type", ""), len(obj.get("data") or {})]
    elif rt.kind == "ServiceAccount":
        cells = [len(obj.get("secrets") or [])]
    elif rt.kind == "Lease":
        cells = [(obj.get("spec") or {}).get("holderIdentity", "")]
    elif rt.kind == "PriorityClass":
        cells = [obj.get("value", 0), bool(obj.get("globalDefault"))]
    elif rt.kind == "Event":
        regarding = obj.get("involvedObject") or obj.get("regarding") or {}
        seen = obj.get("lastTimestamp") or obj.get("eventTime") or meta.get("creationTimestamp")
        cells = [
            _age(seen[:19] + "Z" if isinstance(seen, str) and len(seen) > 20 else seen),
            obj.get("type", ""),
            obj.get("reason", ""),
            f"{str(regarding.get('kind', '')).lower()}/{regarding.get('name', '')}",
            obj.get("message") or obj.get("note", ""),
            meta.get("name", ""),
        ]
        return cells
    else:
        cells = []
    return [*cells, _age(meta.get("creationTimestamp"))]


def table_row(rt: ResourceType, obj: dict[str, Any], include_object: str) -> dict[str, Any]:
    name = (obj.get("metadata") or {}).get("name", "")
    if rt.is_custom:
        if rt.printer_columns:
            cells = [name] + [
                _cell(jsonpath_values(obj, c.get("jsonPath", "")), c.get("type", "string")) for c in rt.printer_columns
            ]
        else:
            cells = [name, _age((obj.get("metadata") or {}).get("creationTimestamp"))]
    elif rt.kind == "Event":
        cells = _builtin_cells(rt, obj)
    else:
        cells = [name, *_builtin_cells(rt, obj)]
    row: dict[str, Any] = {"cells": cells}
    if include_object == "Object":
        row["object"] = obj
    elif include_object != "None":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {},
        }
    return row


def to_table(
    rt: ResourceType, objs: list[dict[str, Any]], list_meta: dict[str, Any], include_object: str
) -> dict[str, Any]:
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": _columns(rt),
        "rows": [table_row(rt, o, include_object) for o in objs],
    }


def wants_table(accept: str) -> bool:
    first = accept.split(",", maxsplit=1)[0] if accept else ""
    return "as=Table" in first and "g=meta.k8s.io" in first
