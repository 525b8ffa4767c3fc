"""Finished runners: the facts the runner worker records on an EphemeralRunner that ended after
its job, read back by the runner-set worker (README "Typed state (new fields)", "runner-set worker").

- ``actions.github.com/job-completed``: ``job=<key>;result=<r>;at=<listener time>;epoch=<listener
  epoch>``, from the listener's JobCompleted. The listener publishes the JobCompleted events of a
  service message before the desired state computed from it, so a desired state of the same epoch
  whose time is at or after ``at`` (or of a later epoch) accounts for the completion.
- ``status.finishedAt``: when the runner worker saw the runner finish, written in the same status
  patch as phase Succeeded. Runners finished by older versions carry it as the annotation
  ``actions.github.com/finished-at`` (ISO 8601) instead; :func:`finished_time` reads both, so an
  upgrade strands none of them.
"""

from __future__ import annotations

import datetime as dt

import msgspec

from shared.api.constants import ANNOTATION_FINISHED_AT, ANNOTATION_JOB_COMPLETED
from shared.api.meta import ObjectMeta
from shared.api.types import EphemeralRunner

# Marks written before the epoch field existed carry a time cut to whole seconds.
_SECONDS = "%Y-%m-%dT%H:%M:%SZ"


class JobCompletion(msgspec.Struct, frozen=True):
    job: str
    at: dt.datetime | None
    epoch: int | None  # None: an older mark without an epoch (time cut to seconds)
    result: str = ""


def completion_value(job: str, result: str, at: dt.datetime, epoch: int) -> str:
    """The ``job-completed`` annotation value (full-precision UTC time and the listener epoch)."""
    stamp = at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return f"job={job};result={result or 'unknown'};at={stamp};epoch={epoch}"


def parse_completion(value: str) -> JobCompletion:
    """The parts of a ``job-completed`` value; unparsable parts are None/""."""
    parts = dict(p.split("=", 1) for p in value.split(";") if "=" in p)
    raw = parts.get("at", "")
    at: dt.datetime | None
    try:
        at = dt.datetime.strptime(raw, _SECONDS).replace(tzinfo=dt.UTC)
    except ValueError:
        try:
            at = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
            at = at if at.tzinfo else at.replace(tzinfo=dt.UTC)
        except ValueError:
            at = None
    try:
        epoch: int | None = int(parts["epoch"])
    except (KeyError, ValueError):
        epoch = None
    return JobCompletion(parts.get("job", ""), at, epoch, parts.get("result", ""))


def job_completion(meta: ObjectMeta) -> JobCompletion | None:
    value = meta.annotations.get(ANNOTATION_JOB_COMPLETED)
    return parse_completion(value) if value else None


def finished_time(er: EphemeralRunner) -> dt.datetime | None:
    """When the runner worker saw the runner finish: ``status.finishedAt``, else the annotation
    older versions stamped (:func:`finished_at`), else None."""
    at = er.status.finished_at if er.status is not None else None
    if at is not None:
        return at if at.tzinfo else at.replace(tzinfo=dt.UTC)
    return finished_at(er.metadata)


def finished_at(meta: ObjectMeta) -> dt.datetime | None:
    """The ``finished-at`` annotation of older versions, or None (absent / unparsable)."""
    raw = meta.annotations.get(ANNOTATION_FINISHED_AT, "")
    try:
        t = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def finished_at_patch(now: dt.datetime) -> dict[str, dict[str, dict[str, str]]]:
    """The annotation as older versions wrote it (tests of the upgrade path; nothing writes it now)."""
    return {"metadata": {"annotations": {ANNOTATION_FINISHED_AT: now.astimezone(dt.UTC).isoformat()}}}
