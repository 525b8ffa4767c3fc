"""Typed bus messages: msgspec Structs, JSON on the wire, each with ``kind`` and ``schemaVersion``.

Every message names its resource, carries its own ordering facts (patch ID and listener epoch,
or revision number) and a timestamp, so a receiver can judge staleness without other context.
Field names are camelCase on the wire (``nats sub`` output reads like the Kubernetes objects).

:func:`decode` is the only way bytes become a message: it picks the type from the subject,
checks the schema version, and checks that the body names the same resource as the subject.
:func:`subject_for` is the inverse: the subject a message is published on.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Final

import msgspec

from shared.bus import subjects
from shared.bus.errors import InvalidResourceName, MalformedMessage, UnknownSchemaVersion
from shared.bus.subjects import SubjectKind

SCHEMA_VERSION: Final = 1
SUPPORTED_SCHEMA_VERSIONS: Final = frozenset({1})


# Times must carry a zone: a naive time cannot be compared with anything safely.
AwareDatetime = Annotated[dt.datetime, msgspec.Meta(tz=True)]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _Message(msgspec.Struct, rename="camel", tag_field="kind"):
    # Positional-with-defaults here and kw_only in subclasses puts kind, schemaVersion and time
    # first on the wire. Unknown fields are ignored so a newer minor writer stays readable.
    schema_version: int = SCHEMA_VERSION
    time: AwareDatetime = msgspec.field(default_factory=utcnow)


class ResourceRef(msgspec.Struct, frozen=True, rename="camel"):
    namespace: str
    name: str


class JobStatistics(msgspec.Struct, kw_only=True, rename="camel"):
    """The Actions service's scale-set statistics, as sent with every message session poll."""

    total_available_jobs: int = 0
    total_acquired_jobs: int = 0
    total_assigned_jobs: int = 0
    total_running_jobs: int = 0
    total_registered_runners: int = 0
    total_busy_runners: int = 0
    total_idle_runners: int = 0


class DesiredState(_Message, tag="DesiredState", kw_only=True):
    """listener → runner-set: the ERS should have ``replicas`` runners (a level, latest wins).

    Order of two DesiredStates for one ERS: higher ``listener_epoch`` wins (a new leader), then
    the later ``time``; ``patch_id`` is what the runner-set worker writes to ``spec.patchID``.
    """

    scale_set_id: int
    ers: ResourceRef
    patch_id: int
    replicas: int
    listener_epoch: int
    statistics: JobStatistics = msgspec.field(default_factory=JobStatistics)


class _JobEvent(_Message, kw_only=True):
    scale_set_id: int
    scale_set: ResourceRef  # the AutoscalingRunnerSet (scale set) namespace/name
    runner_name: str
    runner_id: int
    job_id: str = ""
    runner_request_id: int = 0
    workflow_run_id: int = 0
    workflow_ref: str = ""
    job_display_name: str = ""
    repository: str = ""  # "<owner>/<repo>"
    event_name: str = ""
    listener_epoch: int = 0

    def job_key(self) -> str:
        # github.com may send runnerRequestId 0 with a jobId: key on jobId when present.
        return self.job_id or str(self.runner_request_id)


class JobStarted(_JobEvent, tag="JobStarted", kw_only=True):
    """listener → runner: a runner took a job (the runner worker records it on the ER status)."""


class JobCompleted(_JobEvent, tag="JobCompleted", kw_only=True):
    """listener → runner: a job finished on a runner; ``result`` e.g. succeeded/failed/canceled."""

    result: str = ""


class RevisionPublished(_Message, tag="RevisionPublished", kw_only=True):
    """scale-set → runner-set: ``ERS.spec.actionableRevision`` became ``revision`` (a wake-up)."""

    ers: ResourceRef
    revision: int
    phase: str = ""


class RevisionApplied(_Message, tag="RevisionApplied", kw_only=True):
    """runner-set → scale-set: ``ERS.status.appliedActionableRevision`` reached ``revision``."""

    ers: ResourceRef
    revision: int
    phase: str = ""


class ResourceChanged(_Message, tag="ResourceChanged", kw_only=True):
    """Any worker → the worker owning ``resource_kind``: re-read this object (a wake-up)."""

    resource_kind: str  # e.g. "AutoscalingListener"
    ref: ResourceRef
    generation: int = 0
    resource_version: str = ""


BusMessage = DesiredState | JobStarted | JobCompleted | RevisionPublished | RevisionApplied | ResourceChanged

_TYPE_BY_KIND: dict[SubjectKind, type] = {
    SubjectKind.DESIRED: DesiredState,
    SubjectKind.JOB_STARTED: JobStarted,
    SubjectKind.JOB_COMPLETED: JobCompleted,
    SubjectKind.REVISION_PUBLISHED: RevisionPublished,
    SubjectKind.REVISION_APPLIED: RevisionApplied,
    SubjectKind.RESOURCE_CHANGED: ResourceChanged,
}
_KIND_BY_TYPE = {t: k for k, t in _TYPE_BY_KIND.items()}


