"""An informer-like cache: list, then watch from the list's resourceVersion, and keep a local copy.

- Watches ask for bookmarks and a server-side timeout, so this code (not kubernetes-asyncio's
  ``Watch``) owns reconnection: a stream that ends or breaks is resumed from the last
  resourceVersion seen (events and bookmarks), a 410 Gone (compacted history) triggers a relist
  that is diffed against the cache so handlers see the missed changes.
- Events older than the cached object (a replay after resume) are dropped.
- Handlers are plain functions called with a :class:`Change`; they should only enqueue keys.
  A failing handler is logged and does not stop the informer.
- The cache can lag the server: decisions that lead to writes re-read through ``ApiReader``.
- The cache keeps one decoded object per key, decoded without the presence record of
  :func:`shared.api.decode` and without the JSON it came from (issue 10: that record cost ~8× the
  decode time, and the JSON copy a third more memory), and lighter still where the resource says
  so: a resource's ``cache_view`` decodes only the fields workers read (a Pod's metadata and
  status, not its spec), and :func:`slim_meta` drops ``managedFields`` and shares the strings every
  runner repeats. ``get_cached``/``list_cached`` return
  fresh copies (the object re-encoded and decoded), so callers may mutate what they get; like
  the cached objects they carry no presence record: they are for reading (writes are built as
  patches). Objects in a :class:`Change` are shared between handlers: read-only.
"""

from __future__ import annotations

import copy
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc
import msgspec

from shared.api import ObjectMeta
from shared.api.codec import ApiDecodeError, decode
from shared.backoff import Backoff
from shared.kube.client import KubeClient
from shared.kube.errors import DecodeFailed, Gone, KubeError, Status, Throttled, status_from_watch_error
from shared.kube.reader import ApiReader
from shared.kube.resources import ObjectKey, Resource
from shared.kube.selectors import LabelSelector, parse_label_selector
from shared.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")


class ChangeType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True)
class Change(Generic[T]):
    """One change seen by the cache. For DELETED, ``obj`` is the last known state."""

    type: ChangeType
    key: ObjectKey
    obj: T
    old: T | None = None


Handler = Callable[[Change[Any]], None]


