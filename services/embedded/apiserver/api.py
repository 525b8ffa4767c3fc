"""The API operations (create, get, list, update, patch, delete) with the real server's rules.

Handlers parse HTTP into these calls; the garbage collector and namespace controller call them
directly. Every method is synchronous — no awaits — so each operation is atomic in the loop.
"""

from __future__ import annotations

import base64
import posixpath
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
import yaml

from . import admission, errors, options
from . import patch as patches
from . import schema as crd_schema
from .builtin_schema import prune_builtin, prune_object_meta
from .errors import ApiError, Cause
from .quantity import canonicalise_pod
from .resources import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Registry,
    ResourceType,
    types_from_crd,
)
from .selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from .store import Obj, ObjKey, Store, clone

CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
# The internal API group each built-in kind decodes into (named in the server's conversion errors).
_INTERNAL_GROUP = {
    "": "core",
    "events.k8s.io": "core",
    "rbac.authorization.k8s.io": "rbac",
    "coordination.k8s.io": "coordination",
    "apiextensions.k8s.io": "apiextensions",
}

GC_FINALIZERS = ("orphan", "foregroundDeletion")


_formatted_second: list[tuple[int, str]] = [(-1, "")]  # the last second formatted (timestamps are whole seconds)


def now_rfc3339(offset_seconds: int = 0) -> str:
    second = int(time.time()) + offset_seconds
    last = _formatted_second[0]
    if last[0] == second:
        return last[1]
    text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _formatted_second[0] = (second, text)
    return text


@dataclass
class DeleteOptions:
    grace_period_seconds: int | None = None
    propagation_policy: str | None = None
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False


@dataclass
class WriteResult:
    obj: Obj
    warnings: list[str] = field(default_factory=list)
    code: int = 200


@dataclass
class ListResult:
    items: list[Obj]
    resource_version: int
    continue_token: str = ""
    remaining: int | None = None


