"""Decoding a long-poll message (README "Actions service client") into typed job messages.

The Q1 body is an envelope whose ``body`` is a JSON *string* holding a JSON array of job
messages (double-encoded). It may be empty (a statistics-only message). Inner messages of a type
we do not know are skipped, as the reference listener does; a garbled inner message is a
:class:`MessageDecodeError` naming the message id and the position, never a KeyError.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from shared.actions.errors import ProtocolError
from shared.actions.models import RUNNER_SCALE_SET_JOB_MESSAGES, MessageEnvelope, ScaleSetStatistics

__all__ = [
    "JobAssigned",
    "JobAvailable",
    "JobCompleted",
    "JobMessage",
    "JobStarted",
    "Message",
    "MessageDecodeError",
    "decode_message",
    "strip_bom",
]

_BOM = b"\xef\xbb\xbf"


def strip_bom(data: bytes) -> bytes:
    """Drop a leading UTF-8 byte-order mark, which the service sometimes sends before JSON."""
    return data[len(_BOM) :] if data.startswith(_BOM) else data


class MessageDecodeError(ProtocolError):
    """A message envelope or one of its job messages does not match the protocol.

    ``message_id`` / ``message_type`` are the envelope's when it decoded (``None`` / ``""``
    otherwise), so the caller can acknowledge a message it cannot use; ``reason`` is a short
    machine label: ``malformed_envelope``, ``unsupported_message_type``, ``missing_statistics``
    or ``malformed_body``.
    """

    def __init__(
        self,
        message: str,
        *,
        request: str = "",
        message_id: int | None = None,
        message_type: str = "",
        reason: str = "malformed_body",
    ) -> None:
        self.message_id = message_id
        self.message_type = message_type
        self.reason = reason
        super().__init__(message, request=request)


class _JobBase(msgspec.Struct, rename="camel", kw_only=True, frozen=True):
    """Fields common to every job message. Times are ``None`` when absent or Go's zero time."""

    runner_request_id: int = 0
    job_id: str = ""
    repository_name: str = ""
    owner_name: str = ""
    job_workflow_ref: str = ""
    job_display_name: str = ""
    workflow_run_id: int = 0
    event_name: str = ""
    request_labels: list[str] = []
    queue_time: dt.datetime | None = None
    scale_set_assign_time: dt.datetime | None = None
    runner_assign_time: dt.datetime | None = None
    finish_time: dt.datetime | None = None

    @property
    def job_key(self) -> str:
        """A stable identity for the job: ``jobId`` when present (github.com sends
        ``runnerRequestId`` 0 since mid-2025), else the runner request id."""
        return self.job_id or str(self.runner_request_id)


class JobAvailable(_JobBase, frozen=True, tag="JobAvailable", tag_field="messageType"):
    acquire_job_url: str = ""


class JobAssigned(_JobBase, frozen=True, tag="JobAssigned", tag_field="messageType"):
    pass


class JobStarted(_JobBase, frozen=True, tag="JobStarted", tag_field="messageType"):
    runner_id: int = 0
    runner_name: str = ""


class JobCompleted(_JobBase, frozen=True, tag="JobCompleted", tag_field="messageType"):
    result: str = ""
    runner_id: int = 0
    runner_name: str = ""


JobMessage = JobAvailable | JobAssigned | JobStarted | JobCompleted

_JOB_TYPES: dict[str, type[JobMessage]] = {
    "JobAvailable": JobAvailable,
    "JobAssigned": JobAssigned,
    "JobStarted": JobStarted,
    "JobCompleted": JobCompleted,
}


