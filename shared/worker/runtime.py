"""The common worker runtime: one process = one worker kind = N controllers under one task group.

A worker is declared once as a :class:`shared.worker.WorkerSpec` (its ``worker.py``) and run by
the one shared main::

    sys.exit(worker_main(WORKER, argv))                                  # CLI: flags, signals, exit codes
    async with running_worker(WORKER.name, settings, WORKER.setup(options)) as w:   # tests: in-process
        await w.wait_ready()

Underneath, any ``setup(ctx) -> list[Controller]`` runs the same way (README "Worker runtime").
What the runtime does, in order: JSON logging; Kubernetes client; bus (streams and buckets
checked); shard ownership (``KubeShardOwnership``: Kubernetes Leases, the default; or
``ShardOwnership``: NATS KV, ``--ownership nats``); ``setup(ctx)``; /metrics and /healthz
/readyz; then it starts the parts as a tree, each with ``tg.start`` so it counts as up only when
it says so: the first shard round, informers (synced), controllers (workers taking keys), bus
consumers (subscribed). Readiness flips once every part is up. SIGTERM/SIGINT: controllers stop
taking keys, in-flight reconciles finish (bounded by ``shutdown_timeout``), leases are released,
clients closed, exit 0; a second signal stops at once (exit 1).
"""

from __future__ import annotations

import inspect
import signal
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from prometheus_client import REGISTRY, CollectorRegistry

from shared.bus import Bus, BusError, ShardOwnership
from shared.bus.subjects import ConsumerSpec
from shared.http import HttpServers, health_app, metrics_app
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
    Reconcile,
    Resource,
    Source,
)
from shared.kube.client import ClientOptions, user_agent_for
from shared.kube.leases import KubeShardOwnership, LeaseTiming
from shared.kube.metrics import kube_client_metrics
from shared.log import configure_logging, get_logger
from shared.shards import ShardChange, resource_key
from shared.worker.actions_pool import ActionsClientPool
from shared.worker.routing import KeyOf, OnMessage, default_key_of, route_to_controller
from shared.worker.settings import WorkerSettings

log = get_logger(__name__)

Setup = Callable[["WorkerContext"], Sequence[Controller] | Awaitable[Sequence[Controller]]]
ShardCallback = Callable[[ShardChange], Awaitable[None] | None]


#: A long-lived part started with ``tg.start``: called with ``task_status=``, it calls
#: ``task_status.started()`` once up and then runs until cancelled.
Task = Callable[..., Coroutine[Any, Any, None]]


async def connect_kube(
    settings: WorkerSettings, name: str = "", *, registry: CollectorRegistry | None = None
) -> KubeClient:
    """The Kubernetes client the settings name (emulator URL, kubeconfig, or in-cluster).

    ``name`` (the worker kind) goes into the User-Agent (``runnerscale-runner/…``); ``registry``
    gets the client's request and rate-limit metrics (README "Metrics")."""
    options: ClientOptions = {
        "request_timeout": settings.kube_request_timeout,
        "qps": settings.kube_qps,
        "burst": settings.kube_burst,
        "user_agent": user_agent_for(name),
        "metrics": kube_client_metrics(registry) if registry is not None else None,
    }
    if settings.kube_url:
        return KubeClient.from_url(settings.kube_url, **options)
    return await KubeClient.connect(settings.kubeconfig or None, context=settings.kube_context or None, **options)


def shard_group(name: str, settings: WorkerSettings) -> str:
    """The replicas that split shards: same worker kind and same watched namespaces (replicas
    watching different namespaces reconcile different keys, so they must not share shards)."""
    if not settings.namespaces:
        return name
    return f"{name}-{zlib.crc32(','.join(sorted(settings.namespaces)).encode()):08x}"


