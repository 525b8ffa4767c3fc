"""Per-kind create/update rules of the built-in types: defaulting, admission and validation.

Pure functions over JSON objects; they raise ApiError with the server's messages.
"""

from __future__ import annotations

import base64
import random
from functools import lru_cache
from typing import Any

from shared.kube.names import (
    is_config_map_key,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
    mask_trailing_dash,
)

from .errors import ApiError, Cause, forbidden, invalid, invalid_value, json_kind

Obj = dict[str, Any]


NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SA_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(NAME_ALPHABET) for _ in range(n))


def generate_name(base: str) -> str:
    return base[:58] + random_suffix()


def _name_causes(name: str, label_only: bool, field: str = "metadata.name", shown: str | None = None) -> list[Cause]:
    check = is_dns1123_label if label_only else is_dns1123_subdomain
    return [Cause("FieldValueInvalid", invalid_value(shown or name, m), field) for m in check(name)]


# Label keys and values, annotation keys and finalizers repeat across the objects of a fleet:
# each distinct string is checked once (the checks are pure), not on every write.
@lru_cache(maxsize=8192)
def _qualified_name_errors(key: str) -> tuple[str, ...]:
    return tuple(is_qualified_name(key))


@lru_cache(maxsize=8192)
def _label_value_errors(value: str) -> tuple[str, ...]:
    return tuple(is_valid_label_value(value))


def _qualified_key_causes(key: str, field: str) -> list[Cause]:
    errs = _qualified_name_errors(key)
    return [Cause("FieldValueInvalid", invalid_value(key, m), field) for m in errs] if errs else []


STANDARD_FINALIZERS = ("kubernetes", "orphan", "foregroundDeletion")


def metadata_causes(obj: Obj, label_only_name: bool, check_name: bool = True) -> list[Cause]:
    """ObjectMeta validation common to every kind, in the server's order: generateName, name,
    labels, annotations, ownerReferences, finalizers. (Core Events skip the name rules.)"""
    meta = obj.get("metadata") or {}
    causes: list[Cause] = []
    generate = meta.get("generateName") or ""
    if generate and check_name:
        causes += _name_causes(mask_trailing_dash(generate), label_only_name, "metadata.generateName", generate)
    if check_name:
        causes += _name_causes(meta.get("name", ""), label_only_name)
    labels = meta.get("labels") or {}
    if isinstance(labels, dict):
        for k, v in labels.items():
            if errs := _qualified_name_errors(k):
                causes += [Cause("FieldValueInvalid", invalid_value(k, m), "metadata.labels") for m in errs]
            if isinstance(v, str) and (errs := _label_value_errors(v)):
                causes += [Cause("FieldValueInvalid", invalid_value(v, m), "metadata.labels") for m in errs]
    ann = meta.get("annotations") or {}
    if isinstance(ann, dict):
        for k in ann:
            if errs := _qualified_name_errors(k.lower()):
                causes += [
                    Cause("FieldValueInvalid", invalid_value(k.lower(), m), "metadata.annotations") for m in errs
                ]
    refs = meta.get("ownerReferences") or []
    for i, ref in enumerate(refs):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not (isinstance(ref, dict) and ref.get(f)):
                causes.append(
                    Cause(
                        "FieldValueRequired", "Required value: must not be empty", f"metadata.ownerReferences[{i}].{f}"
                    )
                )
    controllers = [r for r in refs if isinstance(r, dict) and r.get("controller")]
    if len(controllers) > 1:
        shown = [_owner_ref_shape(r) for r in refs if isinstance(r, dict)]
        names = " and ".join(f"{r.get('kind', '')}/{r.get('name', '')}" for r in controllers)
        causes.append(
            Cause(
                "FieldValueInvalid",
                invalid_value(
                    shown, f'Only one reference can have Controller set to true. Found "true" in references for {names}'
                ),
                "metadata.ownerReferences",
            )
        )
    for i, f in enumerate(meta.get("finalizers") or []):
        if not isinstance(f, str):
            continue
        causes += _qualified_key_causes(f, "metadata.finalizers")
        if "/" not in f and f not in STANDARD_FINALIZERS:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(f, "name is neither a standard finalizer name nor is it fully qualified"),
                    f"metadata.finalizers[{i}]",
                )
            )
    return causes


