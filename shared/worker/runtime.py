"""The common worker runtime: one process = one worker kind = N controllers under one task group.

    async def setup(ctx: WorkerContext) -> list[Controller]:
        ers = ctx.informers(EPHEMERAL_RUNNER_SETS)
        ers_runners = ctx.informers(EPHEMERAL_RUNNERS)
        c = ctx.controller("ephemeralrunnerset", reconcile,
                           [*ctx.for_(ers), *ctx.owns(ers_runners, "EphemeralRunnerSet")])
        ctx.route(subjects.RUNNER_SET_REVISIONS, c)          # bus wake-ups → c's queue
        return [c]

    sys.exit(worker_main("runner-set", argv, setup))           # CLI: flags, signals, exit codes
    async with running_worker("runner-set", settings, setup) as w:   # tests: in-process
        await w.wait_ready()

What the runtime does, in order: JSON logging; Kubernetes client; bus (streams and buckets
checked); shard ownership (``KubeShardOwnership``: Kubernetes Leases, the default; or
``ShardOwnership``: NATS KV, ``--ownership nats``) and its first claim round; ``setup(ctx)``; /metrics and
/healthz /readyz; informers; controllers (each key reconciled only by the replica owning its
shard: ``owns=`` is wired for you, and keys of gained shards are re-enqueued); background tasks
(bus routes). SIGTERM/SIGINT: controllers stop taking keys, in-flight reconciles finish (bounded
by ``shutdown_timeout``), leases are released, clients closed. Exit 0.
"""

from __future__ import annotations

import argparse
import inspect
import signal
import sys
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
from prometheus_client import REGISTRY, CollectorRegistry

from shared.bus import Bus, BusError, ShardChange, ShardOwnership, subjects
from shared.bus.subjects import ConsumerSpec
from shared.kube import (
    ApiReader,
    ApiWriter,
    Controller,
    EventRecorder,
    For,
    Informer,
    KubeClient,
    KubeError,
    ObjectKey,
    Owns,
    Resource,
    Source,
)
from shared.kube.leases import KubeShardOwnership, LeaseTiming
from shared.log import configure_logging, get_logger
from shared.worker.actions_pool import ActionsClientPool
from shared.worker.http import HttpServers, health_app, metrics_app
from shared.worker.routing import KeyOf, OnMessage, default_key_of, route_to_controller
from shared.worker.settings import SettingsError, WorkerSettings, add_worker_arguments, load_worker_settings

log = get_logger(__name__)

Setup = Callable[["WorkerContext"], Sequence[Controller] | Awaitable[Sequence[Controller]]]
ShardCallback = Callable[[ShardChange], Awaitable[None] | None]


async def connect_kube(settings: WorkerSettings) -> KubeClient:
    """The Kubernetes client the settings name (emulator URL, kubeconfig, or in-cluster)."""
    if settings.kube_url:
        return KubeClient.from_url(settings.kube_url, request_timeout=settings.kube_request_timeout)
    return await KubeClient.connect(
        settings.kubeconfig or None,
        context=settings.kube_context or None,
        request_timeout=settings.kube_request_timeout,
    )


def shard_group(name: str, settings: WorkerSettings) -> str:
    """The replicas that split shards: same worker kind and same watched namespaces (replicas
    watching different namespaces reconcile different keys, so they must not share shards)."""
    if not settings.namespaces:
        return name
    return f"{name}-{zlib.crc32(','.join(sorted(settings.namespaces)).encode()):08x}"


def join_shards(settings: WorkerSettings, kube: KubeClient, bus: Bus, name: str, on_change: ShardCallback) -> Any:
    """Shard ownership as configured: Kubernetes Leases (default, README "Shard ownership leases") or NATS KV."""
    if settings.ownership == "nats":
        return ShardOwnership.join(bus, name, replica_id=settings.replica_id, on_change=on_change)
    return KubeShardOwnership.join(
        kube,
        shard_group(name, settings),
        replica_id=settings.replica_id,
        shards=settings.bus.shards,
        namespace=settings.lease_namespace or None,
        timing=LeaseTiming(duration=settings.lease_duration),
        on_change=on_change,
    )


