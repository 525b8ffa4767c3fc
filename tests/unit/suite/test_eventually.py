"""The suite's one wait helper (tests/support/eventually.py)."""

from __future__ import annotations

import anyio
import pytest

from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio


async def test_returns_the_first_truthy_value_of_a_sync_or_async_predicate() -> None:
    calls = iter([0, None, "", "ready"])
    assert await eventually(lambda: next(calls), timeout=5, interval=0) == "ready"

    async def check() -> int:
        return 7

    assert await eventually(check, timeout=5) == 7


async def test_fails_after_the_deadline_naming_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError) as failure:
        await eventually(list, timeout=0.05, interval=0.01, what="the queue filled", describe=lambda: "seen")
    message = str(failure.value)
    assert "timed out after 0.05s waiting for the queue filled" in message
    assert "last value: []" in message and "last seen: 'seen'" in message


async def test_the_deadline_bounds_a_predicate_that_hangs() -> None:
    async def hangs() -> bool:
        await anyio.sleep(60)
        return True

    with pytest.raises(AssertionError, match=r"timed out after 0\.05s"):
        await eventually(hangs, timeout=0.05)


async def test_a_timeout_error_of_the_predicate_is_not_the_deadline() -> None:
    def raises() -> bool:
        raise TimeoutError("the client's own")

    with pytest.raises(TimeoutError, match="the client's own"):
        await eventually(raises, timeout=5)
