"""The runner-set worker's I/O shell: reconciles EphemeralRunnerSets with typed revision state
(README "runner-set worker"). Decisions are in :mod:`services.runner_set.decide` and
:mod:`services.runner_set.failures`.

One pass: authoritative GET of the ERS → apply the newest listener desired state (merge patch
locked on the read's resourceVersion) → finalizer → its runners from the informer's cache (as buckets of the runner index kept from
its events, :mod:`services.runner_set.index`), once this replica's own creations and deletions are
observed there (:mod:`services.runner_set.expectations`) → ``plan`` → execute → status (locked). The runners are read through the API instead on a key's
first pass, when expectations expire, and for the decisions the seeds take on authoritative
reads (the finished-cleanup marker, the revision advance; README "runner-set worker"). A pass
that would write nothing is decided on the cached set and ends without the GET (``_quiet_pass``).
The controller runs it under its shared policy (README
"Worker runtime"): the shard lease is held for the whole pass, and a 409 anywhere means
"decided on stale data": the pass is re-run on fresh reads.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import anyio

from services.runner_set import adopt, decide, failures, index
from services.runner_set import expectations as xp
from services.runner_set.decide import Plan
from services.runner_set.failures import FailurePolicy
from services.runner_set.metrics import RunnerSetMetrics
from shared.actions import ActionsClient, ActionsError, JobStillRunningError, RunnerNotFoundError
from shared.api import EphemeralRunner, EphemeralRunnerSet, finished, validate
from shared.api.constants import (
    KIND_AUTOSCALING_RUNNER_SET,
    KIND_EPHEMERAL_RUNNER_SET,
    LABEL_SCALE_SET_NAME,
    LABEL_SCALE_SET_NAMESPACE,
)
from shared.api.names import runner_proxy_secret_name
from shared.bus import Bus, Delivery, DesiredState, JobCompleted, ResourceRef, RevisionApplied, subjects
from shared.bus.errors import BusError
from shared.clock import SYSTEM_CLOCK, Clock
from shared.kube import (
    AUTOSCALING_RUNNER_SETS,
    DONE,
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    NEXT_PASS,
    SECRETS,
    ApiReader,
    ApiWriter,
    BadRequest,
    Change,
    ChangeType,
    Conflict,
    EventRecorder,
    Informer,
    Invalid,
    NotFound,
    ObjectKey,
    ReconcileContext,
    Result,
    controller_owner_key,
)
from shared.log import get_logger
from shared.shards import ShardChange
from shared.worker import ActionsCredentialsUnavailable, WorkerContext

log = get_logger(__name__)

DELETION_REQUEUE = 5.0
ACTIONS_RETRY = 5.0
SAFETY_REQUEUE = 1.0  # multi-step plans re-run after this even if no watch event arrives
CREATE_CONCURRENCY = 8  # parallel EphemeralRunner creates per reconcile
JOB_STILL_RUNNING_RETRY = 30.0  # a Failed runner past its TTL that the service says is busy: ask again after
QUIET_PLANS = frozenset({"steady", "patch-already-applied", "outdated-hold", "scale-up-suppressed"})
# A set's next pass waits at least this many times the CPU its last cached decision took, so one
# big set cannot take more than 1/(1+PASS_SPACING) of a core however often its runners change
# (README "runner-set worker", reads from the cache). From the runner index a scale-up, steady or
# count-only pass costs the same at any size; a pass that reads runner lists (scale-down, reaping,
# failed or outdated runners, a revision change) still grows with them, and is spaced accordingly.
PASS_SPACING = 2.0
AUTHORITATIVE_PLANS = frozenset({"revision-applied"})  # decided on an API list, never on the cache
HEARD_COMPLETIONS = 20_000  # JobCompleted events remembered (by runner); the oldest go first


class ClientSource(Protocol):
    """Where Actions clients come from (``shared.worker.ActionsClientPool``)."""

    async def for_spec(self, namespace: str, spec: Any) -> ActionsClient: ...


class RunnerSetReconciler:
    """The I/O shell of the runner-set worker; holds the per-process state (the newest desired
    state per ERS, and which keys' stream level was read since this replica gained them)."""

    def __init__(
        self,
        reader: ApiReader,
        writer: ApiWriter,
        events: EventRecorder,
        actions: ClientSource,
        bus: Bus,
        policy: FailurePolicy | None = None,
        *,
        metrics: RunnerSetMetrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
        runners_cache: Sequence[Informer[EphemeralRunner]] = (),
        sets_cache: Sequence[Informer[EphemeralRunnerSet]] = (),
        expectations_timeout: float = xp.TIMEOUT,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.events = events
        self.actions = actions
        self.bus = bus
        self.policy = policy or FailurePolicy()
        self.clock = clock
        self.metrics = metrics or RunnerSetMetrics()
        self.desired: dict[ObjectKey, DesiredState] = {}
        # Where each remembered desired state came from (subject, stream sequence; 0 = read as the
        # stream's latest message), for the log line of a clamp.
        self.origin: dict[ObjectKey, tuple[str, int]] = {}
        self.seeded: set[ObjectKey] = set()  # keys whose latest stream message was read since gaining them
        # The listener's JobCompleted per runner (namespace, runner name), as received from the bus:
        # accounts a finished runner before the runner worker's mark is written (README "Typed state (new fields)").
        self.completed: dict[ObjectKey, JobCompleted] = {}
        # Runners come from these informers (README "runner-set worker"); none: every pass lists them.
        self.runners_cache = list(runners_cache)
        # Sets from these informers for a pass that writes nothing (``_quiet_pass``); ``seen_rv``:
        # the newest resourceVersion of each set this replica read or wrote (a cached copy older
        # than that is not used). None: every pass GETs its set.
        self.sets_cache = list(sets_cache)
        self.seen_rv: dict[ObjectKey, int] = {}
        self.expectations_timeout = expectations_timeout
        self.expectations: dict[ObjectKey, xp.Expectations] = {}
        self.cache_trusted: set[ObjectKey] = set()  # keys read through the API since gaining them
        self.pass_spacing = PASS_SPACING
        self.next_pass: dict[ObjectKey, float] = {}  # anyio time before which a set is not decided again
        self.status_window = decide.STATUS_WINDOW
        self.status_written: dict[ObjectKey, float] = {}  # anyio time of each set's last status write
        # Each informer's runners by set and bucket, kept from its events (replayed from what it
        # holds already): a cached pass reads counts, not runners (README "runner-set worker").
        self.runner_indexes = [index.RunnerIndex(informer.namespace) for informer in self.runners_cache]
        for informer, runner_index in zip(self.runners_cache, self.runner_indexes, strict=True):
            informer.add_handler(runner_index.apply)
            informer.add_handler(self._observe, replay=False)

    @classmethod
    def from_context(cls, ctx: WorkerContext, policy: FailurePolicy) -> RunnerSetReconciler:
        return cls(
            ctx.reader,
            ctx.writer,
            ctx.events,
            ctx.actions,
            ctx.bus,
            policy,
            metrics=RunnerSetMetrics(ctx.registry),
            runners_cache=ctx.informers(EPHEMERAL_RUNNERS),
            sets_cache=ctx.informers(EPHEMERAL_RUNNER_SETS),
        )

    # --- bus and shard hooks ---------------------------------------------------------------------

    def on_desired(self, delivery: Delivery) -> None:
        msg = delivery.message
        if not isinstance(msg, DesiredState):
            return
        key = ObjectKey(msg.ers.namespace, msg.ers.name)
        newest = decide.newer_desired(self.desired.get(key), msg)
        assert newest is not None  # msg itself is a candidate
        self.desired[key] = newest
        if newest is msg:
            self.origin[key] = (delivery.subject, delivery.stream_sequence)

    def on_completed(self, delivery: Delivery) -> None:
        msg = delivery.message
        if not isinstance(msg, JobCompleted) or not msg.runner_name:
            return
        key = ObjectKey(msg.scale_set.namespace, msg.runner_name)
        self.completed.pop(key, None)  # re-inserted last: eviction goes oldest first
        self.completed[key] = msg
        while len(self.completed) > HEARD_COMPLETIONS:
            del self.completed[next(iter(self.completed))]

    def _heard(self, b: decide.Buckets) -> dict[str, finished.JobCompletion]:
        """Completions received from the bus for the set's finished runners, by runner uid."""
        heard: dict[str, finished.JobCompletion] = {}
        for er in b.finished:
            event = self.completed.get(ObjectKey(er.metadata.namespace, er.metadata.name))
            c = decide.heard_completion(er, event) if event is not None else None
            if c is not None:
                heard[er.metadata.uid] = c
        return heard

    def on_shard_change(self, change: ShardChange) -> None:
        # Messages of newly gained keys may have been acked while another replica owned them:
        # read each key's latest stream message again on its next reconcile. Their runners may
        # have been written by that replica: read them through the API once, too.
        self.seeded.clear()
        self.cache_trusted.clear()

    def _observe(self, change: Change[EphemeralRunner]) -> None:
        """Informer handler: a runner change observes this replica's expectations of its set."""
        key = controller_owner_key(change.obj, KIND_EPHEMERAL_RUNNER_SET)
        e = self.expectations.get(key) if key is not None else None
        if key is None or e is None:
            return
        meta = change.obj.metadata
        if change.type is ChangeType.DELETED:
            self.completed.pop(ObjectKey(meta.namespace, meta.name), None)
        e = xp.observe(e, meta.uid, gone=change.type is ChangeType.DELETED, deleting=meta.is_deleting)
        if e.pending:
            self.expectations[key] = e
        else:
            del self.expectations[key]

    # --- reconcile -------------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey, ctx: ReconcileContext) -> Result:
        """One pass over ``key`` (see the module docstring for its steps)."""
        ready = self.next_pass.get(key, 0.0) - anyio.current_time()
        if ready > 0:
            return Result(requeue_after=ready)
        draft: _Draft | None = None
        if ctx.attempt <= 1:
            quiet = self._quiet_pass(key)
            if isinstance(quiet, Result):
                return quiet
            draft = quiet
        ers = await self.reader.get_or_none(EPHEMERAL_RUNNER_SETS, key)
        self._saw(key, ers)
        if ers is None:
            self.next_pass.pop(key, None)
            self.metrics.forget(key)
            self.seeded.discard(key)
            self.expectations.pop(key, None)
            self.cache_trusted.discard(key)
            self.status_written.pop(key, None)
            return DONE
        applied = await self._apply_desired(key, ers)
        if applied is not ers:
            # The desired state is on the ERS (this pass's one spec patch, README "Worker runtime");
            # the next pass, right away, plans against it.
            return NEXT_PASS
        if ers.metadata.is_deleting:
            return await self._finalize(key, ers)
        finalizers = adopt.live_finalizers(ers.metadata.finalizers)  # ours, in place of ARC 0.12-0.14's
        if finalizers is not None:
            # Added alone, before any runner exists: the pass ends with it (README "Worker runtime").
            written = await self.writer.patch_merge(
                EPHEMERAL_RUNNER_SETS,
                key,
                {"metadata": {"finalizers": finalizers}},
                resource_version=ers.metadata.resource_version,
            )
            self._saw(key, written)
            return NEXT_PASS
        problems = validate(ers)
        if problems:
            text = "; ".join(f"{p.path}: {p.message}" for p in problems)
            log.warning(
                "invalid EphemeralRunnerSet; not scaling", namespace=key.namespace, name=key.name, problems=text
            )
            await self.events.warning(ers, "InvalidSpec", text)
            return DONE
        proxy_secret = ""
        if ers.spec.ephemeral_runner_spec.proxy is not None:
            proxy_secret = await self._ensure_proxy_secret(ers)
            if not proxy_secret:
                return Result(requeue_after=ACTIONS_RETRY)
        started = time.perf_counter()
        if draft is not None and draft.resource_version == ers.metadata.resource_version:
            # Decided already, on this very set (the GET answered the cached resourceVersion) and
            # the cached runners: the plan stands (its pass spacing is set).
            authoritative, b, now, p = False, draft.buckets, draft.now, draft.plan
        else:
            decided_on, authoritative, wait = await self._decision_buckets(key, ers)
            if decided_on is None:
                self._space(key, started)
                log.debug(
                    "waiting for the cache to observe this replica's writes", namespace=key.namespace, name=key.name
                )
                return Result(requeue_after=wait)
            b = decided_on
            now = self.clock.now()
            p = decide.plan(ers, b, now, self.policy, self._heard(b))
            if not authoritative:
                self._space(key, started)
        if not authoritative and _needs_authoritative(p):
            b = decide.bucket_runners(await self._runners(ers))
            p = decide.plan(ers, b, now, self.policy, self._heard(b))
        self.metrics.set(key, ers, b)
        if p.create:
            p = await self._cap_create(key, ers, b, p)
        p = self._coalesce_status(key, p)
        # Steady-state passes are the common case: they log at debug only.
        (log.debug if p.reason in QUIET_PLANS else log.info)(
            "reconcile",
            namespace=key.namespace,
            name=key.name,
            plan=p.reason,
            replicas=ers.spec.replicas,
            patch_id=ers.spec.patch_id,
            current=b.scale_total,
            deleting=b.counts.deleting,
            finished=b.counts.finished,
            create=p.create,
            delete=len(p.delete),
            remove=p.remove_count,
            reap=len(p.reap),
            failures=p.budget.failures if p.budget else 0,
            backoff_level=p.budget.level if p.budget else 0,
        )
        retry = await self._execute(key, ers, p, proxy_secret)
        self.metrics.set_budget(ers, p.budget, now)
        first = [retry.requeue_after] if retry is not None else [SAFETY_REQUEUE if p.requeue else None]
        after = [r for r in (*first, p.requeue_after) if r is not None]
        return Result(requeue_after=max(0.0, min(after))) if after else DONE

    def _saw(self, key: ObjectKey, ers: EphemeralRunnerSet | None) -> None:
        """Remember the resourceVersion of a set read from or written to the server (None: gone)."""
        if ers is None:
            self.seen_rv.pop(key, None)
            return
        rv = _rv_int(ers.metadata.resource_version)
        if rv is not None and rv > self.seen_rv.get(key, -1):
            self.seen_rv[key] = rv

    def _cached_set(self, key: ObjectKey) -> EphemeralRunnerSet | None:
        """The set from the informers (a shared object: read-only), unless it is older than what
        this replica has read or written of it."""
        for informer in self.sets_cache:
            if informer.namespace in (None, key.namespace):
                ers = informer.get_cached(key, copy=False)
                if ers is not None:
                    rv = _rv_int(ers.metadata.resource_version)
                    return ers if rv is not None and rv >= self.seen_rv.get(key, -1) else None
        return None

    def _quiet_pass(self, key: ObjectKey) -> Result | _Draft | None:
        """The pass decided on the cached set and runners, when it writes nothing: its Result, and
        no GET of the set (README "runner-set worker", reads from the cache). None when anything
        may be written, read or published (a desired state to apply, finalizers, a proxy Secret,
        expectations expired, a plan the seeds decide on authoritative reads, any action or status
        write): the pass then runs from an authoritative GET of the set, as always. A cache that
        lags can only delay a pass here: the change it lacks wakes the set again once it arrives. A
        plan that acts is returned as a draft: the pass uses it when its GET answers the same
        resourceVersion (the same set) instead of deciding a second time."""
        if (
            not self.sets_cache
            or not self.runners_cache
            or key not in self.seeded
            or key in self.desired
            or key not in self.cache_trusted
        ):
            return None
        ers = self._cached_set(key)
        if (
            ers is None
            or ers.metadata.is_deleting
            or adopt.live_finalizers(ers.metadata.finalizers) is not None
            or ers.spec.ephemeral_runner_spec.proxy is not None
            or validate(ers)
        ):
            return None
        started = time.perf_counter()
        e = self.expectations.get(key, xp.NONE)
        if e.pending:
            e = xp.settle(e, self._cached_members(ers))
            self._store_expectations(key, e)
        verdict, left = xp.check(e, anyio.current_time(), self.expectations_timeout)
        if verdict is xp.Verdict.EXPIRED:
            return None
        if verdict is xp.Verdict.PENDING:
            self._space(key, started)
            return Result(requeue_after=left)
        b = self._cached_buckets(ers)
        now = self.clock.now()
        p = decide.plan(ers, b, now, self.policy, self._heard(b))
        self._space(key, started)
        if _needs_authoritative(p):
            return None
        coalesced = self._coalesce_status(key, p)
        if not _writes_nothing(coalesced):
            return _Draft(ers.metadata.resource_version, b, now, p)
        p = coalesced
        self.metrics.set(key, ers, b)
        self.metrics.set_budget(ers, p.budget, now)
        after = [r for r in (SAFETY_REQUEUE if p.requeue else None, p.requeue_after) if r is not None]
        return Result(requeue_after=max(0.0, min(after))) if after else DONE

    async def _runners(self, ers: EphemeralRunnerSet) -> list[EphemeralRunner]:
        """The set's runners through the API (authoritative)."""
        listed = await self.reader.list(EPHEMERAL_RUNNERS, namespace=ers.metadata.namespace)
        return decide.owned_by(listed.items, ers)

    def _cached_buckets(self, ers: EphemeralRunnerSet) -> decide.Buckets:
        """The set's cached runners as buckets, from the runner index: counts at once, each list
        sorted when the plan first reads it, which it must do before the next await (the index
        moves on with the informer's events: :class:`index.StaleBuckets`)."""
        return index.buckets(self.runner_indexes, ers.metadata.uid, ers.metadata.namespace)

    def _cached_members(self, ers: EphemeralRunnerSet) -> Mapping[str, bool]:
        """The set's cached runners, uid → deleting (read it before the next await)."""
        return index.members(self.runner_indexes, ers.metadata.uid, ers.metadata.namespace)

    async def _decision_buckets(
        self, key: ObjectKey, ers: EphemeralRunnerSet
    ) -> tuple[decide.Buckets | None, bool, float]:
        """The buckets to decide on, whether they were read through the API, and (when None:
        wait for the cache) the seconds before expectations expire. Cached buckets are taken
        after the last await: the caller plans on them before its next one."""
        if not self.runners_cache:
            return decide.bucket_runners(await self._runners(ers)), True, 0.0
        now = anyio.current_time()
        e = self.expectations.get(key, xp.NONE)
        if e.pending:
            e = xp.settle(e, self._cached_members(ers))
            self._store_expectations(key, e)
        verdict, left = xp.check(e, now, self.expectations_timeout)
        if verdict is xp.Verdict.PENDING:
            return None, False, left
        if verdict is xp.Verdict.EXPIRED or key not in self.cache_trusted:
            if verdict is xp.Verdict.EXPIRED:
                log.warning(
                    "cache did not observe this replica's writes in time; reading runners through the API",
                    namespace=key.namespace,
                    name=key.name,
                    creates=len(e.creates),
                    deletes=len(e.deletes),
                )
            listed = await self._runners(ers)
            self._store_expectations(key, xp.from_read(_uids(listed), self._cached_members(ers), now))
            self.cache_trusted.add(key)
            return decide.bucket_runners(listed), True, 0.0
        return self._cached_buckets(ers), False, 0.0

    def _space(self, key: ObjectKey, started: float) -> None:
        """Space the set's next pass by PASS_SPACING times the CPU this decision took (no awaits
        since ``started``: the cached path is synchronous)."""
        self.next_pass[key] = anyio.current_time() + self.pass_spacing * (time.perf_counter() - started)

    def _store_expectations(self, key: ObjectKey, e: xp.Expectations) -> None:
        if e.pending:
            self.expectations[key] = e
        else:
            self.expectations.pop(key, None)

    def _expect(self, key: ObjectKey, *, created: str = "", deleted: str = "") -> None:
        e = xp.expect(
            self.expectations.get(key, xp.NONE), created=(created,), deleted=(deleted,), now=anyio.current_time()
        )
        self._store_expectations(key, e)

    # --- desired state -----------------------------------------------------------------------------

    async def _apply_desired(self, key: ObjectKey, ers: EphemeralRunnerSet) -> EphemeralRunnerSet:
        candidate = self.desired.get(key)
        if key not in self.seeded:
            try:
                last = await self.bus.last_message(subjects.desired_subject(key.namespace, key.name))
            except BusError as exc:
                log.warning(
                    "latest desired state unreadable; using delivered messages only",
                    namespace=key.namespace,
                    name=key.name,
                    error=str(exc),
                )
            else:
                if isinstance(last, DesiredState):
                    newest = decide.newer_desired(candidate, last)
                    if newest is last and last is not candidate:
                        self.origin[key] = (subjects.desired_subject(key.namespace, key.name), 0)
                    candidate = newest
                self.seeded.add(key)
        if candidate is None:
            return ers
        problem = decide.desired_problem(candidate)
        if problem is not None:
            log.warning(
                "desired state rejected",
                namespace=key.namespace,
                name=key.name,
                problem=problem,
                epoch=candidate.listener_epoch,
            )
            await self.events.warning(
                ers,
                "InvalidDesiredState",
                f"desired state from listener epoch {candidate.listener_epoch} rejected: {problem}",
            )
            self._settle(key, candidate)
            return ers
        patch = decide.desired_patch(ers, candidate)
        if patch is None:
            self._settle(key, candidate)
            return ers
        clamped = decide.clamp_desired(candidate, await self._max_runners(ers) if candidate.replicas else None)
        if clamped is not None:
            subject, sequence = self.origin.get(key, ("", 0))
            log.warning(
                "desired state above maxRunners clamped",
                namespace=key.namespace,
                name=key.name,
                subject=subject,
                sequence=sequence,
                replicas=candidate.replicas,
                max_runners=clamped.replicas,
                patch_id=candidate.patch_id,
                epoch=candidate.listener_epoch,
            )
            self.metrics.clamp(ers)
            patch = decide.desired_patch(ers, clamped)
            if patch is None:
                self._settle(key, candidate)
                return ers
        updated = await self.writer.patch_merge(
            EPHEMERAL_RUNNER_SETS, key, patch, resource_version=ers.metadata.resource_version
        )
        self._saw(key, updated)
        log.info(
            "desired state applied",
            namespace=key.namespace,
            name=key.name,
            replicas=patch["spec"]["replicas"],
            patch_id=candidate.patch_id,
            epoch=candidate.listener_epoch,
        )
        self._settle(key, candidate)
        return updated

    def _settle(self, key: ObjectKey, candidate: DesiredState) -> None:
        if self.desired.get(key) is candidate:
            del self.desired[key]
            self.origin.pop(key, None)

    async def _cap_create(self, key: ObjectKey, ers: EphemeralRunnerSet, b: decide.Buckets, p: Plan) -> Plan:
        """Defence in depth: whatever spec.replicas says, never more live runners than maxRunners."""
        cap = await self._max_runners(ers)
        create = decide.cap_create(p.create, b.scale_up_total, cap)
        if create == p.create:
            return p
        log.warning(
            "scale-up capped at maxRunners",
            namespace=key.namespace,
            name=key.name,
            replicas=ers.spec.replicas,
            max_runners=cap,
            live=b.scale_up_total,
            create=create,
        )
        self.metrics.clamp(ers)
        return dataclasses.replace(p, create=create, requeue=p.requeue and create > 0)

    async def _max_runners(self, ers: EphemeralRunnerSet) -> int | None:
        """The set's maxRunners, read from its controlling AutoscalingRunnerSet (uncached GET)."""
        owner = ers.metadata.controller_reference()
        if owner is None or owner.kind != KIND_AUTOSCALING_RUNNER_SET:
            return None
        ars = await self.reader.get_or_none(AUTOSCALING_RUNNER_SETS, ObjectKey(ers.metadata.namespace, owner.name))
        return decide.max_runners_of(ers, ars)

    # --- executing a plan --------------------------------------------------------------------------

    async def _execute(self, key: ObjectKey, ers: EphemeralRunnerSet, p: Plan, proxy_secret: str = "") -> Result | None:
        retry: Result | None = None
        if p.budget is not None:
            ers = await self._apply_budget(key, ers, p.budget)
        if p.reap:
            retry = await self._reap_failed(ers, p, proxy_secret)
        status_first = (
            p.reason == "finished-cleanup"
        )  # record the cleanup marker before reaping, so a crash cannot replace a finished runner
        if status_first and p.status:
            ers = await self._patch_status(key, ers, p.status)
        for er in p.delete:
            await self._delete_runner(er)
        if p.remove and p.remove_count:
            retry = await self._remove_idle(ers, p.remove, p.remove_count) or retry
        if p.create:
            await self._create_runners(ers, p.create, proxy_secret)
        if not status_first and p.status:
            ers = await self._patch_status(key, ers, p.status)
            if p.publish_applied is not None:
                await self._revision_applied(ers, p.publish_applied)
        return retry

    # --- failed runners (TTL swap, failure budget) ------------------------------------------------------

    async def _apply_budget(
        self, key: ObjectKey, ers: EphemeralRunnerSet, a: failures.Assessment
    ) -> EphemeralRunnerSet:
        """Write the failure-budget record (locked on the read's resourceVersion: a 409 re-reads and
        decides again) before anything it accounts for is deleted; then say what changed."""
        if a.record is not None:
            ers = await self.writer.patch_merge(
                EPHEMERAL_RUNNER_SETS,
                key,
                {"metadata": {"annotations": {failures.ANNOTATION_FAILURE_BUDGET: a.record}}},
                resource_version=ers.metadata.resource_version,
            )
            self._saw(key, ers)
        if a.escalated:
            log.warning(
                "failure budget exhausted; runner creation backed off",
                namespace=key.namespace,
                name=key.name,
                failures=a.failures,
                level=a.level,
            )
            await self.events.warning(ers, "RunnerFailureBackoff", a.message)
        elif a.reset:
            log.info("failure budget reset", namespace=key.namespace, name=key.name, why=a.reset)
            await self.events.normal(ers, "RunnerFailureBudgetReset", a.message)
        return ers

    async def _reap_failed(self, ers: EphemeralRunnerSet, p: Plan, proxy_secret: str) -> Result | None:
        """Swap Failed runners past their TTL: remove from the service (best effort; RunnerNotFound
        is fine; JobStillRunning keeps the runner), create the replacement (annotated with the
        failed runner's uid, so a crash before the delete never makes a second one), delete."""
        client = None
        client_unusable = False
        kept = 0
        for er in p.reap:
            rid = decide.runner_id(er)
            if rid and not client_unusable:
                if client is None:
                    try:
                        client = await self.actions.for_spec(ers.metadata.namespace, ers.spec.ephemeral_runner_spec)
                    except ActionsCredentialsUnavailable as exc:
                        client_unusable = True  # best effort: the runner's own finalizer retries the removal
                        log.warning(
                            "no Actions client to remove failed runners; deleting them anyway",
                            namespace=ers.metadata.namespace,
                            name=ers.metadata.name,
                            error=str(exc),
                        )
                if client is not None:
                    try:
                        await client.remove_runner(rid)
                    except JobStillRunningError:
                        kept += 1
                        log.info(
                            "failed runner still has a job at the service; kept",
                            namespace=er.metadata.namespace,
                            name=er.metadata.name,
                            runner_id=rid,
                        )
                        continue
                    except RunnerNotFoundError:
                        pass
                    except ActionsError as exc:
                        log.warning(
                            "remove failed runner from the service failed; deleting it anyway",
                            namespace=er.metadata.namespace,
                            name=er.metadata.name,
                            error=str(exc),
                        )
            if er.metadata.uid in p.replace:
                await self._create_runners(ers, 1, proxy_secret, replaces=er.metadata.uid)
            await self._delete_runner(er)
            self.metrics.replaced(ers)
            status = er.status
            why = f"{status.reason}: {status.message}".strip(": ") if status else ""
            at = failures.failed_at(er)
            await self.events.normal(
                ers,
                "FailedRunnerReplaced",
                f"runner {er.metadata.name} failed ({why or 'no reason given'}) at {at.isoformat() if at else 'an unknown time'};"
                f" removed after {self.policy.failed_runner_ttl:g}s"
                + (" and replaced" if er.metadata.uid in p.replace else " (replicas no longer want a replacement)"),
            )
        return Result(requeue_after=JOB_STILL_RUNNING_RETRY) if kept else None

    async def _create_runners(self, ers: EphemeralRunnerSet, count: int, proxy_secret: str, replaces: str = "") -> None:
        """Create ``count`` runners, at most CREATE_CONCURRENCY at a time; the first failure is
        raised after the others finished (the next reconcile re-LISTs and creates what is missing)."""
        body = decide.new_runner(ers, proxy_secret, replaces)
        limiter = anyio.CapacityLimiter(CREATE_CONCURRENCY)
        failures: list[Exception] = []

        key = EPHEMERAL_RUNNER_SETS.key_of(ers)

        async def one() -> None:
            async with limiter:
                try:
                    created = await self.writer.create(EPHEMERAL_RUNNERS, body)
                except Exception as exc:
                    failures.append(exc)
                else:
                    self._expect(key, created=created.metadata.uid)

        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(one)
        if failures:
            exc = failures[0]
            if isinstance(exc, (Invalid, BadRequest)):
                await self.events.warning(ers, "RunnerCreateFailed", str(exc))
            raise exc

    async def _patch_status(
        self, key: ObjectKey, ers: EphemeralRunnerSet, fields: dict[str, Any]
    ) -> EphemeralRunnerSet:
        updated = await self.writer.patch_status(
            EPHEMERAL_RUNNER_SETS, key, {"status": fields}, resource_version=ers.metadata.resource_version
        )
        self.status_written[key] = anyio.current_time()
        self._saw(key, updated)
        return updated

    def _coalesce_status(self, key: ObjectKey, p: Plan) -> Plan:
        """Hold back a count-only status write until the set's status window has passed since its
        last status write; the pass then scheduled recomputes the counts
        (README "runner-set worker", status writes)."""
        last = self.status_written.get(key)
        wait = decide.status_wait(p.status, None if last is None else anyio.current_time() - last, self.status_window)
        if wait <= 0:
            return p
        after = wait if p.requeue_after is None else min(wait, p.requeue_after)
        return dataclasses.replace(p, status=None, requeue_after=after)

    async def _revision_applied(self, ers: EphemeralRunnerSet, revision: int) -> None:
        phase = str(ers.status.phase) if ers.status else ""
        try:
            self.bus.enqueue(
                RevisionApplied(
                    ers=ResourceRef(ers.metadata.namespace, ers.metadata.name), revision=revision, phase=phase
                )
            )
        except BusError as exc:
            log.error(
                "RevisionApplied not queued", namespace=ers.metadata.namespace, name=ers.metadata.name, error=str(exc)
            )
        log.info(
            "actionable revision applied",
            namespace=ers.metadata.namespace,
            name=ers.metadata.name,
            revision=revision,
            phase=phase,
        )
        await self.events.normal(
            ers,
            "RevisionApplied",
            f"runner spec revision {revision} applied: idle and pending runners of older revisions removed",
        )

    async def _delete_runner(self, er: EphemeralRunner) -> None:
        with contextlib.suppress(Conflict):  # a namesake replaced it: not ours to delete
            await self.writer.delete(
                EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(er), uid=er.metadata.uid, missing_ok=True
            )
            owner = controller_owner_key(er, KIND_EPHEMERAL_RUNNER_SET)
            if owner is not None and not er.metadata.is_deleting:
                self._expect(owner, deleted=er.metadata.uid)

    async def _remove_idle(
        self, ers: EphemeralRunnerSet, candidates: list[EphemeralRunner], count: int
    ) -> Result | None:
        """Remove runners from the Actions service first, then delete them (ARC's order), stopping
        after ``count``. A runner that took a job meanwhile (JobStillRunning) is skipped."""
        client = None
        removed = 0
        failed = 0
        for er in candidates:
            if removed >= count:
                break
            rid = decide.runner_id(er)
            if rid:
                if client is None:
                    try:
                        client = await self.actions.for_spec(ers.metadata.namespace, ers.spec.ephemeral_runner_spec)
                    except ActionsCredentialsUnavailable as exc:
                        log.warning(
                            "cannot remove idle runners: no Actions client",
                            namespace=ers.metadata.namespace,
                            name=ers.metadata.name,
                            error=str(exc),
                        )
                        await self.events.warning(ers, "ActionsClientUnavailable", str(exc))
                        return Result(requeue_after=ACTIONS_RETRY)
                try:
                    await client.remove_runner(rid)
                except JobStillRunningError:
                    continue
                except RunnerNotFoundError:
                    pass  # already gone from the service
                except ActionsError as exc:
                    failed += 1
                    log.warning(
                        "remove runner failed",
                        namespace=er.metadata.namespace,
                        name=er.metadata.name,
                        runner_id=rid,
                        error=str(exc),
                    )
                    continue
            await self._delete_runner(er)
            removed += 1
        return Result(requeue_after=ACTIONS_RETRY) if failed else None

    # --- deletion ------------------------------------------------------------------------------------

    async def _finalize(self, key: ObjectKey, ers: EphemeralRunnerSet) -> Result:
        if not adopt.owns_finalizer(ers.metadata.finalizers):
            return DONE
        b = decide.bucket_runners(await self._runners(ers))
        dp = decide.plan_deletion(b)
        if dp.remove_finalizer:
            if ers.spec.ephemeral_runner_spec.proxy is not None:
                secret_key = ObjectKey(
                    ers.metadata.namespace, runner_proxy_secret_name(ers.metadata.name, key.namespace)
                )
                secret = await self.reader.get_or_none(SECRETS, secret_key)
                if secret is not None:  # as ARC: the finalizer is removed once the Secret is gone
                    if not secret.metadata.is_deleting:
                        await self.writer.delete(SECRETS, secret_key, uid=secret.metadata.uid, missing_ok=True)
                    return Result(requeue_after=1.0)
            released = adopt.released_finalizers(ers.metadata.finalizers)
            if released is not None:
                with contextlib.suppress(NotFound):
                    await self.writer.patch_merge(
                        EPHEMERAL_RUNNER_SETS,
                        key,
                        {"metadata": {"finalizers": released}},
                        resource_version=ers.metadata.resource_version,
                    )
            self.metrics.forget(key)
            log.info("runner set deleted", namespace=key.namespace, name=key.name)
            return DONE
        for er in dp.delete:
            await self._delete_runner(er)
        if dp.remove:
            await self._remove_idle(ers, dp.remove, len(dp.remove))
        return Result(requeue_after=DELETION_REQUEUE)

    # --- proxy Secret -------------------------------------------------------

    async def _ensure_proxy_secret(self, ers: EphemeralRunnerSet) -> str:
        """Create or update ``<ERS>-<hash(ns)[:8]>-runner-proxy``; its name, or "" when a
        credential Secret is missing (an Event says which)."""
        ns = ers.metadata.namespace
        proxy = ers.spec.ephemeral_runner_spec.proxy
        assert proxy is not None
        creds: dict[str, tuple[str, str]] = {}
        for server in (proxy.http, proxy.https):
            ref = server.credential_secret_ref if server else ""
            if ref and ref not in creds:
                secret = await self.reader.get_or_none(SECRETS, ObjectKey(ns, ref))
                if secret is None:
                    await self.events.warning(
                        ers, "ProxyCredentialsMissing", f"proxy credential Secret {ref} not found"
                    )
                    return ""
                creds[ref] = (_text(secret, "username"), _text(secret, "password"))
        data = {k: base64.b64encode(v.encode()).decode() for k, v in decide.proxy_secret_data(proxy, creds).items()}
        name = runner_proxy_secret_name(ers.metadata.name, ns)
        labels = {
            k: ers.metadata.labels[k]
            for k in (LABEL_SCALE_SET_NAME, LABEL_SCALE_SET_NAMESPACE)
            if k in ers.metadata.labels
        }
        current = await self.reader.get_or_none(SECRETS, ObjectKey(ns, name))
        if current is None:
            body = decide.new_runner(ers)["metadata"]["ownerReferences"]
            await self.writer.create(
                SECRETS,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": body},
                    "data": data,
                },
            )
        elif current.data != data:
            await self.writer.patch_merge(
                SECRETS, ObjectKey(ns, name), {"data": data}, resource_version=current.metadata.resource_version
            )
        return name


def _uids(runners: Sequence[EphemeralRunner]) -> dict[str, bool]:
    """uid → deleting."""
    return {er.metadata.uid: er.metadata.is_deleting for er in runners}


@dataclasses.dataclass(frozen=True)
class _Draft:
    """A plan that acts, decided on the cached set (``resource_version``) and runners."""

    resource_version: str
    buckets: decide.Buckets
    now: dt.datetime
    plan: Plan


def _writes_nothing(p: Plan) -> bool:
    """The plan makes no write, service call, Event or bus message."""
    a = p.budget
    return not (
        p.delete
        or p.remove_count
        or p.create
        or p.reap
        or p.status
        or p.publish_applied is not None
        or (a is not None and (a.record is not None or a.escalated or bool(a.reset)))
    )


def _rv_int(rv: str) -> int | None:
    try:
        return int(rv)
    except ValueError:
        return None


def _needs_authoritative(p: Plan) -> bool:
    """Plans the seeds decide on an authoritative read: the revision advance, and reaping finished
    runners that records the cleanup marker (it opens a gap below spec.replicas)."""
    return p.reason in AUTHORITATIVE_PLANS or bool(p.status and "finishedRunnerCleanupPatchID" in p.status)


def _text(secret: Any, key: str) -> str:
    raw = secret.decoded(key)
    return raw.decode("utf-8", "replace").strip() if raw else ""


__all__ = ["RunnerSetReconciler"]
