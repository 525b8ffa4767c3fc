"""Per-kind create/update rules of the built-in types: defaulting, admission and validation.

Pure functions over JSON objects; they raise ApiError with the server's messages.
"""

from __future__ import annotations

import base64
import random
import re
from typing import Any

from . import errors
from .errors import ApiError, Cause, forbidden, invalid, invalid_value

Obj = dict[str, Any]

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SA_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(NAME_ALPHABET) for _ in range(n))


def generate_name(base: str) -> str:
    return base[:58] + random_suffix()


def _name_causes(name: str, label_only: bool) -> list[Cause]:
    if label_only:
        if len(name) > 63:
            return [
                Cause("FieldValueInvalid", invalid_value(name, "must be no more than 63 characters"), "metadata.name")
            ]
        if not _DNS1123_LABEL.match(name):
            return [
                Cause(
                    "FieldValueInvalid",
                    invalid_value(
                        name,
                        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                    ),
                    "metadata.name",
                )
            ]
        return []
    if len(name) > 253:
        return [Cause("FieldValueInvalid", invalid_value(name, "must be no more than 253 characters"), "metadata.name")]
    if not _DNS1123_SUBDOMAIN.match(name):
        return [
            Cause(
                "FieldValueInvalid",
                invalid_value(
                    name,
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                ),
                "metadata.name",
            )
        ]
    return []


def _qualified_key_causes(key: str, field: str) -> list[Cause]:
    prefix, _, name = key.rpartition("/")
    bad = not name or len(name) > 63 or not _LABEL_NAME.match(name)
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        bad = True
    if bad:
        return [
            Cause(
                "FieldValueInvalid",
                invalid_value(
                    key,
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                ),
                field,
            )
        ]
    return []


def metadata_causes(obj: Obj, label_only_name: bool) -> list[Cause]:
    """Validation of ObjectMeta common to every kind: name, labels, annotations, ownerReferences."""
    meta = obj.get("metadata") or {}
    causes = _name_causes(meta.get("name", ""), label_only_name)
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        causes.append(Cause("FieldValueTypeInvalid", "must be a map of strings", "metadata.labels"))
    else:
        for k, v in labels.items():
            causes += _qualified_key_causes(k, "metadata.labels")
            if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
                causes.append(
                    Cause(
                        "FieldValueInvalid",
                        invalid_value(
                            v,
                            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                        ),
                        "metadata.labels",
                    )
                )
    ann = meta.get("annotations") or {}
    if isinstance(ann, dict):
        for k, v in ann.items():
            causes += _qualified_key_causes(k, "metadata.annotations")
            if not isinstance(v, str):
                causes.append(Cause("FieldValueTypeInvalid", "must be a string", "metadata.annotations"))
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not (isinstance(ref, dict) and ref.get(f)):
                causes.append(
                    Cause(
                        "FieldValueRequired",
                        "Required value",
                        f"metadata.ownerReferences[{i}].{f.lower() if f != 'apiVersion' else 'apiVersion'}",
                    )
                )
        if isinstance(ref, dict) and ref.get("controller"):
            controllers += 1
    if controllers > 1:
        causes.append(
            Cause(
                "FieldValueInvalid",
                invalid_value(meta.get("ownerReferences"), "Only one reference can have Controller set to true"),
                "metadata.ownerReferences",
            )
        )
    # Finalizers must be qualified names; a name without a domain prefix only earns a warning
    # on a real server, so it is accepted here.
    for f in meta.get("finalizers") or []:
        if not isinstance(f, str) or _qualified_key_causes(f, "metadata.finalizers"):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(f, "name is neither a standard finalizer name nor is it fully qualified"),
                    "metadata.finalizers",
                )
            )
    return causes


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
        if not _SECRET_KEY.match(k):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(
                        k,
                        "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                    ),
                    f"data[{k}]",
                )
            )
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


# --- leases --------------------------------------------------------------------------------


def micro_time(value: Any, field: str, kind: str, version: str) -> str:
    """Normalise an RFC 3339 time to the server's MicroTime form (``…:05.123456Z``).

    kubernetes-asyncio sends ``datetime.isoformat()`` (``+00:00`` offsets); the server re-encodes
    what it decoded, so clients read back the canonical form.
    """
    from datetime import UTC, datetime

    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise ValueError("no time zone")
    except ValueError:
        raise errors.bad_request(
            f'{kind} in version "{version}" cannot be handled as a {kind}: parsing time "{value}" as '
            f'"2006-01-02T15:04:05.000000Z07:00": cannot parse "{value}" ({field})'
        ) from None
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def normalise_lease(lease: Obj) -> None:
    spec = lease.get("spec")
    if isinstance(spec, dict):
        for f in ("acquireTime", "renewTime"):
            if spec.get(f) is not None:
                spec[f] = micro_time(spec[f], f"spec.{f}", "Lease", "v1")


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
