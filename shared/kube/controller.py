"""The controller shell: sources → keyed work queue → N workers calling ``reconcile(key)``.

    controller = Controller(
        "ephemeralrunnerset",
        reconcile,                                   # async (ObjectKey) -> Result | None
        [For(ers_informer), Owns(er_informer, "EphemeralRunnerSet"), WakeUps(bus_keys)],
        workers=2,
        owns=shard.owns,                            # (ObjectKey) -> bool, or None for "all"
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(controller.run)

- ``reconcile`` raising is logged with the key and retried with per-key exponential backoff; the
  loop never crashes. ``Result(requeue_after=s)`` re-runs the key after ``s`` seconds.
- Keys for which ``owns(key)`` is False are skipped (another replica reconciles them); ownership is
  checked when a key is added and again just before it is reconciled.
- Informers named by the sources are run by the controller unless already running (run a shared
  informer yourself in the enclosing task group). Workers start once all of them have synced.
- Cancelling the enclosing task group cancels an in-flight reconcile at its next await (handlers
  are idempotent, so the key is simply reconciled again later). :meth:`stop` is the graceful path:
  no new keys are taken, in-flight reconciles finish, then :meth:`run` returns.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from shared.api.constants import GROUP
from shared.kube.errors import Throttled
from shared.kube.informer import Change, Informer
from shared.kube.metrics import controller_metrics
from shared.kube.resources import InvalidKey, ObjectKey
from shared.kube.workqueue import QueueShutDown, WorkQueue
from shared.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for: nothing (done), or another run after ``requeue_after`` seconds."""

    requeue_after: float | None = None


Reconcile = Callable[[ObjectKey], Awaitable[Result | None]]


# --- sources ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class For:
    """The primary kind: every change enqueues the object's own key."""

    informer: Informer[Any]

    def keys(self, change: Change[Any]) -> Iterable[ObjectKey]:
        return (change.key,)


def controller_owner_key(obj: Any, owner_kind: str, owner_group: str = GROUP) -> ObjectKey | None:
    """The key of ``obj``'s controlling owner of ``owner_kind`` in ``owner_group`` (same namespace)."""
    ref = obj.metadata.controller_reference()
    if ref is None or ref.kind != owner_kind:
        return None
    group = ref.api_version.rpartition("/")[0] if "/" in ref.api_version else ""
    if group != owner_group:
        return None
    return ObjectKey(obj.metadata.namespace, ref.name)


@dataclass(frozen=True)
class Owns:
    """Owned children: a child change enqueues its controlling owner (ownerReferences, controller=true)."""

    informer: Informer[Any]
    owner_kind: str
    owner_group: str = GROUP

    def keys(self, change: Change[Any]) -> Iterable[ObjectKey]:
        found = []
        for obj in (change.obj, change.old):
            if obj is not None:
                key = controller_owner_key(obj, self.owner_kind, self.owner_group)
                if key is not None and key not in found:
                    found.append(key)
        return found


@dataclass(frozen=True)
class Watches:
    """Any kind mapped to keys by a function (e.g. an AutoscalingListener → its ARS by spec fields)."""

    informer: Informer[Any]
    map_keys: Callable[[Any], Iterable[ObjectKey]]

    def keys(self, change: Change[Any]) -> Iterable[ObjectKey]:
        return self.map_keys(change.obj)


@dataclass(frozen=True)
class WakeUps:
    """An external stream of keys (``ObjectKey`` or ``"ns/name"``), e.g. fed by the NATS bus."""

    stream: AsyncIterable[ObjectKey | str]


Source = For | Owns | Watches | WakeUps


# --- the controller ---------------------------------------------------------------------------------


