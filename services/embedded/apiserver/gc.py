"""Background controllers of a real control plane: the garbage collector, namespace cleanup, a
new namespace's default ServiceAccount and root CA ConfigMap, CRD establishment and CRD cleanup.

They run asynchronously (after ``delay`` seconds) like kube-controller-manager and the apiextensions
controllers, so product code cannot come to depend on synchronous effects. Each pass is a sweep
that issues ordinary API operations; passes repeat until nothing changes.

A sweep never walks the whole store: :class:`OwnerIndex`, kept up to date on every commit (like
the real collector's dependency graph, built from watches), says which objects are being deleted,
which objects depend on an owner, what lives in a namespace, and which dependents must have their
owners checked (created, owner references changed, or an owner deleted since the last sweep).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec

from shared.log import get_logger

from .api import Api, DeleteOptions
from .errors import ApiError
from .resources import MERGE_PATCH, ResourceType
from .store import Event, Obj

log = get_logger(__name__)
CRD_KEY = "apiextensions.k8s.io/customresourcedefinitions"

#: (resource key, namespace, name) of a stored object.
ObjRef = tuple[str, str, str]


def absent_owner_refs(obj: Obj, owner_by_uid: Callable[[str], Obj | None]) -> list[dict[str, Any]]:
    """Owner references whose owner does not exist (by uid) or lives in another namespace."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace", "")
    out = []
    for ref in meta.get("ownerReferences") or []:
        owner = owner_by_uid(ref.get("uid", ""))
        if owner is None:
            out.append(ref)
            continue
        owner_ns = (owner.get("metadata") or {}).get("namespace", "")
        if owner_ns and owner_ns != ns:
            out.append(ref)
    return out


def _owner_uids(obj: Obj | None) -> set[str]:
    if obj is None:
        return set()
    return {r.get("uid", "") for r in (obj.get("metadata") or {}).get("ownerReferences") or []}


