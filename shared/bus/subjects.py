"""The one place that names every subject, stream, durable consumer and KV bucket of the bus.

Subjects are per resource so consumers can filter and shard on them::

    runnerscale.desired.<namespace>.<ers-name>                      DesiredState (a level)
    runnerscale.jobs.<namespace>.<scale-set>.started|completed       JobStarted / JobCompleted (edges)
    runnerscale.revisions.<namespace>.<ers-name>.published|applied   RevisionPublished / RevisionApplied
    runnerscale.changes.<kind>.<namespace>.<name>                    ResourceChanged (wake-up)

Resource names become single subject tokens through :func:`encode_token`, a reversible escape
that keeps ``[a-z0-9-]`` (and ``A-Z``) as they are and writes every other byte, dots included,
as ``_xx`` (lowercase hex of the UTF-8 byte). The result is also a valid NATS KV key, so the
same tokens name lease keys.
"""

from __future__ import annotations

import enum
import re

import msgspec

from shared.bus.errors import InvalidResourceName

PREFIX = "runnerscale"

# --- resource name <-> subject token ---------------------------------------------------------

_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_ESCAPE = re.compile(r"_([0-9a-f]{2})")


def encode_token(name: str) -> str:
    """Turn any non-empty string (e.g. ``my.runner-set``) into one subject token (``my_2erunner-set``)."""
    if not isinstance(name, str) or not name:
        raise InvalidResourceName(f"resource name must be a non-empty string, got {name!r}")
    out: list[str] = []
    for byte in name.encode("utf-8"):
        out.append(chr(byte) if byte in _PLAIN else f"_{byte:02x}")
    return "".join(out)


