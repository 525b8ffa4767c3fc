"""Bus → controller routing: consume a subject and wake the controller for the resource it names.

Messages are wake-ups (README "How it works"): the controller re-reads Kubernetes before acting, so routing
only turns a message into the key of the object to reconcile. By default every replica gets its
own durable (``instance=replica id``) so that every replica sees every message and the one that
owns the key's shard enqueues it (a shared durable would hand a message to a replica that does
not own its key, and the wake-up would be lost).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from shared.bus import Bus, Delivery, messages
from shared.bus.subjects import ConsumerSpec
from shared.kube import Controller, ObjectKey
from shared.log import get_logger

log = get_logger(__name__)

KeyOf = Callable[[messages.BusMessage], ObjectKey | None]
OnMessage = Callable[[Delivery], Awaitable[None] | None]


def default_key_of(message: messages.BusMessage) -> ObjectKey | None:
    """The resource a message is about: the ERS of DesiredState/Revision*, the ref of
    ResourceChanged, the scale set (ARS) of job events (pure)."""
    match message:
        case messages.DesiredState(ers=ref) | messages.RevisionPublished(ers=ref) | messages.RevisionApplied(ers=ref):
            return ObjectKey(ref.namespace, ref.name)
        case messages.ResourceChanged(ref=ref):
            return ObjectKey(ref.namespace, ref.name)
        case messages.JobStarted(scale_set=ref) | messages.JobCompleted(scale_set=ref):
            return ObjectKey(ref.namespace, ref.name)
    return None


async def route_to_controller(
    bus: Bus,
    consumer: ConsumerSpec,
    controller: Controller,
    *,
    instance: str | None,
    key_of: KeyOf = default_key_of,
    on_message: OnMessage | None = None,
    namespaces: tuple[str, ...] = (),
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Consume ``consumer`` until cancelled; enqueue ``key_of(message)`` into ``controller``.

    ``on_message`` (optional) sees every delivery first (e.g. to remember the latest level per
    key); if it raises, the message is nak'ed and redelivered. Messages for namespaces outside
    ``namespaces`` (when given) are acked and ignored.
    """

    async def handle(delivery: Delivery) -> None:
        key = key_of(delivery.message)
        if key is None:
            log.warning("message names no resource; ignored", subject=delivery.subject)
            return
        if namespaces and key.namespace not in namespaces:
            return
        if on_message is not None:
            result = on_message(delivery)
            if result is not None:
                await result
        controller.enqueue(key)

    await bus.consume(consumer, handle, instance=instance, task_status=task_status)


__all__ = ["KeyOf", "OnMessage", "default_key_of", "route_to_controller"]