class OwnerIndex:
    """What the collector needs, maintained per commit so a sweep costs what changed, not the store."""

    def __init__(self) -> None:
        self.by_uid: dict[str, ObjRef] = {}
        self.dependents: dict[str, set[ObjRef]] = {}  # owner uid -> objects referencing it
        self.by_namespace: dict[str, set[ObjRef]] = {}
        self.deleting: set[ObjRef] = set()  # objects with a deletionTimestamp
        self.dirty: set[ObjRef] = set()  # dependents whose owners the next sweep checks

    def add(self, resource: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        ref = (resource, meta.get("namespace", ""), meta.get("name", ""))
        if uid := meta.get("uid"):
            self.by_uid[uid] = ref
        for owner in _owner_uids(obj):
            self.dependents.setdefault(owner, set()).add(ref)
        if ref[1]:
            self.by_namespace.setdefault(ref[1], set()).add(ref)
        if meta.get("deletionTimestamp"):
            self.deleting.add(ref)

    def remove(self, resource: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        ref = (resource, meta.get("namespace", ""), meta.get("name", ""))
        if (uid := meta.get("uid")) and self.by_uid.get(uid) == ref:
            del self.by_uid[uid]
        for owner in _owner_uids(obj):
            deps = self.dependents.get(owner)
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self.dependents[owner]
        if ref[1] and (in_ns := self.by_namespace.get(ref[1])) is not None:
            in_ns.discard(ref)
            if not in_ns:
                del self.by_namespace[ref[1]]
        self.deleting.discard(ref)

    def on_commit(self, ev: Event) -> None:
        ref = (ev.resource, ev.namespace, ev.name)
        if ev.prev is not None:
            self.remove(ev.resource, ev.prev)
        if ev.type == "DELETED":
            self.remove(ev.resource, ev.obj)
            self.dirty.discard(ref)
            uid = (ev.obj.get("metadata") or {}).get("uid", "")
            self.dirty.update(self.dependents.get(uid, ()))
            return
        self.add(ev.resource, ev.obj)
        refs = _owner_uids(ev.obj)
        if refs and refs != _owner_uids(ev.prev):
            self.dirty.add(ref)


class Controllers:
    def __init__(self, api: Api, delay: float = 0.05) -> None:
        self.api = api
        self.delay = delay
        self.paused = False
        self._wake = asyncio.Event()
        self.index = OwnerIndex()
        for key, obj in api.store.all_objects():  # once, at start; then kept up to date per commit
            self.index.add(key, obj)
            if obj.get("metadata", {}).get("ownerReferences"):
                self.index.dirty.add((key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        api.store.on_commit.append(self.index.on_commit)
        api.store.on_commit.append(self._on_commit)

    def _on_commit(self, ev: Event) -> None:
        # Only writes that can change what the collector decides wake it (not, e.g., status updates).
        meta = ev.obj.get("metadata") or {}
        refs = meta.get("ownerReferences")
        refs_changed = bool(refs) and (
            ev.prev is None or (ev.prev.get("metadata") or {}).get("ownerReferences") != refs
        )
        if (
            ev.type == "DELETED"
            or meta.get("deletionTimestamp")
            or refs_changed
            or ev.resource in ("/namespaces", CRD_KEY)
        ):
            self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            # Emulates the controller-manager's asynchrony; this is the server's own pacing.
            await asyncio.sleep(self.delay)
            self._wake.clear()
            if self.paused:
                continue
            try:
                for _ in range(20):
                    if not self.run_once():
                        break
            except Exception as exc:  # a sweep must never kill the server
                log.error("garbage collection sweep failed", error=repr(exc))

    def _rt_for(self, key: str) -> ResourceType | None:
        for rt in self.api.registry.all():
            if rt.key == key:
                return rt
        return None

    def _delete(self, key: str, obj: Obj, policy: str = "Background") -> None:
        rt = self._rt_for(key)
        if rt is None:
            return
        m = obj["metadata"]
        try:
            self.api.delete(
                rt, m.get("namespace", ""), m["name"], DeleteOptions(grace_period_seconds=0, propagation_policy=policy)
            )
        except ApiError as exc:
            if exc.code != 404:
                raise

    def _merge(self, key: str, obj: Obj, patch: dict[str, Any]) -> None:
        rt = self._rt_for(key)
        if rt is None:
            return
        m = obj["metadata"]
        try:
            self.api.patch(rt, m.get("namespace", ""), m["name"], MERGE_PATCH, msgspec.json.encode(patch))
        except ApiError as exc:
            if exc.code != 404:
                raise

    def _get(self, ref: ObjRef) -> Obj | None:
        return self.api.store.get(*ref)

    def _owner_by_uid(self, uid: str) -> Obj | None:
        ref = self.index.by_uid.get(uid)
        return None if ref is None else self._get(ref)

    def _in_namespace(self, namespace: str) -> list[tuple[str, Obj]]:
        out = []
        for ref in sorted(self.index.by_namespace.get(namespace, ())):
            obj = self._get(ref)
            if obj is not None:
                out.append((ref[0], obj))
        return out

    def run_once(self) -> bool:
        """One sweep; True when it changed something (so another sweep may be due)."""
        store = self.api.store
        index = self.index
        before = store.rv

        # New CRDs get established; deleted ones have their objects removed, then go.
        for crd in store.items(CRD_KEY):
            name = crd["metadata"]["name"]
            if crd["metadata"].get("deletionTimestamp"):
                self.api.clean_up_crd(name)
            else:
                self.api.establish_crd(name)

        # Namespaces: active ones get their defaults; those being deleted lose their contents,
        # then go themselves.
        for ns in store.items("/namespaces"):
            nm = ns["metadata"]
            if not nm.get("deletionTimestamp"):
                self.api.ensure_namespace_defaults(nm["name"])
                continue
            for k, o in self._in_namespace(nm["name"]):
                if (
                    not o["metadata"].get("deletionTimestamp")
                    or (o["metadata"].get("deletionGracePeriodSeconds") or 0) > 0
                ):
                    self._delete(k, o)
            left = self._in_namespace(nm["name"])
            self.api.report_namespace_deletion(nm["name"], left)
            if not left:
                self.api.finish_namespace(nm["name"])

        # Owners being deleted: orphan or foreground-delete their dependents.
        for ref in sorted(index.deleting):
            owner = self._get(ref)
            if owner is None:
                continue
            key, om = ref[0], owner["metadata"]
            if not om.get("deletionTimestamp"):
                continue
            fins = om.get("finalizers") or []
            if "orphan" not in fins and "foregroundDeletion" not in fins:
                continue
            deps = [
                (d[0], dep_obj)
                for d in sorted(index.dependents.get(om["uid"], ()))
                if (dep_obj := self._get(d)) is not None
            ]
            if "orphan" in fins:
                for dkey, current in deps:
                    refs = [r for r in current["metadata"].get("ownerReferences") or [] if r.get("uid") != om["uid"]]
                    self._merge(dkey, current, {"metadata": {"ownerReferences": refs or None}})
                self._merge(key, owner, {"metadata": {"finalizers": [f for f in fins if f != "orphan"] or None}})
            else:
                blocking = False
                for dkey, dep in deps:
                    if not dep["metadata"].get("deletionTimestamp"):
                        self._delete(dkey, dep)
                    if (
                        any(
                            r.get("uid") == om["uid"] and r.get("blockOwnerDeletion")
                            for r in dep["metadata"].get("ownerReferences") or []
                        )
                        and store.get(dkey, dep["metadata"].get("namespace", ""), dep["metadata"]["name"]) is not None
                    ):
                        blocking = True
                if not blocking:
                    latest = store.get(key, om.get("namespace", ""), om["name"])
                    if latest is not None:
                        left = [f for f in latest["metadata"].get("finalizers") or [] if f != "foregroundDeletion"]
                        self._merge(key, latest, {"metadata": {"finalizers": left or None}})

        # Dependents whose owners are all gone are collected; dangling references are dropped.
        dirty, index.dirty = index.dirty, set()
        for ref in sorted(dirty):
            obj = self._get(ref)
            if obj is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            if not refs:
                continue
            absent = absent_owner_refs(obj, self._owner_by_uid)
            if not absent:
                continue
            if len(absent) == len(refs):
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete(ref[0], obj)
            else:
                kept = [r for r in refs if r not in absent]
                self._merge(ref[0], obj, {"metadata": {"ownerReferences": kept}})
        return store.rv != before
