"""The runner-set's cached decision per pass, before and after the runner index (issue 10).

One set of N runners in an EphemeralRunner informer (fed as watch lines: the cache's own slim
objects), half pending, half running a job, a few creations still expected. Between two passes
one runner changes (pending → running or back), as in a burst where every runner event wakes the
set. Timed per pass, the steps of ``RunnerSetReconciler._quiet_pass`` that depend on N:

- old: the set's runners from the informer (``list_owned_by`` + ``decide.owned_by``), expectations
  settled against their uids, ``decide.bucket_runners`` (sort + classify), ``decide.plan``, the
  finished runners' completions, the gauges;
- new: expectations settled against the index's members, ``index.buckets`` (counts; lists sorted
  only if the plan reads them), the same plan, completions and gauges.

Each pass's plans are checked equal. "event µs" is what the index adds to each runner event;
"quiet pass µs" is the whole ``RunnerSetReconciler._quiet_pass`` on the index once its
expectations are met (cached set, validation, the decision above, status window).

    python -m tests.bench runner_set_decision [300 1000 3000] [--quick]
"""

from __future__ import annotations

import datetime as dt
import gc
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from services.runner_set import decide, index
from services.runner_set import expectations as xp
from services.runner_set.failures import FailurePolicy
from services.runner_set.metrics import RunnerSetMetrics
from services.runner_set.reconciler import RunnerSetReconciler
from shared.api import EphemeralRunner, EphemeralRunnerSet
from shared.api.constants import ANNOTATION_PATCH_ID, FINALIZER_EPHEMERAL_RUNNER_SET
from shared.kube import EPHEMERAL_RUNNER_SETS, EPHEMERAL_RUNNERS, Change, Informer, ObjectKey
from tests.bench.table import Table
from tests.unit.services.runner_set import test_decide as decide_tests

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
UID = "uid-set"
KEY = ObjectKey("ns", "set")
SIZES = (300, 1_000, 3_000)


class _NoClient:
    """The informer is fed watch lines; nothing reaches a client."""


def _runner(i: int, rv: int, running: bool) -> dict[str, Any]:
    return {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunner",
        "metadata": {
            "name": f"set-runner-{i:05d}",
            "namespace": "ns",
            "uid": f"u{i}",
            "resourceVersion": str(rv),
            "creationTimestamp": (T0 + dt.timedelta(milliseconds=i)).isoformat(),
            "annotations": {ANNOTATION_PATCH_ID: str(1 + i // 50)},
            "finalizers": ["ephemeralrunner.actions.github.com/finalizer"],
            "ownerReferences": [
                {"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunnerSet", "name": "set"}
                | {"uid": UID, "controller": True, "blockOwnerDeletion": True}
            ],
        },
        "spec": {
            "githubConfigUrl": "https://github.com/org",
            "githubConfigSecret": "s",
            "runnerScaleSetId": 1,
            "spec": {"containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest"}]},
        },
        "status": {"phase": "Running", "runnerId": i + 1, "jobId": f"j{i}"} if running else {"runnerId": i + 1},
    }


def _set(n: int, scenario: str) -> EphemeralRunnerSet:
    latest = 1 + (n - 1) // 50
    replicas, patch_id, counted = {
        "scale-up": (n + 50, latest + 1, n),  # a new desired state: create 50
        "steady": (n, latest + 1, n),  # a new patch ID, nothing to create
        "status counts": (n, latest, n - 7),  # the patch is applied; stored counts lag
    }[scenario]
    s = decide_tests.ers(replicas=replicas, patch_id=patch_id)
    assert s.status is not None
    return msgspec.structs.replace(
        s,
        metadata=msgspec.structs.replace(s.metadata, uid=UID, finalizers=[FINALIZER_EPHEMERAL_RUNNER_SET]),
        status=msgspec.structs.replace(
            s.status, current_replicas=counted, pending_ephemeral_runners=n - n // 2, running_ephemeral_runners=n // 2
        ),
    )


def _heard(b: decide.Buckets) -> dict[str, Any]:
    """As ``RunnerSetReconciler._heard`` with no JobCompleted received: a walk of the finished."""
    return {er.metadata.uid: None for er in b.finished if er.metadata.uid == ""}


Decision = Callable[[EphemeralRunnerSet, xp.Expectations], tuple[xp.Expectations, decide.Plan]]


