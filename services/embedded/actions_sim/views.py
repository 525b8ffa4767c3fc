"""Payloads of the simulator-only control API (``/_sim/``) and the runner-side API (``/_runner/``).

These are the simulator's own shapes (snake_case JSON), not the Actions service's: tests and the
node simulator use them through :mod:`services.embedded.actions_sim.control_client` and
:mod:`services.embedded.actions_sim.runner_agent`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from services.embedded.actions_sim.wire import Statistics

JobState = Literal["queued", "available", "acquired", "assigned", "started", "completed"]
RunnerStatus = Literal["offline", "idle", "busy", "outdated"]
Mode = Literal["dotcom", "ghes"]


class SimSettings(msgspec.Struct, kw_only=True):
    """Run-time behaviour knobs; ``POST /_sim/config`` changes any subset of them."""

    poll_wait: float = 50.0
    """Seconds a message long-poll is held before answering 202 (the real service holds ~50 s)."""
    admin_token_ttl: float = 600.0
    """Lifetime of the admin JWT from the runner-registration exchange."""
    queue_token_ttl: float = 1800.0
    """Lifetime of a session's message-queue JWT."""
    registration_token_ttl: float = 3600.0
    installation_token_ttl: float = 3600.0
    session_idle_timeout: float = 120.0
    """A session with no poll for this long is expired server-side, freeing the slot."""
    assign_timeout: float = 600.0
    """An assigned job no runner started within this long is cancelled and reassigned (3 times)."""
    mode: Mode = "dotcom"
    """dotcom: jobs are assigned directly; ghes: JobAvailable first, then acquirejobs."""
    zero_runner_request_id: bool = False
    """Send runnerRequestId 0 in job messages (github.com since mid-2025); dotcom mode only."""
    job_still_running_status: int = 400
    """Status of JobStillRunningException on remove-runner (old ARC expected 400, the library 409)."""
    drop_custom_labels: bool = False
    """GHES without custom labels: a scale set's only label is its name."""
    min_runner_version: str = ""
    """Runners older than this are rejected as outdated when they connect ("" = any)."""


NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class SettingsPatch(msgspec.Struct, kw_only=True, omit_defaults=True):
    poll_wait: NonNegative | None = None
    admin_token_ttl: NonNegative | None = None
    queue_token_ttl: NonNegative | None = None
    registration_token_ttl: NonNegative | None = None
    installation_token_ttl: NonNegative | None = None
    session_idle_timeout: NonNegative | None = None
    assign_timeout: NonNegative | None = None
    mode: Mode | None = None
    zero_runner_request_id: bool | None = None
    job_still_running_status: Annotated[int, msgspec.Meta(ge=400, le=499)] | None = None
    drop_custom_labels: bool | None = None
    min_runner_version: str | None = None


class JobSpec(msgspec.Struct, kw_only=True):
    """``POST /_sim/jobs``: enqueue ``count`` identical jobs."""

    count: int = 1
    labels: list[str] = msgspec.field(default_factory=list)
    """The job's ``runs-on`` labels; a scale set matches when it carries every one (case-insensitive)."""
    duration: float = 0.0
    """Seconds the runner spends on the job between started and completed."""
    result: str = "succeeded"
    repository: str = ""
    """``owner/repo``; defaults to the seeded org's default repository."""
    workflow_ref: str = ""
    display_name: str = ""
    event_name: str = "workflow_dispatch"


class JobView(msgspec.Struct, kw_only=True):
    job_id: str
    runner_request_id: int
    state: JobState
    labels: list[str]
    owner: str
    repository: str
    workflow_ref: str
    display_name: str
    duration: float
    result: str
    scale_set_id: int | None
    runner_id: int | None
    runner_name: str
    attempts: int
    final_result: str
    # Simulator clock (epoch seconds): queued, handed to a runner, finished (None until then).
    queue_time: float = 0.0
    runner_assign_time: float | None = None
    finish_time: float | None = None


class RunnerView(msgspec.Struct, kw_only=True):
    id: int
    name: str
    scale_set_id: int
    status: RunnerStatus
    version: str
    job_id: str


class SessionView(msgspec.Struct, kw_only=True):
    session_id: str
    scale_set_id: int
    owner_name: str
    last_poll_capacity: int | None
    polls_in_flight: int


