"""The runner-set's status window (README "runner-set worker", status writes): a count-only status
write within 1 s of the set's previous one is held back and the pass comes back when the window
ends; phase, revision and marker writes never wait."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from services.runner_set.decide import Plan
from services.runner_set.reconciler import RunnerSetReconciler
from shared.kube import ObjectKey

pytestmark = pytest.mark.anyio

KEY = ObjectKey("ns", "set")


def _reconciler() -> RunnerSetReconciler:
    nothing: Any = None
    return RunnerSetReconciler(nothing, nothing, nothing, nothing, nothing)


async def test_count_only_status_is_held_until_the_window_ends() -> None:
    r = _reconciler()
    p = Plan("steady", status={"currentReplicas": 2})
    assert r._coalesce_status(KEY, p) is p  # no write yet: now
    r.status_written[KEY] = anyio.current_time()
    held = r._coalesce_status(KEY, p)
    assert held.status is None and held.requeue_after is not None and 0.9 < held.requeue_after <= 1.0
    sooner = r._coalesce_status(KEY, Plan("steady", status={"currentReplicas": 2}, requeue_after=0.2))
    assert sooner.status is None and sooner.requeue_after == 0.2
    r.status_written[KEY] = anyio.current_time() - 1.0
    assert r._coalesce_status(KEY, p) is p


async def test_phase_and_marker_are_written_at_once() -> None:
    r = _reconciler()
    r.status_written[KEY] = anyio.current_time()
    for status in ({"phase": "Outdated", "currentReplicas": 1}, {"finishedRunnerCleanupPatchID": 4}):
        p = Plan("finished-cleanup", status=status)
        assert r._coalesce_status(KEY, p) is p