def _decisions(informer: Informer[EphemeralRunner], indexes: list[index.RunnerIndex]) -> tuple[Decision, Decision]:
    metrics = RunnerSetMetrics()
    policy = FailurePolicy()

    def old(ers: EphemeralRunnerSet, e: xp.Expectations) -> tuple[xp.Expectations, decide.Plan]:
        cached = decide.owned_by(informer.list_owned_by(UID, copy=False), ers)
        e = xp.settle(e, {er.metadata.uid: er.metadata.is_deleting for er in cached})
        b = decide.bucket_runners(cached)
        p = decide.plan(ers, b, T0, policy, _heard(b))
        metrics.set(KEY, ers, b)
        return e, p

    def new(ers: EphemeralRunnerSet, e: xp.Expectations) -> tuple[xp.Expectations, decide.Plan]:
        e = xp.settle(e, index.members(indexes, UID, "ns"))
        b = index.buckets(indexes, UID, "ns")
        p = decide.plan(ers, b, T0, policy, _heard(b))
        metrics.set(KEY, ers, b)
        return e, p

    return old, new


def _reconciler(informer: Informer[EphemeralRunner], ers: EphemeralRunnerSet) -> RunnerSetReconciler:
    """A reconciler whose quiet pass decides ``ers`` from the caches (it never reaches the API)."""
    sets: Informer[EphemeralRunnerSet] = Informer(_NoClient(), EPHEMERAL_RUNNER_SETS)  # type: ignore[arg-type]
    sets._handle_line(msgspec.json.encode({"type": "ADDED", "object": msgspec.to_builtins(ers)}))
    none: Any = None
    r = RunnerSetReconciler(none, none, none, none, none, FailurePolicy(), runners_cache=[informer], sets_cache=[sets])
    r.seeded.add(KEY)
    r.cache_trusted.add(KEY)
    return r


def measure(n: int, scenario: str, passes: int) -> dict[str, float]:
    # As timeit: no cyclic garbage collection while timing, or a full collection of the whole
    # heap lands in whichever cell happens to cross the threshold (≈ 0.2 ms per pass at 1,000).
    gc.collect()
    gc.disable()
    try:
        return anyio.run(_measure, n, scenario, passes)
    finally:
        gc.enable()


async def _measure(n: int, scenario: str, passes: int) -> dict[str, float]:
    informer: Informer[EphemeralRunner] = Informer(_NoClient(), EPHEMERAL_RUNNERS)  # type: ignore[arg-type]
    runners = [_runner(i, 100 + i, running=i % 2 == 1) for i in range(n)]
    for obj in runners:
        informer._handle_line(msgspec.json.encode({"type": "ADDED", "object": obj}))
    runner_index = index.RunnerIndex()
    event_time = [0.0]

    def timed_apply(change: Change[EphemeralRunner]) -> None:
        t = time.perf_counter()
        runner_index.apply(change)
        event_time[0] += time.perf_counter() - t

    informer.add_handler(timed_apply)  # replays the n runners
    event_time[0] = 0.0
    old, new = _decisions(informer, [runner_index])
    ers = _set(n, scenario)
    # A burst: creations this replica made that the cache has not shown yet.
    e = xp.expect(xp.NONE, created=[f"new-{i}" for i in range(8)], now=anyio.current_time())
    reconciler = _reconciler(informer, ers)
    spent = {"old": 0.0, "new": 0.0, "pass": 0.0}
    rv = 100 + n
    for k in range(passes):
        i = (k * 7919) % n  # one runner changes between passes
        rv += 1
        runners[i] = _runner(i, rv, running=runners[i].get("status", {}).get("phase") != "Running")
        informer._handle_line(msgspec.json.encode({"type": "MODIFIED", "object": runners[i]}))
        plans = {}
        for name, decision in (("old", old), ("new", new)) if k % 2 else (("new", new), ("old", old)):
            t = time.perf_counter()
            _, plans[name] = decision(ers, e)
            spent[name] += time.perf_counter() - t
        assert plans["old"] == plans["new"], (scenario, n, k)
        assert plans["new"].reason in {"scale-up", "steady", "patch-already-applied"}, plans["new"].reason
        t = time.perf_counter()
        outcome = reconciler._quiet_pass(KEY)  # expectations met: it decides (a draft, or the pass's end)
        spent["pass"] += time.perf_counter() - t
        assert outcome is not None and getattr(outcome, "plan", plans["new"]) == plans["new"], outcome
    return {k: v / passes * 1e6 for k, v in spent.items()} | {"event": event_time[0] / passes * 1e6}


def run(quick: bool = False, sizes: tuple[int, ...] = SIZES) -> Table:
    sizes = (30, 100) if quick else sizes
    passes = 20 if quick else 300
    table = Table(
        f"runner-set cached decision per pass (µs; {passes} passes, one runner event between passes)",
        ["pass", "runners", "old µs", "new µs", "old/new", "old µs/runner", "index µs/event", "quiet pass µs"],
    )
    for scenario in ("scale-up", "steady", "status counts"):
        for n in sizes:
            m = measure(n, scenario, passes)
            table.add(scenario, n, m["old"], m["new"], m["old"] / m["new"], m["old"] / n, m["event"], m["pass"])
    return table


__all__ = ["measure", "run"]