class _TypeProbe(msgspec.Struct):
    messageType: str = ""  # wire name


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One long-poll message: its id (ack it with this), the statistics snapshot taken when it
    was sent (the scaling signal), and its job messages in service order, by kind."""

    message_id: int
    statistics: ScaleSetStatistics
    jobs: tuple[JobMessage, ...] = ()
    skipped_types: tuple[str, ...] = ()  # inner messageTypes we do not know, for logging

    @property
    def available(self) -> list[JobAvailable]:
        return [j for j in self.jobs if isinstance(j, JobAvailable)]

    @property
    def assigned(self) -> list[JobAssigned]:
        return [j for j in self.jobs if isinstance(j, JobAssigned)]

    @property
    def started(self) -> list[JobStarted]:
        return [j for j in self.jobs if isinstance(j, JobStarted)]

    @property
    def completed(self) -> list[JobCompleted]:
        return [j for j in self.jobs if isinstance(j, JobCompleted)]


def _zero_to_none(t: dt.datetime | None) -> dt.datetime | None:
    return None if t is None or t.year <= 1 else t


def _normalise(job: JobMessage) -> JobMessage:
    return msgspec.structs.replace(
        job,
        queue_time=_zero_to_none(job.queue_time),
        scale_set_assign_time=_zero_to_none(job.scale_set_assign_time),
        runner_assign_time=_zero_to_none(job.runner_assign_time),
        finish_time=_zero_to_none(job.finish_time),
    )


def decode_job_messages(body: str, *, message_id: int = 0) -> tuple[tuple[JobMessage, ...], tuple[str, ...]]:
    """Decode the double-encoded ``body`` string into job messages (unknown types skipped)."""
    if not body.strip():
        return (), ()
    where = f"message {message_id}"
    try:
        raw_items = msgspec.json.decode(strip_bom(body.encode()), type=list[msgspec.Raw])
    except msgspec.DecodeError as exc:
        raise MessageDecodeError(f"{where}: body is not a JSON array of job messages: {exc}") from None
    jobs: list[JobMessage] = []
    skipped: list[str] = []
    for index, raw in enumerate(raw_items):
        try:
            kind = msgspec.json.decode(raw, type=_TypeProbe).messageType
        except msgspec.DecodeError as exc:
            raise MessageDecodeError(f"{where}: job message [{index}] is not an object: {exc}") from None
        job_type = _JOB_TYPES.get(kind)
        if job_type is None:
            skipped.append(kind or "<missing messageType>")
            continue
        try:
            jobs.append(_normalise(msgspec.json.decode(raw, type=job_type)))
        except msgspec.ValidationError as exc:
            raise MessageDecodeError(f"{where}: {kind} [{index}]: {exc}") from None
    return tuple(jobs), tuple(skipped)


def decode_message(data: bytes, *, request: str = "") -> Message:
    """Decode a Q1 200 response body (BOM tolerated) into a :class:`Message`.

    An envelope with another ``messageType`` or without ``statistics`` is a protocol error:
    the listener cannot scale without the statistics snapshot.
    """
    data = strip_bom(data)
    if not data.strip():
        raise MessageDecodeError("message response has an empty body", request=request, reason="malformed_envelope")
    try:
        envelope = msgspec.json.decode(data, type=MessageEnvelope)
    except msgspec.DecodeError as exc:
        raise MessageDecodeError(
            f"message envelope is invalid: {exc}", request=request, reason="malformed_envelope"
        ) from None
    known: dict[str, Any] = dict(request=request, message_id=envelope.message_id, message_type=envelope.message_type)
    if envelope.message_type != RUNNER_SCALE_SET_JOB_MESSAGES:
        raise MessageDecodeError(
            f"message {envelope.message_id} has unsupported messageType {envelope.message_type!r}",
            reason="unsupported_message_type",
            **known,
        )
    if envelope.statistics is None:
        raise MessageDecodeError(
            f"message {envelope.message_id} has no statistics", reason="missing_statistics", **known
        )
    try:
        jobs, skipped = decode_job_messages(envelope.body, message_id=envelope.message_id)
    except MessageDecodeError as exc:
        raise MessageDecodeError(str(exc), reason="malformed_body", **known) from None
    return Message(message_id=envelope.message_id, statistics=envelope.statistics, jobs=jobs, skipped_types=skipped)
