"""Opening and closing the scale set's message session, recovering from a stale one.

The service allows one session per scale set. A listener that died without deleting its session
(SIGKILL, node loss) leaves it alive until the service expires it, and every create until then
answers 409 ``RunnerScaleSetSessionConflictException``; ARC's listener crash-loops on that.

runnerscale records every session it creates in a NATS KV bucket (``runnerscale_listener_sessions``,
key ``scaleset-<id>``; both named in :mod:`shared.bus.subjects`, the bucket created or checked by
the bus set-up with the others). On a 409 the lease holder (only it can get here) looks the record up:

* **take over**: the record names a session created by an earlier listener of this scale set;
  the new leader deletes that session by id (the admin API allows it) and creates its own at once;
* **wait**: no usable record (the old session was never recorded, or it belongs to somebody
  else, e.g. another cluster using the same scale set): back off with jitter and retry until the
  service expires the stale session, up to ``session.conflict_give_up_seconds``.

Each path logs which one it took.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from typing import Any

import anyio
import msgspec

from services.listener.metrics import ListenerMetrics
from shared.actions.errors import ActionsHTTPError, SessionConflictError, SessionNotFoundError
from shared.backoff import Backoff
from shared.bus import Bus
from shared.bus.subjects import SESSIONS_BUCKET, listener_session_key
from shared.listener_config import SessionSettings
from shared.log import get_logger

log = get_logger(__name__)

__all__ = [
    "SESSIONS_BUCKET",
    "ListenerGaveUp",
    "SessionRecord",
    "SessionRecords",
    "close_session",
    "open_session",
    "session_key",
]


class ListenerGaveUp(Exception):
    """The listener cannot do its job and stops (non-zero exit); the pod's owner recreates it."""


class SessionRecord(msgspec.Struct, rename="camel", kw_only=True, frozen=True):
    """The session a listener created for a scale set; lets its successor take the slot over."""

    scale_set_id: int
    session_id: str
    owner_name: str
    listener_epoch: int
    created: dt.datetime


session_key = listener_session_key  # the key naming lives in shared.bus.subjects


class SessionRecords:
    """The KV bucket of session records. ``Bus.connect`` creates or checks it at start-up with
    the other buckets; if that was skipped, :meth:`Bus.key_value` does it on first use.

    Failures here never stop the listener: a missing record only means a 409 is waited out
    instead of taken over, so every error is logged and swallowed.
    """

    def __init__(self, bus: Bus, *, timeout: float = 5.0) -> None:
        self._bus = bus
        self._timeout = timeout

    async def get(self, scale_set_id: int) -> SessionRecord | None:
        try:
            with anyio.fail_after(self._timeout * 2):
                value = await self._bus.kv_get(SESSIONS_BUCKET, session_key(scale_set_id))
        except Exception as exc:
            log.warning("cannot read the session record", scale_set_id=scale_set_id, error=type(exc).__name__)
            return None
        if not value:
            return None
        try:
            return msgspec.json.decode(value, type=SessionRecord)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring a malformed session record", scale_set_id=scale_set_id, error=str(exc))
            return None

    async def put(self, record: SessionRecord) -> None:
        try:
            with anyio.fail_after(self._timeout * 2):
                await self._bus.kv_put(SESSIONS_BUCKET, session_key(record.scale_set_id), msgspec.json.encode(record))
        except Exception as exc:
            log.warning("cannot record the session", scale_set_id=record.scale_set_id, error=type(exc).__name__)

    async def clear(self, scale_set_id: int, session_id: str) -> None:
        """Forget the record if it still names ``session_id`` (a successor may have replaced it)."""
        current = await self.get(scale_set_id)
        if current is None or current.session_id != session_id:
            return
        try:
            with anyio.fail_after(self._timeout * 2):
                await self._bus.kv_delete(SESSIONS_BUCKET, session_key(scale_set_id))
        except Exception as exc:
            log.warning("cannot clear the session record", scale_set_id=scale_set_id, error=type(exc).__name__)


def conflict_backoff(attempt: int, settings: SessionSettings, *, rand: random.Random | None = None) -> float:
    """Exponential from the initial wait, capped, with +-20% jitter so replicas do not align."""
    backoff = Backoff(base=settings.conflict_backoff_initial_seconds, cap=settings.conflict_backoff_max_seconds)
    return backoff.jittered(attempt, 0.8, 1.2, rand)


async def open_session(
    client: Any,
    *,
    scale_set_id: int,
    owner: str,
    epoch: int,
    records: SessionRecords,
    settings: SessionSettings,
    metrics: ListenerMetrics,
    on_wait: Any = None,
) -> Any:
    """Create the message session, taking over or waiting out a stale one (see module doc)."""
    give_up_at = time.monotonic() + settings.conflict_give_up_seconds
    taken_over: set[str] = set()
    attempt = 0
    while True:
        try:
            session = await client.create_message_session(scale_set_id, owner)
        except SessionConflictError:
            metrics.record_session_conflict()
            stale = await records.get(scale_set_id)
            if stale is not None and stale.session_id not in taken_over:
                taken_over.add(stale.session_id)
                log.warning(
                    "session conflict: taking over the stale session recorded by an earlier listener",
                    scale_set_id=scale_set_id,
                    stale_session_id=stale.session_id,
                    stale_owner=stale.owner_name,
                )
                try:
                    await client.delete_message_session(scale_set_id, stale.session_id)
                except SessionNotFoundError:
                    pass  # already expired: the next create should succeed
                except ActionsHTTPError as exc:
                    log.warning("could not delete the stale session", stale_session_id=stale.session_id, error=str(exc))
                continue
            if time.monotonic() >= give_up_at:
                raise ListenerGaveUp(
                    f"scale set {scale_set_id} still has another active session after "
                    f"{settings.conflict_give_up_seconds:.0f}s"
                ) from None
            wait = conflict_backoff(attempt, settings)
            attempt += 1
            log.warning(
                "session conflict: another session is active and not ours to take over; waiting for it to expire",
                scale_set_id=scale_set_id,
                retry_in=round(wait, 1),
            )
            if on_wait is not None:
                on_wait()
            await anyio.sleep(wait)  # backoff between attempts, not synchronisation
            continue
        await records.put(
            SessionRecord(
                scale_set_id=scale_set_id,
                session_id=session.session_id,
                owner_name=owner,
                listener_epoch=epoch,
                created=dt.datetime.now(dt.UTC),
            )
        )
        log.info("message session created", scale_set_id=scale_set_id, session_id=session.session_id, owner=owner)
        return session


async def close_session(
    client: Any, *, scale_set_id: int, session_id: str, records: SessionRecords, timeout: float = 10.0
) -> None:
    """Delete the session (shielded: runs during cancellation too) and forget its record."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(timeout) as scope:
        try:
            await client.delete_message_session(scale_set_id, session_id)
            log.info("message session deleted", scale_set_id=scale_set_id, session_id=session_id)
        except SessionNotFoundError:
            log.info("message session was already gone", scale_set_id=scale_set_id, session_id=session_id)
        except Exception as exc:
            log.warning(
                "could not delete the message session", scale_set_id=scale_set_id, session_id=session_id, error=str(exc)
            )
            return
        await records.clear(scale_set_id, session_id)
    if scope.cancelled_caught:
        log.warning("deleting the message session timed out", scale_set_id=scale_set_id, session_id=session_id)