class ScaleSetView(msgspec.Struct, kw_only=True):
    id: int
    name: str
    tenant: str
    runner_group_id: int
    labels: list[str]
    statistics: Statistics
    max_capacity: int | None


class MessageView(msgspec.Struct, kw_only=True):
    message_id: int
    scale_set_id: int
    message_type: str
    body: str
    statistics: Statistics
    acked: bool


FaultKind = Literal[
    "status",
    "after",
    "delay",
    "drop",
    "empty_body",
    "bom",
    "redeliver",
    "duplicate_events",
    "reorder",
    "blank_queue_url",
]


class FaultRule(msgspec.Struct, kw_only=True):
    """``POST /_sim/faults``: one rule, matched by endpoint name (or ``*``) and HTTP method.

    kinds: ``status`` answer ``status`` without acting; ``after`` act, then answer ``status``
    ("acted then answered 500"); ``delay`` hold ``seconds`` before acting; ``drop`` close the
    connection without answering (after ``seconds``, e.g. mid-poll); ``empty_body`` answer 200
    with no body; ``bom`` prefix the real answer with a UTF-8 BOM. For get_message only:
    ``redeliver`` deliver the answered message again on the next poll even if acked;
    ``duplicate_events`` repeat the next message's job events inside it and again in the
    following message; ``reorder`` put the next message's job events in reverse order. For
    create_session / refresh_session: ``blank_queue_url`` act, but answer an empty
    ``messageQueueUrl``.
    """

    endpoint: str
    kind: FaultKind = "status"
    status: int = 500
    count: int | None = 1
    """How many matching requests this rule fires on; None = every one until cleared."""
    method: str = ""
    retry_after: str | None = None
    seconds: float = 0.0
    body: str | None = None
    """A body for ``status``/``after`` answers; default: a JSON error in the service's shape."""
    content_type: str = "application/json; charset=utf-8"


class FaultView(msgspec.Struct, kw_only=True):
    id: int
    rule: FaultRule
    fired: int


class FaultCreated(msgspec.Struct):
    id: int


class RequestRecord(msgspec.Struct, kw_only=True):
    time: float
    method: str
    path: str
    query: str
    endpoint: str
    status: int
    headers: dict[str, str]
    fault: int | None = None


class RequestCount(msgspec.Struct, kw_only=True):
    """How many requests of one kind the simulated service answered since the last clear: every
    request counts, where the request log (``/_sim/requests``) keeps only the latest 2,000."""

    method: str
    endpoint: str
    status: int
    count: int


class MinRunnerVersion(msgspec.Struct):
    version: str


class ClockAdvance(msgspec.Struct):
    seconds: float


class ClockView(msgspec.Struct):
    now: float


class InjectMessage(msgspec.Struct, kw_only=True):
    """``POST /_sim/scalesets/{id}/messages``: queue a hand-made message (payload quirks).

    ``events`` are raw job-message objects put into ``body`` as given; ``body`` (a string)
    overrides them verbatim (e.g. ``""`` for a statistics-only message); ``statistics`` replaces
    the live snapshot; ``message_type`` replaces ``RunnerScaleSetJobMessages``.
    """

    events: list[msgspec.Raw] = msgspec.field(default_factory=list)
    body: str | None = None
    statistics: Statistics | None = None
    message_type: str | None = None


class MessageCreated(msgspec.Struct):
    message_id: int


# Runner-side API (what a runner process holding a JIT config does).


class RunnerConnect(msgspec.Struct):
    version: str


class RunnerConnected(msgspec.Struct, kw_only=True, omit_defaults=True):
    runner_id: int
    runner_name: str
    scale_set_id: int
    job: RunnerJob | None = None
    """The job already handed to the runner, as ``GET /_runner/job`` would answer it (the runner
    skips that poll; issue 10: a request per runner saved on both sides)."""


class RunnerRejected(msgspec.Struct, kw_only=True):
    """403 body of ``/_runner/connect`` for a runner below the minimum version."""

    type_name: str = "GitHub.DistributedTask.WebApi.RunnerVersionDeprecatedException"
    message: str = ""
    outdated: bool = True
    min_version: str = ""


class RunnerJob(msgspec.Struct, kw_only=True):
    job_id: str
    runner_request_id: int
    duration: float
    result: str
    repository: str
    workflow_ref: str


class RunnerJobCompleted(msgspec.Struct):
    result: str = ""
