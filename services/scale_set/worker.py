"""The scale-set worker, declared for the shared runtime (README "scale-set worker").

    runnerscale scale-set --controller-namespace arc-systems --listener-image IMAGE [worker flags]
    async with running_worker(WORKER.name, settings, WORKER.setup(ScaleSetSettings(...))) as w: ...

Controller ``autoscalingrunnerset``: For AutoscalingRunnerSets, Owns EphemeralRunnerSets, Watches
AutoscalingListeners in the controller namespace (mapped to their ARS by spec: no owner reference
across namespaces). Bus: ``RevisionApplied`` (runner-set → scale-set) wakes the ARS of the same
name to re-check the Outdated guard.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.scale_set.decide import ScaleSetSettings
from services.scale_set.reconciler import ScaleSetReconciler
from shared.api import AutoscalingListener
from shared.api.constants import KIND_AUTOSCALING_RUNNER_SET
from shared.bus import subjects
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    Informer,
    ObjectKey,
    Source,
    Watches,
)
from shared.worker import Owned, Route, WorkerContext, WorkerSpec, worker_main

__all__ = ["WORKER", "ScaleSetSettings", "listener_owner_keys", "main"]


def listener_owner_keys(al: AutoscalingListener) -> list[ObjectKey]:
    """An AL change wakes the ARS its spec names (it lives in another namespace: no owner ref)."""
    ns, name = al.spec.autoscaling_runner_set_namespace, al.spec.autoscaling_runner_set_name
    return [ObjectKey(ns, name)] if ns and name else []


def listeners(ctx: WorkerContext, settings: ScaleSetSettings) -> list[Source]:
    """AutoscalingListeners live in the controller namespace (whatever --watch-namespace says)."""
    informer = Informer(ctx.kube, AUTOSCALING_LISTENERS, namespace=settings.controller_namespace)
    return [Watches(informer, listener_owner_keys)]


WORKER: WorkerSpec[ScaleSetSettings, ScaleSetReconciler] = WorkerSpec(
    name="scale-set",
    controller="autoscalingrunnerset",
    summary="runnerscale scale-set worker: reconciles AutoscalingRunnerSets",
    settings=ScaleSetSettings,
    reconciler=ScaleSetReconciler.from_context,
    primary=AUTOSCALING_RUNNER_SETS,
    owned=(Owned(EPHEMERAL_RUNNER_SETS, KIND_AUTOSCALING_RUNNER_SET),),
    watches=listeners,
    # runner-set → scale-set: "revision N applied" (ERS name == ARS name) re-checks the Outdated guard.
    routes=(Route(subjects.SCALE_SET_REVISIONS),),
)


def main(argv: Sequence[str]) -> int:
    return worker_main(WORKER, argv)
