"""Small structured-concurrency helpers shared by the bus, the lease backends and the runtime."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio

__all__ = ["background_tasks"]


@asynccontextmanager
async def background_tasks(*tasks: Callable[[], Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
    """Run ``tasks`` beside the caller's block and cancel them when it ends.

    An exception from the block propagates as itself, not wrapped in an ExceptionGroup, so
    callers of ``Bus.connect`` / ``ShardOwnership.join`` can catch what they raised.
    """
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        for task in tasks:
            tg.start_soon(task)
        try:
            yield
        except Exception as exc:
            failure = exc
        finally:
            tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
