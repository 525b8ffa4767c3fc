"""The runner-set worker's I/O shell: reconcile EphemeralRunnerSets (arc-controllers.md §2.2) with
the typed state of the seeds. Decisions are in :mod:`services.runner_set.decide`.

One reconcile: authoritative GET of the ERS → apply the newest listener desired state (merge
patch locked on the read's resourceVersion) → finalizer → authoritative LIST of its runners →
``plan`` → execute → status (locked). A 409 anywhere means "decided on stale data": the key is
re-queued at once and decided again on a fresh read.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge

from services.runner_set import decide, failures
from services.runner_set.decide import Plan
from services.runner_set.failures import FailurePolicy
from shared.actions import ActionsError, JobStillRunningError, RunnerNotFoundError, parse_config_url
from shared.api import EphemeralRunner, EphemeralRunnerSet, validate
from shared.api.constants import FINALIZER_EPHEMERAL_RUNNER_SET, LABEL_SCALE_SET_NAME, LABEL_SCALE_SET_NAMESPACE
from shared.api.names import runner_proxy_secret_name
from shared.bus import Delivery, DesiredState, NotOwner, ResourceRef, RevisionApplied, ShardChange, subjects
from shared.bus.errors import BusError
from shared.kube import (
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    SECRETS,
    BadRequest,
    Conflict,
    Controller,
    Invalid,
    ObjectKey,
    Result,
)
from shared.log import get_logger
from shared.worker import ActionsCredentialsUnavailable, WorkerContext

log = get_logger(__name__)

CONTROLLER_NAME = "ephemeralrunnerset"
WORKER_NAME = "runner-set"
GAUGE_LABELS = ("name", "namespace", "repository", "organization", "enterprise")
CONFLICT_REQUEUE = 0.01
DELETION_REQUEUE = 5.0
ACTIONS_RETRY = 5.0
SAFETY_REQUEUE = 1.0
CREATE_CONCURRENCY = 8  # parallel EphemeralRunner creates per reconcile  # multi-step plans re-run after this even if no watch event arrives
JOB_STILL_RUNNING_RETRY = 30.0  # a Failed runner past its TTL that the service says is busy: ask again after

Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class RunnerSetMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.pending = Gauge(
            "gha_controller_pending_ephemeral_runners",
            "Number of ephemeral runners in a pending state.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.running = Gauge(
            "gha_controller_running_ephemeral_runners",
            "Number of ephemeral runners in a running state.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.failed = Gauge(
            "gha_controller_failed_ephemeral_runners",
            "Number of ephemeral runners in a failed state.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.revision_lag = Gauge(
            "runnerscale_runner_set_revision_lag",
            "spec.actionableRevision - status.appliedActionableRevision: a runner spec update not yet rolled out.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.desired_applied = Gauge(
            "runnerscale_runner_set_desired_replicas",
            "spec.replicas as last applied from the listener.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.backoff_seconds = Gauge(
            "runnerscale_runner_set_failure_backoff_seconds",
            "Seconds left of the failure-budget backoff during which no runner is created (0: none).",
            GAUGE_LABELS,
            registry=registry,
        )
        self.backoff_level = Gauge(
            "runnerscale_runner_set_failure_backoff_level",
            "Failure-budget backoff level (0: none).",
            GAUGE_LABELS,
            registry=registry,
        )
        self.budget_failures = Gauge(
            "runnerscale_runner_set_failure_budget_failures",
            "Runner failures of the current revision counted in the failure-budget window.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.backoffs = Counter(
            "runnerscale_runner_set_failure_backoffs_total",
            "Failure-budget escalations (runner creation backed off).",
            GAUGE_LABELS,
            registry=registry,
        )
        self.failed_replaced = Counter(
            "runnerscale_runner_set_failed_runners_replaced_total",
            "Failed runners removed after --failed-runner-ttl (and replaced when replicas still want them).",
            GAUGE_LABELS,
            registry=registry,
        )
        self._labels: dict[ObjectKey, tuple[str, ...]] = {}

    def _all(self) -> tuple[Gauge | Counter, ...]:
        return (
            self.pending,
            self.running,
            self.failed,
            self.revision_lag,
            self.desired_applied,
            self.backoff_seconds,
            self.backoff_level,
            self.budget_failures,
            self.backoffs,
            self.failed_replaced,
        )

    def labels_of(self, ers: EphemeralRunnerSet) -> tuple[str, ...] | None:
        try:
            cfg = parse_config_url(ers.spec.ephemeral_runner_spec.github_config_url)
        except (ActionsError, ValueError):
            return None
        return (
            ers.metadata.labels.get(LABEL_SCALE_SET_NAME, ers.metadata.name),
            ers.metadata.labels.get(LABEL_SCALE_SET_NAMESPACE, ers.metadata.namespace),
            cfg.repository,
            cfg.organization,
            cfg.enterprise,
        )

    def set_budget(self, ers: EphemeralRunnerSet, a: failures.Assessment | None, now: dt.datetime) -> None:
        labels = self.labels_of(ers)
        if labels is None or a is None:
            return
        left = (a.blocked_until - now).total_seconds() if a.blocked_until is not None else 0.0
        self.backoff_seconds.labels(*labels).set(max(0.0, left))
        self.backoff_level.labels(*labels).set(a.level)
        self.budget_failures.labels(*labels).set(a.failures)
        if a.escalated:
            self.backoffs.labels(*labels).inc()

    def replaced(self, ers: EphemeralRunnerSet) -> None:
        labels = self.labels_of(ers)
        if labels is not None:
            self.failed_replaced.labels(*labels).inc()

    def set(self, key: ObjectKey, ers: EphemeralRunnerSet, b: decide.Buckets) -> None:
        try:
            cfg = parse_config_url(ers.spec.ephemeral_runner_spec.github_config_url)
        except (ActionsError, ValueError):
            return  # as ARC: an unparsable URL publishes no gauges (the Event says why)
        labels = (
            ers.metadata.labels.get(LABEL_SCALE_SET_NAME, ers.metadata.name),
            ers.metadata.labels.get(LABEL_SCALE_SET_NAMESPACE, ers.metadata.namespace),
            cfg.repository,
            cfg.organization,
            cfg.enterprise,
        )
        old = self._labels.get(key)
        if old is not None and old != labels:
            self.forget(key)
        self._labels[key] = labels
        applied = ers.status.applied_actionable_revision if ers.status else 0
        self.pending.labels(*labels).set(len(b.pending))
        self.running.labels(*labels).set(len(b.running))
        self.failed.labels(*labels).set(len(b.failed))
        self.revision_lag.labels(*labels).set(max(0, ers.spec.actionable_revision - applied))
        self.desired_applied.labels(*labels).set(ers.spec.replicas)

    def forget(self, key: ObjectKey) -> None:
        labels = self._labels.pop(key, None)
        if labels is None:
            return
        for g in self._all():
            try:
                g.remove(*labels)
            except KeyError:
                pass


class RunnerSetWorker:
    """Holds the per-process state of the runner-set worker (latest desired state per ERS)."""

    def __init__(self, ctx: WorkerContext, policy: FailurePolicy | None = None, clock: Clock = utcnow) -> None:
        self.ctx = ctx
        self.policy = policy or FailurePolicy()
        self.clock = clock
        self.metrics = RunnerSetMetrics(ctx.registry)
        self.desired: dict[ObjectKey, DesiredState] = {}
        self.seeded: set[ObjectKey] = set()  # keys whose latest stream message was read since gaining them
        self.controller: Controller | None = None

    # --- wiring ----------------------------------------------------------------------------------

    def setup(self) -> list[Controller]:
        ctx = self.ctx
        sets = ctx.informers(EPHEMERAL_RUNNER_SETS)
        runners = ctx.informers(EPHEMERAL_RUNNERS)
        c = ctx.controller(CONTROLLER_NAME, self.reconcile, [*ctx.for_(sets), *ctx.owns(runners, "EphemeralRunnerSet")])
        ctx.route(subjects.RUNNER_SET_DESIRED, c, on_message=self.on_desired)
        ctx.route(subjects.RUNNER_SET_REVISIONS, c)
        ctx.on_shard_change(self.on_shard_change)
        self.controller = c
        return [c]

    def on_desired(self, delivery: Delivery) -> None:
        msg = delivery.message
        if not isinstance(msg, DesiredState):
            return
        key = ObjectKey(msg.ers.namespace, msg.ers.name)
        self.desired[key] = decide.newer_desired(self.desired.get(key), msg)  # type: ignore[assignment]

    def on_shard_change(self, change: ShardChange) -> None:
        # Messages of newly gained keys may have been acked while another replica owned them:
        # read each key's latest stream message again on its next reconcile.
        self.seeded.clear()

    # --- reconcile -------------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Result | None:
        try:
            async with self.ctx.held(key):
                return await self._reconcile(key)
        except NotOwner:
            return None  # another replica owns it now
        except Conflict as exc:
            log.info("conflict; re-reading and deciding again", namespace=key.namespace, name=key.name, error=str(exc))
            return Result(requeue_after=CONFLICT_REQUEUE)

    async def _reconcile(self, key: ObjectKey) -> Result | None:
        ctx = self.ctx
        ers = await ctx.reader.get_or_none(EPHEMERAL_RUNNER_SETS, key)
        if ers is None:
            self.metrics.forget(key)
            self.seeded.discard(key)
            return None
        ers = await self._apply_desired(key, ers)
        if ers.metadata.is_deleting:
            return await self._finalize(key, ers)
        if FINALIZER_EPHEMERAL_RUNNER_SET not in ers.metadata.finalizers:
            ers = await ctx.writer.add_finalizer(EPHEMERAL_RUNNER_SETS, ers, FINALIZER_EPHEMERAL_RUNNER_SET)
        problems = validate(ers)
        if problems:
            text = "; ".join(f"{p.path}: {p.message}" for p in problems)
            log.warning(
                "invalid EphemeralRunnerSet; not scaling", namespace=key.namespace, name=key.name, problems=text
            )
            await ctx.events.warning(ers, "InvalidSpec", text)
            return None
        proxy_secret = ""
        if ers.spec.ephemeral_runner_spec.proxy is not None:
            proxy_secret = await self._ensure_proxy_secret(ers)
            if not proxy_secret:
                return Result(requeue_after=ACTIONS_RETRY)
        b = decide.bucket_runners(await self._runners(ers))
        self.metrics.set(key, ers, b)
        now = self.clock()
        p = decide.plan(ers, b, now, self.policy)
        if (
            p.reason not in ("steady", "patch-already-applied", "outdated-hold", "scale-up-suppressed")
            or log_debug_enabled()
        ):
            (
                log.debug
                if p.reason in ("steady", "patch-already-applied", "outdated-hold", "scale-up-suppressed")
                else log.info
            )(
                "reconcile",
                namespace=key.namespace,
                name=key.name,
                plan=p.reason,
                replicas=ers.spec.replicas,
                patch_id=ers.spec.patch_id,
                current=b.scale_total,
                deleting=len(b.deleting),
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
        return Result(requeue_after=max(0.0, min(after))) if after else None

    async def _runners(self, ers: EphemeralRunnerSet) -> list[EphemeralRunner]:
        listed = await self.ctx.reader.list(EPHEMERAL_RUNNERS, namespace=ers.metadata.namespace)
        return decide.owned_by(listed.items, ers)

    # --- desired state -----------------------------------------------------------------------------

    async def _apply_desired(self, key: ObjectKey, ers: EphemeralRunnerSet) -> EphemeralRunnerSet:
        candidate = self.desired.get(key)
        if key not in self.seeded:
            try:
                last = await self.ctx.bus.last_message(subjects.desired_subject(key.namespace, key.name))
            except BusError as exc:
                log.warning(
                    "latest desired state unreadable; using delivered messages only",
                    namespace=key.namespace,
                    name=key.name,
                    error=str(exc),
                )
            else:
                if isinstance(last, DesiredState):
                    candidate = decide.newer_desired(candidate, last)
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
            await self.ctx.events.warning(
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
        updated = await self.ctx.writer.patch_merge(
            EPHEMERAL_RUNNER_SETS, key, patch, resource_version=ers.metadata.resource_version
        )
        log.info(
            "desired state applied",
            namespace=key.namespace,
            name=key.name,
            replicas=candidate.replicas,
            patch_id=candidate.patch_id,
            epoch=candidate.listener_epoch,
        )
        self._settle(key, candidate)
        return updated

    def _settle(self, key: ObjectKey, candidate: DesiredState) -> None:
        if self.desired.get(key) is candidate:
            del self.desired[key]

    # --- executing a plan --------------------------------------------------------------------------

    async def _execute(self, key: ObjectKey, ers: EphemeralRunnerSet, p: Plan, proxy_secret: str = "") -> Result | None:
        retry: Result | None = None
        if p.budget is not None:
            ers = await self._apply_budget(key, ers, p.budget)
        if p.reap:
            retry = await self._reap_failed(ers, p, proxy_secret)
        status_first = p.reason == "finished-cleanup"  # record the marker before reaping (seed 000)
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
            ers = await self.ctx.writer.patch_merge(
                EPHEMERAL_RUNNER_SETS,
                key,
                {"metadata": {"annotations": {failures.ANNOTATION_FAILURE_BUDGET: a.record}}},
                resource_version=ers.metadata.resource_version,
            )
        if a.escalated:
            log.warning(
                "failure budget exhausted; runner creation backed off",
                namespace=key.namespace,
                name=key.name,
                failures=a.failures,
                level=a.level,
            )
            await self.ctx.events.warning(ers, "RunnerFailureBackoff", a.message)
        elif a.reset:
            log.info("failure budget reset", namespace=key.namespace, name=key.name, why=a.reset)
            await self.ctx.events.normal(ers, "RunnerFailureBudgetReset", a.message)
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
                        client = await self.ctx.actions.for_spec(ers.metadata.namespace, ers.spec.ephemeral_runner_spec)
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
            await self.ctx.events.normal(
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

        async def one() -> None:
            async with limiter:
                try:
                    await self.ctx.writer.create(EPHEMERAL_RUNNERS, body)
                except Exception as exc:
                    failures.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(one)
        if failures:
            exc = failures[0]
            if isinstance(exc, (Invalid, BadRequest)):
                await self.ctx.events.warning(ers, "RunnerCreateFailed", str(exc))
            raise exc

    async def _patch_status(
        self, key: ObjectKey, ers: EphemeralRunnerSet, fields: dict[str, Any]
    ) -> EphemeralRunnerSet:
        return await self.ctx.writer.patch_status(
            EPHEMERAL_RUNNER_SETS, key, {"status": fields}, resource_version=ers.metadata.resource_version
        )

    async def _revision_applied(self, ers: EphemeralRunnerSet, revision: int) -> None:
        phase = str(ers.status.phase) if ers.status else ""
        try:
            self.ctx.bus.enqueue(
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
        await self.ctx.events.normal(
            ers,
            "RevisionApplied",
            f"runner spec revision {revision} applied: idle and pending runners of older revisions removed",
        )

    async def _delete_runner(self, er: EphemeralRunner) -> None:
        try:
            await self.ctx.writer.delete(
                EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(er), uid=er.metadata.uid, missing_ok=True
            )
        except Conflict:
            pass  # a namesake replaced it: not ours to delete

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
                        client = await self.ctx.actions.for_spec(ers.metadata.namespace, ers.spec.ephemeral_runner_spec)
                    except ActionsCredentialsUnavailable as exc:
                        log.warning(
                            "cannot remove idle runners: no Actions client",
                            namespace=ers.metadata.namespace,
                            name=ers.metadata.name,
                            error=str(exc),
                        )
                        await self.ctx.events.warning(ers, "ActionsClientUnavailable", str(exc))
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

    async def _finalize(self, key: ObjectKey, ers: EphemeralRunnerSet) -> Result | None:
        if FINALIZER_EPHEMERAL_RUNNER_SET not in ers.metadata.finalizers:
            return None
        b = decide.bucket_runners(await self._runners(ers))
        dp = decide.plan_deletion(b)
        if dp.remove_finalizer:
            if ers.spec.ephemeral_runner_spec.proxy is not None:
                name = runner_proxy_secret_name(ers.metadata.name, ers.metadata.namespace)
                if await self.ctx.writer.delete(SECRETS, ObjectKey(ers.metadata.namespace, name), missing_ok=True):
                    return Result(requeue_after=1.0)  # as ARC: finalizer removed once the Secret is gone
            await self.ctx.writer.remove_finalizer(EPHEMERAL_RUNNER_SETS, ers, FINALIZER_EPHEMERAL_RUNNER_SET)
            self.metrics.forget(key)
            log.info("runner set deleted", namespace=key.namespace, name=key.name)
            return None
        for er in dp.delete:
            await self._delete_runner(er)
        if dp.remove:
            await self._remove_idle(ers, dp.remove, len(dp.remove))
        return Result(requeue_after=DELETION_REQUEUE)

    # --- proxy Secret (arc-controllers.md §3.5) -------------------------------------------------------

    async def _ensure_proxy_secret(self, ers: EphemeralRunnerSet) -> str:
        """Create or update ``<ERS>-<hash(ns)[:8]>-runner-proxy``; its name, or "" when a
        credential Secret is missing (an Event says which)."""
        ctx, ns = self.ctx, ers.metadata.namespace
        proxy = ers.spec.ephemeral_runner_spec.proxy
        assert proxy is not None
        creds: dict[str, tuple[str, str]] = {}
        for server in (proxy.http, proxy.https):
            ref = server.credential_secret_ref if server else ""
            if ref and ref not in creds:
                secret = await ctx.reader.get_or_none(SECRETS, ObjectKey(ns, ref))
                if secret is None:
                    await ctx.events.warning(ers, "ProxyCredentialsMissing", f"proxy credential Secret {ref} not found")
                    return ""
                creds[ref] = (_text(secret, "username"), _text(secret, "password"))
        data = {k: base64.b64encode(v.encode()).decode() for k, v in decide.proxy_secret_data(proxy, creds).items()}
        name = runner_proxy_secret_name(ers.metadata.name, ns)
        labels = {
            k: ers.metadata.labels[k]
            for k in (LABEL_SCALE_SET_NAME, LABEL_SCALE_SET_NAMESPACE)
            if k in ers.metadata.labels
        }
        current = await ctx.reader.get_or_none(SECRETS, ObjectKey(ns, name))
        if current is None:
            body = decide.new_runner(ers)["metadata"]["ownerReferences"]
            await ctx.writer.create(
                SECRETS,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": body},
                    "data": data,
                },
            )
        elif current.data != data:
            await ctx.writer.patch_merge(
                SECRETS, ObjectKey(ns, name), {"data": data}, resource_version=current.metadata.resource_version
            )
        return name


def log_debug_enabled() -> bool:
    return logging.getLogger(__name__).isEnabledFor(logging.DEBUG)


def _text(secret: Any, key: str) -> str:
    raw = secret.decoded(key)
    return raw.decode("utf-8", "replace").strip() if raw else ""


def setup(ctx: WorkerContext) -> list[Controller]:
    return RunnerSetWorker(ctx).setup()


def make_setup(
    policy: FailurePolicy | None = None, *, clock: Clock = utcnow, holder: dict[str, Any] | None = None
) -> Callable[[WorkerContext], list[Controller]]:
    """A ``setup`` with explicit failure settings (``holder`` receives the worker under "worker")."""

    def _setup(ctx: WorkerContext) -> list[Controller]:
        w = RunnerSetWorker(ctx, policy, clock)
        if holder is not None:
            holder["worker"] = w
        return w.setup()

    return _setup
