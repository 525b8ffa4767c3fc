"""The controller: sources → keyed work queue → N workers calling ``reconcile(key, ctx) -> Result``.

    controller = Controller(
        "ephemeralrunnerset",
        reconciler.reconcile,                        # async (ObjectKey, ReconcileContext) -> Result
        [For(ers_informer), Owns(er_informer, "EphemeralRunnerSet"), WakeUps(bus_keys)],
        workers=2,
        owns=shard.owns,                             # (ObjectKey) -> bool, or None for "all"
        fence=shard.held,                            # the lease held for the whole reconcile
        timeout=300.0,                               # the per-reconcile deadline
    )
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)               # returns once caches synced and workers run

The controller, not the reconciler, owns what every reconcile needs (README "Worker runtime"):

- **Lease fence.** Keys for which ``owns(key)`` is False are skipped (another replica reconciles
  them), checked when a key is added and again just before it is reconciled. With ``fence`` the
  whole reconcile runs inside ``fence(key)``: a lease lost mid-reconcile cancels it at its next
  await (outcome ``not_owner``; the new owner reconciles the key).
- **Conflicts.** Every reconcile runs inside :func:`retry_on_conflict`: a 409 re-runs it from
  fresh reads, and a write without a resourceVersion/uid precondition is refused before it is sent.
  When every attempt met a 409 the key is retried with its backoff (outcome ``conflict``).
- **Deadline.** ``timeout`` bounds one reconcile, retries included (outcome ``timeout``, retried
  with backoff).
- **One patch per part.** The patches of each attempt are recorded (shared/kube/ledger.py); an
  object patched twice in the same part (metadata/spec, or status) in one attempt is counted in
  ``runnerscale_reconcile_repeated_patches_total`` and logged.
- **Outcomes.** Each reconcile ends in exactly one :class:`Outcome`, the ``result`` label of
  ``controller_runtime_reconcile_total``. A raised error is logged with the key and retried with
  per-key exponential backoff (a server's Retry-After wins); the loop never crashes.

Informers named by the sources are run by the controller unless already running (run a shared
informer yourself in the enclosing task group). Workers start once all of them have synced.
Cancelling the enclosing task group cancels an in-flight reconcile at its next await (reconciles
are idempotent, so the key is simply reconciled again later). :meth:`stop` is the graceful path:
no new keys are taken, in-flight reconciles finish, then :meth:`run` returns.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

from shared.api.constants import GROUP
from shared.kube.errors import Conflict, Throttled
from shared.kube.informer import Change, Informer
from shared.kube.ledger import recording, repeated_patches
from shared.kube.metrics import controller_metrics
from shared.kube.resources import InvalidKey, ObjectKey
from shared.kube.workqueue import QueueShutDown, WorkQueue
from shared.kube.writer import retry_on_conflict
from shared.log import StructLogger, get_logger
from shared.shards import NotOwner

log = get_logger(__name__)

#: Logged (with the objects) when one reconcile attempt patched an object twice in one part.
REPEATED_PATCHES_MESSAGE = "one reconcile patched the same object more than once"

#: Attempts of one reconcile when writes meet 409 Conflict (client-go's DefaultRetry has 5 steps).
CONFLICT_ATTEMPTS = 5


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for: nothing more (``Result()``), or another run after ``requeue_after`` seconds."""

    requeue_after: float | None = None


#: The reconcile is done until something changes.
DONE = Result()

#: Run again right away: the pass made its one patch of a part and the next pass continues from it
#: (README "Worker runtime"; the patch's own watch event would wake the key too, later).
NEXT_PASS = Result(requeue_after=0.0)


class Outcome(StrEnum):
    """How one reconcile ended: the closed set of ``result`` labels of ``controller_runtime_reconcile_total``."""

    SUCCESS = "success"  # returned Result(): done until something changes
    REQUEUE_AFTER = "requeue_after"  # returned Result(requeue_after=s): run again after s seconds
    ERROR = "error"  # raised: retried with the key's exponential backoff
    CONFLICT = "conflict"  # every attempt met a 409: retried with the key's backoff
    TIMEOUT = "timeout"  # ran past the per-reconcile deadline: cancelled, retried with backoff
    NOT_OWNER = "not_owner"  # the shard lease was lost: dropped here, the new owner reconciles it


@dataclass(frozen=True)
class ReconcileContext:
    """What the controller hands each reconcile besides the key."""

    controller: str
    attempt: int  # 1, 2, ...: a 409 re-runs the reconcile from fresh reads
    deadline: float  # anyio.current_time() after which the reconcile is cancelled (inf: none)
    log: StructLogger  # bound with controller, namespace and name

    @classmethod
    def direct(cls, controller: str = "direct") -> ReconcileContext:
        """A context for calling a reconciler without a controller (tests, one-off tools): first
        attempt, no deadline."""
        return cls(controller, 1, float("inf"), log.bind(controller=controller))


class Reconciler(Protocol):
    """The one contract of every controller worker's I/O shell (README "Worker runtime")."""

    async def reconcile(self, key: ObjectKey, ctx: ReconcileContext) -> Result: ...


Reconcile = Callable[[ObjectKey, ReconcileContext], Awaitable[Result]]
Fence = Callable[[ObjectKey], AbstractAsyncContextManager[None]]