class Controller:
    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        sources: Sequence[Source],
        *,
        workers: int = 1,
        owns: Callable[[ObjectKey], bool] | None = None,
        registry: CollectorRegistry | None = None,
        base_delay: float = 0.005,
        max_delay: float = 300.0,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.name = name
        self.reconcile = reconcile
        self.sources = list(sources)
        self.workers = workers
        self.owns = owns
        self.queue: WorkQueue[ObjectKey] = WorkQueue(base_delay=base_delay, max_delay=max_delay)
        self._metrics = controller_metrics(registry)
        self._metrics.max_concurrent_reconciles.labels(name).set(workers)
        self._log = log.bind(controller=name)

    # --- keys in ----------------------------------------------------------------------------------

    def _owned(self, key: ObjectKey) -> bool:
        if self.owns is None:
            return True
        try:
            return bool(self.owns(key))
        except Exception:
            self._log.exception("ownership check failed; skipping key", namespace=key.namespace, name=key.name)
            return False

    def enqueue(self, key: ObjectKey | str) -> None:
        """Ask for ``key`` to be reconciled (de-duplicated; skipped if another replica owns it)."""
        key = ObjectKey.of(key)
        if not self._owned(key):
            self._metrics.skipped_total.labels(self.name).inc()
            return
        self.queue.add(key)
        self._metrics.queue_adds_total.labels(self.name, self.name).inc()
        self._update_depth()

    def _update_depth(self) -> None:
        self._metrics.queue_depth.labels(self.name, self.name).set(len(self.queue))

    def _handler(self, source: For | Owns | Watches) -> Callable[[Change[Any]], None]:
        def handle(change: Change[Any]) -> None:
            for key in source.keys(change):
                self.enqueue(key)

        return handle

    async def _pump(self, source: WakeUps) -> None:
        try:
            async for item in source.stream:
                try:
                    self.enqueue(item)
                except InvalidKey as exc:
                    self._log.warning("ignoring malformed wake-up key", error=str(exc))
        except Exception:
            self._log.exception("wake-up stream failed; it no longer feeds this controller")

    # --- running ----------------------------------------------------------------------------------

    def resync(self) -> int:
        """Enqueue every cached primary object (after this replica gained ownership of more keys,
        e.g. when a peer's lease expired). Returns how many keys were offered."""
        offered = 0
        for source in self.sources:
            if isinstance(source, For):
                for key in source.informer.keys():
                    self.enqueue(key)
                    offered += 1
        return offered

    def stop(self) -> None:
        """Graceful stop: take no new keys, let in-flight reconciles finish, then ``run`` returns."""
        self.queue.shutdown()

    async def run(self) -> None:
        informers: list[Informer[Any]] = []
        removers: list[Callable[[], None]] = []
        for source in self.sources:
            if isinstance(source, (For, Owns, Watches)):
                if source.informer not in informers:
                    informers.append(source.informer)
                removers.append(source.informer.add_handler(self._handler(source), replay=True))
        self._log.info("controller starting", workers=self.workers, informers=[i.resource.qualified for i in informers])
        try:
            async with anyio.create_task_group() as sources_tg:
                for informer in informers:
                    if not informer.running:
                        sources_tg.start_soon(informer.run)
                for source in self.sources:
                    if isinstance(source, WakeUps):
                        sources_tg.start_soon(self._pump, source)
                for informer in informers:
                    await informer.has_synced.wait()
                self._log.info("caches synced; workers starting")
                async with anyio.create_task_group() as workers_tg:
                    for _ in range(self.workers):
                        workers_tg.start_soon(self._worker)
                # Workers return only after stop(): end the sources too.
                sources_tg.cancel_scope.cancel()
        finally:
            for remove in removers:
                remove()
            self._log.info("controller stopped")

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            self._update_depth()
            try:
                await self._process(key)
            finally:
                self.queue.done(key)
                self._update_depth()

    async def _process(self, key: ObjectKey) -> None:
        if not self._owned(key):
            self.queue.forget(key)
            self._metrics.skipped_total.labels(self.name).inc()
            return
        m = self._metrics
        m.active_workers.labels(self.name).inc()
        started = time.perf_counter()
        try:
            result = await self.reconcile(key)
        except Exception as exc:
            m.reconcile_total.labels(self.name, "error").inc()
            m.reconcile_errors_total.labels(self.name).inc()
            m.queue_retries_total.labels(self.name, self.name).inc()
            # A server's Retry-After wins over a shorter backoff: an earlier retry is throttled again.
            retry_after = exc.retry_after if isinstance(exc, Throttled) and exc.retry_after else 0.0
            delay = self.queue.add_rate_limited(key, at_least=retry_after)
            self._log.error(
                "reconcile failed; retrying",
                namespace=key.namespace,
                name=key.name,
                error=f"{type(exc).__name__}: {exc}",
                retry_in=round(delay, 3),
            )
            return
        finally:
            m.reconcile_time_seconds.labels(self.name).observe(time.perf_counter() - started)
            m.active_workers.labels(self.name).dec()
        self.queue.forget(key)
        if result is not None and result.requeue_after is not None:
            m.reconcile_total.labels(self.name, "requeue_after").inc()
            self.queue.add_after(key, result.requeue_after)
        else:
            m.reconcile_total.labels(self.name, "success").inc()
