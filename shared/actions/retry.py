"""The reference client's retry policy as pure functions (README "Actions service client").

go-retryablehttp semantics: up to ``max_retries`` retries after the first attempt; retry on a
transport error, on 429 and on every 5xx except 501; wait ``min(base * 2**attempt, max)``
(1, 2, 4, 8 s by default) unless a 429/503 carries ``Retry-After``, which replaces the computed
wait. The runner-registration exchange (G3) additionally retries 401 and 403.
"""

from __future__ import annotations

import datetime as dt
import email.utils

import msgspec

from shared.backoff import Backoff

__all__ = ["RetryPolicy", "backoff_delay", "parse_retry_after", "should_retry_status"]


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Retry knobs. Defaults are the reference client's."""

    max_retries: int = 4
    backoff_base: float = 1.0  # seconds; the first retry waits this long
    backoff_max: float = 30.0  # cap of the exponential wait
    # A Retry-After beyond this is not honoured by waiting: the call fails with RateLimitedError
    # carrying the hint, so the caller (with its own schedule) decides. Also bounded by the deadline.
    retry_after_max: float = 120.0


def should_retry_status(status: int, *, extra: frozenset[int] = frozenset()) -> bool:
    """Whether a response with ``status`` is worth another attempt."""
    if status in extra:
        return True
    if status == 429:
        return True
    if status == 0:
        return True
    return 500 <= status <= 599 and status != 501


def parse_retry_after(value: str | None, *, now: dt.datetime | None = None) -> float | None:
    """``Retry-After`` as seconds from now: an integer, or an HTTP date. ``None`` if absent or
    unparseable (then the computed backoff applies)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    current = now or dt.datetime.now(dt.UTC)
    return max(0.0, (when - current).total_seconds())


def backoff_delay(attempt: int, policy: RetryPolicy, *, status: int = 0, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
    if status in (429, 503) and retry_after is not None:
        return retry_after
    return Backoff(base=policy.backoff_base, cap=policy.backoff_max).delay(attempt)