def _owner_ref_shape(ref: Obj) -> Obj:
    """An owner reference as the server prints it in messages (Go struct field order)."""
    out = {k: ref.get(k, "") for k in ("apiVersion", "kind", "name", "uid")}
    for k in ("controller", "blockOwnerDeletion"):
        if k in ref:
            out[k] = ref[k]
    return out


# --- pods -----------------------------------------------------------------------------------


def image_pull_policy(image: str) -> str:
    """Always for ``:latest`` or no tag (and no digest), else IfNotPresent."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "Always"
    return "Always" if last.rsplit(":", 1)[1] == "latest" else "IfNotPresent"


def _default_container(c: Obj) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if "image" in c and "imagePullPolicy" not in c:
        c["imagePullPolicy"] = image_pull_policy(c["image"])
    res = c.setdefault("resources", {})
    limits = res.get("limits") if isinstance(res, dict) else None
    if isinstance(limits, dict) and limits:
        # A limit without a request defaults the request to the limit (SetDefaults_Pod).
        requests = res.setdefault("requests", {})
        if isinstance(requests, dict):
            for name, value in limits.items():
                requests.setdefault(name, value)
    for p in c.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")
    for e in c.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("fieldRef") if isinstance(e, dict) else None
        if isinstance(ref, dict):
            ref.setdefault("apiVersion", "v1")


def default_pod(pod: Obj) -> None:
    """Defaulting applied when a Pod is decoded (the registry's SetDefaults_*)."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    if spec.get("serviceAccount") and not spec.get("serviceAccountName"):
        spec["serviceAccountName"] = spec["serviceAccount"]
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                _default_container(c)
    for v in spec.get("volumes") or []:
        if not isinstance(v, dict):
            continue
        for src, mode in (
            ("secret", "defaultMode"),
            ("configMap", "defaultMode"),
            ("projected", "defaultMode"),
            ("downwardAPI", "defaultMode"),
        ):
            if isinstance(v.get(src), dict):
                v[src].setdefault(mode, 420)
        if not any(k for k in v if k != "name"):
            v["emptyDir"] = {}


def _qos_class(spec: Obj) -> str:
    requests_set = limits_set = False
    guaranteed = True
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        requests_set |= bool(req)
        limits_set |= bool(lim)
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and str(req[r]) != str(lim[r])):
                guaranteed = False
    if not requests_set and not limits_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed and limits_set else "Burstable"


def validate_pod(pod: Obj) -> list[Cause]:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [Cause("FieldValueRequired", "Required value", "spec")]
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not containers:
        causes.append(Cause("FieldValueRequired", "Required value", "spec.containers"))
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            path = f"spec.{key}[{i}]"
            if not isinstance(c, dict):
                causes.append(Cause("FieldValueTypeInvalid", "must be an object", path))
                continue
            name = c.get("name")
            if not name:
                causes.append(Cause("FieldValueRequired", "Required value", f"{path}.name"))
            elif name in seen:
                causes.append(Cause("FieldValueDuplicate", f'Duplicate value: "{name}"', f"{path}.name"))
            else:
                seen.add(name)
            if not c.get("image"):
                causes.append(Cause("FieldValueRequired", "Required value", f"{path}.image"))
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{spec.get("restartPolicy")}": supported values: "Always", "OnFailure", "Never"',
                "spec.restartPolicy",
            )
        )
    vol_names: set[str] = set()
    for i, v in enumerate(spec.get("volumes") or []):
        n = v.get("name") if isinstance(v, dict) else None
        if not n:
            causes.append(Cause("FieldValueRequired", "Required value", f"spec.volumes[{i}].name"))
        elif n in vol_names:
            causes.append(Cause("FieldValueDuplicate", f'Duplicate value: "{n}"', f"spec.volumes[{i}].name"))
        else:
            vol_names.add(n)
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            for j, m in enumerate((c.get("volumeMounts") if isinstance(c, dict) else None) or []):
                if isinstance(m, dict) and m.get("name") not in vol_names:
                    causes.append(
                        Cause(
                            "FieldValueNotFound",
                            f'Not found: "{m.get("name")}"',
                            f"spec.{key}[{i}].volumeMounts[{j}].name",
                        )
                    )
    return causes


