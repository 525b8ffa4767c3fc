"""Pure: what one long-poll message asks the listener to do.

The loop executes a plan in a fixed order: acquire available jobs, publish job events and the
desired state to JetStream (waiting for the publish acks), and only then acknowledge the message
to the service. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from services.listener.scaling import is_stale_message
from shared.actions.messages import JobAssigned, JobCompleted, JobStarted, Message
from shared.actions.models import ScaleSetStatistics


@dataclass(frozen=True, slots=True)
class MessagePlan:
    message_id: int
    #: An older message than one already handled (out-of-order delivery or a redelivery).
    stale: bool
    #: The statistics to scale on: the message's own, unless it is stale.
    statistics: ScaleSetStatistics
    acquire_request_ids: tuple[int, ...]
    assigned: tuple[JobAssigned, ...]
    started: tuple[JobStarted, ...]
    completed: tuple[JobCompleted, ...]

    @property
    def dirty(self) -> bool:
        """ARC marks the scaler dirty on every job started or completed (a fresh patch ID)."""
        return bool(self.started or self.completed)


_Job = TypeVar("_Job", JobAssigned, JobStarted, JobCompleted)


def _unique(jobs: list[_Job]) -> tuple[_Job, ...]:
    # Reassignment storms and redeliveries repeat identical events inside one batch.
    seen: set[tuple[str, str, str]] = set()
    out: list[_Job] = []
    for job in jobs:
        key = (type(job).__name__, job.job_key, getattr(job, "runner_name", ""))
        if key not in seen:
            seen.add(key)
            out.append(job)
    return tuple(out)


def plan_message(message: Message, *, newest_seen_id: int, latest_statistics: ScaleSetStatistics) -> MessagePlan:
    stale = is_stale_message(newest_seen_id=newest_seen_id, message_id=message.message_id)
    acquire: list[int] = []
    for job in message.available:
        # acquirejobs takes runner request ids; github.com sends 0 there (nothing to acquire).
        if job.runner_request_id and job.runner_request_id not in acquire:
            acquire.append(job.runner_request_id)
    return MessagePlan(
        message_id=message.message_id,
        stale=stale,
        statistics=latest_statistics if stale else message.statistics,
        acquire_request_ids=tuple(acquire),
        assigned=_unique(message.assigned),
        started=_unique(message.started),
        completed=_unique(message.completed),
    )