@dataclass
class WorkerContext:
    """What ``setup`` gets: clients, the bus, shard ownership, and builders for controllers."""

    name: str
    settings: WorkerSettings
    kube: KubeClient
    reader: ApiReader
    writer: ApiWriter
    bus: Bus
    shards: ShardOwnership | KubeShardOwnership
    events: EventRecorder
    actions: ActionsClientPool
    registry: CollectorRegistry
    controllers: list[Controller] = field(default_factory=list)
    _informers: dict[tuple[Any, ...], list[Informer[Any]]] = field(default_factory=dict)
    _tasks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _shard_callbacks: list[ShardCallback] = field(default_factory=list)

    @property
    def replica_id(self) -> str:
        return self.settings.replica_id

    # --- ownership ----------------------------------------------------------------------------

    def owns_key(self, key: ObjectKey | str) -> bool:
        """True when this replica holds the shard of ``key`` right now."""
        key = ObjectKey.of(key)
        return self.shards.owns(subjects.resource_key(key.namespace, key.name))

    def held(self, key: ObjectKey | str) -> Any:
        """``async with ctx.held(key):`` run writes only while holding ``key`` (NotOwner otherwise;
        the block is cancelled the moment the lease is lost)."""
        key = ObjectKey.of(key)
        return self.shards.held(subjects.resource_key(key.namespace, key.name))

    def watched(self, namespace: str) -> bool:
        return not self.settings.namespaces or namespace in self.settings.namespaces

    def on_shard_change(self, callback: ShardCallback) -> None:
        """Also call ``callback`` when shards are gained or lost (after the runtime re-enqueued keys)."""
        self._shard_callbacks.append(callback)

    # --- informers and sources ----------------------------------------------------------------

    def informers(self, resource: Resource[Any], *, label_selector: str = "") -> list[Informer[Any]]:
        """Shared informers for ``resource``: one per watched namespace (one for all namespaces by
        default). The runtime runs them; build them in ``setup``."""
        key = (resource, label_selector)
        found = self._informers.get(key)
        if found is None:
            namespaces: Sequence[str | None] = self.settings.namespaces or (None,)
            found = [Informer(self.kube, resource, namespace=ns, label_selector=label_selector) for ns in namespaces]
            self._informers[key] = found
        return found

    def for_(self, informers: Sequence[Informer[Any]]) -> list[Source]:
        return [For(i) for i in informers]

    def owns(self, informers: Sequence[Informer[Any]], owner_kind: str) -> list[Source]:
        return [Owns(i, owner_kind) for i in informers]

    def cached(self, resource: Resource[Any], key: ObjectKey | str, *, label_selector: str = "") -> Any:
        """The cached object (may lag the server: never decide a write on it)."""
        key = ObjectKey.of(key)
        for informer in self.informers(resource, label_selector=label_selector):
            if informer.namespace in (None, key.namespace):
                obj = informer.get_cached(key)
                if obj is not None:
                    return obj
        return None

    # --- controllers and tasks ----------------------------------------------------------------

    def controller(
        self,
        name: str,
        reconcile: Callable[[ObjectKey], Awaitable[Any]],
        sources: Sequence[Source],
        *,
        workers: int | None = None,
    ) -> Controller:
        """A Controller whose keys are filtered by this replica's shards, with the worker's registry."""
        c = Controller(
            name,
            reconcile,
            sources,
            workers=workers or self.settings.workers,
            owns=self.owns_key,
            registry=self.registry,
        )
        self.controllers.append(c)
        return c

    def add_task(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run ``task`` beside the controllers until shutdown (e.g. a bus consumer)."""
        self._tasks.append(task)

    def route(
        self,
        consumer: ConsumerSpec,
        controller: Controller,
        *,
        key_of: KeyOf = default_key_of,
        on_message: OnMessage | None = None,
        shared: bool = False,
    ) -> None:
        """Wake ``controller`` for every message of ``consumer`` (see routing.py). ``shared=True``
        uses one durable for all replicas (only right when the handler does not depend on shards)."""

        async def task() -> None:
            await route_to_controller(
                self.bus,
                consumer,
                controller,
                instance=None if shared else self.replica_id,
                key_of=key_of,
                on_message=on_message,
                namespaces=self.settings.namespaces,
            )

        self.add_task(task)

    # --- internals ----------------------------------------------------------------------------

    def all_informers(self) -> list[Informer[Any]]:
        return [i for group in self._informers.values() for i in group]

    async def _shards_changed(self, change: ShardChange) -> None:
        if change.gained:
            for c in self.controllers:
                for source in c.sources:
                    if isinstance(source, For):
                        for key in source.informer.keys():
                            if self.shards.shard_of(subjects.resource_key(key.namespace, key.name)) in change.gained:
                                c.enqueue(key)
        for cb in list(self._shard_callbacks):
            try:
                result = cb(change)
                if result is not None:
                    await result
            except Exception:
                log.exception("shard change callback failed", worker=self.name)


@dataclass
class WorkerHandle:
    """A running worker (from :func:`running_worker`). The worker runs in its own task, so
    :meth:`kill` and :meth:`stop` never cancel the code that holds the handle."""

    name: str
    settings: WorkerSettings
    ports: dict[str, int] = field(default_factory=dict)
    ctx: WorkerContext | None = None
    failure: BaseException | None = None
    stopping: bool = False
    _ready: anyio.Event = field(default_factory=anyio.Event)
    _started: anyio.Event = field(default_factory=anyio.Event)
    _done: anyio.Event = field(default_factory=anyio.Event)
    _stop: anyio.Event = field(default_factory=anyio.Event)
    _scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        with anyio.fail_after(timeout):
            while not self._ready.is_set():
                if self._done.is_set():
                    raise RuntimeError(f"worker {self.name} stopped before it was ready: {self.failure!r}")
                with anyio.move_on_after(0.05):
                    await self._ready.wait()

    def stop(self) -> None:
        """Graceful stop: no new keys, in-flight reconciles finish, leases released."""
        self._stop.set()

    def kill(self) -> None:
        """Stop like a crash: nothing finishes, leases are not released (another replica must
        wait for them to expire)."""
        if self.ctx is not None:
            self.ctx.shards.abandon()
        self._scope.cancel()

    async def wait_done(self, timeout: float | None = None) -> None:
        with anyio.fail_after(timeout) if timeout else anyio.CancelScope():
            await self._done.wait()


async def _call_setup(setup: Setup, ctx: WorkerContext) -> list[Controller]:
    result = setup(ctx)
    if inspect.isawaitable(result):
        result = await result
    controllers = list(result or [])
    for c in ctx.controllers:
        if c not in controllers:
            controllers.append(c)
    return controllers


async def _serve(handle: WorkerHandle, setup: Setup, registry: CollectorRegistry | None) -> None:
    name, settings = handle.name, handle.settings
    servers = HttpServers()
    handle.ports = servers.ports
    pool: ActionsClientPool | None = None
    holder: dict[str, WorkerContext] = {}

    async def on_change(change: ShardChange) -> None:
        ctx = holder.get("ctx")
        if ctx is not None:
            await ctx._shards_changed(change)

    kube = await connect_kube(settings)
    try:
        async with Bus.connect(settings.bus, name=f"runnerscale-{name}-{settings.replica_id}") as bus:
            async with join_shards(settings, kube, bus, name, on_change) as shards:
                reader, writer = ApiReader(kube), ApiWriter(kube)
                pool = ActionsClientPool(reader, timeout=settings.actions_timeout)
                ctx = WorkerContext(
                    name=name,
                    settings=settings,
                    kube=kube,
                    reader=reader,
                    writer=writer,
                    bus=bus,
                    shards=shards,
                    events=EventRecorder(writer, f"runnerscale-{name}", host=settings.replica_id),
                    actions=pool,
                    registry=registry or CollectorRegistry(),
                )
                handle.ctx = ctx
                controllers = await _call_setup(setup, ctx)
                holder["ctx"] = ctx

                def live() -> tuple[bool, str]:
                    return True, "ok" if bus.connected else "ok (NATS reconnecting)"

                def is_ready() -> tuple[bool, str]:
                    if handle.stopping:
                        return False, "stopping"
                    if not handle._ready.is_set():
                        return False, "starting: informers syncing or shards not claimed"
                    return True, f"ok: {len(shards.owned_shards())}/{shards.shards} shards"

                await servers.start("metrics", metrics_app([REGISTRY, ctx.registry]), settings.metrics_addr)
                await servers.start("health", health_app(live, is_ready), settings.health_addr)
                async with anyio.create_task_group() as tg:
                    for informer in ctx.all_informers():
                        tg.start_soon(informer.run)
                    await anyio.lowlevel.checkpoint()  # informers mark themselves running before controllers look
                    with anyio.fail_after(max(30.0, settings.bus.lease_ttl * 3)):
                        await shards.wait_ready()
                    for c in controllers:
                        tg.start_soon(c.run)
                    for task in ctx._tasks:
                        tg.start_soon(task)
                    handle._started.set()
                    for informer in ctx.all_informers():
                        await informer.has_synced.wait()
                    handle._ready.set()
                    log.info(
                        "worker ready",
                        worker=name,
                        replica=settings.replica_id,
                        controllers=[c.name for c in controllers],
                    )
                    await handle._stop.wait()
                    handle.stopping = True
                    for c in controllers:
                        c.stop()
                    with anyio.move_on_after(settings.shutdown_timeout):
                        while any(c.queue.processing for c in controllers):
                            await anyio.sleep(0.02)  # bounded drain of in-flight reconciles
                    tg.cancel_scope.cancel()
    finally:
        handle.stopping = True
        with anyio.CancelScope(shield=True):
            if pool is not None:
                await pool.close()
            await servers.stop()
            await kube.close()


async def _run_handle(handle: WorkerHandle, setup: Setup, registry: CollectorRegistry | None) -> None:
    try:
        with handle._scope:
            await _serve(handle, setup, registry)
    except Exception as exc:  # reported through the handle, raised by the caller
        handle.failure = exc
        log.error("worker failed", worker=handle.name, error=f"{type(exc).__name__}: {exc}")
    finally:
        handle._started.set()
        handle._done.set()


@asynccontextmanager
async def running_worker(
    name: str, settings: WorkerSettings, setup: Setup, *, registry: CollectorRegistry | None = None
) -> AsyncIterator[WorkerHandle]:
    """Run worker ``name`` in-process for the duration of the block (tests, embedded mode).

    Entering returns once the controllers are started (``await handle.wait_ready()`` for synced
    caches); a start-up failure is raised here. Leaving the block stops it gracefully;
    ``handle.kill()`` simulates a crash.
    """
    handle = WorkerHandle(name, settings)
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_run_handle, handle, setup, registry)
        await handle._started.wait()
        started = not (handle.failure is not None and handle.done)
        if started:
            try:
                yield handle
            except Exception as exc:
                failure = exc
            finally:
                handle.stop()
                with anyio.CancelScope(shield=True):
                    await handle._done.wait()
    if not started:
        assert handle.failure is not None
        raise handle.failure
    if failure is not None:
        raise failure


async def run_worker(name: str, settings: WorkerSettings, setup: Setup) -> int:
    """Run until SIGTERM/SIGINT; 0 after a clean stop, 1 when a dependency is unusable."""
    configure_logging("warning" if settings.log_level.lower() == "warn" else settings.log_level)
    log.info("worker starting", worker=name, replica=settings.replica_id, namespaces=list(settings.namespaces) or "all")
    handle = WorkerHandle(name, settings)

    async def signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                log.info("shutting down", worker=name, signal=signal.Signals(signum).name)
                handle.stop()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(signals)
        await _run_handle(handle, setup, None)
        tg.cancel_scope.cancel()
    if handle.failure is not None:
        if isinstance(handle.failure, (BusError, KubeError)):
            log.error("worker stopped: dependency unavailable", worker=name, error=str(handle.failure))
        return 1
    log.info("worker stopped", worker=name)
    return 0


def worker_main(name: str, argv: Sequence[str], setup: Setup, *, description: str = "") -> int:
    """The body of a worker's ``main(argv)``: flags, settings (exit 2 on a bad one), run."""
    parser = argparse.ArgumentParser(
        prog=f"runnerscale {name}", description=description or f"runnerscale {name} worker"
    )
    add_worker_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        settings = load_worker_settings(args)
    except SettingsError as exc:
        print(f"runnerscale {name}: {exc}", file=sys.stderr)
        return 2
    return anyio.run(run_worker, name, settings, setup)


__all__ = ["Setup", "WorkerContext", "WorkerHandle", "connect_kube", "run_worker", "running_worker", "worker_main"]
