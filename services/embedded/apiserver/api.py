"""The API operations (create, get, list, update, patch, delete) with the real server's rules.

Handlers parse HTTP into these calls; the garbage collector and namespace controller call them
directly. Every method is synchronous — no awaits — so each operation is atomic in the loop.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from . import admission, errors
from . import patch as patches
from . import schema as crd_schema
from .builtin_schema import prune_builtin, prune_object_meta
from .errors import ApiError, Cause
from .quantity import canonicalise_pod
from .resources import (
    APPLY_PATCH,
    APPLY_PATCH_CBOR,
    JSON_PATCH,
    MERGE_PATCH,
    Registry,
    ResourceType,
    types_from_crd,
)
from .selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from .store import Obj, Store, clone

GC_FINALIZERS = ("orphan", "foregroundDeletion")


def now_rfc3339(offset_seconds: int = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


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
            return clone(self.store.get(key, namespace, name))
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

    def _check_type_meta(self, rt: ResourceType, body: Obj) -> None:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if rt.is_custom:
            if not kind:
                raise errors.bad_request(f"Object 'Kind' is missing in '{_short_json(body)}'")
            if not api_version:
                raise errors.bad_request(f"Object 'apiVersion' is missing in '{_short_json(body)}'")
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version ({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: kind {kind} does not match {rt.kind}'
            )
        body["apiVersion"], body["kind"] = rt.api_version, rt.kind

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
            out, pruned = prune_builtin(rt.group, rt.kind, obj)
        warnings = [f'unknown field "{p}"' for p in pruned]
        if pruned and field_validation == "Strict":
            raise errors.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: '
                + ", ".join(warnings)
            )
        return out, warnings if field_validation != "Ignore" else []

    def _validate(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        causes = admission.metadata_causes(obj, label_only_name=rt.kind == "Namespace")
        if rt.kind == "Pod":
            causes += admission.validate_pod(obj)
        if causes:
            raise errors.invalid(rt.group, rt.kind, meta.get("name", ""), causes)

    # --- create ------------------------------------------------------------------------------

    def create(self, rt: ResourceType, namespace: str, body: Any, field_validation: str = "Warn") -> WriteResult:
        meta = self._object_meta(body, rt)
        self._check_type_meta(rt, body)
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
        generated = False
        if not meta.get("name"):
            base = meta.get("generateName")
            if not base:
                raise errors.invalid(
                    rt.group,
                    rt.kind,
                    "",
                    [Cause("FieldValueRequired", "name or generateName is required", "metadata.name")],
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
        elif rt.kind == "PriorityClass":
            admission.admit_priority_class(obj, None, self.store.items(admission.PRIORITY_CLASS_KEY))
        elif rt.kind == "CustomResourceDefinition":
            self._crd_prepare(obj)

    def _after_create(self, rt: ResourceType, obj: Obj) -> None:
        if rt.kind == "Namespace" and not rt.group:
            ns = obj["metadata"]["name"]
            sa_rt = self.registry.lookup("", "v1", "serviceaccounts")
            cm_rt = self.registry.lookup("", "v1", "configmaps")
            assert sa_rt and cm_rt
            # Controllers in a real cluster add these shortly after; pods depend on both.
            self.create(sa_rt, ns, {"metadata": {"name": "default"}})
            ca = self.cluster_ca_pem
            self.create(
                cm_rt,
                ns,
                {
                    "metadata": {
                        "name": "kube-root-ca.crt",
                        "annotations": {"kubernetes.io/description": "emulated cluster CA"},
                    },
                    "data": {"ca.crt": ca},
                },
            )
        elif rt.kind == "CustomResourceDefinition":
            for t in types_from_crd(obj):
                self.registry.add(t)

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
        t = now_rfc3339()
        crd["status"] = {
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": t,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": t,
                },
            ],
            "acceptedNames": dict(names),
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        }

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
    ) -> ListResult:
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, rt.selectable_fields, rt.is_custom)
        ns_filter = namespace if rt.namespaced else None
        if continue_token:
            rv, start = decode_continue(continue_token)
            if rv < self.store.oldest_replayable():
                raise errors.gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."
                )
            snapshot = self.store.snapshot_at(rt.key, rv)
            keys = sorted(k for k in snapshot if (ns_filter is None or k[0] == ns_filter) and k > start)
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
        matched = []
        last_key: tuple[str, str] | None = None
        more = False
        for obj in pool:
            if (labels or fields) and not (labels_match(labels, obj) and fields_match(fields, obj)):
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
            token = encode_continue(rv, last_key)
            if not labels and not fields:
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
    ) -> WriteResult:
        meta = self._object_meta(body, rt)
        self._check_type_meta(rt, body)
        if meta.get("name", "") != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
            )
        self._check_namespace(rt, meta, namespace)
        old = self._require(rt, namespace, name)
        if meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
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
    ) -> WriteResult:
        ctype = content_type.split(";", maxsplit=1)[0].strip().lower()
        accepted = rt.patch_types()
        if ctype in (APPLY_PATCH, APPLY_PATCH_CBOR):
            # Server-side apply is not emulated: answer like a server that lacks the media type,
            # and say so, so a client author sees why instead of guessing.
            err = errors.unsupported_media_type([t for t in accepted if t not in (APPLY_PATCH, APPLY_PATCH_CBOR)])
            err.message += " (server-side apply is not supported by the runnerscale API emulator: use a merge or strategic merge patch)"
            raise err
        if ctype not in accepted:
            raise errors.unsupported_media_type(accepted)
        try:
            doc = msgspec.json.decode(raw) if raw.strip() else None
        except msgspec.DecodeError as exc:
            if ctype == JSON_PATCH:
                raise errors.bad_request(f"error decoding patch: {exc}") from None
            raise errors.bad_request(f"error decoding patch: invalid JSON patch: {exc}") from None
        if doc is None:
            raise errors.bad_request("empty patch")
        if ctype == JSON_PATCH:
            try:
                ops = patches.validate_json_patch(doc)
            except patches.PatchError as exc:
                raise errors.bad_request(f"error decoding patch: {exc}") from None
        elif not isinstance(doc, dict):
            raise ApiError(
                422,
                "Invalid",
                f'couldn\'t get version/kind; json parse error: json: cannot unmarshal {"array" if isinstance(doc, list) else "string"} into Go value of type struct {{ APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string "json:\\"kind,omitempty\\"" }}',
            )
        old = self._require(rt, namespace, name)
        try:
            if ctype == JSON_PATCH:
                new = patches.apply_json_patch(old, ops)
            elif ctype == MERGE_PATCH:
                new = patches.apply_merge_patch(old, doc)
            else:
                new = patches.apply_strategic_merge_patch(old, doc, rt.smp_rules)
        except patches.PatchFailed as exc:
            # NewGenericServerResponse(422): generic message, the patch library's text as a cause.
            raise ApiError(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
                causes=[Cause("UnexpectedServerResponse", str(exc))],
            ) from None
        except patches.PatchError as exc:
            raise errors.bad_request(str(exc)) from None
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request")
        meta = self._object_meta(new, rt)
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
                f'{errors.qualified(rt.group, rt.plural)} "{name}" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update',
                name=name,
                group=rt.group,
                kind=rt.plural,
                causes=[
                    Cause(
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update",
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
                raise errors.invalid(
                    rt.group,
                    rt.kind,
                    name,
                    [
                        Cause(
                            "FieldValueForbidden",
                            f"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {shown}",
                            "metadata.finalizers",
                        )
                    ],
                )
        _normalise_meta(meta)
        self._validate(rt, new)
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
        if rt.kind == "CustomResourceDefinition" and not self._dry:
            self.registry.remove_crd(name)
            for t in types_from_crd(new):
                self.registry.add(t)
        return WriteResult(new, warnings)

    def _status_update(self, rt: ResourceType, old: Obj, new: Obj) -> Obj:
        result = clone(old)
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
        if opts.precondition_uid and opts.precondition_uid != meta.get("uid"):
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: UID in precondition: {opts.precondition_uid}, UID in object meta: {meta.get('uid')}",
            )
        if opts.precondition_rv and opts.precondition_rv != meta.get("resourceVersion"):
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {opts.precondition_rv}, ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )
        if rt.kind == "PriorityClass":
            admission.check_priority_class_delete(name)
        if rt.kind == "Namespace" and not rt.group:
            return self._delete_namespace(rt, obj)
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
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new.setdefault("status", {})["phase"] = "Terminating"
        self._replace(rt.key, new)
        return WriteResult(new)

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


def encode_continue(rv: int, last_key: tuple[str, str]) -> str:
    start = f"{last_key[0]}/{last_key[1]}"
    raw = msgspec.json.encode({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = msgspec.json.decode(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
            raise ValueError("bad version")
        rv = int(data["rv"])
        start = str(data["start"]).rstrip("\x00")
        ns, _, name = start.partition("/")
        return rv, (ns, name)
    except (ValueError, KeyError, TypeError, msgspec.DecodeError):
        raise errors.bad_request(f"invalid continue token: continue key is not valid: {token[:40]}") from None


def parse_delete_options(body: bytes, query: dict[str, str]) -> DeleteOptions:
    """DeleteOptions come from the body if it is non-empty, else from the query."""
    src: dict[str, Any]
    if body and body.strip():
        try:
            src = msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            raise errors.bad_request(f"error decoding DeleteOptions: {exc}") from None
        if not isinstance(src, dict):
            raise errors.bad_request("DeleteOptions must be a JSON object")
    else:
        src = dict(query)
        if "preconditions" in src:
            src.pop("preconditions")
    opts = DeleteOptions()
    g = src.get("gracePeriodSeconds")
    if g is not None and g != "":
        try:
            opts.grace_period_seconds = int(g)
        except (TypeError, ValueError):
            raise errors.bad_request(f"invalid gracePeriodSeconds: {g!r}") from None
    policy = src.get("propagationPolicy") or None
    orphan = src.get("orphanDependents")
    if policy is None and orphan is not None:
        policy = "Orphan" if str(orphan).lower() == "true" else "Background"
    if policy not in (None, "Background", "Foreground", "Orphan"):
        raise ApiError(
            422,
            "Invalid",
            f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan", "nil"',
        )
    opts.propagation_policy = policy
    dry = src.get("dryRun")
    if dry:
        values = dry if isinstance(dry, list) else [dry]
        if any(v != "All" for v in values):
            raise errors.bad_request(f'dryRun: Unsupported value: "{values[0]}": supported values: "All"')
        opts.dry_run = True
    pre = src.get("preconditions") or {}
    if isinstance(pre, dict):
        opts.precondition_uid = pre.get("uid") or None
        opts.precondition_rv = pre.get("resourceVersion") or None
    return opts