class Api:
    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self._dry = False  # set for the duration of one dryRun=All operation
        # What every namespace's kube-root-ca.crt holds: the serving CA when serving HTTPS.
        self.cluster_ca_pem = "-----BEGIN CERTIFICATE-----\nemulator\n-----END CERTIFICATE-----\n"

    # --- writes go through these, so a dry run can stop short of storage ----------------------

    def _put_new(self, key: str, obj: Obj) -> None:
        if not self._dry:
            self.store.put_new(key, obj)

    def _replace(self, key: str, obj: Obj) -> None:
        if not self._dry:
            self.store.replace(key, obj)

    def _remove(self, key: str, namespace: str, name: str) -> Obj:
        if self._dry:
            kept: Obj = clone(self.store.get(key, namespace, name))
            return kept
        return self.store.remove(key, namespace, name).obj

    def dry_run(self, enabled: bool) -> _DryRun:
        return _DryRun(self, enabled)

    # --- shared checks ---------------------------------------------------------------------

    def _object_meta(self, body: Any, rt: ResourceType) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of the request is not a {rt.kind} object")
        meta = body.get("metadata")
        if meta is None:
            body["metadata"] = meta = {}
        if not isinstance(meta, dict):
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: metadata must be an object'
            )
        return meta

    def _check_type_meta(self, rt: ResourceType, body: Obj, raw: bytes | None = None) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if rt.is_custom:
            if not kind:
                sent = raw if raw is not None else msgspec.json.encode(body)
                why = f"Object 'Kind' is missing in '{sent.decode(errors='replace')}'"
                raise errors.unrecognized_object(rt.kind, why, sent)
            if api_version != rt.api_version:
                raise errors.bad_request(
                    f"the API version in the data ({api_version or ''}) does not match the expected API version ({rt.api_version})"
                )
            if kind != rt.kind:
                name = (body.get("metadata") or {}).get("name", "")
                cause = Cause("FieldValueInvalid", errors.invalid_value(kind, f"must be {rt.kind}"), "kind")
                raise errors.invalid(rt.group, kind, name, [cause])
        elif api_version and api_version != rt.api_version:
            version = api_version.rpartition("/")[2]
            raise errors.bad_request(
                f'{kind or rt.kind} in version "{version}" cannot be handled as a {rt.kind}: no kind "{kind or rt.kind}" '
                f'is registered for version "{api_version}" in scheme "pkg/runtime/scheme.go:111"'
            )
        elif kind and kind != rt.kind:
            internal = _INTERNAL_GROUP.get(rt.group, rt.group)
            if self.registry.by_kind(rt.api_version, kind) is not None:
                why = f"converting ({rt.version}.{kind}) to ({internal}.{rt.kind}): unknown conversion"
            else:
                why = f'no kind "{kind}" is registered for version "{rt.api_version}" in scheme "pkg/runtime/scheme.go:111"'
            raise errors.bad_request(f'{kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {why}')
        body["apiVersion"], body["kind"] = rt.api_version, rt.kind

    def _decode(self, rt: ResourceType, obj: Obj) -> None:
        """The typed decoding of a write's body: a value the decoder refuses is a 400."""
        if rt.is_custom:
            return
        try:
            admission.decode_check(rt.group, rt.kind, obj)
        except admission.DecodeError as exc:
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {exc.json_message}'
            ) from None

    def _check_namespace(self, rt: ResourceType, meta: Obj, namespace: str) -> None:
        body_ns = meta.get("namespace") or ""
        if rt.namespaced:
            if body_ns and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)

    def _require(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if obj is None:
            raise errors.not_found(rt.group, rt.plural, name)
        return obj

    def _custom_processing(
        self, rt: ResourceType, obj: Obj, field_validation: str, old: Obj | None = None, status_only: bool = False
    ) -> tuple[Obj, list[str]]:
        """Prune unknown fields (and for custom resources default and validate, ratcheting
        against ``old`` on an update; ``status_only`` for the status subresource)."""
        if rt.is_custom:
            out, pruned, causes = crd_schema.process_custom_object(obj, rt.schema, old, status_only)
            if isinstance(out.get("metadata"), dict):
                out["metadata"] = prune_object_meta(out["metadata"], pruned)
            meta = out.get("metadata") or {}
            if causes:
                raise errors.invalid(rt.group, rt.kind, meta.get("name", ""), causes)
        else:
            out, pruned = prune_builtin(rt.group, rt.kind, obj, old)
        warnings = [f'unknown field "{p}"' for p in pruned]
        if pruned and field_validation == "Strict":
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: '
                + ", ".join(warnings)
            )
        return out, warnings if field_validation != "Ignore" else []

    def _validate(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        core_event = rt.kind == "Event" and not rt.group
        causes = admission.metadata_causes(obj, label_only_name=rt.kind == "Namespace", check_name=not core_event)
        if rt.kind == "Pod":
            causes += admission.validate_pod(obj)
        elif rt.kind == "ConfigMap" and not rt.group:
            causes += admission.validate_config_map(obj)
        if causes:
            raise errors.invalid(rt.group, rt.kind, meta.get("name", ""), causes)

    # --- create ------------------------------------------------------------------------------

    def create(
        self, rt: ResourceType, namespace: str, body: Any, field_validation: str = "Warn", raw: bytes | None = None
    ) -> WriteResult:
        meta = self._object_meta(body, rt)
        self._check_type_meta(rt, body, raw)
        self._decode(rt, body)
        self._check_namespace(rt, meta, namespace)
        if meta.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        if rt.namespaced:
            ns_obj = self.store.get("/namespaces", "", namespace)
            shown = meta.get("name") or meta.get("generateName", "")
            if ns_obj is None:
                raise errors.not_found("", "namespaces", namespace)
            if (ns_obj.get("metadata") or {}).get("deletionTimestamp"):
                raise admission.namespace_terminating(rt.group, rt.plural, shown, namespace)
        if rt.is_custom:
            crd = self.store.get("apiextensions.k8s.io/customresourcedefinitions", "", rt.crd_name)
            if crd is not None and crd["metadata"].get("deletionTimestamp"):
                raise errors.forbidden(
                    rt.group,
                    rt.plural,
                    meta.get("name") or meta.get("generateName", ""),
                    "create not allowed while custom resource definition is terminating",
                )
        generated = False
        if not meta.get("name"):
            base = meta.get("generateName")
            if not base:
                raise errors.invalid(
                    rt.group,
                    rt.kind,
                    "",
                    [Cause("FieldValueRequired", "Required value: name or generateName is required", "metadata.name")],
                )
            meta["name"] = admission.generate_name(base)
            generated = True
        # System fields: the server owns these.
        for k in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
            "generation",
        ):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if rt.has_generation:
            meta["generation"] = 1
        if rt.status_subresource and rt.is_custom:
            body.pop("status", None)
        obj, warnings = self._custom_processing(rt, body, field_validation)
        self._kind_create(rt, obj, namespace)
        _normalise_meta(obj["metadata"])
        self._validate(rt, obj)
        _normalise_nil_lists(rt, obj)
        ns_key = namespace if rt.namespaced else ""
        for _ in range(5 if generated else 1):
            if self.store.get(rt.key, ns_key, obj["metadata"]["name"]) is None:
                break
            if generated:
                obj["metadata"]["name"] = admission.generate_name(obj["metadata"]["generateName"])
        if self.store.get(rt.key, ns_key, obj["metadata"]["name"]) is not None:
            raise errors.already_exists(rt.group, rt.plural, obj["metadata"]["name"])
        self._put_new(rt.key, obj)
        if not self._dry:
            self._after_create(rt, obj)
        return WriteResult(obj, warnings, 201)

    def _kind_create(self, rt: ResourceType, obj: Obj, namespace: str) -> None:
        if rt.is_custom:
            return
        if rt.kind == "Pod":
            admission.default_pod(obj)
            _canonical_quantities(obj)
            causes = admission.validate_pod(obj)
            if causes:
                raise errors.invalid("", "Pod", obj["metadata"]["name"], causes)
            sa = self.store.get("/serviceaccounts", namespace, obj["spec"].get("serviceAccountName") or "default")
            admission.admit_pod_create(obj, sa, namespace)
            admission.admit_pod_priority(obj, self.store.items(admission.PRIORITY_CLASS_KEY))
        elif rt.kind == "Secret":
            causes = admission.normalise_secret(obj)
            if causes:
                raise errors.invalid("", "Secret", obj["metadata"]["name"], causes)
        elif rt.kind == "Namespace":
            admission.default_namespace(obj)
        elif rt.kind == "Lease":
            admission.normalise_lease(obj)
        elif rt.kind == "Event":
            causes = admission.validate_event(obj, events_api=rt.group == "events.k8s.io")
            if causes:
                raise errors.invalid("", "Event", obj["metadata"]["name"], causes)
        elif rt.kind == "PriorityClass":
            admission.admit_priority_class(obj, None, self.store.items(admission.PRIORITY_CLASS_KEY))
        elif rt.kind == "CustomResourceDefinition":
            self._crd_prepare(obj)
            obj["status"] = {
                "conditions": None,
                "acceptedNames": {"plural": "", "kind": ""},
                "storedVersions": [v["name"] for v in obj["spec"].get("versions") or [] if v.get("storage")],
            }

    def _after_create(self, rt: ResourceType, obj: Obj) -> None:
        """Hook after a stored create. Namespace defaults and CRD establishment are controllers'
        work (see ``gc.Controllers``): they happen shortly after, as on a real cluster."""

    # --- what kube-controller-manager and the apiextensions controllers do ---------------------

    def ensure_namespace_defaults(self, name: str) -> bool:
        """The service-account and root-CA controllers: a namespace gets its ``default``
        ServiceAccount and ``kube-root-ca.crt`` ConfigMap. True when something was created."""
        ns = self.store.get("/namespaces", "", name)
        if ns is None or ns["metadata"].get("deletionTimestamp"):
            return False
        created = False
        if self.store.get("/serviceaccounts", name, "default") is None:
            sa_rt = self.registry.lookup("", "v1", "serviceaccounts")
            assert sa_rt is not None
            self.create(sa_rt, name, {"metadata": {"name": "default"}})
            created = True
        if self.store.get("/configmaps", name, "kube-root-ca.crt") is None:
            cm_rt = self.registry.lookup("", "v1", "configmaps")
            assert cm_rt is not None
            ca = self.cluster_ca_pem
            description = (
                "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints "
                "such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across "
                "distributions of Kubernetes clusters."
            )
            self.create(
                cm_rt,
                name,
                {
                    "metadata": {"name": "kube-root-ca.crt", "annotations": {"kubernetes.io/description": description}},
                    "data": {"ca.crt": ca},
                },
            )
            created = True
        return created

    def establish_crd(self, name: str) -> bool:
        """The naming and establishing controllers: accept a new CRD's names (unless another CRD
        of the group uses them), mark it Established and start serving its kinds."""
        crd_key = "apiextensions.k8s.io/customresourcedefinitions"
        crd = self.store.get(crd_key, "", name)
        if crd is None or crd["metadata"].get("deletionTimestamp"):
            return False
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return False
        spec = crd["spec"]
        names = dict(spec.get("names") or {})
        conflict, accepted = self._crd_names(name, spec.get("group", ""), names)
        if conflict is not None and any(
            c.get("type") == "NamesAccepted" and c.get("reason") == conflict[0] for c in conditions
        ):
            return False  # already reported
        now = now_rfc3339()
        new = clone(crd)
        status = new.setdefault("status", {})
        if conflict is not None:
            status["acceptedNames"] = accepted
            status["conditions"] = [
                {
                    "type": "NamesAccepted",
                    "status": "False",
                    "lastTransitionTime": now,
                    "reason": conflict[0],
                    "message": conflict[1],
                },
                {
                    "type": "Established",
                    "status": "False",
                    "lastTransitionTime": now,
                    "reason": "NotAccepted",
                    "message": "not all names are accepted",
                },
            ]
            self.store.replace(crd_key, new)
            return True
        status["conditions"] = [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ]
        status["acceptedNames"] = names
        self.store.replace(crd_key, new)
        self._serve_crd(new)
        return True

    def _serve_crd(self, crd: Obj) -> None:
        self.registry.remove_crd(crd["metadata"]["name"])
        for t in types_from_crd(crd):
            if t.key not in self.store.windows:  # first served now: its watch history starts here
                self.store.open_window(t.key)
            self.registry.add(t)

    def _crd_names(self, name: str, group: str, names: Obj) -> tuple[tuple[str, str] | None, Obj]:
        """The naming controller: ``(conflict, accepted names)`` against the accepted names of the
        group's other CRDs. Names in use elsewhere are not accepted; the last conflict is reported."""
        taken_resources: set[str] = set()
        taken_kinds: set[str] = set()
        for other in self.store.items("apiextensions.k8s.io/customresourcedefinitions"):
            if other["metadata"]["name"] == name or (other.get("spec") or {}).get("group") != group:
                continue
            accepted = (other.get("status") or {}).get("acceptedNames") or {}
            taken_resources |= {accepted.get("plural", ""), accepted.get("singular", "")}
            taken_resources |= set(accepted.get("shortNames") or [])
            taken_kinds |= {accepted.get("kind", ""), accepted.get("listKind", "")}
        taken_resources.discard("")
        taken_kinds.discard("")
        conflict = None
        granted: Obj = {"plural": "", "kind": ""}
        for which, pool, reason in (
            ("plural", taken_resources, "PluralConflict"),
            ("singular", taken_resources, "SingularConflict"),
            ("shortNames", taken_resources, "ShortNamesConflict"),
            ("kind", taken_kinds, "KindConflict"),
            ("listKind", taken_kinds, "ListKindConflict"),
            ("categories", set(), ""),
        ):
            value = names.get(which)
            if not value:
                continue
            clash = (
                next((v for v in value if v in pool), None)
                if isinstance(value, list)
                else value
                if value in pool
                else None
            )
            if clash is None:
                granted[which] = value
            else:
                conflict = (reason, f'"{clash}" is already in use')
        return conflict, granted

    def clean_up_crd(self, name: str) -> bool:
        """The CRD finalizer controller: delete a terminating CRD's objects, then release it."""
        crd_key = "apiextensions.k8s.io/customresourcedefinitions"
        crd = self.store.get(crd_key, "", name)
        if crd is None or not crd["metadata"].get("deletionTimestamp"):
            return False
        if CRD_CLEANUP_FINALIZER not in (crd["metadata"].get("finalizers") or []):
            return False
        changed = False
        terminating = next((c for c in crd["status"].get("conditions") or [] if c.get("type") == "Terminating"), None)
        if terminating is not None and terminating.get("reason") == "InstanceDeletionPending":
            crd = clone(crd)
            terminating = next(c for c in crd["status"]["conditions"] if c.get("type") == "Terminating")
            terminating.update(reason="InstanceDeletionInProgress", message="CustomResource deletion is in progress")
            self.store.replace(crd_key, crd)
            changed = True
        types = [t for t in self.registry.all() if t.is_custom and t.crd_name == name]
        remaining = False
        for t in types[:1]:  # every version shares one storage
            for obj in list(self.store.items(t.key)):
                remaining = True
                if not obj["metadata"].get("deletionTimestamp"):
                    m = obj["metadata"]
                    self.delete(t, m.get("namespace", ""), m["name"], DeleteOptions(propagation_policy="Background"))
                    changed = True
        if remaining:
            return changed
        crd = clone(self.store.get(crd_key, "", name))
        fins = [f for f in crd["metadata"].get("finalizers") or [] if f != CRD_CLEANUP_FINALIZER]
        if fins:
            crd["metadata"]["finalizers"] = fins
            self.store.replace(crd_key, crd)
        else:
            self.store.remove(crd_key, "", name)
            crd_rt = self.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            assert crd_rt is not None
            self._after_delete(crd_rt, crd)
        return True

    def _crd_prepare(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        causes = []
        for f in ("group", "names", "scope", "versions"):
            if not spec.get(f):
                causes.append(Cause("FieldValueRequired", "Required value", f"spec.{f}"))
        if names and (not names.get("plural") or not names.get("kind")):
            causes.append(Cause("FieldValueRequired", "Required value", "spec.names.plural"))
        expected = f"{names.get('plural')}.{spec.get('group')}"
        if spec.get("group") and names.get("plural") and crd["metadata"]["name"] != expected:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    errors.invalid_value(crd["metadata"]["name"], 'must be spec.names.plural+"."+spec.group'),
                    "metadata.name",
                )
            )
        if causes:
            raise errors.invalid("apiextensions.k8s.io", "CustomResourceDefinition", crd["metadata"]["name"], causes)
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
        for v in spec.get("versions") or []:
            v.setdefault("served", True)
        spec.setdefault("conversion", {"strategy": "None"})

    # --- read ----------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        return self._require(rt, namespace, name)

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 0,
        continue_token: str | None = None,
        exact_rv: int | None = None,
    ) -> ListResult:
        """A list in storage-key order; ``continue_token`` resumes a paged list on its snapshot,
        ``exact_rv`` lists the state at that resourceVersion (``resourceVersionMatch=Exact``)."""
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, rt.selectable_fields)
        ns_filter = namespace if rt.namespaced else None
        start = None
        if continue_token or exact_rv is not None:
            if continue_token:
                rv, start = decode_continue(continue_token)
                too_old = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."
            else:
                rv, too_old = int(exact_rv or 0), "The resourceVersion for the provided list is too old."
            if rv < self.store.oldest_replayable():
                raise errors.gone(too_old)
            snapshot = self.store.snapshot_at(rt.key, rv)
            keys = sorted(
                (k for k in snapshot if ns_filter is None or k[0] == ns_filter),
                key=lambda k: _list_key(rt, ns_filter, k),
            )
            if start is not None:
                keys = [k for k in keys if _list_key(rt, ns_filter, k) > start]
            pool = [snapshot[k] for k in keys]
        else:
            rv = self.store.rv
            by_name = next((f.value for f in fields if f.path == "metadata.name" and f.equal), None)
            if by_name is not None and (ns_filter is not None or not rt.namespaced):
                # A single-object list/watch (what clients do for one name): no scan needed.
                found = self.store.get(rt.key, ns_filter or "", by_name)
                pool = [found] if found is not None else []
            else:
                pool = self.store.items(rt.key, ns_filter)
        filtered = bool(labels.requirements or fields)
        matched: list[Obj] = []
        last_key: ObjKey | None = None
        more = False
        for obj in pool:
            if filtered and not (labels_match(labels, obj) and fields_match(fields, obj)):
                continue
            if limit and len(matched) >= limit:
                more = True
                break
            matched.append(obj)
            m = obj["metadata"]
            last_key = (m.get("namespace", ""), m["name"])
        token = ""
        remaining = None
        if more and last_key is not None:
            token = encode_continue(rv, _list_key(rt, ns_filter, last_key))
            if not filtered:
                remaining = len(pool) - pool.index(matched[-1]) - 1 if matched else None
        return ListResult(matched, rv, token, remaining)

    # --- update (PUT) ----------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        subresource: str = "",
        field_validation: str = "Warn",
        raw: bytes | None = None,
    ) -> WriteResult:
        meta = self._object_meta(body, rt)
        self._check_type_meta(rt, body, raw)
        self._decode(rt, body)
        if meta.get("name", "") != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
            )
        self._check_namespace(rt, meta, namespace)
        old = self._require(rt, namespace, name)
        if meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
            key = f"/registry/{rt.group + '/' if rt.is_custom or rt.kind == 'CustomResourceDefinition' else ''}{rt.plural}"
            key += f"/{namespace}/{name}" if rt.namespaced else f"/{name}"
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: "
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {old['metadata']['uid']}",
            )
        return self._write_update(rt, old, body, subresource, is_put=True, field_validation=field_validation)

    # --- patch -------------------------------------------------------------------------------

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        raw: bytes,
        subresource: str = "",
        field_validation: str = "Warn",
        field_manager: str = "",
    ) -> WriteResult:
        ctype = content_type.split(";", maxsplit=1)[0].strip().lower()
        accepted = rt.patch_types()
        if ctype not in accepted:
            if rt.is_custom:
                raise errors.unsupported_media_type(accepted)
            err = ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type")
            err.empty_details = True
            raise err
        if ctype == APPLY_PATCH:
            return self._apply(rt, namespace, name, raw, subresource, field_validation, field_manager)
        try:
            doc = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise errors.bad_request("invalid JSON patch") from None
        if ctype == JSON_PATCH:
            if doc is None:
                ops: list[dict[str, Any]] = []
            else:
                try:
                    ops = patches.validate_json_patch(doc)
                except patches.PatchError as exc:
                    raise errors.bad_request(f"error decoding patch: {exc}") from None
        elif ctype == MERGE_PATCH:
            if doc is None:
                raise errors.bad_request("Invalid JSON Patch")
            if not isinstance(doc, dict):
                raise errors.bad_request(
                    f"error decoding patch: json: cannot unmarshal {errors.json_kind(doc)} into Go value of type map[string]interface {{}}"
                )
        elif doc is not None and not isinstance(doc, dict):
            raise errors.bad_request(
                f"json: cannot unmarshal {errors.json_kind(doc)} into Go value of type map[string]interface {{}}"
            )
        old = self._require(rt, namespace, name)
        try:
            if ctype == JSON_PATCH:
                new = patches.apply_json_patch(old, ops)
            elif ctype == MERGE_PATCH:
                new = patches.apply_merge_patch(old, doc)
            else:
                new = patches.apply_strategic_merge_patch(old, doc or {}, rt.smp_rules)
        except patches.PatchFailed:
            # NewGenericServerResponse(422) with the generic message and empty details.
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request") from None
        except patches.PatchTypeError as exc:
            raise errors.internal(str(exc)) from None
        except patches.PatchError as exc:
            raise errors.bad_request(str(exc)) from None
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request")
        self._decode_patched(rt, new, doc if ctype == STRATEGIC_PATCH else None)
        return self._update_from_patch(rt, namespace, name, old, new, subresource, field_validation)

    def _decode_patched(self, rt: ResourceType, new: Obj, smp_doc: Any) -> None:
        """A patched object the decoder refuses is a 422 on the field ``patch``: the value shown is
        the patched object's JSON, or for a strategic merge patch the patch in Go's map notation."""
        if rt.is_custom:
            return
        try:
            admission.decode_check(rt.group, rt.kind, new)
        except admission.DecodeError as exc:
            if smp_doc is not None:
                shown, why = patches.go_repr(smp_doc), exc.converter_message
            else:
                shown, why = msgspec.json.encode(new).decode(), exc.json_message
            raise errors.invalid(
                "", "", "", [Cause("FieldValueInvalid", errors.invalid_value(shown, why), "patch")]
            ) from None

    def _update_from_patch(
        self, rt: ResourceType, namespace: str, name: str, old: Obj, new: Obj, subresource: str, field_validation: str
    ) -> WriteResult:
        meta = self._object_meta(new, rt)
        if not meta.get("name"):
            raise errors.bad_request(
                f"the name of the object ({name} based on URL) was undeterminable: name must be provided"
            )
        if meta.get("name") != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace", namespace) != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if new.get("apiVersion") != rt.api_version or new.get("kind") != rt.kind:
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        return self._write_update(rt, old, new, subresource, is_put=False, field_validation=field_validation)

    def _apply(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        raw: bytes,
        subresource: str,
        field_validation: str,
        field_manager: str,
    ) -> WriteResult:
        """Server-side apply, a subset: the applied configuration creates the object or is merged
        into it (maps recursively, lists by their merge keys or list-type, else replaced). Field
        ownership is not tracked: no managedFields, no conflicts, and fields left out of a later
        apply stay."""
        options.apply_field_manager_required(field_manager)
        try:
            doc = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"error decoding patch: error converting YAML to JSON: yaml: {exc}") from None
        if not isinstance(doc, dict):
            doc = {}
        api_version, kind = doc.get("apiVersion") or "", doc.get("kind") or ""
        if api_version != rt.api_version or kind != rt.kind:
            group, _, version = api_version.rpartition("/")
            raise errors.bad_request(f"invalid object type: {group}/{version}, Kind={kind}")
        meta = self._object_meta(doc, rt)
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        meta["name"] = name
        old = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if old is None:
            if subresource:
                raise errors.not_found(rt.group, rt.plural, name)
            return self.create(rt, namespace, doc, field_validation)
        if meta.get("resourceVersion") and meta["resourceVersion"] != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.group, rt.plural, name, errors.STALE)
        new = patches.apply_configuration(old, doc, rt.smp_rules, rt.schema)
        self._decode_patched(rt, new, None)
        return self._update_from_patch(rt, namespace, name, old, new, subresource, field_validation)

    # --- the update pipeline shared by PUT and PATCH ----------------------------------------

    def _write_update(
        self, rt: ResourceType, old: Obj, new: Obj, subresource: str, is_put: bool, field_validation: str
    ) -> WriteResult:
        old_meta = old["metadata"]
        meta = new["metadata"]
        name = old_meta["name"]
        body_rv = meta.get("resourceVersion") or ""
        if body_rv:
            if body_rv != old_meta.get("resourceVersion"):
                raise errors.conflict(rt.group, rt.plural, name, errors.STALE)
        elif is_put and not rt.allow_unconditional_update:
            raise ApiError(
                422,
                "Invalid",
                f'{errors.qualified(rt.group, rt.plural)} "{name}" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update',
                name=name,
                group=rt.group,
                kind=rt.plural,
                causes=[
                    Cause(
                        "FieldValueInvalid",
                        "Invalid value: 0: must be specified for an update",
                        "metadata.resourceVersion",
                    )
                ],
            )
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise errors.invalid(
                rt.group,
                rt.kind,
                name,
                [Cause("FieldValueInvalid", errors.invalid_value(meta["uid"], "field is immutable"), "metadata.uid")],
            )
        if subresource == "status":
            new = self._status_update(rt, old, new)
            meta = new["metadata"]
        elif rt.status_subresource:
            if "status" in old:
                new["status"] = clone(old["status"])
            else:
                new.pop("status", None)
        # System fields are restored from storage whatever the client sent.
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if k in old_meta:
                meta[k] = old_meta[k]
            else:
                meta.pop(k, None)
        meta.pop("managedFields", None)
        meta.pop("selfLink", None)
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = old_meta.get("namespace", "")
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        warnings: list[str] = []
        if subresource != "status":
            new, warnings = self._custom_processing(rt, new, field_validation, old)
            meta = new["metadata"]
            self._kind_update(rt, old, new)
        else:
            # The status subresource validates like the main endpoint (types, schema, pruning).
            new, warnings = self._custom_processing(rt, new, field_validation, old, status_only=True)
            meta = new["metadata"]
        # No new finalizers once deletion has started.
        if old_meta.get("deletionTimestamp"):
            added = [f for f in meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
            if added:
                shown = "[]string{" + ", ".join(f'"{f}"' for f in added) + "}"
                cause = Cause(
                    "FieldValueForbidden",
                    f"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {shown}",
                    "metadata.finalizers",
                )
                # Custom resources run the metadata update check twice (strategy and registry):
                # the cause is listed twice, the message once.
                raise errors.invalid(rt.group, rt.kind, name, [cause, cause] if rt.is_custom else [cause])
        _normalise_meta(meta)
        self._validate(rt, new)
        _normalise_nil_lists(rt, new)
        if rt.has_generation and subresource != "status" and _spec_changed(rt, old, new):
            meta["generation"] = int(old_meta.get("generation") or 0) + 1
        if (
            old_meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not old_meta.get("deletionGracePeriodSeconds")
            and rt.kind != "Namespace"
        ):
            # The last finalizer is gone: the update deletes the object (DELETED, no MODIFIED).
            self._remove(rt.key, old_meta.get("namespace", ""), name)
            if not self._dry:
                self._after_delete(rt, old)
            return WriteResult(new, warnings)
        if new == old:
            return WriteResult(old, warnings)  # a no-op write is not a write: no new RV, no event
        self._replace(rt.key, new)
        if rt.kind == "CustomResourceDefinition" and not self._dry and _established(new):
            self._serve_crd(new)  # an established CRD's changes are served at once
        return WriteResult(new, warnings)

    def _status_update(self, rt: ResourceType, old: Obj, new: Obj) -> Obj:
        result: Obj = clone(old)
        if "status" in new and new["status"] is not None:
            result["status"] = new["status"]
        else:
            result.pop("status", None)
        if not rt.is_custom:
            # Built-in status strategies keep spec but take label/annotation/finalizer changes.
            for k in ("labels", "annotations", "finalizers"):
                if k in new["metadata"]:
                    result["metadata"][k] = new["metadata"][k]
                else:
                    result["metadata"].pop(k, None)
            if rt.kind == "Pod":
                old_og = (old.get("status") or {}).get("observedGeneration")
                if old_og is not None and isinstance(result.get("status"), dict):
                    result["status"].setdefault("observedGeneration", old_og)
        result["metadata"]["resourceVersion"] = new["metadata"].get("resourceVersion") or old["metadata"].get(
            "resourceVersion"
        )
        return result

    def _kind_update(self, rt: ResourceType, old: Obj, new: Obj) -> None:
        if rt.is_custom:
            return
        name = old["metadata"]["name"]
        if rt.kind == "Pod":
            if not isinstance(new.get("spec"), dict):
                raise errors.invalid("", "Pod", name, [Cause("FieldValueRequired", "Required value", "spec")])
            admission.default_pod(new)
            _canonical_quantities(new)
            causes = admission.pod_spec_update_causes(old.get("spec") or {}, new["spec"])
            if causes:
                raise errors.invalid("", "Pod", name, causes)
        elif rt.kind == "Secret":
            causes = admission.normalise_secret(new)
            if old.get("immutable") and (new.get("data") != old.get("data") or not new.get("immutable")):
                causes.append(
                    Cause("FieldValueForbidden", "Forbidden: field is immutable when `immutable` is set", "data")
                )
            if causes:
                raise errors.invalid("", "Secret", name, causes)
        elif rt.kind == "ConfigMap":
            if old.get("immutable") and (
                new.get("data") != old.get("data") or new.get("binaryData") != old.get("binaryData")
            ):
                raise errors.invalid(
                    "",
                    "ConfigMap",
                    name,
                    [Cause("FieldValueForbidden", "Forbidden: field is immutable when `immutable` is set", "data")],
                )
        elif rt.kind == "Namespace":
            new["spec"] = clone(old.get("spec") or {})
        elif rt.kind == "Lease":
            admission.normalise_lease(new)
        elif rt.kind == "PriorityClass":
            admission.admit_priority_class(new, old, self.store.items(admission.PRIORITY_CLASS_KEY))
        elif rt.kind == "CustomResourceDefinition":
            self._crd_prepare(new)

    # --- pods/binding ------------------------------------------------------------------------

    def bind_pod(self, rt: ResourceType, namespace: str, name: str, body: Any) -> Obj:
        """POST pods/<name>/binding: what the scheduler does to put a pod on a node."""
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict) or not body["target"].get("name"):
            raise errors.invalid("", "Binding", name, [Cause("FieldValueRequired", "Required value", "target.name")])
        meta = body.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        pod = self._require(rt, namespace, name)
        node = body["target"]["name"]
        current = (pod.get("spec") or {}).get("nodeName")
        if pod["metadata"].get("deletionTimestamp"):
            raise errors.conflict(
                "", "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        if current:
            raise errors.conflict("", "pods/binding", name, f'pod {name} is already assigned to node "{current}"')
        new = clone(pod)
        new["spec"]["nodeName"] = node
        # The binding also records the scheduling (status keys kept in the server's field order).
        status = new.get("status") or {}
        scheduled = {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": now_rfc3339(),
        }
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"] + [scheduled]
        new["status"] = {
            **{k: v for k, v in status.items() if k == "phase"},
            "conditions": conditions,
            **{k: v for k, v in status.items() if k not in ("phase", "conditions")},
        }
        for k in ("labels", "annotations"):
            if meta.get(k):
                new["metadata"].setdefault(k, {}).update(meta[k])
        self._replace(rt.key, new)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # --- delete ------------------------------------------------------------------------------

    def delete(self, rt: ResourceType, namespace: str, name: str, opts: DeleteOptions | None = None) -> WriteResult:
        opts = opts or DeleteOptions()
        obj = self._require(rt, namespace, name)
        meta = obj["metadata"]
        # Checked before the delete strategy runs (rest.BeforeDelete): the Kind names the object.
        for precondition, have, what, why in (
            (opts.precondition_uid, meta.get("uid"), "UID", "deleted and then recreated"),
            (opts.precondition_rv, meta.get("resourceVersion"), "ResourceVersion", "modified"),
        ):
            if precondition and precondition != have:
                err = errors.conflict(
                    rt.group,
                    rt.kind,
                    name,
                    f"the {what} in the precondition ({precondition}) does not match the {what} in record ({have}). "
                    f"The object might have been {why}",
                )
                raise err
        if rt.kind == "PriorityClass":
            admission.check_priority_class_delete(name)
        if rt.kind == "Namespace" and not rt.group:
            return self._delete_namespace(rt, obj)
        if rt.kind == "CustomResourceDefinition":
            return self._delete_crd(rt, obj)
        fins = list(meta.get("finalizers") or [])
        policy = opts.propagation_policy
        if policy == "Foreground":
            fins = [f for f in fins if f != "orphan"] + ([] if "foregroundDeletion" in fins else ["foregroundDeletion"])
        elif policy == "Orphan":
            fins = [f for f in fins if f != "foregroundDeletion"] + ([] if "orphan" in fins else ["orphan"])
        elif policy == "Background":
            fins = [f for f in fins if f not in GC_FINALIZERS]
        grace = 0
        if rt.graceful_delete:
            spec = obj.get("spec") or {}
            grace = (
                opts.grace_period_seconds
                if opts.grace_period_seconds is not None
                else int(spec.get("terminationGracePeriodSeconds", 30))
            )
            phase = (obj.get("status") or {}).get("phase")
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed") or grace < 0:
                grace = 0
        if meta.get("deletionTimestamp"):
            # Already being deleted: only finalizer changes (policy) or a shorter grace take effect.
            new = clone(obj)
            new["metadata"]["finalizers"] = fins
            if not fins:
                new["metadata"].pop("finalizers")
            pending = meta.get("deletionGracePeriodSeconds")
            if rt.graceful_delete and pending and grace < pending:
                if grace == 0 and not fins:
                    last = self._remove(rt.key, meta.get("namespace", ""), name)
                    if not self._dry:
                        self._after_delete(rt, obj)
                    return self._deleted_response(rt, last)
                new["metadata"]["deletionGracePeriodSeconds"] = grace
                new["metadata"]["deletionTimestamp"] = now_rfc3339(grace)
            if new != obj:
                self._replace(rt.key, new)
                return WriteResult(new)
            return WriteResult(obj)
        if fins or grace > 0:
            new = clone(obj)
            m = new["metadata"]
            m["deletionTimestamp"] = now_rfc3339(grace)
            m["deletionGracePeriodSeconds"] = grace
            if fins:
                m["finalizers"] = fins
            else:
                m.pop("finalizers", None)
            if rt.has_generation and int(m.get("generation") or 0) > 0:
                m["generation"] = int(m["generation"]) + 1
            self._replace(rt.key, new)
            return WriteResult(new)
        last = self._remove(rt.key, meta.get("namespace", ""), name)
        if not self._dry:
            self._after_delete(rt, obj)
        return self._deleted_response(rt, last)

    def _deleted_response(self, rt: ResourceType, last: Obj) -> WriteResult:
        if rt.return_deleted_object:
            return WriteResult(last)
        details: dict[str, Any] = {"name": last["metadata"]["name"]}
        if rt.group:
            details["group"] = rt.group
        details["kind"] = rt.plural
        details["uid"] = last["metadata"].get("uid", "")
        return WriteResult(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
        )

    def _delete_namespace(self, rt: ResourceType, obj: Obj) -> WriteResult:
        name = obj["metadata"]["name"]
        if name in admission.PROTECTED_NAMESPACES:
            raise errors.forbidden("", "namespaces", name, "this namespace may not be deleted")
        if obj["metadata"].get("deletionTimestamp"):
            return WriteResult(obj)
        new = clone(obj)
        new["metadata"]["deletionTimestamp"] = now_rfc3339()
        new.setdefault("status", {})["phase"] = "Terminating"
        self._replace(rt.key, new)
        return WriteResult(new)

    def _delete_crd(self, rt: ResourceType, crd: Obj) -> WriteResult:
        """A CRD is not removed at once: it gets the cleanup finalizer and a Terminating condition,
        its kinds stay served while the finalizer controller deletes their objects."""
        if crd["metadata"].get("deletionTimestamp"):
            return WriteResult(crd)
        new = clone(crd)
        meta = new["metadata"]
        meta["deletionTimestamp"] = now_rfc3339()
        meta["deletionGracePeriodSeconds"] = 0
        meta["finalizers"] = [*(meta.get("finalizers") or []), CRD_CLEANUP_FINALIZER]
        if rt.has_generation:
            meta["generation"] = int(meta.get("generation") or 0) + 1
        status = new.setdefault("status", {})
        status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "Terminating"] + [
            {
                "type": "Terminating",
                "status": "True",
                "lastTransitionTime": meta["deletionTimestamp"],
                "reason": "InstanceDeletionPending",
                "message": "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
            }
        ]
        self._replace(rt.key, new)
        return WriteResult(new)

    def report_namespace_deletion(self, name: str, remaining: Sequence[tuple[str, Obj]]) -> None:
        """The namespace controller's status conditions on a Terminating namespace: what content
        and which finalizers still hold it."""
        ns = self.store.get("/namespaces", "", name)
        if ns is None:
            return
        by_resource: dict[str, int] = {}
        by_finalizer: dict[str, int] = {}
        for key, obj in remaining:
            group, _, plural = key.partition("/")
            by_resource[f"{plural}.{group}"] = by_resource.get(f"{plural}.{group}", 0) + 1
            for f in obj["metadata"].get("finalizers") or []:
                by_finalizer[f] = by_finalizer.get(f, 0) + 1
        content = sorted(f"{r} has {n} resource instances" for r, n in by_resource.items())
        held = sorted(f"{f} in {n} resource instances" for f, n in by_finalizer.items())
        wanted = [
            (
                "NamespaceDeletionDiscoveryFailure",
                "False",
                "ResourcesDiscovered",
                "All resources successfully discovered",
            ),
            (
                "NamespaceDeletionGroupVersionParsingFailure",
                "False",
                "ParsedGroupVersions",
                "All legacy kube types successfully parsed",
            ),
            (
                "NamespaceDeletionContentFailure",
                "False",
                "ContentDeleted",
                "All content successfully deleted, may be waiting on finalization",
            ),
            (
                "NamespaceContentRemaining",
                "True",
                "SomeResourcesRemain",
                "Some resources are remaining: " + ", ".join(content),
            )
            if content
            else ("NamespaceContentRemaining", "False", "ContentRemoved", "All content successfully removed"),
            (
                "NamespaceFinalizersRemaining",
                "True",
                "SomeFinalizersRemain",
                "Some content in the namespace has finalizers remaining: " + ", ".join(held),
            )
            if held
            else (
                "NamespaceFinalizersRemaining",
                "False",
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished",
            ),
        ]
        before = {c.get("type"): c for c in (ns.get("status") or {}).get("conditions") or []}
        conditions = []
        for ctype, status, reason, message in wanted:
            old = before.get(ctype) or {}
            since = old.get("lastTransitionTime") if old.get("status") == status else now_rfc3339()
            conditions.append(
                {"type": ctype, "status": status, "lastTransitionTime": since, "reason": reason, "message": message}
            )
        if conditions != (ns.get("status") or {}).get("conditions"):
            new = clone(ns)
            new.setdefault("status", {})["conditions"] = conditions
            self.store.replace("/namespaces", new)

    def finish_namespace(self, name: str) -> None:
        """The namespace controller's last step: the namespace is empty, remove it."""
        ns = self.store.get("/namespaces", "", name)
        if ns is not None and not (ns["metadata"].get("finalizers")):
            self.store.remove("/namespaces", "", name)

    def _after_delete(self, rt: ResourceType, obj: Obj) -> None:
        if rt.kind == "CustomResourceDefinition":
            for t in self.registry.remove_crd(obj["metadata"]["name"]):
                if not any(o.key == t.key for o in self.registry.all()):
                    self.store.drop_resource(t.key)
                    self.store.close_window(t.key)
                    for w in list(self.store.watchers):
                        if w.filter.resource == t.key:
                            w.close("end")  # the resource no longer exists: end its watches

    def delete_collection(
        self,
        rt: ResourceType,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        opts: DeleteOptions,
    ) -> Obj:
        listed = self.list(rt, namespace, label_selector, field_selector)
        items = []
        for obj in listed.items:
            m = obj["metadata"]
            try:
                res = self.delete(rt, m.get("namespace", ""), m["name"], opts)
            except ApiError as exc:
                if exc.code == 404:
                    continue
                raise
            items.append(res.obj if res.obj.get("kind") != "Status" else obj)
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": items,
        }


