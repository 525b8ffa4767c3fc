"""The one exponential backoff of the project: ``base · 2**attempt``, capped, optionally jittered.

Every retry loop (work queue, informer re-list, bus publish and reconnect, Actions client
retries, listener session conflicts, listener pod restarts, the runner-set failure budget) asks
this type for its delay; only the attempt numbering and the jitter band differ per caller.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]

_MAX_EXPONENT = 64  # base * 2**64 is past any cap; avoids float overflow on huge attempt counts


@dataclass(frozen=True)
class Backoff:
    base: float
    cap: float

    def delay(self, attempt: int) -> float:
        """``base · 2**attempt``, at most ``cap``; ``attempt`` counts from 0 (the first retry waits ``base``)."""
        if attempt < 0:
            raise ValueError("attempt must be >= 0")
        if attempt > _MAX_EXPONENT:
            return self.cap
        return float(min(self.cap, self.base * 2**attempt))

    def jittered(self, attempt: int, low: float, high: float, rand: random.Random | None = None) -> float:
        """:meth:`delay` scaled by a uniform factor in ``[low, high]``, so replicas do not retry in step."""
        return self.delay(attempt) * (rand or random).uniform(low, high)