def admit_pod_create(pod: Obj, service_account: Obj | None, namespace: str) -> None:
    """Admission of a new Pod: ServiceAccount (token volume + mounts) and default tolerations.

    Raises 403 when the pod's service account does not exist, as the ServiceAccount plugin does.
    """
    spec = pod["spec"]
    name = pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
    sa_name = spec.setdefault("serviceAccountName", "default")
    spec["serviceAccount"] = sa_name
    if service_account is None:
        raise forbidden(
            "",
            "pods",
            name,
            f'error looking up service account {namespace}/{sa_name}: serviceaccount "{sa_name}" not found',
        )
    automount = spec.get("automountServiceAccountToken")
    if automount is None:
        automount = service_account.get("automountServiceAccountToken", True)
    if automount:
        volumes = spec.setdefault("volumes", [])
        vol_name = next((v["name"] for v in volumes if v.get("name", "").startswith("kube-api-access-")), None)
        if vol_name is None:
            vol_name = "kube-api-access-" + random_suffix()
            volumes.append(
                {
                    "name": vol_name,
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            )
        for key in ("initContainers", "containers"):
            for c in spec.get(key) or []:
                mounts = c.setdefault("volumeMounts", [])
                if not any(m.get("mountPath") == SA_MOUNT_PATH for m in mounts):
                    mounts.append({"name": vol_name, "readOnly": True, "mountPath": SA_MOUNT_PATH})
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") in (None, "", "NoExecute") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


# Fields of a pod spec that may change on update (everything else is immutable).
_MUTABLE_CONTAINER = ("image",)


def pod_spec_update_causes(old_spec: Obj, new_spec: Obj) -> list[Cause]:
    def masked(spec: Obj) -> Obj:
        s = {
            k: v
            for k, v in spec.items()
            if k not in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates")
        }
        for key in ("containers", "initContainers"):
            if isinstance(s.get(key), list):
                s[key] = [
                    {k: v for k, v in c.items() if k not in _MUTABLE_CONTAINER} for c in s[key] if isinstance(c, dict)
                ]
        return s

    if len(old_spec.get("containers") or []) != len(new_spec.get("containers") or []):
        return [
            Cause("FieldValueForbidden", "Forbidden: pod updates may not add or remove containers", "spec.containers")
        ]
    # nodeName is set once through the pods/binding subresource, never by an update.
    old_m, new_m = masked(old_spec), masked(new_spec)
    if old_m == new_m:
        return []
    return [
        Cause(
            "FieldValueForbidden",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            "spec",
        )
    ]


# --- secrets ---------------------------------------------------------------------------------


def normalise_secret(secret: Obj) -> list[Cause]:
    """Fold ``stringData`` into base64 ``data``; default ``type``; validate keys and encoding."""
    causes: list[Cause] = []
    if not secret.get("type"):
        secret["type"] = "Opaque"
    data = secret.get("data") or {}
    if not isinstance(data, dict):
        return [Cause("FieldValueTypeInvalid", "must be a map", "data")]
    for k, v in data.items():
        causes += [Cause("FieldValueInvalid", invalid_value(k, m), f"data[{k}]") for m in is_config_map_key(k)]
        try:
            base64.b64decode(v or "", validate=True)
        except (ValueError, TypeError):
            causes.append(Cause("FieldValueInvalid", invalid_value("<redacted>", "illegal base64 data"), f"data[{k}]"))
    string_data = secret.pop("stringData", None) or {}
    if isinstance(string_data, dict):
        for k, v in string_data.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
    if data:
        secret["data"] = data
    return causes


# --- namespaces ------------------------------------------------------------------------------


def default_namespace(ns: Obj) -> None:
    ns.setdefault("spec", {})["finalizers"] = ["kubernetes"]
    ns["status"] = {"phase": "Active"}
    labels = ns["metadata"].setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = ns["metadata"]["name"]


PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")


def namespace_terminating(group: str, plural: str, name: str, namespace: str) -> ApiError:
    return forbidden(
        group,
        plural,
        name,
        f"unable to create new content in namespace {namespace} because it is being terminated",
        causes=[Cause("NamespaceTerminating", f"namespace {namespace} is being terminated", "metadata.namespace")],
    )


def pod_invalid(name: str, causes: list[Cause]) -> ApiError:
    return invalid("", "Pod", name, causes)


# --- configmaps ------------------------------------------------------------------------------


def validate_config_map(cm: Obj) -> list[Cause]:
    causes: list[Cause] = []
    for field in ("data", "binaryData"):
        for k in cm.get(field) or {}:
            causes += [Cause("FieldValueInvalid", invalid_value(k, m), f"{field}[{k}]") for m in is_config_map_key(k)]
    return causes


# --- events --------------------------------------------------------------------------------------


def validate_event(event: Obj, events_api: bool) -> list[Cause]:
    """Event validation. Both APIs store the core Event, so paths use its field names; the
    ``events.k8s.io`` API adds the strict checks (an ``eventTime``, a ``type``, no legacy fields)."""
    meta = event.get("metadata") or {}
    ns = meta.get("namespace", "")
    involved = event.get("regarding" if events_api else "involvedObject") or {}
    involved_ns = involved.get("namespace", "") if isinstance(involved, dict) else ""
    event_time = event.get("eventTime")
    causes: list[Cause] = []
    mismatch = Cause(
        "FieldValueInvalid", invalid_value(involved_ns, "does not match event.namespace"), "involvedObject.namespace"
    )
    if not event_time:
        if (not involved_ns and ns not in ("", "default")) or (involved_ns and involved_ns != ns):
            causes.append(mismatch)
    else:
        if not involved_ns and ns not in ("default", "kube-system"):
            causes.append(mismatch)
        controller_field = "reportingController" if events_api else "reportingComponent"
        controller = event.get(controller_field) or ""
        if not controller:
            causes.append(Cause("FieldValueRequired", "Required value", controller_field))
        causes += [
            Cause("FieldValueInvalid", invalid_value(controller, m), controller_field)
            for m in is_qualified_name(controller)
        ]
        for field, limit in (("reportingInstance", 128), ("action", 128), ("reason", 128)):
            value = event.get(field) or ""
            if not value:
                causes.append(Cause("FieldValueRequired", "Required value", field))
            elif len(value) > limit:
                causes.append(
                    Cause("FieldValueInvalid", invalid_value("", f"can have at most {limit} characters"), field)
                )
    if events_api:
        if not event_time:
            causes.append(Cause("FieldValueRequired", "Required value", "eventTime"))
        if event.get("type") not in ("Normal", "Warning"):
            causes.append(
                Cause("FieldValueInvalid", invalid_value("", f"has invalid value: {event.get('type') or ''}"), "type")
            )
    return causes


# --- decoding: typed fields a real server decodes strictly -----------------------------------------


class DecodeError(Exception):
    """A field value the server's decoder rejects. ``json_message`` is the JSON decoder's text (create,
    update, JSON and merge patches); ``converter_message`` the unstructured converter's (strategic
    merge patches)."""

    def __init__(self, json_message: str, converter_message: str | None = None) -> None:
        super().__init__(json_message)
        self.json_message = json_message
        self.converter_message = converter_message or json_message


MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
TIME_LAYOUT = "2006-01-02T15:04:05Z07:00"
_LAYOUT_ELEMENTS = (
    ("2006", 4),
    ("-", 0),
    ("01", 2),
    ("-", 0),
    ("02", 2),
    ("T", 0),
    ("15", 2),
    (":", 0),
    ("04", 2),
    (":", 0),
    ("05", 2),
)
_GO_TYPES = {"bool": "bool", "number": "float64", "array": "[]interface {}", "object": "map[string]interface {}"}


def go_parse_time(value: str, micro: bool) -> None:
    """Go's ``time.Parse`` with the MicroTime (exactly six fraction digits) or Time (RFC 3339)
    layout; raises ValueError with Go's message."""
    layout = MICRO_LAYOUT if micro else TIME_LAYOUT
    rest = value

    def fail(element: str) -> ValueError:
        return ValueError(f'parsing time "{value}" as "{layout}": cannot parse "{rest}" as "{element}"')

    for element, digits in _LAYOUT_ELEMENTS:
        if digits:
            if len(rest) < digits or not rest[:digits].isdigit():
                raise fail(element)
            rest = rest[digits:]
        elif not rest.startswith(element):
            raise fail(element)
        else:
            rest = rest[len(element) :]
    if micro:
        if len(rest) < 7 or rest[0] != "." or not rest[1:7].isdigit():
            raise fail(".000000")
        rest = rest[7:]
    elif len(rest) >= 2 and rest[0] in ".," and rest[1].isdigit():
        i = 1
        while i < len(rest) and rest[i].isdigit():
            i += 1
        rest = rest[i:]
    if rest.startswith("Z"):
        rest = rest[1:]
    elif len(rest) >= 6 and rest[0] in "+-" and rest[1:3].isdigit() and rest[3] == ":" and rest[4:6].isdigit():
        rest = rest[6:]
    else:
        raise fail("Z07:00")
    if rest:
        raise ValueError(f'parsing time "{value}": extra text: "{rest}"')
    month, day, hour, minute, second = (int(value[i : i + 2]) for i in (5, 8, 11, 14, 17))
    for bad, what in (
        (not 1 <= month <= 12, "month"),
        (not 1 <= day <= 31, "day"),
        (hour > 23, "hour"),
        (minute > 59, "minute"),
        (second > 59, "second"),
    ):
        if bad:
            raise ValueError(f'parsing time "{value}": {what} out of range')


# Typed fields checked at decode time, per (group, kind): (path, go struct, what) where what is
# "micro" (MicroTime), "time" (Time) or "strmap" (map of strings).
_TYPED_FIELDS: dict[tuple[str, str], tuple[tuple[str, str, str], ...]] = {
    ("coordination.k8s.io", "Lease"): (
        ("spec.acquireTime", "LeaseSpec", "micro"),
        ("spec.renewTime", "LeaseSpec", "micro"),
    ),
    ("", "Event"): (
        ("eventTime", "Event", "micro"),
        ("series.lastObservedTime", "EventSeries", "micro"),
        ("firstTimestamp", "Event", "time"),
        ("lastTimestamp", "Event", "time"),
    ),
    ("events.k8s.io", "Event"): (("eventTime", "Event", "micro"), ("series.lastObservedTime", "EventSeries", "micro")),
    ("", "ConfigMap"): (("data", "ConfigMap", "strmap"), ("binaryData", "ConfigMap", "strmap")),
    ("", "Secret"): (("data", "Secret", "strmap"), ("stringData", "Secret", "strmap")),
}


def _at(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for seg in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(seg)
    return cur


def decode_check(group: str, kind: str, obj: Obj) -> None:
    """Raise :class:`DecodeError` for a value the server's decoder would refuse."""
    for key, owner in (("labels", "ObjectMeta"), ("annotations", "ObjectMeta")):
        _check_str_map((obj.get("metadata") or {}).get(key), f"{owner}.metadata.{key}")
    for path, owner, what in _TYPED_FIELDS.get((group, kind), ()):
        value = _at(obj, path)
        if value is None:
            continue
        if what == "strmap":
            _check_str_map(value, f"{owner}.{path}")
            continue
        if not isinstance(value, str):
            raise DecodeError(
                f"json: cannot unmarshal {json_kind(value)} into Go struct field {owner}.{path} of type string"
            )
        try:
            go_parse_time(value, micro=what == "micro")
        except ValueError as exc:
            raise DecodeError(str(exc)) from None


def _check_str_map(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        return
    for v in value.values():
        if v is not None and not isinstance(v, str):
            kind = json_kind(v)
            go_type = "int64" if isinstance(v, int) and not isinstance(v, bool) else _GO_TYPES.get(kind, kind)
            raise DecodeError(
                f"json: cannot unmarshal {kind} into Go struct field {where} of type string",
                f"cannot convert {go_type} to string",
            )


# --- leases --------------------------------------------------------------------------------


def normalise_micro_time(value: str) -> str:
    """A MicroTime as the server re-encodes it: UTC, ``…:05.123456Z`` (input already checked)."""
    from datetime import UTC, datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def normalise_lease(lease: Obj) -> None:
    spec = lease.get("spec")
    if isinstance(spec, dict):
        for f in ("acquireTime", "renewTime"):
            if spec.get(f) is not None:
                spec[f] = normalise_micro_time(spec[f])


# --- priority classes ---------------------------------------------------------------------

PRIORITY_CLASS_KEY = "scheduling.k8s.io/priorityclasses"
PREEMPT_LOWER = "PreemptLowerPriority"
PREEMPTION_POLICIES = (PREEMPT_LOWER, "Never")
HIGHEST_USER_PRIORITY = 1_000_000_000
# The two classes every cluster has (the apiserver creates them at start and never lets them go).
SYSTEM_PRIORITY_CLASSES: dict[str, tuple[int, str]] = {
    "system-node-critical": (
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    "system-cluster-critical": (
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
}


def system_priority_classes() -> list[Obj]:
    return [
        {"metadata": {"name": name}, "value": value, "description": text, "preemptionPolicy": PREEMPT_LOWER}
        for name, (value, text) in SYSTEM_PRIORITY_CLASSES.items()
    ]


def admit_pod_priority(pod: Obj, classes: list[Obj]) -> None:
    """The Priority admission plugin: resolve ``priorityClassName`` (or the global default) into
    ``priority`` and ``preemptionPolicy``; 403 for an unknown class or a contradicting value."""
    spec = pod["spec"]
    name = pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
    class_name = spec.get("priorityClassName") or ""
    chosen: Obj | None = None
    if class_name:
        chosen = next((c for c in classes if c["metadata"]["name"] == class_name), None)
        if chosen is None:
            raise forbidden("", "pods", name, f"no PriorityClass with name {class_name} was found")
    else:
        chosen = next((c for c in classes if c.get("globalDefault")), None)
    value = int(chosen.get("value") or 0) if chosen else 0
    policy = (chosen.get("preemptionPolicy") if chosen else None) or PREEMPT_LOWER
    for what, given, computed in (
        ("the integer value of priority", spec.get("priority"), value),
        ("the string value of PreemptionPolicy", spec.get("preemptionPolicy"), policy),
    ):
        if given is not None and given != computed:
            raise forbidden(
                "",
                "pods",
                name,
                f"{what} ({given}) must not be provided in pod spec; "
                f"priority admission controller computed {computed} from the given PriorityClass name",
            )
    if chosen is not None:
        spec["priorityClassName"] = chosen["metadata"]["name"]
    spec["priority"] = value
    spec["preemptionPolicy"] = policy


def admit_priority_class(pc: Obj, old: Obj | None, classes: list[Obj]) -> None:
    """Defaulting, validation and the one-default rule of a PriorityClass create or update."""
    name = pc["metadata"].get("name", "")
    pc.setdefault("value", 0)
    pc.setdefault("preemptionPolicy", PREEMPT_LOWER)
    causes: list[Cause] = []
    if old is None and name.startswith("system-") and name not in SYSTEM_PRIORITY_CLASSES:
        causes.append(
            Cause(
                "FieldValueForbidden",
                "Forbidden: priority class names with 'system-' prefix are reserved for system use only. "
                f"error: {name} is not a known system priority class",
                "metadata.name",
            )
        )
    value = pc.get("value")
    if old is not None and value != old.get("value"):
        causes.append(Cause("FieldValueForbidden", "Forbidden: may not be changed in an update.", "value"))
    elif (
        old is None and isinstance(value, int) and value > HIGHEST_USER_PRIORITY and name not in SYSTEM_PRIORITY_CLASSES
    ):
        causes.append(
            Cause(
                "FieldValueForbidden",
                f"Forbidden: maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}",
                "value",
            )
        )
    policy = pc.get("preemptionPolicy")
    if policy not in PREEMPTION_POLICIES:
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{policy}": supported values: "{PREEMPT_LOWER}", "Never"',
                "preemptionPolicy",
            )
        )
    if causes:
        raise invalid("scheduling.k8s.io", "PriorityClass", name, causes)
    if pc.get("globalDefault"):
        other = next(
            (c for c in classes if c.get("globalDefault") and c["metadata"]["name"] != name),
            None,
        )
        if other is not None:
            raise forbidden(
                "scheduling.k8s.io",
                "priorityclasses",
                name,
                f"PriorityClass {other['metadata']['name']} is already marked as default. Only one default can exist",
            )


def check_priority_class_delete(name: str) -> None:
    if name in SYSTEM_PRIORITY_CLASSES:
        raise forbidden(
            "scheduling.k8s.io", "priorityclasses", name, "this is a system priority class and cannot be deleted"
        )
