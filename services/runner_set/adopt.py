"""Taking over EphemeralRunnerSets Go ARC left behind (README "Switching from ARC"): pure.

ARC 0.12–0.14 put the *runner* finalizer (``ephemeralrunner.actions.github.com/finalizer``) on
its EphemeralRunnerSets, not the set finalizer. The runner-set worker owns the set's finalizer, so
it treats that one as its own: a live set gets runnerscale's finalizer in its place, and a set
being deleted (ARC's mid-rollout sets, or legacy sets the scale-set worker retires) is drained by
the usual finalizer flow, which then removes both.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.api.constants import FINALIZER_EPHEMERAL_RUNNER, FINALIZER_EPHEMERAL_RUNNER_SET

#: The finalizer ARC 0.12–0.14 wrote on EphemeralRunnerSets.
LEGACY_SET_FINALIZER = FINALIZER_EPHEMERAL_RUNNER


def owns_finalizer(finalizers: Sequence[str]) -> bool:
    """The set carries a finalizer the runner-set worker must resolve (its own, or ARC's)."""
    return FINALIZER_EPHEMERAL_RUNNER_SET in finalizers or LEGACY_SET_FINALIZER in finalizers


def live_finalizers(finalizers: Sequence[str]) -> list[str] | None:
    """The finalizer list of a live set: runnerscale's present, ARC's gone. None: no change."""
    if FINALIZER_EPHEMERAL_RUNNER_SET in finalizers and LEGACY_SET_FINALIZER not in finalizers:
        return None
    out = [f for f in finalizers if f != LEGACY_SET_FINALIZER]
    if FINALIZER_EPHEMERAL_RUNNER_SET not in out:
        out.append(FINALIZER_EPHEMERAL_RUNNER_SET)
    return out


def released_finalizers(finalizers: Sequence[str]) -> list[str] | None:
    """The finalizer list once the set is drained: neither runnerscale's nor ARC's. None: no change."""
    out = [f for f in finalizers if f not in (FINALIZER_EPHEMERAL_RUNNER_SET, LEGACY_SET_FINALIZER)]
    return out if len(out) != len(finalizers) else None
