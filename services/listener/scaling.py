"""Pure scaling decisions: the desired runner count and ARC's patch ID sequence.

No I/O here. The loop feeds statistics and job events in and publishes what comes out.

Patch IDs follow ARC's listener scaler exactly (README "Listener"):

* state starts at ``target = -1, seq = -1, dirty = False``;
* every decision advances the sequence (wrapping 2^31-1 -> 1, never 0 after a wrap);
* the patch ID is the sequence value, except that it collapses to 0 when nothing happened since
  the last decision (not dirty), the target did not change and it equals ``min_runners``: the
  set is idle at its minimum and the runner-set may treat the count as authoritative and scale
  down. The very first decision of an incarnation is therefore always patch ID 0.
* a job started or completed marks the state dirty, so the next decision carries a fresh,
  non-zero patch ID (the runner-set's finished-runner cleanup guard waits for exactly that).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MAX_PATCH_ID = 2**31 - 1


def desired_runners(*, min_runners: int, max_runners: int, assigned_jobs: int) -> int:
    """ARC: ``min(minRunners + totalAssignedJobs, maxRunners)``; minRunners are idle runners kept
    on top of the assigned jobs (ARC ADR 2023-11-02). A negative count from a garbled message
    counts as 0."""
    return min(min_runners + max(assigned_jobs, 0), max_runners)


def next_patch_seq(seq: int) -> int:
    """Advance the sequence; after 2^31-1 it wraps to 1 (0 is reserved for "authoritative")."""
    if seq >= MAX_PATCH_ID:
        seq = 0
    return seq + 1


@dataclass(frozen=True, slots=True)
class ScalerState:
    target: int = -1
    patch_seq: int = -1
    dirty: bool = False


@dataclass(frozen=True, slots=True)
class DesiredDecision:
    replicas: int
    patch_id: int
    #: The assigned-job count the decision was made from (for the statistics in the message).
    assigned_jobs: int


def mark_dirty(state: ScalerState) -> ScalerState:
    """A job started or completed since the last decision."""
    return replace(state, dirty=True)


def decide(
    state: ScalerState, *, min_runners: int, max_runners: int, assigned_jobs: int
) -> tuple[ScalerState, DesiredDecision]:
    target = desired_runners(min_runners=min_runners, max_runners=max_runners, assigned_jobs=assigned_jobs)
    seq = next_patch_seq(state.patch_seq)
    patch_id = seq
    if not state.dirty and target == state.target and target == min_runners:
        patch_id = 0
    # The first decision of an incarnation: seq goes -1 -> 0, so patch_id is 0 too.
    new_state = ScalerState(target=target, patch_seq=seq, dirty=False)
    return new_state, DesiredDecision(replicas=target, patch_id=patch_id, assigned_jobs=max(assigned_jobs, 0))


def is_stale_message(*, newest_seen_id: int, message_id: int) -> bool:
    """A message older than one already handled carries an older statistics snapshot: its job
    events still count (they are idempotent downstream) but its statistics must not move the
    desired state backwards."""
    return message_id < newest_seen_id
