"""Expectations (pure): what this replica wrote to a set's EphemeralRunners that its informer has
not observed yet (README "runner-set worker", reads from the cache).

The runner-set decides from its informer's cache, which lags the server. A decision taken on a
cache that does not yet show this replica's own creations would create again; one that does not
yet show its own deletions would delete again. As controller-runtime's and the ReplicaSet
controller's expectations, every creation (by uid) and deletion (by uid) this replica issued for
a set is remembered until the cache shows it: a created uid is observed once the cache holds it
(or reported it at all, even deleted), a deleted uid once the cache shows it deleting or gone.
While anything is outstanding the set does not scale from the cache; after ``timeout`` seconds
the set is read authoritatively instead (a watch that lost an event must not stall the set).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

#: Seconds an expectation may stay unobserved before the set is re-read through the API.
TIMEOUT = 15.0


@dataclass(frozen=True)
class Expectations:
    """Outstanding writes of one set. ``since``: monotonic time of the newest expectation."""

    creates: frozenset[str] = frozenset()
    deletes: frozenset[str] = frozenset()
    since: float = 0.0

    @property
    def pending(self) -> bool:
        return bool(self.creates or self.deletes)


NONE = Expectations()


class Verdict(StrEnum):
    SATISFIED = "satisfied"  # the cache shows every write: decide from it
    PENDING = "pending"  # wait for the cache (the observing event wakes the set)
    EXPIRED = "expired"  # waited too long: read the set's runners through the API


def expect(e: Expectations, *, created: Iterable[str] = (), deleted: Iterable[str] = (), now: float) -> Expectations:
    """``e`` plus the uids just created / deleted (empty uids are ignored)."""
    c, d = frozenset(u for u in created if u), frozenset(u for u in deleted if u)
    if not c and not d:
        return e
    return Expectations(e.creates | c, e.deletes | d, now)


def observe(e: Expectations, uid: str, *, gone: bool, deleting: bool) -> Expectations:
    """``e`` after the informer reported ``uid`` (``gone``: a DELETED event; ``deleting``: it
    carries a deletionTimestamp). Any report of a created uid observes its creation."""
    creates = e.creates - {uid}
    deletes = e.deletes - {uid} if gone or deleting else e.deletes
    if creates is e.creates and deletes is e.deletes:
        return e
    return replace(e, creates=creates, deletes=deletes)


def settle(e: Expectations, cached: Mapping[str, bool]) -> Expectations:
    """``e`` checked against the cache (uid → deleting): catches an event that arrived before the
    write it observes was recorded."""
    creates = frozenset(u for u in e.creates if u not in cached)
    deletes = frozenset(u for u in e.deletes if cached.get(u) is False)
    if creates == e.creates and deletes == e.deletes:
        return e
    return replace(e, creates=creates, deletes=deletes)


def check(e: Expectations, now: float, timeout: float = TIMEOUT) -> tuple[Verdict, float]:
    """The verdict, and for PENDING the seconds left before it expires."""
    if not e.pending:
        return Verdict.SATISFIED, 0.0
    left = e.since + timeout - now
    return (Verdict.PENDING, left) if left > 0 else (Verdict.EXPIRED, 0.0)


def from_read(listed: Mapping[str, bool], cached: Mapping[str, bool], now: float) -> Expectations:
    """What the cache has yet to show of an authoritative read (uid → deleting on both sides):
    runners listed but not cached are outstanding creations; runners cached alive but listed
    deleting, or cached but not listed, are outstanding deletions."""
    creates = frozenset(u for u in listed if u not in cached)
    deletes = frozenset(u for u, deleting in cached.items() if not deleting and listed.get(u, True))
    return expect(NONE, created=creates, deleted=deletes, now=now)


__all__ = ["NONE", "TIMEOUT", "Expectations", "Verdict", "check", "expect", "from_read", "observe", "settle"]
