"""The listener-pod worker, declared for the shared runtime (README "listener-pod worker").

    runnerscale listener-pod [worker flags] [--listener-image IMG] [--listener-metrics-addr :8080] ...
    async with running_worker(WORKER.name, settings, WORKER.setup(ListenerPodSettings(...))) as w: ...

Controller ``autoscalinglistener``: For AutoscalingListeners, Owns their pods and service
accounts, Watches roles and role bindings (ARS namespace, no owner reference: by ARC's labels)
and the AutoscalingRunnerSets they name (only their disappearance), woken by
``runnerscale.changes.autoscalinglistener.>`` on the bus, and requeued every ``--resync-period``
(GitHub secrets are not watched, as in ARC).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.listener_pod.decide import ListenerPodSettings
from services.listener_pod.reconciler import ListenerPodReconciler
from shared.api.constants import (
    COMPONENT_LISTENER,
    KIND_AUTOSCALING_LISTENER,
    LABEL_COMPONENT,
    LABEL_LISTENER_NAME,
    LABEL_LISTENER_NAMESPACE,
    LABEL_SCALE_SET_NAME,
)
from shared.bus import subjects
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    Change,
    ChangeType,
    ObjectKey,
    Source,
    Watches,
)
from shared.worker import Owned, Route, WorkerContext, WorkerSpec, worker_main

__all__ = ["WORKER", "ListenerPodSettings", "WhenGone", "listener_key_from_labels", "main"]

POD_SELECTOR = f"{LABEL_COMPONENT}={COMPONENT_LISTENER}"


def listener_key_from_labels(obj: Any) -> Iterable[ObjectKey]:
    """Role / RoleBinding (in the ARS namespace, no owner reference) → its AL, by ARC's labels."""
    if obj is None:
        return ()
    labels = obj.metadata.labels
    ns, name = labels.get(LABEL_LISTENER_NAMESPACE), labels.get(LABEL_LISTENER_NAME)
    return (ObjectKey(ns, name),) if ns and name else ()


@dataclass(frozen=True)
class WhenGone(Watches):
    """A :class:`Watches` source that only fires for objects being deleted or deleted (ARS status
    churns with every runner count change; only its disappearance matters to a listener)."""

    def keys(self, change: Change[Any]) -> Iterable[ObjectKey]:
        if change.type is ChangeType.DELETED or (change.obj is not None and change.obj.metadata.is_deleting):
            return self.map_keys(change.obj)
        return ()


def watches(ctx: WorkerContext, settings: ListenerPodSettings) -> list[Source]:
    """Roles and role bindings (no owner reference: by labels) and the ARSs the listeners name."""
    als = ctx.informers(AUTOSCALING_LISTENERS)

    def listeners_of_runner_set(ars: Any) -> list[ObjectKey]:
        """ARS → the ALs that name it (an ARS deleted without the scale-set worker's cleanup
        must still take its listener down promptly)."""
        if ars is None:
            return []
        ns, name = ars.metadata.namespace, ars.metadata.name
        return [
            ObjectKey(al.metadata.namespace, al.metadata.name)
            for informer in als
            for al in informer.list_cached()
            if al.spec.autoscaling_runner_set_namespace == ns and al.spec.autoscaling_runner_set_name == name
        ]

    rbac = [
        *ctx.informers(ROLES, label_selector=LABEL_LISTENER_NAME),
        *ctx.informers(ROLE_BINDINGS, label_selector=LABEL_LISTENER_NAME),
    ]
    return [
        *[Watches(i, listener_key_from_labels) for i in rbac],
        *[WhenGone(i, listeners_of_runner_set) for i in ctx.informers(AUTOSCALING_RUNNER_SETS)],
    ]


WORKER: WorkerSpec[ListenerPodSettings, ListenerPodReconciler] = WorkerSpec(
    name="listener-pod",
    controller="autoscalinglistener",
    summary="reconcile AutoscalingListeners into listener pods",
    settings=ListenerPodSettings,
    reconciler=ListenerPodReconciler.from_context,
    primary=AUTOSCALING_LISTENERS,
    owned=(
        Owned(PODS, KIND_AUTOSCALING_LISTENER, label_selector=POD_SELECTOR),
        Owned(SERVICE_ACCOUNTS, KIND_AUTOSCALING_LISTENER, label_selector=LABEL_SCALE_SET_NAME),
    ),
    watches=watches,
    routes=(Route(subjects.LISTENER_POD_CHANGES),),
)


def main(argv: Sequence[str]) -> int:
    return worker_main(WORKER, argv)