@asynccontextmanager
async def _unfenced(_: ObjectKey) -> AsyncIterator[None]:
    yield


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
        fence: Fence | None = None,
        timeout: float | None = None,
        conflict_attempts: int = CONFLICT_ATTEMPTS,
        registry: CollectorRegistry | None = None,
        base_delay: float = 0.005,
        max_delay: float = 300.0,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.name = name
        self.reconcile = reconcile
        self.sources = list(sources)
        self.workers = workers
        self.owns = owns
        self.fence = fence or _unfenced
        self.timeout = timeout
        self.conflict_attempts = conflict_attempts
        self.queue: WorkQueue[ObjectKey] = WorkQueue(base_delay=base_delay, max_delay=max_delay)
        self.stopped = anyio.Event()
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
                for key in source.informer.keys():  # noqa: SIM118 - Informer.keys() is a method, not a dict view
                    self.enqueue(key)
                    offered += 1
        return offered

    def stop(self) -> None:
        """Graceful stop: take no new keys, let in-flight reconciles finish, then ``run`` returns
        (``stopped`` is set then)."""
        self.queue.shutdown()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`stop` (or cancellation); ``task_status.started()`` once the caches
        have synced and the workers take keys."""
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
                        await sources_tg.start(informer.run)
                for source in self.sources:
                    if isinstance(source, WakeUps):
                        sources_tg.start_soon(self._pump, source)
                for informer in informers:
                    await informer.has_synced.wait()  # a shared informer run by the caller
                self._log.info("caches synced; workers starting")
                async with anyio.create_task_group() as workers_tg:
                    for _ in range(self.workers):
                        workers_tg.start_soon(self._worker)
                    task_status.started()
                # Workers return only after stop(): end the sources too.
                sources_tg.cancel_scope.cancel()
        finally:
            for remove in removers:
                remove()
            self.stopped.set()
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
            outcome, result, error = await self._reconcile_once(key)
        finally:
            m.reconcile_time_seconds.labels(self.name).observe(time.perf_counter() - started)
            m.active_workers.labels(self.name).dec()
        m.reconcile_total.labels(self.name, outcome).inc()
        self._settle(key, outcome, result, error)

    async def _reconcile_once(self, key: ObjectKey) -> tuple[Outcome, Result, BaseException | None]:
        """One reconcile under the fence, the conflict policy and the deadline; never raises
        (except cancellation of the enclosing task group)."""
        bound = self._log.bind(namespace=key.namespace, name=key.name)
        deadline = anyio.current_time() + self.timeout if self.timeout is not None else float("inf")
        attempt = 0

        async def run() -> Result:
            nonlocal attempt
            attempt += 1
            ctx = ReconcileContext(self.name, attempt, deadline, bound)
            with recording() as patches:
                try:
                    return await self.reconcile(key, ctx)
                finally:
                    repeated = repeated_patches(patches)
                    if repeated:
                        # The rule of README "Worker runtime": one metadata/spec and one status patch
                        # per object per reconcile. Said, never enforced: the writes are already made.
                        self._metrics.repeated_patches_total.labels(self.name).inc(len(repeated))
                        bound.warning(
                            REPEATED_PATCHES_MESSAGE,
                            patches=[r.describe() for r in repeated],
                        )

        def conflicted(exc: Conflict, tried: int) -> None:
            self._metrics.conflicts_total.labels(self.name).inc()
            bound.info("stale read; re-reading and deciding again", error=str(exc), attempt=tried)

        try:
            with anyio.CancelScope(deadline=deadline) as scope:
                async with self.fence(key):
                    result = await retry_on_conflict(run, attempts=self.conflict_attempts, on_conflict=conflicted)
                return (Outcome.REQUEUE_AFTER if result.requeue_after is not None else Outcome.SUCCESS), result, None
            # Only the deadline's own scope gets here: it cancelled the reconcile.
            assert scope.cancelled_caught
            return Outcome.TIMEOUT, DONE, None
        except NotOwner as exc:
            return Outcome.NOT_OWNER, DONE, exc
        except Conflict as exc:
            return Outcome.CONFLICT, DONE, exc
        except Exception as exc:
            return Outcome.ERROR, DONE, exc

    def _settle(self, key: ObjectKey, outcome: Outcome, result: Result, error: BaseException | None) -> None:
        """What the queue does after ``outcome``: one place for every retry decision."""
        m = self._metrics
        match outcome:
            case Outcome.SUCCESS:
                self.queue.forget(key)
            case Outcome.REQUEUE_AFTER:
                self.queue.forget(key)
                assert result.requeue_after is not None
                self.queue.add_after(key, result.requeue_after)
            case Outcome.NOT_OWNER:
                # Another replica holds the key now; if this one wins it back, the resync re-enqueues it.
                self.queue.forget(key)
                self._log.info(
                    "lease lost during reconcile; left to the new owner", namespace=key.namespace, name=key.name
                )
            case Outcome.ERROR | Outcome.CONFLICT | Outcome.TIMEOUT:
                if outcome is not Outcome.CONFLICT:
                    m.reconcile_errors_total.labels(self.name).inc()
                m.queue_retries_total.labels(self.name, self.name).inc()
                # A server's Retry-After wins over a shorter backoff: an earlier retry is throttled again.
                retry_after = error.retry_after if isinstance(error, Throttled) and error.retry_after else 0.0
                delay = self.queue.add_rate_limited(key, at_least=retry_after)
                what = {
                    Outcome.ERROR: "reconcile failed; retrying",
                    Outcome.CONFLICT: "reconcile met a conflict on every attempt; retrying",
                    Outcome.TIMEOUT: "reconcile ran past its deadline and was cancelled; retrying",
                }[outcome]
                self._log.error(
                    what,
                    namespace=key.namespace,
                    name=key.name,
                    error=f"{type(error).__name__}: {error}" if error is not None else f"timeout {self.timeout}s",
                    retry_in=round(delay, 3),
                )
