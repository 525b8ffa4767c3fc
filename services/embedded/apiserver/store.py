"""In-memory object store with one global resourceVersion, an event log and watch fan-out.

Every mutation is synchronous (no awaits), so within the single event loop each write is atomic.
Stored objects are never mutated after they are stored: writers build a new dict and commit it,
which lets readers and watchers share references safely.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .selectors import FieldRequirement, LabelSelector, fields_match, labels_match

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped


def storage_key(key: ObjKey) -> str:
    """The object's place in storage order: ``<namespace>/<name>`` compared as one string, so
    ``t-x-b/a`` sorts before ``t-x/z`` (``-`` < ``/``), as etcd keys do."""
    return f"{key[0]}/{key[1]}"


#: The ``encoded`` form of an object sent as it is stored (a read's or write's response body, and a
#: watch event's object when it carries its kind and apiVersion): the same bytes for both.
OBJECT_FORM = "object"

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


def clone(obj: Any) -> Any:
    """A deep copy of JSON data (a msgspec round trip is several times faster than deepcopy)."""
    return _dec.decode(_enc.encode(obj))


@dataclass
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str  # ResourceType.key
    namespace: str
    name: str
    obj: Obj  # state after the write; for DELETED the last state stamped with the deletion RV
    prev: Obj | None  # stored state before the write
    at: float = 0.0  # monotonic commit time, for the watch lag knob


@dataclass
class WatchFilter:
    resource: str
    namespace: str | None
    labels: LabelSelector = field(default_factory=LabelSelector)
    fields: list[FieldRequirement] = field(default_factory=list)

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and (obj.get("metadata") or {}).get("namespace", "") != self.namespace:
            return False
        return labels_match(self.labels, obj) and fields_match(self.fields, obj)


class Watcher:
    """One open watch: a filter and a bounded queue of events already translated for it."""

    def __init__(self, flt: WatchFilter, max_pending: int, after_rv: int = 0) -> None:
        self.filter = flt
        self.after_rv = after_rv  # events at or before this RV are not for this watcher
        self.pending: deque[Event] = deque()
        self.max_pending = max_pending
        self.wakeup = asyncio.Event()
        self.closed_reason: str | None = None

    def push(self, ev: Event) -> None:
        if self.closed_reason:
            return
        if len(self.pending) >= self.max_pending:
            # A real server closes a watch whose buffer is full; the client re-watches.
            self.closed_reason = "slow consumer"
            self.pending.clear()
        else:
            self.pending.append(ev)
        self.wakeup.set()

    def close(self, reason: str) -> None:
        self.closed_reason = reason
        self.wakeup.set()

    def offer(self, ev: Event) -> None:
        """Translate a store event into what this watcher sees (selector transitions)."""
        if ev.resource != self.filter.resource or ev.rv <= self.after_rv:
            return
        now_in = ev.type != "DELETED" and self.filter.matches(ev.obj)
        was_in = self.filter.matches(ev.prev) if ev.prev is not None else False
        if ev.type == "DELETED":
            if was_in:
                self.push(ev)
        elif ev.type == "ADDED":
            if now_in:
                self.push(ev)
        elif now_in and was_in:
            self.push(ev)
        elif now_in:
            self.push(Event(ev.rv, "ADDED", ev.resource, ev.namespace, ev.name, ev.obj, ev.prev, ev.at))
        elif was_in:
            gone = clone(ev.prev)
            gone.setdefault("metadata", {})["resourceVersion"] = str(ev.rv)
            self.push(Event(ev.rv, "DELETED", ev.resource, ev.namespace, ev.name, gone, ev.prev, ev.at))


@dataclass
class WatchWindow:
    """What a watch of one resource can start from, like the API server's per-resource watch
    cache: the RV the window opened at, then a sliding history of that resource's events."""

    start_rv: int
    events: deque[tuple[int, float]] = field(default_factory=deque)  # (rv, commit time), oldest first
    evicted: bool = False

    def oldest_start(self) -> int:
        """The oldest RV a watch may start from (the cache's ``oldest - 1``)."""
        if self.evicted and self.events:
            return self.events[0][0] - 1
        return self.start_rv


