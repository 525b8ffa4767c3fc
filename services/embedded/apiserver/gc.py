"""Background controllers of a real control plane: the garbage collector, namespace cleanup, a
new namespace's default ServiceAccount and root CA ConfigMap, CRD establishment and CRD cleanup.

They run asynchronously (after ``delay`` seconds) like kube-controller-manager and the apiextensions
controllers, so product code cannot come to depend on synchronous effects. Each pass is a pure-ish
sweep over the store that issues ordinary API operations; passes repeat until nothing changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from shared.log import get_logger

from .api import Api, DeleteOptions
from .errors import ApiError
from .resources import MERGE_PATCH, ResourceType
from .store import Event, Obj

log = get_logger(__name__)
CRD_KEY = "apiextensions.k8s.io/customresourcedefinitions"


def absent_owner_refs(obj: Obj, index: dict[str, Obj]) -> list[dict[str, Any]]:
    """Owner references whose owner does not exist (by uid) or lives in another namespace."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace", "")
    out = []
    for ref in meta.get("ownerReferences") or []:
        owner = index.get(ref.get("uid", ""))
        if owner is None:
            out.append(ref)
            continue
        owner_ns = (owner.get("metadata") or {}).get("namespace", "")
        if owner_ns and owner_ns != ns:
            out.append(ref)
    return out


class Controllers:
    def __init__(self, api: Api, delay: float = 0.05) -> None:
        self.api = api
        self.delay = delay
        self.paused = False
        self._wake = asyncio.Event()
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

    def run_once(self) -> bool:
        """One sweep; True when it changed something (so another sweep may be due)."""
        store = self.api.store
        before = store.rv
        everything = store.all_objects()
        index = {o["metadata"]["uid"]: o for _, o in everything if o.get("metadata", {}).get("uid")}
        dependents: dict[str, list[tuple[str, Obj]]] = {}
        for key, o in everything:
            for ref in o["metadata"].get("ownerReferences") or []:
                dependents.setdefault(ref.get("uid", ""), []).append((key, o))

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
            remaining = [(k, o) for k, o in everything if o["metadata"].get("namespace") == nm["name"]]
            for k, o in remaining:
                if (
                    not o["metadata"].get("deletionTimestamp")
                    or (o["metadata"].get("deletionGracePeriodSeconds") or 0) > 0
                ):
                    self._delete(k, o)
            left = [(k, o) for k, o in store.all_objects() if o["metadata"].get("namespace") == nm["name"]]
            self.api.report_namespace_deletion(nm["name"], left)
            if not left:
                self.api.finish_namespace(nm["name"])

        for key, owner in everything:
            om = owner["metadata"]
            if not om.get("deletionTimestamp"):
                continue
            fins = om.get("finalizers") or []
            deps = dependents.get(om["uid"], [])
            if "orphan" in fins:
                for dkey, dep in deps:
                    current = store.get(dkey, dep["metadata"].get("namespace", ""), dep["metadata"]["name"])
                    if current is None:
                        continue
                    refs = [r for r in current["metadata"].get("ownerReferences") or [] if r.get("uid") != om["uid"]]
                    self._merge(dkey, current, {"metadata": {"ownerReferences": refs or None}})
                self._merge(key, owner, {"metadata": {"finalizers": [f for f in fins if f != "orphan"] or None}})
            elif "foregroundDeletion" in fins:
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
                    current = store.get(key, om.get("namespace", ""), om["name"])
                    if current is not None:
                        left = [f for f in current["metadata"].get("finalizers") or [] if f != "foregroundDeletion"]
                        self._merge(key, current, {"metadata": {"finalizers": left or None}})

        # Dependents whose owners are all gone are collected; dangling references are dropped.
        for key, o in store.all_objects():
            refs = o["metadata"].get("ownerReferences") or []
            if not refs:
                continue
            absent = absent_owner_refs(o, index)
            if not absent:
                continue
            if len(absent) == len(refs):
                if not o["metadata"].get("deletionTimestamp"):
                    self._delete(key, o)
            else:
                kept = [r for r in refs if r not in absent]
                self._merge(key, o, {"metadata": {"ownerReferences": kept}})
        return store.rv != before
