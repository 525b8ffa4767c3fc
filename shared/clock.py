"""One clock type for every worker: wall time for what goes into the API, monotonic time for waits.

Reconcilers take ``clock: Clock`` as a constructor argument (default :data:`SYSTEM_CLOCK`) and
pass ``clock.now()`` into their pure decisions, so tests move time with a :class:`ManualClock`
instead of patching anything.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware UTC wall time (timestamps written to objects, ages of objects)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (intervals inside this process)."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()


class ManualClock:
    """A clock that only moves when told to (:meth:`advance`): both readings move together."""

    def __init__(self, start: datetime | None = None, monotonic: float = 1000.0) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._monotonic = monotonic

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._monotonic += seconds