class _VersionProbe(msgspec.Struct, rename="camel"):
    schema_version: object = None


_encoder = msgspec.json.Encoder()
_probe_decoder = msgspec.json.Decoder(_VersionProbe)
_decoders: dict[SubjectKind, msgspec.json.Decoder[BusMessage]] = {
    kind: msgspec.json.Decoder(t) for kind, t in _TYPE_BY_KIND.items()
}


def encode(message: BusMessage) -> bytes:
    """JSON bytes of ``message``, checked against its own schema first.

    Structs are not validated when constructed, so a wrong type or a naive time would otherwise
    reach the bus and be terminated by every consumer; it fails here, in the publisher, instead.
    """
    data = _encoder.encode(message)
    kind = _KIND_BY_TYPE.get(type(message))
    if kind is None:
        raise TypeError(f"not a bus message: {type(message).__name__}")
    try:
        _decoders[kind].decode(data)
    except msgspec.ValidationError as exc:
        raise MalformedMessage(subject_for(message), f"refusing to publish: {exc}") from None
    return data


def subject_kind_of(message: BusMessage) -> SubjectKind:
    return _KIND_BY_TYPE[type(message)]


def subject_for(message: BusMessage) -> str:
    """The subject ``message`` is published on (derived from the resource it names)."""
    match message:
        case DesiredState(ers=ref):
            return subjects.desired_subject(ref.namespace, ref.name)
        case JobStarted(scale_set=ref):
            return subjects.job_started_subject(ref.namespace, ref.name)
        case JobCompleted(scale_set=ref):
            return subjects.job_completed_subject(ref.namespace, ref.name)
        case RevisionPublished(ers=ref):
            return subjects.revision_published_subject(ref.namespace, ref.name)
        case RevisionApplied(ers=ref):
            return subjects.revision_applied_subject(ref.namespace, ref.name)
        case ResourceChanged(resource_kind=kind, ref=ref):
            return subjects.resource_changed_subject(kind, ref.namespace, ref.name)
    raise TypeError(f"not a bus message: {type(message).__name__}")


def dedup_id(message: BusMessage) -> str | None:
    """The ``Nats-Msg-Id`` of an edge message (JetStream drops a repeat inside the duplicate window).

    Levels and wake-ups get none: publishing one twice is harmless by construction. A job can be
    re-assigned to another runner after a cancel, so the runner id is part of the job event id.
    """
    match message:
        case JobStarted():
            return f"job-started.{message.scale_set_id}.{message.job_key()}.{message.runner_id}"
        case JobCompleted():
            return f"job-completed.{message.scale_set_id}.{message.job_key()}.{message.runner_id}"
    return None


def _ref_of(message: BusMessage) -> ResourceRef:
    match message:
        case DesiredState(ers=ref) | RevisionPublished(ers=ref) | RevisionApplied(ers=ref):
            return ref
        case JobStarted(scale_set=ref) | JobCompleted(scale_set=ref):
            return ref
        case ResourceChanged(ref=ref):
            return ref
    raise TypeError(type(message).__name__)


def decode(subject: str, data: bytes) -> BusMessage:
    """Decode ``data`` received on ``subject`` into its typed message.

    Raises :class:`MalformedMessage` (unknown subject, bad JSON, wrong/missing fields, a body
    naming another resource than its subject) or :class:`UnknownSchemaVersion`.
    """
    try:
        info = subjects.parse_subject(subject)
    except InvalidResourceName as exc:
        raise MalformedMessage(subject, f"subject does not decode: {exc}") from None
    if info.kind is SubjectKind.UNKNOWN:
        raise MalformedMessage(subject, "not a runnerscale message subject")
    try:
        probe = _probe_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedMessage(subject, f"not a JSON object: {exc}") from None
    version = probe.schema_version
    if version is None:
        raise MalformedMessage(subject, "missing schemaVersion")
    if type(version) is not int or version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnknownSchemaVersion(subject, version)
    try:
        message: BusMessage = _decoders[info.kind].decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedMessage(subject, str(exc)) from None
    ref = _ref_of(message)
    if (ref.namespace, ref.name) != (info.namespace, info.name):
        raise MalformedMessage(
            subject, f"body names {ref.namespace}/{ref.name}, subject names {info.namespace}/{info.name}"
        )
    if isinstance(message, ResourceChanged) and message.resource_kind.lower() != info.resource_kind:
        raise MalformedMessage(subject, f"body kind {message.resource_kind!r} does not match the subject")
    return message
