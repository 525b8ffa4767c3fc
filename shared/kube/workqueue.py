"""A keyed work queue with client-go's semantics, for one event loop.

- De-duplicating: a key waiting in the queue is there once, however often it is added.
- One at a time: a key handed out by :meth:`get` is not handed out again until :meth:`done`;
  if it was re-added meanwhile it is queued again at ``done`` (processed after, never concurrently).
- Delays: :meth:`add_after` (``requeue_after``) and :meth:`add_rate_limited` (per-key exponential
  backoff, capped; :meth:`forget` resets it). Delayed keys are promoted inside :meth:`get`, so the
  queue needs no background task.
- :meth:`shutdown`: waiting and later ``get`` calls raise :class:`QueueShutDown`.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import anyio

from shared.backoff import Backoff

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """The queue was shut down; workers should exit."""


class WorkQueue(Generic[K]):
    def __init__(
        self, *, base_delay: float = 0.005, max_delay: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._backoff = Backoff(base=base_delay, cap=max_delay)
        self._clock = clock
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # waiting to be processed (queued, or re-added while processing)
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []  # heap of (due, seq, key)
        self._delayed_due: dict[K, float] = {}  # earliest due time per delayed key
        self._seq = 0
        self._failures: dict[K, int] = {}
        self._shutdown = False
        self._changed = anyio.Event()

    # --- inspection --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys ready to be handed out (the queue depth)."""
        return len(self._queue)

    @property
    def delayed(self) -> int:
        return len(self._delayed_due)

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    @property
    def is_shut_down(self) -> bool:
        return self._shutdown

    # --- adding ------------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def add(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._notify()

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds (an earlier pending due time wins)."""
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        due = self._clock() + delay
        current = self._delayed_due.get(key)
        if current is not None and current <= due:
            return
        self._delayed_due[key] = due
        self._seq += 1
        heapq.heappush(self._delayed, (due, self._seq, key))
        self._notify()

    requeue_after = add_after

    def next_backoff(self, key: K) -> float:
        """Count one more failure of ``key`` and return the delay it has earned (no scheduling)."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return self._backoff.delay(failures)

    def add_rate_limited(self, key: K, *, at_least: float = 0.0) -> float:
        """Add ``key`` after its backoff delay (doubling with each call until :meth:`forget`), or
        after ``at_least`` seconds if that is longer (a server's Retry-After)."""
        delay = max(self.next_backoff(key), at_least)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset the key's backoff (after a successful reconcile)."""
        self._failures.pop(key, None)

    def _promote_due(self) -> float | None:
        """Move due delayed keys into the queue; return seconds until the next one (None: none)."""
        now = self._clock()
        while self._delayed:
            due, _, key = self._delayed[0]
            if self._delayed_due.get(key) != due:
                heapq.heappop(self._delayed)  # superseded by an earlier due time
                continue
            if due > now:
                return due - now
            heapq.heappop(self._delayed)
            del self._delayed_due[key]
            self.add(key)
        return None

    # --- taking ------------------------------------------------------------------------------------

    async def get(self) -> K:
        """The next key to process (waits); call :meth:`done` with it afterwards."""
        while True:
            if self._shutdown:
                raise QueueShutDown()
            wait = self._promote_due()
            if self._queue:
                key = self._queue.popleft()
                self._processing.add(key)
                self._dirty.discard(key)
                return key
            changed = self._changed
            if wait is None:
                await changed.wait()
            else:
                with anyio.move_on_after(wait):
                    await changed.wait()

    def done(self, key: K) -> None:
        """Processing of ``key`` finished; if it was re-added meanwhile, queue it again."""
        self._processing.discard(key)
        if key in self._dirty and not self._shutdown:
            self._queue.append(key)
            self._notify()

    def shutdown(self) -> None:
        self._shutdown = True
        self._notify()