def decode_token(token: str) -> str:
    """Invert :func:`encode_token`; reject tokens it could not have produced (so encoding is 1:1)."""
    if not token:
        raise InvalidResourceName("empty subject token")
    raw = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "_":
            m = _ESCAPE.match(token, i)
            if m is None:
                raise InvalidResourceName(f"bad escape at offset {i} in token {token!r}")
            byte = int(m.group(1), 16)
            if byte in _PLAIN:
                raise InvalidResourceName(f"non-canonical escape {m.group(0)!r} in token {token!r}")
            raw.append(byte)
            i += 3
        elif ord(ch) < 128 and ord(ch) in _PLAIN:
            raw.append(ord(ch))
            i += 1
        else:
            raise InvalidResourceName(f"character {ch!r} not allowed in token {token!r}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidResourceName(f"token {token!r} does not decode to UTF-8") from exc


# --- subjects --------------------------------------------------------------------------------


class SubjectKind(str, enum.Enum):
    """What a subject carries; also the ``subject_kind`` label of the bus metrics."""

    DESIRED = "desired"
    JOB_STARTED = "job_started"
    JOB_COMPLETED = "job_completed"
    REVISION_PUBLISHED = "revision_published"
    REVISION_APPLIED = "revision_applied"
    RESOURCE_CHANGED = "resource_changed"
    UNKNOWN = "unknown"


class SubjectInfo(msgspec.Struct, frozen=True):
    """A parsed subject: its kind and the (decoded) resource it names."""

    kind: SubjectKind
    namespace: str
    name: str
    resource_kind: str = ""  # only for RESOURCE_CHANGED


def desired_subject(namespace: str, ers_name: str) -> str:
    return f"{PREFIX}.desired.{encode_token(namespace)}.{encode_token(ers_name)}"


def job_started_subject(namespace: str, scale_set_name: str) -> str:
    return f"{PREFIX}.jobs.{encode_token(namespace)}.{encode_token(scale_set_name)}.started"


def job_completed_subject(namespace: str, scale_set_name: str) -> str:
    return f"{PREFIX}.jobs.{encode_token(namespace)}.{encode_token(scale_set_name)}.completed"


def revision_published_subject(namespace: str, ers_name: str) -> str:
    return f"{PREFIX}.revisions.{encode_token(namespace)}.{encode_token(ers_name)}.published"


def revision_applied_subject(namespace: str, ers_name: str) -> str:
    return f"{PREFIX}.revisions.{encode_token(namespace)}.{encode_token(ers_name)}.applied"


def resource_changed_subject(resource_kind: str, namespace: str, name: str) -> str:
    return f"{PREFIX}.changes.{encode_token(resource_kind.lower())}.{encode_token(namespace)}.{encode_token(name)}"


def parse_subject(subject: str) -> SubjectInfo:
    """Classify a bus subject; raise :class:`InvalidResourceName` if its tokens do not decode.

    Unrecognised shapes come back as ``SubjectKind.UNKNOWN`` rather than raising, so a consumer
    can count and terminate them.
    """
    parts = subject.split(".")
    if len(parts) < 4 or parts[0] != PREFIX:
        return SubjectInfo(SubjectKind.UNKNOWN, "", "")
    family = parts[1]
    if family == "desired" and len(parts) == 4:
        return SubjectInfo(SubjectKind.DESIRED, decode_token(parts[2]), decode_token(parts[3]))
    if family == "jobs" and len(parts) == 5 and parts[4] in ("started", "completed"):
        kind = SubjectKind.JOB_STARTED if parts[4] == "started" else SubjectKind.JOB_COMPLETED
        return SubjectInfo(kind, decode_token(parts[2]), decode_token(parts[3]))
    if family == "revisions" and len(parts) == 5 and parts[4] in ("published", "applied"):
        kind = SubjectKind.REVISION_PUBLISHED if parts[4] == "published" else SubjectKind.REVISION_APPLIED
        return SubjectInfo(kind, decode_token(parts[2]), decode_token(parts[3]))
    if family == "changes" and len(parts) == 5:
        return SubjectInfo(
            SubjectKind.RESOURCE_CHANGED, decode_token(parts[3]), decode_token(parts[4]), decode_token(parts[2])
        )
    return SubjectInfo(SubjectKind.UNKNOWN, "", "")


# --- streams ---------------------------------------------------------------------------------


class StreamSpec(msgspec.Struct, frozen=True):
    """What a stream is for. Limits (history depth, replicas) come from settings at start-up.

    ``level``: only the latest message per subject matters (history kept for inspection);
    ``edge``: every message matters once, so publishes carry a ``Nats-Msg-Id``.
    """

    name: str
    subjects: tuple[str, ...]
    level: bool
    description: str


DESIRED_STREAM = StreamSpec(
    "RUNNERSCALE_DESIRED", (f"{PREFIX}.desired.>",), True, "runnerscale desired state per EphemeralRunnerSet (a level)"
)
JOBS_STREAM = StreamSpec("RUNNERSCALE_JOBS", (f"{PREFIX}.jobs.>",), False, "runnerscale job started/completed events")
REVISIONS_STREAM = StreamSpec(
    "RUNNERSCALE_REVISIONS", (f"{PREFIX}.revisions.>",), True, "runnerscale revision published/applied wake-ups"
)
CHANGES_STREAM = StreamSpec(
    "RUNNERSCALE_CHANGES", (f"{PREFIX}.changes.>",), True, "runnerscale resource-changed wake-ups"
)
STREAMS: tuple[StreamSpec, ...] = (DESIRED_STREAM, JOBS_STREAM, REVISIONS_STREAM, CHANGES_STREAM)

# --- durable consumers -----------------------------------------------------------------------


class DeliverFrom(str, enum.Enum):
    """Where a (re)created consumer starts."""

    LAST_PER_SUBJECT = "last_per_subject"  # levels: the latest message of every subject, then new ones
    ALL = "all"  # edges: everything still in the stream
    NEW = "new"  # only messages published after creation


class ConsumerSpec(msgspec.Struct, frozen=True):
    """A durable pull consumer: its stream, durable name, filters and redelivery bounds."""

    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    deliver_from: DeliverFrom
    max_deliver: int = 5
    ack_wait_seconds: float = 30.0


RUNNER_SET_DESIRED = ConsumerSpec(
    DESIRED_STREAM.name, "runner-set-desired", (f"{PREFIX}.desired.>",), DeliverFrom.LAST_PER_SUBJECT
)
RUNNER_JOBS = ConsumerSpec(JOBS_STREAM.name, "runner-jobs", (f"{PREFIX}.jobs.>",), DeliverFrom.ALL)
# The runner-set's own copy of the listener's JobCompleted events (per-replica durable, new
# messages only): a finished runner is accounted as soon as the desired state is, without waiting
# for the runner worker's job-completed mark (README "Typed state (new fields)").
RUNNER_SET_COMPLETIONS = ConsumerSpec(
    JOBS_STREAM.name, "runner-set-completions", (f"{PREFIX}.jobs.*.*.completed",), DeliverFrom.NEW
)
RUNNER_SET_REVISIONS = ConsumerSpec(
    REVISIONS_STREAM.name, "runner-set-revisions", (f"{PREFIX}.revisions.*.*.published",), DeliverFrom.LAST_PER_SUBJECT
)
SCALE_SET_REVISIONS = ConsumerSpec(
    REVISIONS_STREAM.name, "scale-set-revisions", (f"{PREFIX}.revisions.*.*.applied",), DeliverFrom.LAST_PER_SUBJECT
)
LISTENER_POD_CHANGES = ConsumerSpec(
    CHANGES_STREAM.name,
    "listener-pod-changes",
    (f"{PREFIX}.changes.autoscalinglistener.>",),
    DeliverFrom.LAST_PER_SUBJECT,
)
CONSUMERS: tuple[ConsumerSpec, ...] = (
    RUNNER_SET_DESIRED,
    RUNNER_JOBS,
    RUNNER_SET_COMPLETIONS,
    RUNNER_SET_REVISIONS,
    SCALE_SET_REVISIONS,
    LISTENER_POD_CHANGES,
)

# --- KV buckets and lease keys ---------------------------------------------------------------

MEMBERS_BUCKET = "runnerscale_members"  # <group>.<replica>_<instance> -> claimed shards (shared.membership)
LEADERS_BUCKET = "runnerscale_leaders"  # <lease name>     -> holder replica id
SESSIONS_BUCKET = "runnerscale_listener_sessions"  # scaleset-<id> -> the listener's message session record


class BucketSpec(msgspec.Struct, frozen=True):
    """A KV bucket the bus creates (or checks) at start-up. Every bucket keeps one value per key.

    ``lease``: keys expire ``lease_ttl`` after their last write (every replica must agree on the
    TTL); otherwise keys never expire.
    """

    name: str
    lease: bool
    description: str


BUCKET_SPECS: tuple[BucketSpec, ...] = (
    BucketSpec(MEMBERS_BUCKET, True, "runnerscale leases"),
    BucketSpec(LEADERS_BUCKET, True, "runnerscale leases"),
    BucketSpec(SESSIONS_BUCKET, False, "runnerscale listener message sessions"),
)
BUCKETS: tuple[str, ...] = tuple(b.name for b in BUCKET_SPECS)


def bucket_spec(name: str) -> BucketSpec:
    for spec in BUCKET_SPECS:
        if spec.name == name:
            return spec
    raise KeyError(f"{name!r} is not a runnerscale KV bucket (see shared.bus.subjects.BUCKET_SPECS)")


def member_key(group: str, replica_id: str) -> str:
    return f"{encode_token(group)}.{encode_token(replica_id)}"


def listener_lease_name(namespace: str, scale_set_name: str) -> str:
    """The LeaderLease name held by the active listener of one scale set."""
    return f"listener.{encode_token(namespace)}.{encode_token(scale_set_name)}"


def listener_session_key(scale_set_id: int) -> str:
    """The key of a scale set's session record in :data:`SESSIONS_BUCKET`."""
    return f"scaleset-{int(scale_set_id)}"
