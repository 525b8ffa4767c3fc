"""Watch streams: one JSON event per line over a chunked 200 response.

Start points follow the server: no RV (or "0") → synthetic ADDED for current objects, then live
events; RV N → every later event in RV order; N older than the resource's watch history → one
ERROR 410 event; N in the future → the stream stays open and delivers events once the store gets
past N. Bookmarks (when allowed) come shortly before the deadline and every bookmark interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from . import discovery, watchlist
from .errors import ApiError
from .resources import ResourceType
from .store import OBJECT_FORM, Event, Obj, Store, Watcher, WatchFilter

if TYPE_CHECKING:
    from .server import Emulator

_enc = msgspec.json.Encoder()
WATCH_BATCH = 256  # events written to a watch stream at once, at most


@dataclass
class WatchRequest:
    rt: ResourceType
    namespace: str | None
    flt: WatchFilter
    resource_version: str
    timeout_seconds: float | None
    bookmarks: bool
    table: bool
    include_object: str
    send_initial_events: bool | None = None  # set: a streaming list (WatchList), see watchlist.py


def _status_event(err: ApiError) -> bytes:
    return _enc.encode({"type": "ERROR", "object": err.status_body()}) + b"\n"


async def serve_watch(
    request: web.BaseRequest, emu: Emulator, wr: WatchRequest, drop_after: int | None
) -> web.StreamResponse:
    store = emu.store
    rt = wr.rt
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
    )
    resp.enable_chunked_encoding()
    await resp.prepare(request)  # headers go out before the first event, as the real server does

    watcher = Watcher(wr.flt, store.max_pending_per_watch)
    rv_text = wr.resource_version
    if wr.send_initial_events is not None:
        # A streaming list: resourceVersionMatch=NotOlderThan, so an old RV is fine (the current
        # state is newer) and a future one waits for the store like any watch.
        if (
            rv_text not in ("", "0")
            and int(rv_text) > store.rv
            and not await _stream_caught_up(resp, store, int(rv_text))
        ):
            return resp
        if wr.send_initial_events:
            _queue_current_state(watcher, store, wr)
            if wr.bookmarks:
                end = watchlist.initial_events_end_bookmark(rt.kind, rt.api_version, store.rv)
                watcher.pending.append(Event(store.rv, "BOOKMARK", rt.key, "", "", end, None, 0.0))
    elif rv_text in ("", "0"):
        _queue_current_state(watcher, store, wr)
    else:
        start = int(rv_text)
        oldest = store.oldest_watch_start(rt.key)
        if start < oldest:
            await resp.write(_status_event(ApiError(410, "Expired", f"too old resource version: {start} ({oldest})")))
            return resp
        watcher.after_rv = start  # a future RV: nothing is sent until the store gets past it
        for ev in store.events_after(start):
            watcher.offer(ev)
    store.add_watcher(watcher)
    emu.open_watches.add(watcher)
    counts = emu.watch_counts.setdefault(rt.plural, [0, 0, 0, 0])
    counts[0] += 1
    if watcher.pending:
        watcher.wakeup.set()

    timeout = wr.timeout_seconds if wr.timeout_seconds is not None else random.uniform(1800, 3600)
    deadline = time.monotonic() + timeout
    bookmark_due = _next_bookmark(time.monotonic(), deadline, emu.settings.bookmark_interval_seconds)
    sent = 0
    try:
        while True:
            if drop_after is not None and sent >= drop_after:
                _abort(request)  # an injected drop: the connection dies mid-stream
                break
            if watcher.closed_reason:
                if watcher.closed_reason in ("cut", "slow consumer"):
                    _abort(request)
                break
            now = time.monotonic()
            if now >= deadline:
                break
            if wr.bookmarks and bookmark_due is not None and now >= bookmark_due:
                if store.rv >= watcher.after_rv:  # never a bookmark before the watch's start
                    await _write_bookmark(resp, rt, store.rv)
                bookmark_due = _next_bookmark(now, deadline, emu.settings.bookmark_interval_seconds)
                continue
            if not watcher.pending:
                wait = deadline - now
                if wr.bookmarks and bookmark_due is not None:
                    wait = min(wait, bookmark_due - now)
                if request.transport is None or request.transport.is_closing():
                    break  # the client went away
                watcher.wakeup.clear()
                # Wake at least every 5 s to notice a client that disconnected.
                with contextlib.suppress(TimeoutError):
                    # asyncio.timeout, not wait_for: no task per wait (issue 10: CPU per event).
                    async with asyncio.timeout(min(max(wait, 0.001), 5.0)):
                        await watcher.wakeup.wait()
                continue
            ev = watcher.pending[0]
            lag = emu.settings.watch_lag_seconds
            if lag > 0 and ev.at:
                due = ev.at + lag - time.monotonic()
                if due > 0:
                    await asyncio.sleep(min(due, max(deadline - time.monotonic(), 0)))  # the lag knob delays delivery
                    continue
            # The events waiting go out in one write (issue 10: a write per event was the emulator's
            # largest single cost in a burst); the same lines, fewer chunks. With a lag knob, or up
            # to an injected drop, one at a time as before.
            limit = 1 if lag > 0 else WATCH_BATCH
            if drop_after is not None:
                limit = min(limit, drop_after - sent)
            lines: list[bytes] = []
            while watcher.pending and len(lines) < limit:
                lines.append(_encode_event(watcher.pending.popleft(), wr, emu.api.store))
            chunk = lines[0] if len(lines) == 1 else b"".join(lines)
            await resp.write(chunk)
            sent += len(lines)
            counts = emu.watch_counts.setdefault(rt.plural, [0, 0, 0, 0])  # cleared: counted afresh
            counts[1] += len(lines)
            counts[2] += 1
            counts[3] += len(chunk)
    except ConnectionResetError:
        return resp  # the client went away mid-write
    finally:
        store.remove_watcher(watcher)
        emu.open_watches.discard(watcher)
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await resp.write_eof()
    return resp


def _next_bookmark(now: float, deadline: float, interval: float) -> float | None:
    """When the next bookmark is due, as the watch cache schedules it: every ``interval`` (0 =
    never periodically) but no later than 2 s before the deadline; None once that moment has
    passed, so a watch of 2 s or less gets none."""
    due = now + interval if interval > 0 else deadline
    due = min(due, deadline - 2.0)
    return due if due >= now else None


def _queue_current_state(watcher: Watcher, store: Store, wr: WatchRequest) -> None:
    """Synthetic ADDED events for the matching objects, in key order, each with its own RV."""
    for obj in store.items(wr.rt.key, wr.flt.namespace):
        if wr.flt.matches(obj):
            m = obj["metadata"]
            ev = Event(
                int(m.get("resourceVersion") or 0), "ADDED", wr.rt.key, m.get("namespace", ""), m["name"], obj, None
            )
            watcher.pending.append(ev)


async def _stream_caught_up(resp: web.StreamResponse, store: Store, start: int) -> bool:
    """Wait up to 3 s (as the real cacher) for the store to reach ``start``; else send the
    504 "Too large resource version" ERROR event and report False."""
    deadline = time.monotonic() + 3.0
    while store.rv < start and time.monotonic() < deadline:  # noqa: ASYNC110 - no commit hook to wait on
        await asyncio.sleep(0.05)  # polling the store's RV with a bound, as the cacher does
    if store.rv >= start:
        return True
    err = ApiError(
        504, "Timeout", f"Timeout: Too large resource version: {start}, current: {store.rv}", retry_after_seconds=1
    )
    await resp.write(_status_event(err))
    return False


def _abort(request: web.BaseRequest) -> None:
    """Cut the connection without ending the chunked body: the client sees a broken stream."""
    if request.transport is not None:
        request.transport.close()


async def _write_bookmark(resp: web.StreamResponse, rt: ResourceType, rv: int) -> None:
    obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(rv)}}
    await resp.write(_enc.encode({"type": "BOOKMARK", "object": obj}) + b"\n")


def _encode_event(ev: Event, wr: WatchRequest, store: Store | None = None) -> bytes:
    if store is not None and not wr.table and ev.type in ("ADDED", "MODIFIED"):
        # The stored version's encoding is shared by every watcher (and computed once).
        if "kind" in ev.obj and "apiVersion" in ev.obj:  # as the write's response sent it: encoded once
            body = store.encoded(wr.rt.key, OBJECT_FORM, ev.obj, _enc.encode)
        else:
            body = store.encoded(
                wr.rt.key, f"watch-object {wr.rt.api_version}", ev.obj, lambda o: _encode_with_type(o, wr)
            )
        return b'{"type":"' + ev.type.encode() + b'","object":' + body + b"}\n"
    obj: Obj | dict[str, Any] = ev.obj
    if "kind" not in obj or "apiVersion" not in obj:
        obj = {"kind": wr.rt.kind, "apiVersion": wr.rt.api_version, **obj}
    if wr.table and ev.type != "BOOKMARK":
        meta = {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion", "")}
        obj = discovery.to_table(wr.rt, [obj], meta, wr.include_object)
    return _enc.encode({"type": ev.type, "object": obj}) + b"\n"


def _encode_with_type(obj: Obj, wr: WatchRequest) -> bytes:
    if "kind" not in obj or "apiVersion" not in obj:
        obj = {"kind": wr.rt.kind, "apiVersion": wr.rt.api_version, **obj}
    return _enc.encode(obj)
