"""The runner-set worker, declared for the shared runtime (README "runner-set worker").

    runnerscale runner-set [worker flags] [runner-set flags]
    async with running_worker(WORKER.name, settings, WORKER.setup(FailurePolicy(...))) as w: ...

Controller ``ephemeralrunnerset``: For EphemeralRunnerSets, Owns EphemeralRunners. Bus: the
listener's desired state (remembered per ERS, newest wins, then the ERS is woken), its JobCompleted
events (remembered per runner: README "Typed state (new fields)") and revision announcements from
the scale-set worker, each on a per-replica durable (the replica owning the key's shard acts on it). After gaining shards, each key's newest desired state is read again from
its stream: messages for it may have been acked while another replica owned it.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.runner_set.failures import FailurePolicy
from services.runner_set.reconciler import RunnerSetReconciler
from shared.api.constants import KIND_EPHEMERAL_RUNNER_SET
from shared.bus import subjects
from shared.kube import EPHEMERAL_RUNNER_SETS, EPHEMERAL_RUNNERS
from shared.worker import Owned, Route, WorkerSpec, worker_main

__all__ = ["WORKER", "FailurePolicy", "main"]


WORKER: WorkerSpec[FailurePolicy, RunnerSetReconciler] = WorkerSpec(
    name="runner-set",
    controller="ephemeralrunnerset",
    summary=(
        "reconcile EphemeralRunnerSets: runners, typed revision state, desired state from the listener,"
        " failed-runner TTL and failure budget"
    ),
    settings=FailurePolicy,
    reconciler=RunnerSetReconciler.from_context,
    primary=EPHEMERAL_RUNNER_SETS,
    owned=(Owned(EPHEMERAL_RUNNERS, KIND_EPHEMERAL_RUNNER_SET),),
    routes=(
        Route(subjects.RUNNER_SET_DESIRED, on_message=RunnerSetReconciler.on_desired),
        Route(subjects.RUNNER_SET_REVISIONS),
        Route(subjects.RUNNER_SET_COMPLETIONS, on_message=RunnerSetReconciler.on_completed),
    ),
    on_shard_change=RunnerSetReconciler.on_shard_change,
)


def main(argv: Sequence[str]) -> int:
    return worker_main(WORKER, argv)