class Store:
    def __init__(
        self,
        history: int = 20000,
        max_pending_per_watch: int = 100_000,
        watch_history_seconds: float = 75.0,
        watch_history_min_events: int = 100,
    ) -> None:
        self.rv = 1  # a fresh etcd starts above zero; "0" means "any" to clients
        self.objects: dict[str, dict[ObjKey, Obj]] = {}
        self._sorted_keys: dict[str, list[ObjKey]] = {}  # per resource; dropped on create/delete
        # Names per (resource, namespace), so a namespace's list or watch walks that namespace only;
        # their sorted keys are cached like _sorted_keys, dropped on a create/delete in the namespace.
        self._names_in_ns: dict[tuple[str, str], set[str]] = {}
        self._sorted_ns_keys: dict[tuple[str, str], list[ObjKey]] = {}
        # Encoded forms of stored objects, per (resource, form): computed once per stored version
        # (stored objects are immutable), so a list or a watch costs what it sends, not a re-encode.
        self._encoded: dict[tuple[str, str], dict[ObjKey, tuple[Obj, bytes]]] = {}
        self.log: deque[Event] = deque(maxlen=history)
        self.compacted_rv = 0  # events with rv <= this are no longer replayable
        self.watchers: set[Watcher] = set()
        # The same watchers by resource: a commit is offered only to its resource's watchers.
        self._watchers_by_resource: dict[str, set[Watcher]] = {}
        self.on_commit: list[Callable[[Event], None]] = []
        self.max_pending_per_watch = max_pending_per_watch
        # Watch windows per resource: an event stays replayable while it is younger than
        # watch_history_seconds or among the newest watch_history_min_events of its resource.
        self.windows: dict[str, WatchWindow] = {}
        self.watch_history_seconds = watch_history_seconds
        self.watch_history_min_events = watch_history_min_events
        self._rv_waiters: list[tuple[int, asyncio.Event]] = []

    # --- reads ---------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        return self.objects.get(resource, {}).get((namespace, name))

    def items(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Objects of one resource (optionally one namespace) in key order (namespace, name)."""
        if namespace is None:
            bucket = self.objects.get(resource, {})
            keys = self._sorted_keys.get(resource)
            if keys is None:
                keys = self._sorted_keys[resource] = sorted(bucket, key=storage_key)
            return [bucket[k] for k in keys]
        # One namespace: storage order within it is name order.
        slot = (resource, namespace)
        keys = self._sorted_ns_keys.get(slot)
        if keys is None:
            keys = self._sorted_ns_keys[slot] = [(namespace, n) for n in sorted(self._names_in_ns.get(slot, ()))]
        bucket = self.objects.get(resource, {})
        return [bucket[k] for k in keys]

    def encoded(self, resource: str, form: str, obj: Obj, encode: Callable[[Obj], bytes]) -> bytes:
        """``encode(obj)``, cached while ``obj`` is the stored version of its key. ``form`` names
        the encoding (one ``encode`` per resource and form)."""
        m = obj["metadata"]
        key = (m.get("namespace", ""), m["name"])
        cache = self._encoded.setdefault((resource, form), {})
        hit = cache.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        data = encode(obj)
        if self.objects.get(resource, {}).get(key) is obj:
            cache[key] = (obj, data)
        return data

    def all_objects(self) -> list[tuple[str, Obj]]:
        return [(res, obj) for res, bucket in self.objects.items() for obj in bucket.values()]

    def snapshot_at(self, resource: str, rv: int) -> dict[ObjKey, Obj]:
        """The objects of one resource as they were at ``rv`` (undoing later events)."""
        current = dict(self.objects.get(resource, {}))
        for ev in reversed(self.log):
            if ev.rv <= rv:
                break
            if ev.resource != resource:
                continue
            key = (ev.namespace, ev.name)
            if ev.type == "ADDED":
                current.pop(key, None)
            elif ev.prev is not None:
                current[key] = ev.prev
        return current

    def oldest_replayable(self) -> int:
        """The smallest RV from which a watch or continue token can still resume."""
        first = self.log[0].rv - 1 if self.log else self.rv
        return max(first, self.compacted_rv)

    def events_after(self, rv: int) -> list[Event]:
        return [ev for ev in self.log if ev.rv > rv]

    async def wait_for_rv(self, rv: int, timeout: float) -> bool:
        """Wait until the store's RV reaches ``rv`` (at most ``timeout`` seconds)."""
        if rv <= self.rv:
            return True
        waiter = (rv, asyncio.Event())
        self._rv_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter[1].wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self._rv_waiters.remove(waiter)
        return True

    def open_window(self, resource: str) -> None:
        """Start a resource's watch history at the current RV (the server began serving it)."""
        self.windows[resource] = WatchWindow(self.rv)

    def close_window(self, resource: str) -> None:
        self.windows.pop(resource, None)

    def oldest_watch_start(self, resource: str) -> int:
        """The smallest RV a watch of ``resource`` can start from; older ones get 410."""
        window = self.windows.get(resource)
        bound = window.oldest_start() if window is not None else 0
        return max(bound, self.oldest_replayable())

    def add_watcher(self, watcher: Watcher) -> None:
        self.watchers.add(watcher)
        self._watchers_by_resource.setdefault(watcher.filter.resource, set()).add(watcher)

    def remove_watcher(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)
        same = self._watchers_by_resource.get(watcher.filter.resource)
        if same is not None:
            same.discard(watcher)
            if not same:
                del self._watchers_by_resource[watcher.filter.resource]

    # --- writes --------------------------------------------------------------------------

    def _commit(self, type_: str, resource: str, namespace: str, name: str, obj: Obj, prev: Obj | None) -> Event:
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.rv)
        ev = Event(self.rv, type_, resource, namespace, name, obj, prev, time.monotonic())
        if self.log.maxlen is not None and len(self.log) == self.log.maxlen:
            self.compacted_rv = max(self.compacted_rv, self.log[0].rv)
        self.log.append(ev)
        window = self.windows.get(resource)
        if window is not None:
            window.events.append((ev.rv, ev.at))
            keep = max(self.watch_history_min_events, 1)
            while len(window.events) > keep and ev.at - window.events[0][1] > self.watch_history_seconds:
                window.events.popleft()
                window.evicted = True
        if self._rv_waiters:
            for rv, reached in self._rv_waiters:
                if rv <= self.rv:
                    reached.set()
        watchers = self._watchers_by_resource.get(resource)
        if watchers:
            for w in list(watchers):
                w.offer(ev)
        for hook in self.on_commit:
            hook(ev)
        return ev

    def _keys_changed(self, resource: str, namespace: str) -> None:
        self._sorted_keys.pop(resource, None)
        self._sorted_ns_keys.pop((resource, namespace), None)

    def put_new(self, resource: str, obj: Obj) -> Event:
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        self.objects.setdefault(resource, {})[(ns, name)] = obj
        self._keys_changed(resource, ns)
        self._names_in_ns.setdefault((resource, ns), set()).add(name)
        return self._commit("ADDED", resource, ns, name, obj, None)

    def replace(self, resource: str, obj: Obj) -> Event:
        meta = obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        bucket = self.objects.setdefault(resource, {})
        prev = bucket.get((ns, name))
        bucket[(ns, name)] = obj
        return self._commit("MODIFIED", resource, ns, name, obj, prev)

    def remove(self, resource: str, namespace: str, name: str) -> Event:
        bucket = self.objects.get(resource, {})
        prev = bucket.pop((namespace, name))
        self._keys_changed(resource, namespace)
        names = self._names_in_ns.get((resource, namespace))
        if names is not None:
            names.discard(name)
            if not names:
                del self._names_in_ns[(resource, namespace)]
        for (res, _), cache in self._encoded.items():
            if res == resource:
                cache.pop((namespace, name), None)
        last = clone(prev)
        return self._commit("DELETED", resource, namespace, name, last, prev)

    def drop_resource(self, resource: str) -> list[Obj]:
        """Forget every object of a resource (its CRD was deleted), emitting DELETED events."""
        gone = []
        for ns, name in sorted(self.objects.get(resource, {})):
            gone.append(self.remove(resource, ns, name).obj)
        self.objects.pop(resource, None)
        self._sorted_keys.pop(resource, None)
        return gone

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to ``rv`` (default: everything): older watches/continues get 410."""
        upto = self.rv if rv is None else min(rv, self.rv)
        while self.log and self.log[0].rv <= upto:
            self.log.popleft()
        self.compacted_rv = max(self.compacted_rv, upto)
        return self.compacted_rv

    def count(self) -> int:
        return sum(len(b) for b in self.objects.values())