class _DryRun:
    """``with api.dry_run(flag):`` runs one operation without touching storage when flag is set."""

    def __init__(self, api: Api, enabled: bool) -> None:
        self.api, self.enabled = api, enabled

    def __enter__(self) -> None:
        self.api._dry = self.enabled

    def __exit__(self, *exc: object) -> None:
        self.api._dry = False


def _established(crd: Obj) -> bool:
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )


def _canonical_quantities(pod: Obj) -> None:
    """Quantities are decoded and re-encoded by the server: ``1024Mi`` is stored as ``1Gi``."""
    bad = canonicalise_pod(pod)
    if bad:
        raise errors.bad_request(
            f'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular expression '
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' ({bad[0]})"
        )


def _normalise_meta(meta: Obj) -> None:
    """ObjectMeta fields are ``omitempty``: empty lists and maps are not stored."""
    for k in ("labels", "annotations", "finalizers", "ownerReferences", "generateName"):
        if k in meta and not meta[k]:
            del meta[k]


#: Built-in list fields without ``omitempty`` that etcd's protobuf turns nil when empty: the real
#: server answers ``null`` for them (a Role without rules reads back as ``"rules": null``).
_NIL_WHEN_EMPTY = {
    ("rbac.authorization.k8s.io", "Role"): "rules",
    ("rbac.authorization.k8s.io", "ClusterRole"): "rules",
}


