"""``MessageSessionClient``: one message session of one scale set, with its token refresh.

The session's queue token is separate from the admin token. On a 401
from the queue (get, delete, acquire) the session is refreshed (``PATCH sessions/{id}``) and the
call retried once; a second 401 raises :class:`MessageQueueTokenExpiredError`. Beyond the
reference client, a queue token that is a JWT is also refreshed shortly before its ``exp``,
which saves the 401 round trip (garm does the same).

Closing deletes the session even when the caller is being cancelled (shielded, bounded), so a
graceful stop never leaves a session that blocks the next listener with 409s.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TypeVar

import anyio

from shared.actions.auth import jwt_expiry, needs_refresh
from shared.actions.client import ActionsClient
from shared.actions.errors import ActionsError, MessageQueueTokenExpiredError, SessionNotFoundError
from shared.actions.messages import Message
from shared.actions.models import MessageSession, ScaleSetStatistics
from shared.log import get_logger

__all__ = ["MessageSessionClient"]

log = get_logger(__name__)
_T = TypeVar("_T")

# Refresh a JWT queue token this long before it expires (garm uses ~10 min; any margin works).
_QUEUE_TOKEN_MARGIN_S = 120.0
# Deleting the session on close must not hang a shutdown.
_CLOSE_TIMEOUT_S = 15.0


class MessageSessionClient:
    """The listener's view of the service: poll, ack, acquire, all on one session.

    Create with :meth:`create` (new session) or the constructor (an existing session). Use as an
    async context manager so the session is deleted on exit.
    """

    def __init__(self, client: ActionsClient, scale_set_id: int, session: MessageSession) -> None:
        self._client = client
        self.scale_set_id = scale_set_id
        self._session = session
        self._generation = 0  # bumped per refresh, so concurrent 401s refresh only once
        self._lock = anyio.Lock()
        self._closed = False

    @classmethod
    async def create(
        cls, client: ActionsClient, scale_set_id: int, owner_name: str | None = None
    ) -> MessageSessionClient:
        """Create the session (S1). Raises :class:`SessionConflictError` if one is live."""
        session = await client.create_message_session(scale_set_id, owner_name)
        log.info(
            "message session created",
            scale_set_id=scale_set_id,
            session_id=session.session_id,
            owner=session.owner_name,
        )
        return cls(client, scale_set_id, session)

    @property
    def session(self) -> MessageSession:
        return self._session

    @property
    def statistics(self) -> ScaleSetStatistics | None:
        """The statistics that came with the session (create or latest refresh)."""
        return self._session.statistics

    async def __aenter__(self) -> MessageSessionClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def refresh(self, *, seen_generation: int | None = None) -> None:
        """S2. If ``seen_generation`` is given and another task refreshed since, do nothing."""
        async with self._lock:
            if seen_generation is not None and seen_generation != self._generation:
                return
            self._session = await self._client.refresh_message_session(self.scale_set_id, self._session.session_id)
            self._generation += 1
            log.info("message session refreshed", scale_set_id=self.scale_set_id, session_id=self._session.session_id)

    async def _with_token(self, call: Callable[[MessageSession], Awaitable[_T]]) -> _T:
        expires_at = jwt_expiry(self._session.message_queue_access_token)
        if expires_at is not None and needs_refresh(
            expires_at, now=dt.datetime.now(dt.UTC), margin=_QUEUE_TOKEN_MARGIN_S
        ):
            await self.refresh(seen_generation=self._generation)
        generation = self._generation
        try:
            return await call(self._session)
        except MessageQueueTokenExpiredError:
            log.info("message queue token rejected; refreshing the session", scale_set_id=self.scale_set_id)
        await self.refresh(seen_generation=generation)
        # A second 401 propagates as MessageQueueTokenExpiredError.
        return await call(self._session)

    async def get_message(self, last_message_id: int, max_capacity: int) -> Message | None:
        """Long-poll the next message after ``last_message_id``; ``None`` when nothing came."""
        return await self._with_token(lambda s: self._client.get_message(s, last_message_id, max_capacity))

    async def delete_message(self, message_id: int) -> None:
        await self._with_token(lambda s: self._client.delete_message(s, message_id))

    async def acquire_jobs(self, request_ids: Sequence[int]) -> list[int]:
        if not request_ids:
            return []
        return await self._with_token(lambda s: self._client.acquire_jobs(s, self.scale_set_id, request_ids))

    async def close(self) -> None:
        """Delete the session (S3); idempotent; never raises (a failure is logged)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT_S) as scope:
            try:
                await self._client.delete_message_session(self.scale_set_id, self._session.session_id)
                log.info("message session deleted", scale_set_id=self.scale_set_id, session_id=self._session.session_id)
            except SessionNotFoundError:
                pass  # already gone: that is what we wanted
            except ActionsError as exc:
                log.warning(
                    "message session delete failed; the service will expire it",
                    scale_set_id=self.scale_set_id,
                    session_id=self._session.session_id,
                    error=str(exc),
                )
        if scope.cancelled_caught:
            log.warning("message session delete timed out", scale_set_id=self.scale_set_id)