class _Head(msgspec.Struct, kw_only=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class _Event(msgspec.Struct, kw_only=True):
    type: str
    object: msgspec.Raw


# Longer label or annotation values (a JSON record, a message) are rarely shared: not interned.
_INTERN_MAX = 64


@dataclass(slots=True)
class _Entry:
    meta: ObjectMeta
    obj: Any


def _interned(values: dict[str, str]) -> dict[str, str]:
    return {sys.intern(k): sys.intern(v) if len(v) <= _INTERN_MAX else v for k, v in values.items()}


def slim_meta(meta: ObjectMeta) -> None:
    """Make a cached object's metadata lighter, in place, keeping every field a worker reads.

    - ``managedFields`` is dropped: the server's field-ownership record (often the largest part
      of an object's metadata on a real API server) is never read by a worker, and writes are
      patches built from their own fields.
    - Label and annotation keys, short label and annotation values, the owner references' kinds
      and API versions, finalizers and the namespace are interned: every runner carries the same
      few dozen strings (``actions.github.com/scale-set-name: <set>``, ...), decoded once per
      object and shared here (issue 10: ~1.5 kB per cached object).
    """
    if meta.managed_fields:
        meta.managed_fields = []
    meta.namespace = sys.intern(meta.namespace)
    if meta.labels:
        meta.labels = _interned(meta.labels)
    if meta.annotations:
        meta.annotations = _interned(meta.annotations)
    if meta.finalizers:
        meta.finalizers = [sys.intern(f) for f in meta.finalizers]
    for ref in meta.owner_references:
        ref.api_version = sys.intern(ref.api_version)
        ref.kind = sys.intern(ref.kind)


def _rv_int(rv: str) -> int | None:
    try:
        return int(rv)
    except (TypeError, ValueError):
        return None


def is_stale(cached_rv: str, incoming_rv: str) -> bool:
    """True when an incoming event is not newer than the cached object (pure; RVs compared as
    integers, as etcd and the emulator issue them; opaque RVs are never considered stale)."""
    a, b = _rv_int(cached_rv), _rv_int(incoming_rv)
    return a is not None and b is not None and b <= a


class Informer(Generic[T]):
    """A cache of one resource, optionally scoped to a namespace and label/field selectors.

    Run :meth:`run` in a task group; ``has_synced`` is set after the first complete list.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: Resource[T],
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout: float = 300.0,
        page_size: int = 500,
        max_backoff: float = 10.0,
    ) -> None:
        parse_label_selector(label_selector)  # reject a malformed selector now, not in the loop
        self.client = client
        self.resource = resource
        self.namespace = namespace or None
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.has_synced = anyio.Event()
        self.resource_version = ""
        self.relists = 0  # how many times the informer had to list (1 + one per 410 / failure)
        self.watches = 0  # how many watch streams it opened
        self._reader = ApiReader(client)
        self._items: dict[ObjectKey, _Entry] = {}
        self._by_owner: dict[str, set[ObjectKey]] = {}
        self._handlers: list[Handler] = []
        self._running = False
        self._backoff = Backoff(base=0.2, cap=max_backoff)
        self._failures = 0  # list/watch failures in a row
        self._what = resource.describe("WATCH", namespace=self.namespace)

    # --- reading the cache -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    @property
    def running(self) -> bool:
        return self._running

    def keys(self) -> list[ObjectKey]:
        return sorted(self._items)

    def get_cached(self, key: ObjectKey | str, *, copy: bool = True) -> T | None:
        """The cached object of ``key``: a fresh copy, or with ``copy=False`` the cache's own
        decoded object (no decode; strictly read-only, as :meth:`list_owned_by`)."""
        entry = self._items.get(ObjectKey.of(key))
        if entry is None:
            return None
        return self._fresh(entry) if copy else entry.obj

    def list_cached(self, selector: LabelSelector | str | None = None, *, namespace: str | None = None) -> list[T]:
        """Cached objects (sorted by key), filtered by label selector and namespace."""
        sel = parse_label_selector(selector) if isinstance(selector, str) else selector
        out = []
        for key in sorted(self._items):
            entry = self._items[key]
            if namespace and key.namespace != namespace:
                continue
            if sel is not None and not sel.matches(entry.meta.labels):
                continue
            out.append(self._fresh(entry))
        return out

    def list_owned_by(self, owner_uid: str, *, copy: bool = True) -> list[T]:
        """Cached objects with an ownerReference to ``owner_uid`` (replaces ARC's field index).
        ``copy=False`` returns the cache's own decoded objects without decoding them again, in no
        particular order: cheap, but strictly read-only (they are shared with every other reader
        and with handlers)."""
        found = self._by_owner.get(owner_uid, ())
        if not copy:
            items = self._items
            return [items[k].obj for k in found if k in items]
        return [self._fresh(self._items[k]) for k in sorted(found) if k in self._items]

    def _fresh(self, entry: _Entry) -> T:
        try:
            return self._decode(msgspec.json.encode(entry.obj))
        except DecodeFailed:  # a struct whose encoding does not decode back: copy it slowly
            copied: T = copy.deepcopy(entry.obj)
            return copied

    def _decode(self, data: bytes | msgspec.Raw) -> T:
        view = self.resource.cache_view
        try:
            if view is not None:
                return self.resource.from_cache_view(decode(view, bytes(data), presence_record=False))
            return decode(self.resource.type, bytes(data), presence_record=False)
        except ApiDecodeError as exc:
            raise DecodeFailed(self._what, str(exc)) from None

    async def wait_synced(self, timeout: float = 30.0) -> None:
        with anyio.fail_after(timeout):
            await self.has_synced.wait()

    # --- handlers ----------------------------------------------------------------------------------

    def add_handler(self, handler: Handler, *, replay: bool = True) -> Callable[[], None]:
        """Register ``handler``; with ``replay`` it first gets ADDED for every cached object.
        Returns a function that unregisters it."""
        self._handlers.append(handler)
        if replay:
            for key in sorted(self._items):
                self._call(handler, Change(ChangeType.ADDED, key, self._items[key].obj))

        def remove() -> None:
            if handler in self._handlers:
                self._handlers.remove(handler)

        return remove

    def _call(self, handler: Handler, change: Change[Any]) -> None:
        try:
            handler(change)
        except Exception:
            log.exception(
                "informer handler failed",
                resource=self.resource.qualified,
                key=str(change.key),
                change=str(change.type),
            )

    def _emit(self, change: Change[Any]) -> None:
        for handler in list(self._handlers):
            self._call(handler, change)

    # --- store -------------------------------------------------------------------------------------

    def _index(self, key: ObjectKey, meta: ObjectMeta | None, old: ObjectMeta | None) -> None:
        if old is not None:
            for ref in old.owner_references:
                keys = self._by_owner.get(ref.uid)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._by_owner[ref.uid]
        if meta is not None:
            for ref in meta.owner_references:
                self._by_owner.setdefault(ref.uid, set()).add(key)

    def _decode_entry(self, raw: msgspec.Raw | bytes) -> tuple[ObjectKey, _Entry] | None:
        try:
            obj = self._decode(raw)
        except DecodeFailed as exc:
            # One malformed object must not stop the cache; it stays invisible until fixed.
            log.error("skipping undecodable object", resource=self.resource.qualified, error=str(exc))
            return None
        meta: ObjectMeta = obj.metadata  # type: ignore[attr-defined]
        slim_meta(meta)
        return self.resource.key_of(obj), _Entry(meta, obj)

    def _upsert(self, key: ObjectKey, entry: _Entry) -> None:
        old = self._items.get(key)
        if old is not None and is_stale(old.meta.resource_version, entry.meta.resource_version):
            return
        self._items[key] = entry
        self._index(key, entry.meta, old.meta if old else None)
        if old is None:
            self._emit(Change(ChangeType.ADDED, key, entry.obj))
        else:
            self._emit(Change(ChangeType.MODIFIED, key, entry.obj, old.obj))

    def _remove(self, key: ObjectKey, last: _Entry | None = None) -> None:
        old = self._items.pop(key, None)
        if old is None:
            return
        self._index(key, None, old.meta)
        self._emit(Change(ChangeType.DELETED, key, (last or old).obj, old.obj))

    def _replace_all(self, entries: Iterable[tuple[ObjectKey, _Entry]]) -> None:
        """Install a fresh list, emitting the difference to the previous contents as changes."""
        fresh = dict(entries)
        for key in sorted(set(self._items) - set(fresh)):
            self._remove(key)
        for key in sorted(fresh):
            old = self._items.get(key)
            if old is not None and old.meta.resource_version == fresh[key].meta.resource_version:
                continue
            if old is not None:
                # A relist is authoritative: take it even if its RV compares lower (never with etcd).
                self._items.pop(key)
                self._index(key, None, old.meta)
                self._items[key] = fresh[key]
                self._index(key, fresh[key].meta, None)
                self._emit(Change(ChangeType.MODIFIED, key, fresh[key].obj, old.obj))
            else:
                self._upsert(key, fresh[key])

    # --- the loop ----------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """List and watch until cancelled. Never returns normally; errors are retried with backoff.
        ``task_status.started()`` once the first list is in the cache (``has_synced``)."""
        if self._running:
            raise RuntimeError(f"informer for {self.resource.qualified} is already running")
        self._running = True
        need_list = True
        started_up = False
        try:
            while True:
                try:
                    if need_list:
                        await self._list()
                        need_list = False
                        if not started_up:
                            started_up = True
                            task_status.started()
                    began, events = time.monotonic(), await self._watch()
                    if events == 0 and time.monotonic() - began < 1.0:
                        # A stream that ends at once without events: do not spin on it.
                        await anyio.sleep(self._next_delay())
                    else:
                        self._failures = 0
                except Gone as exc:
                    log.info("watch history compacted; relisting", resource=self.resource.qualified, error=str(exc))
                    need_list = True
                except KubeError as exc:
                    delay = self._next_delay()
                    if isinstance(exc, Throttled) and exc.retry_after:
                        delay = max(delay, exc.retry_after)
                    log.warning(
                        "list/watch failed; retrying",
                        resource=self.resource.qualified,
                        error=str(exc),
                        retry_in=round(delay, 3),
                    )
                    await anyio.sleep(delay)
        finally:
            self._running = False

    def _next_delay(self) -> float:
        """The pause before the next list/watch attempt: exponential, jittered to [0.5, 1] of it so
        many informers do not retry in step."""
        delay = self._backoff.jittered(self._failures, 0.5, 1.0)
        self._failures += 1
        return delay

    async def _list(self) -> None:
        self.relists += 1
        raw_items, rv = await self._reader.list_raw(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            page_size=self.page_size,
        )
        entries = [e for e in (self._decode_entry(raw) for raw in raw_items) if e is not None]
        self._replace_all(entries)
        self.resource_version = rv
        self.has_synced.set()

    async def _watch(self) -> int:
        """One watch stream from ``resource_version``; returns the number of events on clean end."""
        self.watches += 1
        # Spread re-watches of many informers over time, as client-go does (timeout × [1, 2)).
        server_timeout = int(self.watch_timeout * (1 + random.random()))
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", self.resource_version),
            ("timeoutSeconds", str(server_timeout)),
        ]
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        events = 0
        path = self.resource.collection_path(self.namespace)
        async with self.client.stream(path, what=self._what, query=query, read_timeout=server_timeout + 30) as lines:
            async for line in lines:
                self._handle_line(line)
                events += 1
        return events

    def _handle_line(self, line: bytes) -> None:
        try:
            event = msgspec.json.decode(line, type=_Event)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeFailed(self._what, f"malformed watch event: {exc}") from None
        if event.type == "ERROR":
            try:
                status = msgspec.json.decode(event.object, type=Status)
            except (msgspec.DecodeError, msgspec.ValidationError):
                status = Status(code=500, message="undecodable ERROR event")
            raise status_from_watch_error(self._what, status)
        try:
            head = msgspec.json.decode(event.object, type=_Head)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeFailed(self._what, f"watch event without metadata: {exc}") from None
        rv = head.metadata.resource_version
        if event.type == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        decoded = self._decode_entry(event.object)
        if decoded is not None:
            key, entry = decoded
            if event.type == "DELETED":
                self._remove(key, entry)
            elif event.type in ("ADDED", "MODIFIED"):
                self._upsert(key, entry)
        if rv:
            self.resource_version = rv