def _normalise_nil_lists(rt: ResourceType, obj: Obj) -> None:
    field = _NIL_WHEN_EMPTY.get((rt.group, rt.kind))
    if field is not None and not obj.get(field):
        obj[field] = None


def _spec_changed(rt: ResourceType, old: Obj, new: Obj) -> bool:
    """Generation rule: anything outside metadata (and status, when it has its own endpoint)."""
    if rt.kind == "Pod":
        return old.get("spec") != new.get("spec")
    skip = {"metadata", "status"} if rt.status_subresource else {"metadata"}
    skip |= {"apiVersion", "kind"}
    return {k: v for k, v in old.items() if k not in skip} != {k: v for k, v in new.items() if k not in skip}


def _short_json(body: Obj) -> str:
    text = msgspec.json.encode(body).decode()
    return text if len(text) < 200 else text[:200] + "..."


# --- continue tokens ------------------------------------------------------------------------


def _list_key(rt: ResourceType, ns_filter: str | None, key: ObjKey) -> str:
    """An object's storage key relative to the listed collection (what continue tokens carry)."""
    if ns_filter is not None or not rt.namespaced:
        return key[1]
    return f"{key[0]}/{key[1]}"


def encode_continue(rv: int, last_key: str) -> str:
    raw = msgspec.json.encode({"v": "meta.k8s.io/v1", "rv": rv, "start": "/" + last_key + "\x00"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_B64URL = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def decode_continue(token: str) -> tuple[int, str]:
    """``(rv, key of the last listed object)`` of a continue token, or a 400 worded as the server's
    (its base64 and JSON decoders' errors included)."""

    def bad(why: str) -> ApiError:
        return errors.bad_request(f"invalid continue token: continue key is not valid: {why}")

    at = next((i for i, ch in enumerate(token) if ch not in _B64URL), None)
    if at is None and len(token) % 4 == 1:
        at = len(token) - 1
    if at is not None:
        raise bad(f"illegal base64 data at input byte {at}")
    data = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    why = errors.go_json_error(data, "storage.continueToken")
    if why is not None:
        raise bad(why)
    doc = msgspec.json.decode(data) or {}
    for name, want, go_type in (("v", str, "string"), ("rv", int, "int64"), ("start", str, "string")):
        value = doc.get(name)
        if value is not None and (not isinstance(value, want) or isinstance(value, bool)):
            raise bad(
                f"json: cannot unmarshal {errors.json_kind(value)} into Go struct field continueToken.{name} of type {go_type}"
            )
    version = doc.get("v") or ""
    if version != "meta.k8s.io/v1":
        raise bad(f"server does not recognize this encoded version {version}")
    rv, start = doc.get("rv") or 0, doc.get("start") or ""
    if rv == 0:
        raise bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not start:
        raise bad("encoded start key empty (version meta.k8s.io/v1)")
    key = start if start.startswith("/") else "/" + start
    if posixpath.normpath(key) != key and not (key.endswith("\x00") and posixpath.normpath(key[:-1]) == key[:-1]):
        raise bad(start)
    return rv, key[1:].rstrip("\x00")


def parse_delete_options(body: bytes, query: Any) -> DeleteOptions:
    """DeleteOptions come from the body if it is non-empty, else from the query; then the server's
    ``ValidateDeleteOptions`` (422 on ``DeleteOptions``)."""
    src: dict[str, Any]
    if body and body.strip():
        try:
            src = msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            raise errors.bad_request(f"error decoding DeleteOptions: {exc}") from None
        if not isinstance(src, dict):
            raise errors.bad_request("DeleteOptions must be a JSON object")
        dry_values = src.get("dryRun") or []
        if not isinstance(dry_values, list):
            dry_values = [dry_values]
    else:
        src = {k: v for k, v in query.items() if k != "preconditions"}
        dry_values = query.getall("dryRun", []) if hasattr(query, "getall") else list(query.get("dryRun") or [])
    opts = DeleteOptions()
    g = src.get("gracePeriodSeconds")
    if g is not None and g != "":
        opts.grace_period_seconds = g if isinstance(g, int) else options.parse_int(str(g))
    policy = src.get("propagationPolicy") or None
    orphan = src.get("orphanDependents")
    causes: list[Cause] = []
    if policy is not None and orphan is not None:
        causes.append(
            Cause(
                "FieldValueInvalid",
                errors.invalid_value(policy, "orphanDependents and deletionPropagation cannot be both set"),
                "propagationPolicy",
            )
        )
    if policy is None and orphan is not None:
        policy = "Orphan" if str(orphan).lower() == "true" else "Background"
    if policy not in (None, "Background", "Foreground", "Orphan"):
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan", "nil"',
                "propagationPolicy",
            )
        )
    if causes:
        raise errors.options_invalid("DeleteOptions", causes)
    opts.propagation_policy = policy
    opts.dry_run = options.dry_run([str(v) for v in dry_values], "DeleteOptions")
    pre = src.get("preconditions") or {}
    if isinstance(pre, dict):
        opts.precondition_uid = pre.get("uid") or None
        opts.precondition_rv = pre.get("resourceVersion") or None
    return opts
