"""The writer: create, merge/strategic/status patches, delete with preconditions, finalizers, and
``retry_on_conflict``.

Rules (README "Kubernetes access layer"):

- Custom resources are always patched with ``application/merge-patch+json``.
- A write that depends on what was read carries that read's resourceVersion
  (``resource_version=``); the server then answers 409 :class:`Conflict` if the object changed.
- :func:`retry_on_conflict` re-runs a *decide-and-write* callable on Conflict. Inside it, a write
  without a resourceVersion precondition raises :class:`LocklessWrite` before anything is sent:
  such a write cannot conflict, so a retry loop around it would only look like protection.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum
from typing import Any, TypeVar

import anyio

from shared.api import to_dict
from shared.kube.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, KubeClient
from shared.kube.codec import decode_object, object_body
from shared.kube.errors import BadRequest, Conflict, LocklessWrite, NotFound
from shared.kube.ledger import note_patch
from shared.kube.resources import ObjectKey, Resource

T = TypeVar("T")
R = TypeVar("R")

# Set while a retry_on_conflict callable runs: every write in it must carry a precondition.
_LOCK_REQUIRED: ContextVar[bool] = ContextVar("runnerscale_kube_lock_required", default=False)


class PropagationPolicy(StrEnum):
    BACKGROUND = "Background"
    FOREGROUND = "Foreground"
    ORPHAN = "Orphan"


def with_resource_version(patch: Mapping[str, Any], resource_version: str | None) -> dict[str, Any]:
    """A copy of ``patch`` with ``metadata.resourceVersion`` set (the optimistic lock), if given."""
    if not isinstance(patch, Mapping):
        raise TypeError(f"a merge patch is a JSON object, got {type(patch).__name__}")
    body = copy.deepcopy(dict(patch))
    if resource_version:
        meta = body.get("metadata")
        meta = dict(meta) if isinstance(meta, Mapping) else {}
        meta["resourceVersion"] = resource_version
        body["metadata"] = meta
    return body


def finalizers_patch(current: list[str], *, add: str | None = None, remove: str | None = None) -> list[str] | None:
    """The finalizer list after adding/removing one, or None when nothing changes (pure)."""
    if add is not None:
        return None if add in current else [*current, add]
    if remove is not None:
        return [f for f in current if f != remove] if remove in current else None
    return None


@contextmanager
def best_effort_writes() -> Iterator[None]:
    """Allow lock-less writes inside retry_on_conflict for writes that are deliberately
    last-write-wins and independent of the decision (Event counts)."""
    token = _LOCK_REQUIRED.set(False)
    try:
        yield
    finally:
        _LOCK_REQUIRED.reset(token)


def _require_lock(what: str, locked: bool) -> None:
    if _LOCK_REQUIRED.get() and not locked:
        raise LocklessWrite(
            what,
            "write without a resourceVersion inside retry_on_conflict: it can never conflict, so the "
            "retry would protect nothing; pass resource_version= from the read the decision used",
        )


class ApiWriter:
    """Writes to the API server; every method returns the object as stored (new resourceVersion)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def create(
        self, resource: Resource[T], obj: Any, *, namespace: str | None = None, timeout: float | None = None
    ) -> T:
        """POST ``obj`` (a struct or JSON tree). :class:`AlreadyExists` if the name is taken."""
        body = object_body(resource, obj)
        found = body.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        ns = namespace or meta.get("namespace") or None
        if resource.namespaced and not ns:
            raise BadRequest(
                resource.describe("CREATE"), "a namespaced object needs metadata.namespace (or namespace=)"
            )
        key = ObjectKey(ns or "", meta.get("name") or meta.get("generateName", "") + "*")
        what = resource.describe("CREATE", key)
        data = await self.client.request("POST", resource.collection_path(ns), what=what, body=body, timeout=timeout)
        return decode_object(resource, data, what)

    async def _patch(
        self,
        resource: Resource[T],
        key: ObjectKey,
        patch: Any,
        resource_version: str | None,
        content_type: str,
        subresource: str,
        timeout: float | None,
    ) -> T:
        what = resource.describe("PATCH", key, subresource)
        _require_lock(what, bool(resource_version))
        body = with_resource_version(patch, resource_version)
        note_patch(resource.qualified, key, subresource)
        data = await self.client.request(
            "PATCH",
            resource.object_path(key, subresource),
            what=what,
            body=body,
            content_type=content_type,
            timeout=timeout,
        )
        return decode_object(resource, data, what)

    async def patch_merge(
        self,
        resource: Resource[T],
        key: ObjectKey | str,
        patch: Mapping[str, Any],
        *,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> T:
        """JSON merge patch (RFC 7386: objects merge, ``None`` deletes, lists replace).

        With ``resource_version`` the patch is conditional: :class:`Conflict` if the object changed.
        """
        return await self._patch(resource, ObjectKey.of(key), patch, resource_version, MERGE_PATCH, "", timeout)

    async def patch_status(
        self,
        resource: Resource[T],
        key: ObjectKey | str,
        patch: Mapping[str, Any],
        *,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> T:
        """Merge patch of the ``/status`` subresource (spec and metadata in ``patch`` are ignored by
        the server for custom resources)."""
        if not resource.has_status:
            raise BadRequest(
                resource.describe("PATCH", ObjectKey.of(key), "status"),
                f"{resource.qualified} has no status subresource",
            )
        return await self._patch(resource, ObjectKey.of(key), patch, resource_version, MERGE_PATCH, "status", timeout)

    async def patch_strategic(
        self,
        resource: Resource[T],
        key: ObjectKey | str,
        patch: Mapping[str, Any],
        *,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> T:
        """Strategic merge patch (built-in kinds only: lists such as containers merge by name)."""
        key = ObjectKey.of(key)
        if resource.custom:
            raise BadRequest(
                resource.describe("PATCH", key),
                "custom resources do not support strategic merge patch; use patch_merge",
            )
        return await self._patch(resource, key, patch, resource_version, STRATEGIC_MERGE_PATCH, "", timeout)

    async def replace(self, resource: Resource[T], obj: Any, *, timeout: float | None = None) -> T:
        """PUT the whole object (struct or JSON tree). It must carry ``metadata.resourceVersion``
        (refused otherwise), so a replace is always conditional: :class:`Conflict` when stale.

        Prefer :meth:`patch_merge`: a struct decoded by an older worker lacks fields a newer one
        added, and a PUT of it would remove them (README "API types, CRDs and semantic comparison"). Use a JSON tree read as a whole.
        """
        tree = to_dict(obj) if not isinstance(obj, Mapping) else copy.deepcopy(dict(obj))
        found = tree.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        key = ObjectKey(meta.get("namespace", "") if resource.namespaced else "", meta.get("name", ""))
        what = resource.describe("PUT", key)
        if not meta.get("resourceVersion"):
            raise BadRequest(what, "replace needs metadata.resourceVersion from the read it was decided on")
        if not key.name:
            raise BadRequest(what, "replace needs metadata.name")
        tree["apiVersion"], tree["kind"] = resource.api_version, resource.kind
        note_patch(resource.qualified, key, "")
        data = await self.client.request("PUT", resource.object_path(key), what=what, body=tree, timeout=timeout)
        return decode_object(resource, data, what)

    async def delete(
        self,
        resource: Resource[Any],
        key: ObjectKey | str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: PropagationPolicy = PropagationPolicy.BACKGROUND,
        grace_period_seconds: int | None = None,
        missing_ok: bool = False,
        timeout: float | None = None,
    ) -> bool:
        """DELETE with optional preconditions (``uid``: not a recreated namesake; ``resource_version``:
        not modified since read → else :class:`Conflict`). Returns False when already gone and
        ``missing_ok``; an object with finalizers is only marked (deletionTimestamp) by this call."""
        key = ObjectKey.of(key)
        what = resource.describe("DELETE", key)
        _require_lock(what, bool(resource_version or uid))
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": str(propagation)}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        try:
            await self.client.request("DELETE", resource.object_path(key), what=what, body=options, timeout=timeout)
        except NotFound:
            if missing_ok:
                return False
            raise
        return True

    async def add_finalizer(self, resource: Resource[T], obj: T, finalizer: str, *, timeout: float | None = None) -> T:
        """Add ``finalizer`` to ``obj`` (as read), locked on its resourceVersion. No write if present."""
        meta = obj.metadata  # type: ignore[attr-defined]
        new = finalizers_patch(list(meta.finalizers), add=finalizer)
        if new is None:
            return obj
        return await self.patch_merge(
            resource,
            resource.key_of(obj),
            {"metadata": {"finalizers": new}},
            resource_version=meta.resource_version,
            timeout=timeout,
        )

    async def remove_finalizer(
        self, resource: Resource[T], obj: T, finalizer: str, *, timeout: float | None = None
    ) -> T | None:
        """Remove ``finalizer`` from ``obj`` (as read), locked on its resourceVersion.

        Returns None when the object is gone (already deleted, or this removal let it go). Merge
        patch, not strategic: under a strategic merge patch a finalizer list *unions* on built-ins.
        """
        meta = obj.metadata  # type: ignore[attr-defined]
        new = finalizers_patch(list(meta.finalizers), remove=finalizer)
        if new is None:
            return obj
        try:
            return await self.patch_merge(
                resource,
                resource.key_of(obj),
                {"metadata": {"finalizers": new}},
                resource_version=meta.resource_version,
                timeout=timeout,
            )
        except NotFound:
            return None


async def retry_on_conflict(
    decide_and_write: Callable[[], Awaitable[R]],
    *,
    attempts: int = 5,
    backoff: float = 0.01,
    on_conflict: Callable[[Conflict, int], None] | None = None,
) -> R:
    """Run ``decide_and_write`` (which must re-read authoritatively, decide, and write with that
    read's resourceVersion) and re-run it on :class:`Conflict`, at most ``attempts`` times.

    The last Conflict is re-raised when attempts are exhausted (the caller requeues). Any write
    inside that carries no precondition raises :class:`LocklessWrite`. ``on_conflict(exc, attempt)``
    sees every 409 (metrics, a log line).
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    token = _LOCK_REQUIRED.set(True)
    try:
        for attempt in range(1, attempts + 1):
            try:
                return await decide_and_write()
            except Conflict as exc:
                if on_conflict is not None:
                    on_conflict(exc, attempt)
                if attempt == attempts:
                    raise
                # Spread competing writers apart (client-go's DefaultRetry: 10 ms steps, jitter).
                await anyio.sleep(backoff * attempt * (1 + random.random() * 0.1))
        raise AssertionError("unreachable")
    finally:
        _LOCK_REQUIRED.reset(token)