def join_shards(
    settings: WorkerSettings, kube: KubeClient, bus: Bus, name: str, on_change: ShardCallback
) -> AbstractAsyncContextManager[ShardOwnership | KubeShardOwnership]:
    """Shard ownership as configured: Kubernetes Leases (default, README "Shard ownership leases") or NATS KV."""
    if settings.ownership == "nats":
        return ShardOwnership.join(bus, name, replica_id=settings.replica_id, on_change=on_change)
    return KubeShardOwnership.join(
        kube.unthrottled(),  # liveness never queues behind bulk requests (README "Client (`KubeClient`)")
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
    #: The worker's reconciler (set by ``WorkerSpec.setup``): tests and introspection read it here.
    reconciler: Any = None
    _informers: dict[tuple[Any, ...], list[Informer[Any]]] = field(default_factory=dict)
    _tasks: list[Task] = field(default_factory=list)
    _shard_callbacks: list[ShardCallback] = field(default_factory=list)

    @property
    def replica_id(self) -> str:
        return self.settings.replica_id

    # --- ownership ----------------------------------------------------------------------------

    def owns_key(self, key: ObjectKey | str) -> bool:
        """True when this replica holds the shard of ``key`` right now."""
        key = ObjectKey.of(key)
        return self.shards.owns(resource_key(key.namespace, key.name))

    def held(self, key: ObjectKey | str) -> AbstractAsyncContextManager[None]:
        """``async with ctx.held(key):`` run writes only while holding ``key`` (NotOwner otherwise;
        the block is cancelled the moment the lease is lost). Every controller built with
        :meth:`controller` runs its whole reconcile inside this fence."""
        key = ObjectKey.of(key)
        return self.shards.held(resource_key(key.namespace, key.name))

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
        reconcile: Reconcile,
        sources: Sequence[Source],
        *,
        workers: int | None = None,
    ) -> Controller:
        """A Controller with the runtime's policy: keys filtered by this replica's shards, the
        shard lease held for the whole reconcile, the ``reconcile_timeout`` deadline, the worker's
        registry."""
        c = Controller(
            name,
            reconcile,
            sources,
            workers=workers or self.settings.workers,
            owns=self.owns_key,
            fence=self.held,
            timeout=self.settings.reconcile_timeout,
            registry=self.registry,
        )
        self.controllers.append(c)
        return c

    def add_task(self, task: Task) -> None:
        """Run ``task`` beside the controllers until shutdown (e.g. a bus consumer); it is started
        with ``tg.start`` and counts toward readiness."""
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

        async def task(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            await route_to_controller(
                self.bus,
                consumer,
                controller,
                instance=None if shared else self.replica_id,
                key_of=key_of,
                on_message=on_message,
                namespaces=self.settings.namespaces,
                task_status=task_status,
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
                        for key in source.informer.keys():  # noqa: SIM118 - Informer.keys() is a method, not a dict view
                            if self.shards.shard_of(resource_key(key.namespace, key.name)) in change.gained:
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
    _settled: anyio.Event = field(default_factory=anyio.Event)  # ready, or stopped before it
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
        """Wait until every part said it is up (RuntimeError if the worker stopped first)."""
        with anyio.fail_after(timeout):
            await self._settled.wait()
        if not self._ready.is_set():
            raise RuntimeError(f"worker {self.name} stopped before it was ready: {self.failure!r}")

    def readiness(self) -> tuple[bool, str]:
        """The ``/readyz`` answer."""
        if self.stopping:
            return False, "stopping"
        if not self._ready.is_set():
            return False, "starting: shards, informers, controllers or bus consumers not up yet"
        ctx = self.ctx
        owned = f"{len(ctx.shards.owned_shards())}/{ctx.shards.shards} shards" if ctx is not None else ""
        return True, f"ok: {owned}"

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
        with anyio.fail_after(timeout):
            await self._done.wait()

    def _mark_ready(self) -> None:
        self._ready.set()
        self._settled.set()

    def _mark_done(self) -> None:
        self._started.set()
        self._settled.set()
        self._done.set()

    async def _on_shard_change(self, change: ShardChange) -> None:
        if self.ctx is not None:
            await self.ctx._shards_changed(change)


async def _call_setup(setup: Setup, ctx: WorkerContext) -> list[Controller]:
    result = setup(ctx)
    if inspect.isawaitable(result):
        result = await result
    controllers = list(result or [])
    for c in ctx.controllers:
        if c not in controllers:
            controllers.append(c)
    return controllers


async def start_all(tg: anyio.abc.TaskGroup, parts: Sequence[Task]) -> None:
    """Start ``parts`` in ``tg`` concurrently; return once every one of them said it is up."""

    async def start(part: Task) -> None:
        await tg.start(part)

    async with anyio.create_task_group() as starting:
        for part in parts:
            starting.start_soon(start, part)


async def _cancel_when_set(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _serve(handle: WorkerHandle, setup: Setup, registry: CollectorRegistry | None) -> None:
    name, settings = handle.name, handle.settings
    servers = HttpServers()
    handle.ports = servers.ports
    pool: ActionsClientPool | None = None
    registry = registry or CollectorRegistry()
    kube = await connect_kube(settings, name, registry=registry)
    try:
        async with (
            Bus.connect(settings.bus, name=f"runnerscale-{name}-{settings.replica_id}") as bus,
            join_shards(settings, kube, bus, name, handle._on_shard_change) as shards,
        ):
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
                registry=registry,
            )
            handle.ctx = ctx
            controllers = await _call_setup(setup, ctx)

            def live() -> tuple[bool, str]:
                return True, "ok" if bus.connected else "ok (NATS reconnecting)"

            await servers.start("metrics", metrics_app([REGISTRY, ctx.registry]), settings.metrics_addr)
            await servers.start("health", health_app(live, handle.readiness), settings.health_addr)
            async with anyio.create_task_group() as tg:
                with anyio.fail_after(max(30.0, settings.bus.lease_ttl * 3)):
                    await shards.wait_ready()
                handle._started.set()
                async with anyio.create_task_group() as starting:
                    # A stop while starting (a cache that never syncs) ends the start, not the wait.
                    starting.start_soon(_cancel_when_set, handle._stop, starting.cancel_scope)
                    # The start tree: each level is up before the next one starts.
                    await start_all(tg, [informer.run for informer in ctx.all_informers()])
                    await start_all(tg, [c.run for c in controllers])
                    await start_all(tg, ctx._tasks)
                    handle._mark_ready()
                    starting.cancel_scope.cancel()
                if handle.ready:
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
                if handle.ready:
                    with anyio.move_on_after(settings.shutdown_timeout):  # bounded drain of in-flight reconciles
                        for c in controllers:
                            await c.stopped.wait()
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
        handle._mark_done()


@asynccontextmanager
async def running_worker(
    name: str, settings: WorkerSettings, setup: Setup, *, registry: CollectorRegistry | None = None
) -> AsyncIterator[WorkerHandle]:
    """Run worker ``name`` in-process for the duration of the block (tests, embedded mode).

    Entering returns once the first shard round is done (``await handle.wait_ready()`` for every
    part up); a start-up failure is raised here. Leaving the block stops it gracefully;
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
    """Run until SIGTERM/SIGINT; 0 after a clean stop, 1 when a dependency is unusable or a
    second signal cut the graceful stop short."""
    configure_logging("warning" if settings.log_level.lower() == "warn" else settings.log_level)
    log.info("worker starting", worker=name, replica=settings.replica_id, namespaces=list(settings.namespaces) or "all")
    handle = WorkerHandle(name, settings)
    interrupted = False

    async def signals() -> None:
        nonlocal interrupted
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                if not handle.stopping and not handle._stop.is_set():
                    log.info("shutting down", worker=name, signal=signal.Signals(signum).name)
                    handle.stop()
                    continue
                # A second signal: the operator does not want to wait for in-flight reconciles.
                log.warning("second signal: stopping at once", worker=name, signal=signal.Signals(signum).name)
                interrupted = True
                handle.kill()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(signals)
        await _run_handle(handle, setup, None)
        tg.cancel_scope.cancel()
    if handle.failure is not None:
        if isinstance(handle.failure, (BusError, KubeError)):
            log.error("worker stopped: dependency unavailable", worker=name, error=str(handle.failure))
        return 1
    if interrupted:
        log.warning("worker stopped without draining", worker=name)
        return 1
    log.info("worker stopped", worker=name)
    return 0


__all__ = [
    "Setup",
    "Task",
    "WorkerContext",
    "WorkerHandle",
    "connect_kube",
    "run_worker",
    "running_worker",
    "start_all",
]
