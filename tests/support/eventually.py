"""The one way a test waits for something another task, process or server does: poll a condition
under a deadline, never sleep to synchronise (README "Tests, benchmarks, real clusters").

A condition on a remote server (an object gone, a session's poll in flight, a consumer settled)
cannot signal the test, so the helper polls it; where the code under test offers an event, wait on
that instead. This loop is the suite's only sanctioned poll: the ruff rule ASYNC110 (busy-wait
``while not cond: await sleep()``) holds everywhere else.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio

T = TypeVar("T")


# Two signatures, so that mypy infers T from an async predicate's awaited value (with one
# `Callable[[], T | Awaitable[T]]` it cannot pick T for a coroutine function).
@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
    describe: Callable[[], object] | None = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
    describe: Callable[[], object] | None = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], Any],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str = "condition",
    describe: Callable[[], object] | None = None,
) -> Any:
    """Call ``predicate`` (sync or async) every ``interval`` seconds until it returns something
    truthy and return that; after ``timeout`` seconds fail the test with an AssertionError naming
    ``what``, the predicate's last value and, when given, ``describe()`` (what the test saw).

    The deadline also bounds a predicate call that hangs. A TimeoutError the predicate raises
    itself propagates as it is: it is not mistaken for the deadline.
    """
    last: Any = None
    calls = 0
    with anyio.move_on_after(timeout) as scope:
        while True:
            calls += 1
            last = predicate()
            if inspect.isawaitable(last):
                last = await last
            if last:
                return last
            await anyio.sleep(interval)
    assert scope.cancelled_caught
    seen = f"; last seen: {describe()!r}" if describe is not None else ""
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} ({calls} checks); last value: {last!r}{seen}"
    ) from None
