"""Pure handling of JobStarted / JobCompleted bus events for an EphemeralRunner.

Job events are edges with de-dup ids, but they may still arrive twice or out of order (a
redelivery, a listener failover, the service's own reordering). The status fields they set are
therefore computed as a *fill*: the first event about a job records it, a repeat changes nothing,
and a ``JobCompleted`` seen before its ``JobStarted`` records the same fields, so the later
``JobStarted`` is a no-op. Completion itself is recorded as an annotation that nothing clears,
so a late ``JobStarted`` never moves the runner back to "started".
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from shared.api import EphemeralRunner, EphemeralRunnerStatus, finished
from shared.api.constants import ANNOTATION_JOB_COMPLETED, LABEL_SCALE_SET_NAME
from shared.bus.messages import JobCompleted, JobStarted

JsonTree = dict[str, Any]

# ANNOTATION_JOB_COMPLETED (shared.api.constants): set on an EphemeralRunner when the service
# reported its job completed; "job=<job key>;result=<result>;at=<event time>;epoch=<listener epoch>".
# Written once, never removed (a late JobStarted cannot undo it). The runner-set worker reads it to
# know whether a finished runner's completion is accounted for (shared.api.finished).

JobEvent = JobStarted | JobCompleted


def mismatch(er: EphemeralRunner, event: JobEvent) -> str | None:
    """Why ``event`` is not about this ER (None when it is)."""
    if er.metadata.name != event.runner_name:
        return f"runner name {event.runner_name!r} is not the EphemeralRunner {er.metadata.name!r}"
    label = er.metadata.labels.get(LABEL_SCALE_SET_NAME)
    if label and label != event.scale_set.name:
        return f"EphemeralRunner belongs to scale set {label!r}, the event to {event.scale_set.name!r}"
    if er.spec.runner_scale_set_id and event.scale_set_id and er.spec.runner_scale_set_id != event.scale_set_id:
        return f"EphemeralRunner registers in scale set id {er.spec.runner_scale_set_id}, the event names {event.scale_set_id}"
    status = er.status
    if status is not None and status.runner_id and event.runner_id and status.runner_id != event.runner_id:
        return f"EphemeralRunner is runner id {status.runner_id}, the event names {event.runner_id}"
    return None


def _same_job(status: EphemeralRunnerStatus, event: JobEvent) -> bool | None:
    """True/False when the recorded job is/is not the event's, None when nothing is recorded."""
    if not status.job_id and not status.job_request_id:
        return None
    if status.job_id and event.job_id:
        return status.job_id == event.job_id
    if status.job_request_id and event.runner_request_id:
        return status.job_request_id == event.runner_request_id
    return True  # one side lacks the identifying field: treat as the same job (fill the gaps)


def event_fields(event: JobEvent) -> JsonTree:
    """ARC's status fields from a job event; zero values left out (as ARC's listener does)."""
    fields = {
        "jobRequestId": event.runner_request_id,
        "jobId": event.job_id,
        "jobRepositoryName": event.repository,
        "workflowRunId": event.workflow_run_id,
        "jobWorkflowRef": event.workflow_ref,
        "jobDisplayName": event.job_display_name,
    }
    return {k: v for k, v in fields.items() if v not in (0, "", None)}


_ATTR = {
    "jobRequestId": "job_request_id",
    "jobId": "job_id",
    "jobRepositoryName": "job_repository_name",
    "workflowRunId": "workflow_run_id",
    "jobWorkflowRef": "job_workflow_ref",
    "jobDisplayName": "job_display_name",
}


def job_status_patch(er: EphemeralRunner, event: JobEvent) -> JsonTree | None:
    """The status merge patch recording ``event``'s job on ``er``; None when nothing changes or the
    ER already records a different job (an ephemeral runner runs exactly one)."""
    status = er.status if er.status is not None else EphemeralRunnerStatus()
    if _same_job(status, event) is False:
        return None
    wanted = event_fields(event)
    changes = {k: v for k, v in wanted.items() if getattr(status, _ATTR[k]) != v}
    if not changes:
        return None
    return {"status": changes}


def with_job(er: EphemeralRunner, fields: JsonTree) -> EphemeralRunner:
    """``er`` as it will read once the status patch ``{"status": fields}`` of
    :func:`job_status_patch` is written: what the runner worker decides on while that write waits
    to ride on the runner's next status write (README "runner worker", job events)."""
    status = er.status if er.status is not None else EphemeralRunnerStatus()
    filled = msgspec.structs.replace(status, **{_ATTR[k]: v for k, v in fields.items() if k in _ATTR})
    return msgspec.structs.replace(er, status=filled)


def conflicting_job(er: EphemeralRunner, event: JobEvent) -> bool:
    status = er.status if er.status is not None else EphemeralRunnerStatus()
    return _same_job(status, event) is False


def completion_value(event: JobCompleted) -> str:
    return finished.completion_value(event.job_key(), event.result, event.time, event.listener_epoch)


def parse_completion(value: str) -> tuple[str, datetime | None]:
    """(job key, completion time) from the annotation value; ("", None) when unparsable."""
    c = finished.parse_completion(value)
    return c.job, c.at


def completed_at(er: EphemeralRunner) -> datetime | None:
    """When the ER's recorded job completed (per the service), or None."""
    value = er.metadata.annotations.get(ANNOTATION_JOB_COMPLETED)
    if not value or er.status is None or not er.status.has_job():
        return None
    job, at = parse_completion(value)
    recorded = er.status.job_id or str(er.status.job_request_id)
    return at if job == recorded else None


def completion_patch(er: EphemeralRunner, event: JobEvent) -> JsonTree | None:
    """The metadata merge patch marking the job completed (JobCompleted only; written once)."""
    if not isinstance(event, JobCompleted):
        return None
    if ANNOTATION_JOB_COMPLETED in er.metadata.annotations:
        return None
    if conflicting_job(er, event):
        return None
    return {"metadata": {"annotations": {ANNOTATION_JOB_COMPLETED: completion_value(event)}}}
