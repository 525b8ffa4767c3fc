"""A controller worker declared as data, run by the one shared main (README "Worker runtime").

Every controller worker's ``worker.py`` is one :class:`WorkerSpec`::

    WORKER = WorkerSpec(
        name="runner-set",                           # runnerscale runner-set; leases, durables, logs
        controller="ephemeralrunnerset",             # the controller's metric label
        summary="reconcile EphemeralRunnerSets",
        settings=RunnerSetSettings,                  # its own flags (msgspec struct, shared.settings)
        reconciler=RunnerSetReconciler.from_context, # (ctx, settings) -> the I/O shell
        primary=EPHEMERAL_RUNNER_SETS,               # For: the kind it reconciles
        owned=(Owned(EPHEMERAL_RUNNERS, "EphemeralRunnerSet"),),  # children that wake their owner
        routes=(Route(subjects.RUNNER_SET_DESIRED, on_message=RunnerSetReconciler.on_desired),),
    )

    def main(argv: Sequence[str]) -> int:
        return worker_main(WORKER, argv)

The runtime builds the reconciler once per process, one controller with the shared policy (lease
fence, conflict handling, deadline, outcomes), the bus routes and consumers, and starts it all as
a tree; ``ctx.reconciler`` is the built reconciler.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc
import msgspec

from shared import settings as settings_loader
from shared.bus import Delivery
from shared.bus.subjects import ConsumerSpec
from shared.kube import Controller, ReconcileContext, Reconciler, Result, Source
from shared.kube.resources import ObjectKey, Resource
from shared.settings import SettingsError
from shared.shards import ShardChange
from shared.worker.routing import KeyOf, default_key_of
from shared.worker.runtime import Setup, Task, WorkerContext, run_worker
from shared.worker.settings import add_worker_arguments, load_worker_settings

__all__ = ["Consume", "Owned", "Route", "WorkerSpec", "worker_main"]

S = TypeVar("S", bound=msgspec.Struct)
R = TypeVar("R", bound=Reconciler)


@dataclass(frozen=True)
class Route(Generic[R]):
    """Wake the controller for every message of ``consumer`` (each replica its own durable, so the
    replica owning the key's shard gets it). ``on_message(reconciler, delivery)`` sees every
    delivery first (e.g. to remember the newest level per key); raising naks it."""

    consumer: ConsumerSpec
    on_message: Callable[[R, Delivery], None] | None = None
    key_of: KeyOf = default_key_of


@dataclass(frozen=True)
class Owned:
    """Owned children of ``resource`` (optionally label-selected) wake their controlling owner of ``owner_kind``."""

    resource: Resource[Any]
    owner_kind: str
    label_selector: str = ""


@dataclass(frozen=True)
class Consume(Generic[R]):
    """Handle every message of ``consumer`` in the reconciler itself, on one durable shared by all
    replicas (for handlers that do not depend on shards). Raising naks (redelivered with backoff)."""

    consumer: ConsumerSpec
    handler: Callable[[R, Delivery], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class WorkerSpec(Generic[S, R]):
    name: str
    controller: str
    summary: str
    settings: type[S]
    reconciler: Callable[[WorkerContext, S], R]
    primary: Resource[Any]
    owned: Sequence[Owned] = ()
    watches: Callable[[WorkerContext, S], Sequence[Source]] | None = None
    routes: Sequence[Route[R]] = ()
    consumers: Sequence[Consume[R]] = ()
    on_shard_change: Callable[[R, ShardChange], None] | None = None
    description: str = field(default="")

    def setup(self, options: S) -> Setup:
        """The runtime's ``setup(ctx)`` for this worker with ``options`` (its loaded settings)."""

        def setup(ctx: WorkerContext) -> list[Controller]:
            reconciler = self.reconciler(ctx, options)
            ctx.reconciler = reconciler

            async def reconcile(key: ObjectKey, rctx: ReconcileContext) -> Result:
                return await reconciler.reconcile(key, rctx)

            controller = ctx.controller(self.controller, reconcile, self.sources(ctx, options))
            for route in self.routes:
                ctx.route(
                    route.consumer, controller, key_of=route.key_of, on_message=_bound(route.on_message, reconciler)
                )
            for consume in self.consumers:
                ctx.add_task(_consumer(ctx, consume, reconciler))
            if self.on_shard_change is not None:
                callback = self.on_shard_change
                ctx.on_shard_change(lambda change: callback(reconciler, change))
            return [controller]

        return setup

    def sources(self, ctx: WorkerContext, options: S) -> list[Source]:
        """What wakes a key: the primary kind, its owned children, then the worker's own watches."""
        sources = ctx.for_(ctx.informers(self.primary))
        for owned in self.owned:
            sources += ctx.owns(ctx.informers(owned.resource, label_selector=owned.label_selector), owned.owner_kind)
        if self.watches is not None:
            sources += self.watches(ctx, options)
        return sources

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"runnerscale {self.name}", description=self.summary)
        add_worker_arguments(parser)
        settings_loader.add_arguments(parser, self.settings, title=self.name)
        return parser


def _bound(hook: Callable[[R, Delivery], None] | None, reconciler: R) -> Callable[[Delivery], None] | None:
    """``hook`` with the reconciler filled in (None stays None)."""
    if hook is None:
        return None

    def on_message(delivery: Delivery) -> None:
        hook(reconciler, delivery)

    return on_message


def _consumer(ctx: WorkerContext, consume: Consume[R], reconciler: R) -> Task:
    async def task(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async def handle(delivery: Delivery) -> None:
            await consume.handler(reconciler, delivery)

        await ctx.bus.consume(consume.consumer, handle, instance=None, task_status=task_status)

    return task


def worker_main(spec: WorkerSpec[S, R], argv: Sequence[str]) -> int:
    """The body of every worker's ``main(argv)``: flags, settings (exit 2 on a bad one), run."""
    args = spec.parser().parse_args(list(argv))
    try:
        worker_settings = load_worker_settings(args)
        options = settings_loader.load(spec.settings, args)
    except SettingsError as exc:
        print(f"runnerscale {spec.name}: {exc}", file=sys.stderr)
        return 2
    return anyio.run(run_worker, spec.name, worker_settings, spec.setup(options))
