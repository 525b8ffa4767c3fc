"""The message loop of one session: long-poll, act, publish durably, then acknowledge.

Order per message (better than ARC, which acknowledges first and loses the batch on a crash):

1. acquire the batch's available jobs (GHES flow; acquiring twice is harmless);
2. publish the job events and the new desired state to JetStream and wait for every publish
   acknowledgement;
3. only then delete (acknowledge) the message at the service.

A listener killed anywhere before step 3 leaves the message unacknowledged; the service delivers
it again to the next session and the effects are published again: job events carry a
``Nats-Msg-Id`` (JetStream drops the repeat) and the desired state is a level.

Empty polls re-publish the desired state from the latest statistics, as ARC re-asserts its target
about every 50 s, so a lost or superseded message heals.

A message that does not decode (garbled body, unknown envelope type, no statistics) but whose
envelope names its id is *rejected*: logged, counted, the desired state re-published from the last
good statistics, and acknowledged, so one bad message can never stall the scale set.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from services.listener.health import HealthState
from services.listener.metrics import ListenerMetrics
from services.listener.plan import MessagePlan, plan_message
from services.listener.scaling import DesiredDecision, ScalerState, decide, mark_dirty
from shared.actions.errors import RateLimitedError, ServiceUnavailableError, TransportError
from shared.actions.messages import JobCompleted as ServiceJobCompleted
from shared.actions.messages import JobStarted as ServiceJobStarted
from shared.actions.messages import Message, MessageDecodeError
from shared.actions.models import ScaleSetStatistics
from shared.actions.session import MessageSessionClient
from shared.backoff import Backoff
from shared.bus import messages as bus
from shared.bus.errors import BusError
from shared.listener_config import ListenerConfig
from shared.log import get_logger

log = get_logger(__name__)

#: Longest pause between retries of a failed poll or publish (the first pause is the configured error backoff).
RETRY_CAP = 30.0

#: Publishes messages to JetStream and returns once every one is acknowledged (or raises).
Publish = Callable[[Sequence[bus.BusMessage]], Awaitable[None]]


@dataclass(frozen=True)
class Identity:
    """What every published message says about where it comes from."""

    scale_set_id: int
    scale_set: bus.ResourceRef  # namespace/name of the scale set (AutoscalingRunnerSet)
    ers: bus.ResourceRef
    min_runners: int
    max_runners: int

    @classmethod
    def from_config(cls, cfg: ListenerConfig) -> Identity:
        ns = cfg.ephemeral_runner_set_namespace
        return cls(
            scale_set_id=cfg.runner_scale_set_id,
            scale_set=bus.ResourceRef(namespace=ns, name=cfg.runner_scale_set_name or cfg.ephemeral_runner_set_name),
            ers=bus.ResourceRef(namespace=ns, name=cfg.ephemeral_runner_set_name),
            min_runners=cfg.min_runners,
            max_runners=cfg.max_runners,
        )


def bus_statistics(stats: ScaleSetStatistics) -> bus.JobStatistics:
    return bus.JobStatistics(
        total_available_jobs=stats.total_available_jobs,
        total_acquired_jobs=stats.total_acquired_jobs,
        total_assigned_jobs=stats.total_assigned_jobs,
        total_running_jobs=stats.total_running_jobs,
        total_registered_runners=stats.total_registered_runners,
        total_busy_runners=stats.total_busy_runners,
        total_idle_runners=stats.total_idle_runners,
    )


def desired_state(
    ident: Identity, decision: DesiredDecision, stats: ScaleSetStatistics, epoch: int
) -> bus.DesiredState:
    return bus.DesiredState(
        scale_set_id=ident.scale_set_id,
        ers=ident.ers,
        patch_id=decision.patch_id,
        replicas=decision.replicas,
        listener_epoch=epoch,
        statistics=bus_statistics(stats),
    )


def job_event(
    ident: Identity, job: ServiceJobStarted | ServiceJobCompleted, epoch: int
) -> bus.JobStarted | bus.JobCompleted:
    common: dict[str, Any] = dict(
        scale_set_id=ident.scale_set_id,
        scale_set=ident.scale_set,
        runner_name=job.runner_name,
        runner_id=job.runner_id,
        job_id=job.job_id,
        runner_request_id=job.runner_request_id,
        workflow_run_id=job.workflow_run_id,
        workflow_ref=job.job_workflow_ref,
        job_display_name=job.job_display_name,
        repository=f"{job.owner_name}/{job.repository_name}" if job.owner_name else job.repository_name,
        event_name=job.event_name,
        listener_epoch=epoch,
    )
    if isinstance(job, ServiceJobCompleted):
        return bus.JobCompleted(result=job.result, **common)
    return bus.JobStarted(**common)


def plan_effects(
    ident: Identity, plan: MessagePlan, epoch: int, scaler: ScalerState
) -> tuple[list[bus.BusMessage], ScalerState, DesiredDecision]:
    """Pure: the bus messages a planned service message turns into, and the next scaler state."""
    events: list[bus.BusMessage] = [job_event(ident, j, epoch) for j in plan.started]
    events += [job_event(ident, j, epoch) for j in plan.completed]
    if plan.dirty:
        scaler = mark_dirty(scaler)
    scaler, decision = decide(
        scaler,
        min_runners=ident.min_runners,
        max_runners=ident.max_runners,
        assigned_jobs=plan.statistics.total_assigned_jobs,
    )
    events.append(desired_state(ident, decision, plan.statistics, epoch))
    return events, scaler, decision


class SessionLoop:
    """Serves one message session until it fails or is cancelled. State lives for the session
    (one incarnation, one epoch): patch IDs restart at 0 with every new session."""

    def __init__(
        self,
        *,
        ident: Identity,
        session_client: MessageSessionClient,
        publish: Publish,
        metrics: ListenerMetrics,
        health: HealthState,
        epoch: int,
        poll_error_backoff: float = 2.0,
        scaler: ScalerState | None = None,
        newest_message_id: int = 0,
    ) -> None:
        self.ident = ident
        self.client = session_client
        self.publish = publish
        self.metrics = metrics
        self.health = health
        self.epoch = epoch
        self.poll_error_backoff = poll_error_backoff
        self.scaler = scaler or ScalerState()
        self.latest_statistics = ScaleSetStatistics()
        # Carried over from the term's earlier sessions: service message ids only grow, so a
        # redelivered message older than one already handled is recognised as stale.
        self.newest_message_id = newest_message_id
        self.last_message_id = 0
        self.polls = 0  # successful long polls on this session

    async def publish_desired(self, stats: ScaleSetStatistics) -> DesiredDecision:
        scaler, decision = decide(
            self.scaler,
            min_runners=self.ident.min_runners,
            max_runners=self.ident.max_runners,
            assigned_jobs=stats.total_assigned_jobs,
        )
        await self._publish_durably([desired_state(self.ident, decision, stats, self.epoch)])
        self.scaler = scaler  # committed only once the publish was acknowledged
        self.metrics.record_desired(replicas=decision.replicas, patch_id=decision.patch_id)
        return decision

    async def _publish_durably(self, messages: list[bus.BusMessage]) -> None:
        """Publish until JetStream acknowledged everything. While NATS is unreachable the message
        stays unacknowledged at the service and polling pauses; if the outage outlasts the lease,
        leadership lapses and cancels this (a successor re-delivers the message)."""
        backoff = Backoff(base=self.poll_error_backoff, cap=RETRY_CAP)
        for attempt in itertools.count():
            try:
                await self.publish(messages)
                return
            except BusError as exc:
                self.health.progressed()
                delay = backoff.delay(attempt)
                log.warning(
                    "publishing to JetStream failed; retrying before acknowledging",
                    error=str(exc),
                    retry_in=round(delay, 1),
                )
                await anyio.sleep(delay)  # backoff between attempts, not synchronisation

    async def run(self, initial_statistics: ScaleSetStatistics | None) -> None:
        # The start-up decision, before any poll, from the session's statistics (ARC does the
        # same): the first desired state of an incarnation is authoritative (patch ID 0). A
        # session without statistics gives no basis for a decision: wait for the first poll.
        if initial_statistics is not None:
            self.latest_statistics = initial_statistics
            self.metrics.record_statistics(initial_statistics)
            await self.publish_desired(initial_statistics)
        else:
            log.warning("session came without statistics; deciding after the first poll")
        while True:
            try:
                message = await self._poll()
            except MessageDecodeError as exc:
                await self.reject(exc)
                continue
            if message is None:
                await self.publish_desired(self.latest_statistics)
                continue
            await self.handle(message)

    async def _poll(self) -> Message | None:
        """Long poll; transient failures (after the client's own retries) back off and poll again
        on the same session. Session-level failures propagate to the caller."""
        backoff = Backoff(base=self.poll_error_backoff, cap=RETRY_CAP)
        failures = 0
        while True:
            try:
                message = await self.client.get_message(self.last_message_id, self.ident.max_runners)
            except (TransportError, ServiceUnavailableError, RateLimitedError) as exc:
                self.health.progressed()
                wait = max(backoff.delay(failures), getattr(exc, "retry_after", None) or 0)
                failures += 1
                log.warning("poll failed, retrying on the same session", error=str(exc), retry_in=round(wait, 1))
                await anyio.sleep(wait)  # backoff between attempts, not synchronisation
                continue
            self.health.polled()
            self.metrics.record_poll()
            self.polls += 1
            return message

    async def reject(self, exc: MessageDecodeError) -> None:
        """A message the service sent but we cannot decode. With its id known: log it, count it,
        re-publish the desired state from the last good statistics (durably, as for any message),
        then acknowledge it so the queue moves on. Without an id nothing can be acknowledged: the
        error propagates and the session is re-created (``malformed_envelope``)."""
        if exc.message_id is None:
            self.metrics.record_rejected(exc.reason)
            log.error(
                "a service message could not be decoded and names no message id; it cannot be acknowledged",
                reason=exc.reason,
                error=str(exc),
            )
            raise exc
        self.health.polled()  # the service answered; the poll itself worked
        self.metrics.record_poll()
        self.polls += 1
        if self.metrics.first_sight(exc.message_id):  # counted once, even if delivered again
            self.metrics.record_rejected(exc.reason)
        message_type = exc.message_type[:100]
        log.error(
            "rejected a service message that cannot be decoded; acknowledging it and keeping the last good statistics",
            message_id=exc.message_id,
            message_type=message_type,
            reason=exc.reason,
            error=str(exc),
        )
        decision = await self.publish_desired(self.latest_statistics)
        await self.client.delete_message(exc.message_id)
        self.last_message_id = exc.message_id
        log.info(
            "acknowledged a rejected message",
            message_id=exc.message_id,
            replicas=decision.replicas,
            patch_id=decision.patch_id,
        )

    async def handle(self, message: Message) -> None:
        received_at = dt.datetime.now(dt.UTC)
        plan = plan_message(message, newest_seen_id=self.newest_message_id, latest_statistics=self.latest_statistics)
        if plan.stale:
            log.info(
                "older message than one already handled: its statistics are not used",
                message_id=message.message_id,
                newest_message_id=self.newest_message_id,
            )
        if message.skipped_types:
            log.info(
                "skipped job messages of unknown type", message_id=message.message_id, types=list(message.skipped_types)
            )
        if plan.acquire_request_ids:
            acquired = await self.client.acquire_jobs(list(plan.acquire_request_ids))
            log.info(
                "acquired jobs",
                message_id=message.message_id,
                requested=len(plan.acquire_request_ids),
                acquired=len(acquired),
            )
        events, scaler, decision = plan_effects(self.ident, plan, self.epoch, self.scaler)
        await self._publish_durably(events)  # returns only once JetStream acknowledged every message
        self.scaler = scaler
        await self.client.delete_message(message.message_id)
        self.last_message_id = message.message_id
        if not plan.stale:
            self.latest_statistics = plan.statistics
            self.newest_message_id = message.message_id
            self.metrics.record_statistics(plan.statistics)
        self.metrics.record_desired(replicas=decision.replicas, patch_id=decision.patch_id)
        if self.metrics.first_sight(message.message_id):
            for assigned in plan.assigned:
                self.metrics.record_job_assigned(assigned, received_at=received_at)
            for started in plan.started:
                self.metrics.record_job_started(started)
            for completed in plan.completed:
                self.metrics.record_job_completed(completed)
        log.info(
            "handled message",
            message_id=message.message_id,
            started=len(plan.started),
            completed=len(plan.completed),
            replicas=decision.replicas,
            patch_id=decision.patch_id,
        )
