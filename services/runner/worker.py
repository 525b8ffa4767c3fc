"""The runner worker, declared for the shared runtime (README "runner worker").

    runnerscale runner [worker flags] [runner flags]
    async with running_worker(WORKER.name, settings, WORKER.setup(RunnerSettings(...))) as w: ...

Controller ``ephemeralrunner``: For EphemeralRunners, Owns runner pods (label
``actions-ephemeral-runner=True``). Bus: the shared durable ``runner-jobs`` consumer of
JobStarted/JobCompleted (any replica may record a job event: every write carries the
resourceVersion it was decided on, so replicas cannot clobber each other).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.runner.decide import RunnerSettings
from services.runner.reconciler import RunnerReconciler
from shared.api.constants import KIND_EPHEMERAL_RUNNER, LABEL_EPHEMERAL_RUNNER
from shared.bus import subjects
from shared.kube import EPHEMERAL_RUNNERS, PODS
from shared.worker import Consume, Owned, WorkerSpec, worker_main

__all__ = ["WORKER", "RunnerSettings", "main"]


WORKER: WorkerSpec[RunnerSettings, RunnerReconciler] = WorkerSpec(
    name="runner",
    controller="ephemeralrunner",
    summary="runnerscale runner worker: reconciles EphemeralRunners",
    settings=RunnerSettings,
    reconciler=RunnerReconciler.from_context,
    primary=EPHEMERAL_RUNNERS,
    owned=(Owned(PODS, KIND_EPHEMERAL_RUNNER, label_selector=f"{LABEL_EPHEMERAL_RUNNER}=True"),),
    consumers=(Consume(subjects.RUNNER_JOBS, RunnerReconciler.on_job),),
)


def main(argv: Sequence[str]) -> int:
    return worker_main(WORKER, argv)
