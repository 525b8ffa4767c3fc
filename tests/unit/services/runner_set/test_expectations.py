"""Expectations of the runner-set (services/runner_set/expectations.py): what counts as observed,
when a set may be decided from the cache, when it is read through the API instead."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import pytest

from services.runner_set import expectations as xp
from services.runner_set.expectations import Expectations, Verdict

E = Expectations


@pytest.mark.parametrize(
    ("before", "created", "deleted", "now", "after"),
    [
        (xp.NONE, (), (), 5.0, xp.NONE),  # nothing written: nothing expected, time unchanged
        (xp.NONE, ("a",), (), 5.0, E(frozenset({"a"}), frozenset(), 5.0)),
        (xp.NONE, ("",), ("",), 5.0, xp.NONE),  # a write without a uid is not expected
        (E(frozenset({"a"}), frozenset(), 1.0), ("b",), ("x",), 2.0, E(frozenset({"a", "b"}), frozenset({"x"}), 2.0)),
    ],
)
def test_expect(
    before: Expectations, created: tuple[str, ...], deleted: tuple[str, ...], now: float, after: Expectations
) -> None:
    assert xp.expect(before, created=created, deleted=deleted, now=now) == after


BOTH = E(frozenset({"c"}), frozenset({"d"}), 1.0)


@pytest.mark.parametrize(
    ("uid", "gone", "deleting", "creates", "deletes"),
    [
        ("c", False, False, set(), {"d"}),  # ADDED/MODIFIED of a created runner
        ("c", True, False, set(), {"d"}),  # created and deleted before the cache held it: still observed
        ("d", False, False, {"c"}, {"d"}),  # a deleted runner still alive in the cache: not yet
        ("d", False, True, {"c"}, set()),  # ... carrying its deletionTimestamp: observed
        ("d", True, False, {"c"}, set()),  # ... gone: observed
        ("z", True, True, {"c"}, {"d"}),  # someone else's runner: nothing changes
    ],
)
def test_observe(uid: str, gone: bool, deleting: bool, creates: AbstractSet[str], deletes: AbstractSet[str]) -> None:
    after = xp.observe(BOTH, uid, gone=gone, deleting=deleting)
    assert (after.creates, after.deletes, after.since) == (creates, deletes, 1.0)


@pytest.mark.parametrize(
    ("cached", "creates", "deletes"),
    [
        ({}, {"c"}, set()),  # the deleted runner is not cached any more
        ({"c": False, "d": False}, set(), {"d"}),  # created one cached, deleted one still alive
        ({"c": False, "d": True}, set(), set()),  # deleted one shows its deletionTimestamp
    ],
)
def test_settle_against_cache(cached: dict[str, bool], creates: AbstractSet[str], deletes: AbstractSet[str]) -> None:
    after = xp.settle(BOTH, cached)
    assert (after.creates, after.deletes) == (creates, deletes)


@pytest.mark.parametrize(
    ("e", "now", "timeout", "verdict", "left"),
    [
        (xp.NONE, 100.0, 15.0, Verdict.SATISFIED, 0.0),
        (E(frozenset({"c"}), frozenset(), 10.0), 11.0, 15.0, Verdict.PENDING, 14.0),
        (E(frozenset(), frozenset({"d"}), 10.0), 24.5, 15.0, Verdict.PENDING, 0.5),
        (E(frozenset({"c"}), frozenset(), 10.0), 25.0, 15.0, Verdict.EXPIRED, 0.0),
        (E(frozenset({"c"}), frozenset(), 10.0), 10.0, 0.0, Verdict.EXPIRED, 0.0),
    ],
)
def test_check(e: Expectations, now: float, timeout: float, verdict: Verdict, left: float) -> None:
    assert xp.check(e, now, timeout) == (verdict, left)


@pytest.mark.parametrize(
    ("listed", "cached", "creates", "deletes"),
    [
        ({"a": False}, {"a": False}, set(), set()),  # the cache agrees
        ({"a": False, "b": False}, {"a": False}, {"b"}, set()),  # b not cached yet
        ({"a": True}, {"a": False}, set(), {"a"}),  # deleting on the server, alive in the cache
        ({}, {"a": False}, set(), {"a"}),  # gone on the server, alive in the cache
        ({}, {"a": True}, set(), set()),  # gone on the server, deleting in the cache: nothing to wait for
    ],
)
def test_from_read(
    listed: dict[str, bool], cached: dict[str, bool], creates: AbstractSet[str], deletes: AbstractSet[str]
) -> None:
    e = xp.from_read(listed, cached, 3.0)
    assert (e.creates, e.deletes) == (creates, deletes)
    assert e.since == (3.0 if e.pending else 0.0)
