"""The listener's pure scaling decisions against ARC's scaler test table."""

from __future__ import annotations

import pytest

from services.listener.scaling import (
    MAX_PATCH_ID,
    ScalerState,
    decide,
    desired_runners,
    is_stale_message,
    mark_dirty,
    next_patch_seq,
)
from shared.listener_config import MAX_INT32

UNBOUNDED = MAX_INT32

# (min, max, steps, expected) where a step is (dirty_before, assigned_jobs) and an expectation is
# (patch_id, target, seq) after that step.
ARC_TABLE = [
    ("defaults idle", 0, UNBOUNDED, [(False, 0)], [(0, 0, 0)]),
    ("defaults first call with jobs", 0, UNBOUNDED, [(False, 1)], [(0, 1, 0)]),
    ("defaults completion then idle", 0, UNBOUNDED, [(False, 1), (True, 0)], [(0, 1, 0), (1, 0, 1)]),
    ("increment patch with same parameters", 0, UNBOUNDED, [(False, 1), (False, 1)], [(0, 1, 0), (1, 1, 1)]),
    ("dirty first call", 0, UNBOUNDED, [(True, 1)], [(0, 1, 0)]),
    ("dirty twice", 0, UNBOUNDED, [(True, 1), (True, 0)], [(0, 1, 0), (1, 0, 1)]),
    ("min 1 idle", 1, UNBOUNDED, [(False, 0)], [(0, 1, 0)]),
    ("min 1 scale down", 1, UNBOUNDED, [(False, 2), (True, 0)], [(0, 3, 0), (1, 1, 1)]),
    (
        "min 1 force 0 on empty batch at min",
        1,
        UNBOUNDED,
        [(False, 3), (True, 0), (False, 0)],
        [(0, 4, 0), (1, 1, 1), (0, 1, 2)],
    ),
    ("max 5 idle", 0, 5, [(False, 0)], [(0, 0, 0)]),
    ("max 5 down", 0, 5, [(False, 2), (True, 0)], [(0, 2, 0), (1, 0, 1)]),
    ("max 5 capped", 0, 5, [(False, 6)], [(0, 5, 0)]),
    ("max 5 at cap", 0, 5, [(False, 5)], [(0, 5, 0)]),
    ("max 5 up to cap", 0, 5, [(False, 1), (True, 6)], [(0, 1, 0), (1, 5, 1)]),
    ("max 5 cap then idle", 0, 5, [(False, 6), (True, 0)], [(0, 5, 0), (1, 0, 1)]),
    ("max 5 force 0", 0, 5, [(False, 3), (True, 0), (False, 0)], [(0, 3, 0), (1, 0, 1), (0, 0, 2)]),
    ("min 1 max 3 idle", 1, 3, [(False, 0)], [(0, 1, 0)]),
    ("min 1 max 3 over", 1, 3, [(False, 4)], [(0, 3, 0)]),
    ("min 1 max 3 at", 1, 3, [(False, 3)], [(0, 3, 0)]),
    ("min 1 max 3 down", 1, 3, [(False, 2), (True, 0)], [(0, 3, 0), (1, 1, 1)]),
    ("min 1 max 3 force 0", 1, 3, [(False, 3), (True, 0), (False, 0)], [(0, 3, 0), (1, 1, 1), (0, 1, 2)]),
]


@pytest.mark.parametrize(
    ("min_runners", "max_runners", "steps", "expected"), [r[1:] for r in ARC_TABLE], ids=[r[0] for r in ARC_TABLE]
)
def test_patch_sequence_matches_arc_scaler(
    min_runners: int, max_runners: int, steps: list[tuple[bool, int]], expected: list[tuple[int, int, int]]
) -> None:
    state = ScalerState()
    for (dirty, assigned), (want_patch, want_target, want_seq) in zip(steps, expected, strict=True):
        if dirty:
            state = mark_dirty(state)
        state, decision = decide(state, min_runners=min_runners, max_runners=max_runners, assigned_jobs=assigned)
        assert (decision.patch_id, decision.replicas, state.patch_seq) == (want_patch, want_target, want_seq)
        assert state.dirty is False


def test_sequence_wraps_after_int32_max_and_skips_zero() -> None:
    state = ScalerState(target=3, patch_seq=MAX_PATCH_ID - 2, dirty=False)
    ids = []
    for _ in range(4):
        state, decision = decide(mark_dirty(state), min_runners=0, max_runners=10, assigned_jobs=3)
        ids.append(decision.patch_id)
    assert ids == [MAX_PATCH_ID - 1, MAX_PATCH_ID, 1, 2]
    assert next_patch_seq(MAX_PATCH_ID) == 1


def test_idle_after_wrap_still_collapses_to_zero() -> None:
    state = ScalerState(target=0, patch_seq=MAX_PATCH_ID, dirty=False)
    state, decision = decide(state, min_runners=0, max_runners=10, assigned_jobs=0)
    assert (decision.patch_id, state.patch_seq) == (0, 1)


def test_restart_begins_again_at_patch_zero() -> None:
    # A new incarnation starts from a fresh state: its first decision is authoritative.
    _, decision = decide(ScalerState(), min_runners=2, max_runners=10, assigned_jobs=5)
    assert (decision.patch_id, decision.replicas) == (0, 7)


@pytest.mark.parametrize(
    ("min_runners", "max_runners", "assigned", "want"),
    [(0, UNBOUNDED, 7, 7), (2, 10, 3, 5), (2, 10, 30, 10), (0, 0, 4, 0), (3, 3, 0, 3), (1, 5, -2, 1)],
)
def test_desired_runners_is_min_plus_assigned_capped_at_max(
    min_runners: int, max_runners: int, assigned: int, want: int
) -> None:
    assert desired_runners(min_runners=min_runners, max_runners=max_runners, assigned_jobs=assigned) == want


def test_older_message_is_stale() -> None:
    assert is_stale_message(newest_seen_id=100000005, message_id=100000004)
    assert not is_stale_message(newest_seen_id=100000005, message_id=100000005)
    assert not is_stale_message(newest_seen_id=0, message_id=100000001)
