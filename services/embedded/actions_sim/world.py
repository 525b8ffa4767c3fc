"""The simulator's state and its transitions: a synchronous core with no I/O.

Every operation takes ``now`` (simulated epoch seconds) and either returns a result or raises
:class:`ServiceFault` carrying the real service's status and exception name. Job events are
appended to the scale set's message queue; the async shell (server.py) wakes long-polls when
:attr:`World.generation` changes. Decisions that need no state (statistics, label matching,
version comparison, scope parsing, message rendering) are module-level pure functions.

Assumptions where the real service is not observable (research §9) are marked "assumption".
"""

from __future__ import annotations

import functools
import heapq
import itertools
import uuid
from datetime import UTC, datetime
from typing import Literal

import msgspec

from services.embedded.actions_sim import wire
from services.embedded.actions_sim.views import JobSpec, JobState, RunnerStatus, SimSettings

MESSAGE_ID_BASE = 100_000_000  # large, so 32-bit bugs show
MAX_EVENTS_PER_MESSAGE = 50
MAX_REASSIGNMENTS = 3
MAX_KEPT_MESSAGES = 1000
DEFAULT_GROUP = "Default"

_RT = "GitHub.Actions.Runtime.WebApi"
_DT = "GitHub.DistributedTask.WebApi"


def exception_name(short: str, assembly: str = _RT) -> str:
    return f"{assembly}.{short}, {assembly}"


class ServiceFault(Exception):
    """An error answer of the Actions service: status plus the ``{typeName, message}`` body."""

    def __init__(self, status: int, type_name: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type_name = type_name
        self.message = message


def scale_set_not_found(what: str) -> ServiceFault:
    return ServiceFault(
        404, exception_name("RunnerScaleSetNotFoundException"), f"No runner scale set found with {what}."
    )


def bad_request(message: str) -> ServiceFault:
    return ServiceFault(400, "System.ArgumentException, mscorlib", message)


# ---------------------------------------------------------------------------------------------
# Pure helpers


class ScopeRef(msgspec.Struct, frozen=True):
    """Where a config URL points: an organization, a repository, or an enterprise."""

    kind: Literal["org", "repo", "enterprise"]
    owner: str
    repo: str = ""

    @property
    def key(self) -> str:
        return (
            f"{self.owner}/{self.repo}"
            if self.kind == "repo"
            else (f"enterprises/{self.owner}" if self.kind == "enterprise" else self.owner)
        )


def parse_scope_path(path: str) -> ScopeRef | None:
    """The scope of a config URL path (§1.1): ``org``, ``org/repo`` or ``enterprises/ent``."""
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) == 1:
        return ScopeRef("org", parts[0])
    if len(parts) == 2 and parts[0].lower() == "enterprises":
        return ScopeRef("enterprise", parts[1])
    if len(parts) == 2:
        return ScopeRef("repo", parts[0], parts[1])
    return None


def labels_match(job_labels: list[str], scale_set_labels: list[wire.Label]) -> bool:
    """A scale set takes a job when it carries every one of the job's labels (case-insensitive)."""
    have = {label.name.lower() for label in scale_set_labels}
    return bool(job_labels) and all(label.lower() in have for label in job_labels)


def parse_version(text: str) -> tuple[int, ...] | None:
    parts = text.strip().lstrip("vV").split(".")
    try:
        return tuple(int(p) for p in parts) if parts and parts[0] else None
    except ValueError:
        return None


def is_outdated(version: str, minimum: str) -> bool:
    """True when ``version`` is below ``minimum`` ("" = no minimum)."""
    if not minimum:
        return False
    have, need = parse_version(version), parse_version(minimum)
    if need is None:
        return False
    return have is None or have < need


@functools.lru_cache(maxsize=4096)  # the jobs of a burst share their times (issue 10: 4 per event)
def rfc3339(t: float | None) -> str:
    """.NET-style time with 7 fractional digits, as the service sends; ZERO_TIME when unset."""
    if t is None:
        return wire.ZERO_TIME
    dt = datetime.fromtimestamp(t, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{dt.microsecond * 10:07d}Z"


# ---------------------------------------------------------------------------------------------
# State


class Tenant(msgspec.Struct):
    id: int
    scope: ScopeRef
    runner_groups: list[wire.RunnerGroup]
    service_url: str = ""  # the Actions base URL last handed out for it (absolute URLs in messages)


class ScaleSetRecord(msgspec.Struct):
    id: int
    tenant_id: int
    name: str
    runner_group_id: int
    labels: list[wire.Label]
    runner_setting: wire.RunnerSetting
    created_on: float
    max_capacity: int | None = None  # last X-ScaleSetMaxCapacity seen; None = not limited yet


class JobRecord(msgspec.Struct, kw_only=True):
    job_id: str
    runner_request_id: int
    workflow_run_id: int
    labels: list[str]
    owner: str
    repository: str
    workflow_ref: str
    display_name: str
    event_name: str
    duration: float
    result: str
    state: JobState = "queued"
    scale_set_id: int | None = None
    runner_id: int | None = None
    runner_name: str = ""
    attempts: int = 0
    final_result: str = ""
    queue_time: float
    scale_set_assign_time: float | None = None
    runner_assign_time: float | None = None
    finish_time: float | None = None
    seq: int = 0  # creation order: the order settle treats jobs in


class RunnerRecord(msgspec.Struct, kw_only=True):
    id: int
    name: str
    tenant_id: int
    scale_set_id: int
    token: str
    created_on: float
    status: RunnerStatus = "offline"
    version: str = ""
    job_id: str = ""


class SessionRecord(msgspec.Struct, kw_only=True):
    session_id: str
    scale_set_id: int
    owner_name: str
    last_active: float
    polls_in_flight: int = 0


class StoredMessage(msgspec.Struct, kw_only=True):
    message_id: int
    scale_set_id: int
    message_type: str
    body: str
    statistics: wire.Statistics
    acked: bool = False


class MessageQueue(msgspec.Struct):
    """Per scale set, surviving sessions: unacked messages are redelivered to the next session."""

    pending: list[wire.JobMessage] = msgspec.field(default_factory=list)
    messages: list[StoredMessage] = msgspec.field(default_factory=list)
    # The unacked ones among ``messages`` by id, oldest first: a poll and an ack look here, not at
    # the up to MAX_KEPT_MESSAGES acked ones kept for inspection (issue 10: a burst of N runners
    # makes ~N messages, and every poll, wake-up and ack walked all of them kept, O(N) each).
    unacked: dict[int, StoredMessage] = msgspec.field(default_factory=dict)
    redeliver: list[int] = msgspec.field(default_factory=list)
    duplicate_next: bool = False
    reverse_next: bool = False
    carry_over: list[wire.JobMessage] = msgspec.field(default_factory=list)


class Seed(msgspec.Struct, kw_only=True):
    """Who exists: organizations (any repository under them exists), an enterprise holding them
    all, extra runner groups per tenant, and the credentials (see settings.py for the CLI)."""

    orgs: list[str] = msgspec.field(default_factory=lambda: ["octo-org"])
    default_repo: str = "octo-repo"
    enterprise: str = "octo-enterprise"
    runner_groups: list[str] = msgspec.field(default_factory=list)


def compute_statistics(scale_set_id: int, jobs: list[JobRecord], runners: list[RunnerRecord]) -> wire.Statistics:
    """Statistics of one scale set from state; ``assigned ≥ running`` and ``registered = busy + idle``."""
    stats = wire.Statistics()
    for job in jobs:
        if job.scale_set_id != scale_set_id:
            continue
        if job.state == "available":
            stats.total_available_jobs += 1
        elif job.state == "acquired":
            stats.total_acquired_jobs += 1
        elif job.state in ("assigned", "started"):
            stats.total_assigned_jobs += 1
            if job.state == "started":
                stats.total_running_jobs += 1
    for runner in runners:
        if runner.scale_set_id != scale_set_id:
            continue
        stats.total_registered_runners += 1
        if runner.job_id:
            stats.total_busy_runners += 1
    stats.total_idle_runners = stats.total_registered_runners - stats.total_busy_runners
    return stats


# ---------------------------------------------------------------------------------------------


class World:
    """All simulator state. Not thread-safe: the server's one event loop owns it."""

    def __init__(self, seed: Seed, settings: SimSettings) -> None:
        self.seed = seed
        self.settings = settings
        self.reset()

    def reset(self) -> None:
        self.tenants: dict[int, Tenant] = {}
        self.scale_sets: dict[int, ScaleSetRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.open_jobs: dict[str, JobRecord] = {}  # not completed
        # Indexes kept with every change of a job or runner (issue 10: settle, its deadline and
        # the statistics of every message walked every open job and runner, O(N) per request).
        # Open jobs by (scale set or None, state); statistics are their sizes.
        self._by_state: dict[tuple[int | None, str], dict[str, JobRecord]] = {}
        # Assigned jobs waiting for a runner, per scale set: a heap of (seq, job id), checked when
        # popped (an entry whose job moved on is dropped).
        self._waiting: dict[int, list[tuple[int, str]]] = {}
        # Assignment deadlines: per attempt count a heap of (assign time, seq, job id), checked
        # when looked at; the deadline is assign time + assign_timeout × (attempts + 1).
        self._deadlines: dict[int, list[tuple[float, int, str]]] = {}
        self._job_seq = itertools.count(1)
        self.runners: dict[int, RunnerRecord] = {}
        # Per scale set: registered and busy runner counts, and the idle runners by id.
        self._runner_counts: dict[int, list[int]] = {}
        self._idle: dict[int, dict[int, RunnerRecord]] = {}
        # Runners whose status, job or registration changed since the shell last looked: it wakes
        # only their job long-polls, not every runner's (issue 10).
        self.changed_runners: set[int] = set()
        # Lookup hints by token and by (tenant, name), checked against ``runners`` on every use (a
        # removed runner's entry is stale, never trusted): runner-side calls and registrations no
        # longer scan every runner (issue 10).
        self._runner_by_token: dict[str, RunnerRecord] = {}
        self._runner_by_name: dict[tuple[int, str], RunnerRecord] = {}
        self.sessions: dict[str, SessionRecord] = {}
        self.queues: dict[int, MessageQueue] = {}
        self._tenant_ids = itertools.count(1)
        self._scale_set_ids = itertools.count(1)
        self._runner_ids = itertools.count(1)
        self._message_ids = itertools.count(MESSAGE_ID_BASE + 1)
        self._request_ids = itertools.count(1001)
        self._run_ids = itertools.count(7_000_001)
        self.generation = 0  # bumped on every change a long-poll may care about

    def touch(self) -> None:
        self.generation += 1

    # -- indexes -------------------------------------------------------------------------------
    # Every change of an open job's state, scale set or runner goes _unindex → change → _index;
    # every change of a runner's status or job, or its removal, _runner_out → change → _runner_in.

    def _index(self, job: JobRecord) -> None:
        if job.job_id not in self.open_jobs:
            return
        self._by_state.setdefault((job.scale_set_id, job.state), {})[job.job_id] = job
        if job.state == "assigned" and job.scale_set_id is not None:
            if job.runner_id is None:
                heapq.heappush(self._waiting.setdefault(job.scale_set_id, []), (job.seq, job.job_id))
            if job.scale_set_assign_time is not None:
                entry = (job.scale_set_assign_time, job.seq, job.job_id)
                heapq.heappush(self._deadlines.setdefault(job.attempts, []), entry)

    def _unindex(self, job: JobRecord) -> None:
        jobs = self._by_state.get((job.scale_set_id, job.state))
        if jobs is not None:
            jobs.pop(job.job_id, None)

    def _jobs_in(self, scale_set_id: int | None, state: str) -> dict[str, JobRecord]:
        return self._by_state.get((scale_set_id, state), {})

    def _runner_in(self, runner: RunnerRecord) -> None:
        if self.runners.get(runner.id) is not runner:
            return
        counts = self._runner_counts.setdefault(runner.scale_set_id, [0, 0])
        counts[0] += 1
        if runner.job_id:
            counts[1] += 1
        if runner.status == "idle":
            self._idle.setdefault(runner.scale_set_id, {})[runner.id] = runner

    def _runner_out(self, runner: RunnerRecord) -> None:
        if self.runners.get(runner.id) is not runner:
            return
        self.changed_runners.add(runner.id)
        counts = self._runner_counts[runner.scale_set_id]
        counts[0] -= 1
        if runner.job_id:
            counts[1] -= 1
        self._idle.get(runner.scale_set_id, {}).pop(runner.id, None)

    def _due(self, attempts: int, heap: list[tuple[float, int, str]]) -> tuple[float, JobRecord] | None:
        """The earliest assignment deadline of this attempt count: (deadline, job); stale heap
        entries on top are dropped."""
        while heap:
            at, _, job_id = heap[0]
            job = self.open_jobs.get(job_id)
            if (
                job is not None
                and job.state == "assigned"
                and job.attempts == attempts
                and job.scale_set_assign_time == at
            ):
                return at + self.settings.assign_timeout * (attempts + 1), job
            heapq.heappop(heap)
        return None

    # -- tenants -------------------------------------------------------------------------------

    def scope_exists(self, scope: ScopeRef) -> bool:
        orgs = {o.lower() for o in self.seed.orgs}
        if scope.kind == "enterprise":
            return scope.owner.lower() == self.seed.enterprise.lower()
        return scope.owner.lower() in orgs

    def tenant_for(self, scope: ScopeRef) -> Tenant:
        """The Actions tenant of a scope, created on first exchange. Names compare case-insensitively."""
        norm = ScopeRef(scope.kind, scope.owner.lower(), scope.repo.lower())
        for tenant in self.tenants.values():
            if tenant.scope == norm:
                return tenant
        groups = [wire.RunnerGroup(id=1, name=DEFAULT_GROUP, is_default_group=True)]
        groups += [wire.RunnerGroup(id=i, name=n) for i, n in enumerate(self.seed.runner_groups, start=2)]
        tenant = Tenant(id=next(self._tenant_ids), scope=norm, runner_groups=groups)
        self.tenants[tenant.id] = tenant
        return tenant

    def tenant(self, tenant_id: int) -> Tenant:
        tenant = self.tenants.get(tenant_id)
        if tenant is None:
            raise ServiceFault(404, exception_name("TenantNotFoundException"), f"No tenant {tenant_id}.")
        return tenant

    # -- runner groups and scale sets ----------------------------------------------------------

    def runner_groups(self, tenant_id: int, name: str | None) -> list[wire.RunnerGroup]:
        """A1. Assumption: group names compare case-insensitively (GitHub treats them so in the UI)."""
        groups = self.tenant(tenant_id).runner_groups
        if name is None:
            return list(groups)
        return [g for g in groups if g.name.lower() == name.lower()]

    def _group(self, tenant_id: int, group_id: int) -> wire.RunnerGroup:
        for g in self.tenant(tenant_id).runner_groups:
            if g.id == group_id:
                return g
        raise ServiceFault(
            404, exception_name("TaskAgentPoolNotFoundException", _DT), f"Runner group {group_id} not found."
        )

    def scale_set(self, tenant_id: int, scale_set_id: int) -> ScaleSetRecord:
        record = self.scale_sets.get(scale_set_id)
        if record is None or record.tenant_id != tenant_id:
            raise scale_set_not_found(f"id {scale_set_id}")
        return record

    def find_scale_sets(self, tenant_id: int, group_id: int | None, name: str | None) -> list[ScaleSetRecord]:
        return [
            s
            for s in self.scale_sets.values()
            if s.tenant_id == tenant_id
            and (group_id is None or s.runner_group_id == group_id)
            and (name is None or s.name == name)
        ]

    def _labels_for(self, name: str, labels: list[wire.Label] | None) -> list[wire.Label]:
        if self.settings.drop_custom_labels or not labels:
            return [wire.Label(name=name)]
        return [wire.Label(name=lb.name, type=lb.type or "System") for lb in labels]

    def _check_name_free(self, tenant_id: int, group_id: int, name: str, except_id: int = 0) -> None:
        for s in self.find_scale_sets(tenant_id, group_id, name):
            if s.id != except_id:
                # Assumption: the real answer to a duplicate name is not documented (research §2.3).
                raise ServiceFault(
                    409,
                    exception_name("RunnerScaleSetExistsException"),
                    f"A runner scale set named {name} already exists in runner group {group_id}.",
                )

    def create_scale_set(self, tenant_id: int, req: wire.ScaleSetRequest, *, now: float) -> ScaleSetRecord:
        if not req.name:
            raise bad_request("Runner scale set name is required (field: name).")
        group = self._group(tenant_id, req.runner_group_id or 1)
        self._check_name_free(tenant_id, group.id, req.name)
        setting = wire.RunnerSetting()
        if req.runner_setting is not None:
            setting = _apply_setting(setting, req.runner_setting)
        record = ScaleSetRecord(
            id=next(self._scale_set_ids),
            tenant_id=tenant_id,
            name=req.name,
            runner_group_id=group.id,
            labels=self._labels_for(req.name, req.labels),
            runner_setting=setting,
            created_on=now,
        )
        self.scale_sets[record.id] = record
        self.queues[record.id] = MessageQueue()
        self.touch()
        return record

    def update_scale_set(self, tenant_id: int, scale_set_id: int, req: wire.ScaleSetRequest) -> ScaleSetRecord:
        """A5: only non-zero fields apply; the zero ``createdOn`` and empty ``RunnerSetting`` are ignored."""
        record = self.scale_set(tenant_id, scale_set_id)
        group_id = record.runner_group_id
        if req.runner_group_id:
            group_id = self._group(tenant_id, req.runner_group_id).id
        name = req.name or record.name
        if name != record.name or group_id != record.runner_group_id:
            self._check_name_free(tenant_id, group_id, name, except_id=record.id)
        record.name, record.runner_group_id = name, group_id
        if req.labels:
            record.labels = self._labels_for(name, req.labels)
        if req.runner_setting is not None:
            record.runner_setting = _apply_setting(record.runner_setting, req.runner_setting)
        self.touch()
        return record

    def delete_scale_set(self, tenant_id: int, scale_set_id: int) -> None:
        """A6. Cascades: sessions and runners go; its unfinished jobs go back to the queue
        (assumption: on GitHub a job waits for any runner with its labels)."""
        self.scale_set(tenant_id, scale_set_id)
        del self.scale_sets[scale_set_id]
        self.queues.pop(scale_set_id, None)
        for sid in [s.session_id for s in self.sessions.values() if s.scale_set_id == scale_set_id]:
            del self.sessions[sid]
        for runner in [r for r in self.runners.values() if r.scale_set_id == scale_set_id]:
            self._runner_out(runner)
            del self.runners[runner.id]
        for job in self.open_jobs.values():
            if job.scale_set_id == scale_set_id:
                self._unindex(job)
                _requeue(job)
                self._index(job)
        self._waiting.pop(scale_set_id, None)
        self.touch()

    # -- sessions ------------------------------------------------------------------------------

    def create_session(self, tenant_id: int, scale_set_id: int, owner_name: str, *, now: float) -> SessionRecord:
        record = self.scale_set(tenant_id, scale_set_id)
        for session in self.sessions.values():
            if session.scale_set_id == scale_set_id:
                raise ServiceFault(
                    409,
                    exception_name("RunnerScaleSetSessionConflictException"),
                    f"The actions runner scaleset {record.name} already has an active session.",
                )
        session = SessionRecord(
            session_id=str(uuid.uuid4()), scale_set_id=scale_set_id, owner_name=owner_name, last_active=now
        )
        self.sessions[session.session_id] = session
        self.touch()
        return session

    def session(self, scale_set_id: int, session_id: str) -> SessionRecord:
        session = self.sessions.get(session_id)
        if session is None or session.scale_set_id != scale_set_id:
            raise ServiceFault(
                404,
                exception_name("RunnerAdminException"),
                f"runner referenced a session ID that doesn't exist: {session_id}",
            )
        return session

    def refresh_session(self, tenant_id: int, scale_set_id: int, session_id: str, *, now: float) -> SessionRecord:
        self.scale_set(tenant_id, scale_set_id)
        session = self.session(scale_set_id, session_id)
        session.last_active = now
        return session

    def delete_session(self, tenant_id: int, scale_set_id: int, session_id: str) -> None:
        """S3. Assumption: deleting an unknown session is 404 (research §9.2)."""
        self.scale_set(tenant_id, scale_set_id)
        self.session(scale_set_id, session_id)
        del self.sessions[session_id]
        self.touch()

    # -- message queue -------------------------------------------------------------------------

    def set_capacity(self, scale_set_id: int, capacity: int) -> None:
        record = self.scale_sets.get(scale_set_id)
        if record is not None and record.max_capacity != capacity:
            record.max_capacity = capacity
            self.touch()

    def statistics(self, scale_set_id: int) -> wire.Statistics:
        """As :func:`compute_statistics` over every open job and runner, from the indexes."""
        assigned, started = len(self._jobs_in(scale_set_id, "assigned")), len(self._jobs_in(scale_set_id, "started"))
        registered, busy = self._runner_counts.get(scale_set_id, (0, 0))
        return wire.Statistics(
            total_available_jobs=len(self._jobs_in(scale_set_id, "available")),
            total_acquired_jobs=len(self._jobs_in(scale_set_id, "acquired")),
            total_assigned_jobs=assigned + started,
            total_running_jobs=started,
            total_registered_runners=registered,
            total_busy_runners=busy,
            total_idle_runners=registered - busy,
        )

    def next_message(self, scale_set_id: int, last_message_id: int) -> StoredMessage | None:
        """Q1 without the wait: the oldest unacked message newer than ``last_message_id``, else a
        new message from up to 50 pending events with a statistics snapshot, else None."""
        queue = self.queues.get(scale_set_id)
        if queue is None:
            return None
        if queue.redeliver:
            wanted = queue.redeliver.pop(0)
            for m in queue.messages:
                if m.message_id == wanted:
                    return m
        for m in queue.unacked.values():
            if m.message_id > last_message_id:
                return m
        if not queue.pending and not queue.carry_over:
            return None
        batch = queue.carry_over + queue.pending[:MAX_EVENTS_PER_MESSAGE]
        queue.carry_over = []
        del queue.pending[:MAX_EVENTS_PER_MESSAGE]
        if queue.reverse_next:
            queue.reverse_next = False
            batch.reverse()
        if queue.duplicate_next:
            queue.duplicate_next = False
            queue.carry_over = list(batch)
            batch = batch + batch
        body = msgspec.json.encode(batch).decode()
        return self._store(scale_set_id, wire.MESSAGE_TYPE, body, self.statistics(scale_set_id))

    def _store(self, scale_set_id: int, message_type: str, body: str, stats: wire.Statistics) -> StoredMessage:
        message = StoredMessage(
            message_id=next(self._message_ids),
            scale_set_id=scale_set_id,
            message_type=message_type,
            body=body,
            statistics=stats,
        )
        queue = self.queues[scale_set_id]
        queue.messages.append(message)
        queue.unacked[message.message_id] = message
        self.touch()
        return message

    def inject_message(
        self, scale_set_id: int, *, body: str, statistics: wire.Statistics | None, message_type: str | None
    ) -> StoredMessage:
        if scale_set_id not in self.scale_sets:
            raise scale_set_not_found(f"id {scale_set_id}")
        stats = statistics if statistics is not None else self.statistics(scale_set_id)
        return self._store(scale_set_id, message_type or wire.MESSAGE_TYPE, body, stats)

    def ack_message(self, scale_set_id: int, message_id: int) -> None:
        """Q2. Acking twice is fine (a retried delete); an id never issued is 404 (assumption)."""
        queue = self.queues.get(scale_set_id)
        if queue is not None:
            message = queue.unacked.pop(message_id, None)
            if message is not None:
                message.acked = True
                self._prune(queue)
                return
            if any(m.message_id == message_id for m in queue.messages):
                return  # acked before: a retried delete (the only walk of the kept messages)
        raise ServiceFault(404, exception_name("MessageNotFoundException"), f"No message with id {message_id}.")

    @staticmethod
    def _prune(queue: MessageQueue) -> None:
        """Keep the newest MAX_KEPT_MESSAGES for inspection; acked ones beyond that are forgotten."""
        excess = len(queue.messages) - MAX_KEPT_MESSAGES
        if excess > 0:
            keep_unacked = [m for m in queue.messages[:excess] if not m.acked]
            queue.messages[:excess] = keep_unacked

    def _emit(self, job: JobRecord, event: wire.JobMessage) -> None:
        if job.scale_set_id is not None and job.scale_set_id in self.queues:
            self.queues[job.scale_set_id].pending.append(event)
            self.touch()

    def _event(self, cls: type, job: JobRecord, **extra: object) -> wire.JobMessage:
        zero = self.settings.zero_runner_request_id and self.settings.mode == "dotcom"
        event: wire.JobMessage = cls(
            runner_request_id=0 if zero else job.runner_request_id,
            job_id=job.job_id,
            repository_name=job.repository,
            owner_name=job.owner,
            job_workflow_ref=job.workflow_ref,
            job_display_name=job.display_name,
            workflow_run_id=job.workflow_run_id,
            event_name=job.event_name,
            request_labels=list(job.labels),
            queue_time=rfc3339(job.queue_time),
            scale_set_assign_time=rfc3339(job.scale_set_assign_time),
            runner_assign_time=rfc3339(job.runner_assign_time),
            finish_time=rfc3339(job.finish_time),
            **extra,
        )
        return event

    # -- jobs ----------------------------------------------------------------------------------

    def enqueue_jobs(self, spec: JobSpec, *, now: float) -> list[JobRecord]:
        if spec.count < 1 or spec.count > 10_000:
            raise bad_request("count must be between 1 and 10000 (field: count).")
        if spec.duration < 0:
            raise bad_request("duration must not be negative (field: duration).")
        repository = spec.repository or f"{self.seed.orgs[0]}/{self.seed.default_repo}"
        owner, _, repo = repository.partition("/")
        if not owner or not repo or "/" in repo:
            raise bad_request("repository must be owner/repo (field: repository).")
        labels = spec.labels or ["self-hosted"]
        created = []
        for _ in range(spec.count):
            job = JobRecord(
                job_id=str(uuid.uuid4()),
                runner_request_id=next(self._request_ids),
                workflow_run_id=next(self._run_ids),
                labels=list(labels),
                owner=owner,
                repository=repo,
                workflow_ref=spec.workflow_ref or f"{owner}/{repo}/.github/workflows/ci.yaml@refs/heads/main",
                display_name=spec.display_name or "build",
                event_name=spec.event_name,
                duration=spec.duration,
                result=spec.result,
                queue_time=now,
                seq=next(self._job_seq),
            )
            self.jobs[job.job_id] = job
            self.open_jobs[job.job_id] = job
            self._index(job)
            created.append(job)
        self.touch()
        return created

    def _covers(self, scale_set: ScaleSetRecord, job: JobRecord) -> bool:
        scope = self.tenants[scale_set.tenant_id].scope
        owner, repo = job.owner.lower(), job.repository.lower()
        if scope.kind == "repo" and (scope.owner, scope.repo) != (owner, repo):
            return False
        if scope.kind == "org" and scope.owner != owner:
            return False
        if scope.kind == "enterprise" and owner not in {o.lower() for o in self.seed.orgs}:
            return False
        return labels_match(job.labels, scale_set.labels)

    def acquire_jobs(self, scale_set_id: int, request_ids: list[int]) -> list[int]:
        """J1: available jobs of this scale set among ``request_ids`` become acquired."""
        wanted = set(request_ids)
        acquired = []
        for job in self.acquirable_jobs(scale_set_id):
            if job.runner_request_id in wanted:
                self._unindex(job)
                job.state = "acquired"
                self._index(job)
                acquired.append(job.runner_request_id)
        if acquired:
            self.touch()
        return acquired

    def acquirable_jobs(self, scale_set_id: int) -> list[JobRecord]:
        return sorted(self._jobs_in(scale_set_id, "available").values(), key=_seq)

    # -- runners -------------------------------------------------------------------------------

    def register_runner(self, tenant_id: int, scale_set_id: int, name: str, token: str, *, now: float) -> RunnerRecord:
        """A7. Runner names are unique per tenant."""
        if not name:
            raise bad_request("Runner name is required (field: name).")
        self.scale_set(tenant_id, scale_set_id)
        known = self._runner_by_name.get((tenant_id, name))
        if known is not None and self.runners.get(known.id) is known:
            raise ServiceFault(
                409, exception_name("AgentExistsException", _DT), f"A runner exists with the same name {name}."
            )
        runner = RunnerRecord(
            id=next(self._runner_ids),
            name=name,
            tenant_id=tenant_id,
            scale_set_id=scale_set_id,
            token=token,
            created_on=now,
        )
        self.runners[runner.id] = runner
        self._runner_in(runner)
        self._runner_by_token[token] = runner
        self._runner_by_name[(tenant_id, name)] = runner
        self._forget_stale_hints()
        self.touch()
        return runner

    def _forget_stale_hints(self) -> None:
        """Drop the hints of removed runners once they outnumber the registered ones."""
        if len(self._runner_by_token) > 2 * len(self.runners) + 64:
            live = {id(r) for r in self.runners.values()}
            self._runner_by_token = {t: r for t, r in self._runner_by_token.items() if id(r) in live}
            self._runner_by_name = {k: r for k, r in self._runner_by_name.items() if id(r) in live}

    def runner(self, tenant_id: int, runner_id: int) -> RunnerRecord:
        runner = self.runners.get(runner_id)
        if runner is None or runner.tenant_id != tenant_id:
            raise ServiceFault(
                404, exception_name("AgentNotFoundException", _DT), f"No runner found with identifier {runner_id}."
            )
        return runner

    def runners_named(self, tenant_id: int, name: str | None) -> list[RunnerRecord]:
        return [r for r in self.runners.values() if r.tenant_id == tenant_id and (name is None or r.name == name)]

    def remove_runner(self, tenant_id: int, runner_id: int) -> None:
        """A10. As the service: a runner that is gone (removed, an ephemeral runner deregistered
        after its job, or never this tenant's) answers 404 ``AgentNotFoundException``; callers treat
        that as "already removed" (README "Actions service simulator")."""
        runner = self.runners.get(runner_id)
        if runner is None or runner.tenant_id != tenant_id:
            raise ServiceFault(
                404, exception_name("AgentNotFoundException", _DT), f"No runner found with identifier {runner_id}."
            )
        if runner.job_id:
            raise ServiceFault(
                self.settings.job_still_running_status,
                exception_name("JobStillRunningException", _DT),
                f"Runner {runner.name} is running job {runner.job_id} and cannot be removed.",
            )
        self._runner_out(runner)
        del self.runners[runner_id]
        self.touch()

    def runner_by_token(self, token: str) -> RunnerRecord | None:
        r = self._runner_by_token.get(token)
        if r is not None and self.runners.get(r.id) is r and r.token == token:
            return r
        return None

    def runner_connect(self, runner: RunnerRecord, version: str) -> bool:
        """A runner process comes online. False: rejected as outdated (it stays registered)."""
        runner.version = version
        self._runner_out(runner)
        try:
            if is_outdated(version, self.settings.min_runner_version):
                runner.status = "outdated"
                self.touch()
                return False
            if runner.status in ("offline", "outdated"):
                runner.status = "busy" if runner.job_id else "idle"
            self.touch()
            return True
        finally:
            self._runner_in(runner)

    def runner_job(self, runner: RunnerRecord) -> JobRecord | None:
        job = self.jobs.get(runner.job_id) if runner.job_id else None
        return job if job is not None and job.runner_id == runner.id else None

    def _runner_job_or_conflict(self, runner: RunnerRecord, job_id: str) -> JobRecord:
        job = self.jobs.get(job_id)
        if job is None or job.runner_id != runner.id or job.state not in ("assigned", "started"):
            raise ServiceFault(
                409, exception_name("JobNotAssignedException", _DT), f"Job {job_id} is not assigned to this runner."
            )
        return job

    def job_started(self, runner: RunnerRecord, job_id: str, *, now: float) -> JobRecord:
        job = self._runner_job_or_conflict(runner, job_id)
        if job.state == "assigned":  # idempotent: a repeated report changes nothing
            self._unindex(job)
            job.state = "started"
            self._index(job)
            self._emit(job, self._event(wire.JobStarted, job, runner_id=runner.id, runner_name=runner.name))
        return job

    def job_completed(self, runner: RunnerRecord, job_id: str, result: str, *, now: float) -> JobRecord:
        """The runner finished; it is ephemeral, so it deregisters."""
        job = self._runner_job_or_conflict(runner, job_id)
        self._unindex(job)
        job.state, job.finish_time = "completed", now
        job.final_result = result or job.result
        self.open_jobs.pop(job.job_id, None)
        self._emit(
            job,
            self._event(wire.JobCompleted, job, result=job.final_result, runner_id=runner.id, runner_name=runner.name),
        )
        self._runner_out(runner)
        self.runners.pop(runner.id, None)
        self.touch()
        return job

    def runner_lost(self, runner: RunnerRecord, *, now: float) -> None:
        """The runner process went away (pod killed, crash). A started job ends ``canceled``; a
        job handed over but not started goes back to waiting for another runner. The runner
        stays registered, offline, until removed (as a dead runner does on GitHub)."""
        job = self.runner_job(runner)
        if job is not None:
            self._unindex(job)
        if job is not None and job.state == "started":
            job.state, job.finish_time, job.final_result = "completed", now, "canceled"
            self.open_jobs.pop(job.job_id, None)
            self._emit(
                job,
                self._event(wire.JobCompleted, job, result="canceled", runner_id=runner.id, runner_name=runner.name),
            )
        elif job is not None:
            job.runner_id, job.runner_name, job.runner_assign_time = None, "", None
            self._index(job)
        self._runner_out(runner)
        runner.job_id = ""
        if runner.status != "outdated":
            runner.status = "offline"
        self._runner_in(runner)
        self.touch()

    # -- time and the job pipeline -------------------------------------------------------------

    def settle(self, *, now: float) -> None:
        """Advance everything that follows from the current state and time: session expiry,
        assignment timeouts, routing jobs to scale sets, assignment within capacity, and handing
        assigned jobs to idle connected runners.

        Only the jobs that need something are looked at (issue 10): those whose assignment
        deadline passed and those not routed yet, in creation order, then per scale set the jobs
        ready for assignment and, while runners are idle, the assigned jobs waiting for one."""
        s = self.settings
        for session in list(self.sessions.values()):
            if session.polls_in_flight == 0 and now - session.last_active > s.session_idle_timeout:
                del self.sessions[session.session_id]
                self.touch()
        work = dict(self._jobs_in(None, "queued"))
        for attempts, heap in self._deadlines.items():
            while (due := self._due(attempts, heap)) is not None and now >= due[0]:
                heapq.heappop(heap)
                work[due[1].job_id] = due[1]
        for job in sorted(work.values(), key=_seq):
            if (
                job.state == "assigned"
                and job.scale_set_assign_time is not None
                and now >= job.scale_set_assign_time + s.assign_timeout * (job.attempts + 1)
            ):
                self._cancel_assignment(job, now=now)
            if job.state == "queued" and job.scale_set_id is None and job.job_id in self.open_jobs:
                self._route(job)
        for scale_set in self.scale_sets.values():
            self._assign(scale_set, now=now)
            self._dispatch(scale_set, now=now)

    def _cancel_assignment(self, job: JobRecord, *, now: float) -> None:
        """Nobody started it in time: JobCompleted(canceled), then requeue (up to 3 times)."""
        runner = self.runners.get(job.runner_id) if job.runner_id else None
        self._emit(
            job,
            self._event(
                wire.JobCompleted,
                job,
                result="canceled",
                runner_id=runner.id if runner else 0,
                runner_name=runner.name if runner else "",
            ),
        )
        if runner is not None:
            self._runner_out(runner)
            runner.job_id = ""
            runner.status = "idle" if runner.status == "busy" else runner.status
            self._runner_in(runner)
        self._unindex(job)
        job.attempts += 1
        if job.attempts > MAX_REASSIGNMENTS:
            job.state, job.final_result, job.finish_time = "completed", "canceled", now
            job.runner_id, job.runner_name = None, ""
            self.open_jobs.pop(job.job_id, None)
        else:
            _requeue(job)
            self._index(job)
        self.touch()

    def _route(self, job: JobRecord) -> None:
        # Assumption: with several matching scale sets, the oldest (lowest id) takes the job.
        for scale_set in sorted(self.scale_sets.values(), key=lambda x: x.id):
            if self._covers(scale_set, job):
                self._unindex(job)
                job.scale_set_id = scale_set.id
                if self.settings.mode == "ghes":
                    job.state = "available"
                    base = self.tenants[scale_set.tenant_id].service_url
                    url = f"{base}_apis/runtime/runnerscalesets/{scale_set.id}/acquirejobs"
                    self._emit(job, self._event(wire.JobAvailable, job, acquire_job_url=url))
                self._index(job)
                self.touch()
                return

    def _assign(self, scale_set: ScaleSetRecord, *, now: float) -> None:
        ready_state = "acquired" if self.settings.mode == "ghes" else "queued"
        if not self._jobs_in(scale_set.id, ready_state):
            return
        active = 0
        if scale_set.max_capacity is not None:
            active = len(self._jobs_in(scale_set.id, "assigned")) + len(self._jobs_in(scale_set.id, "started"))
            if active >= scale_set.max_capacity:
                return
        for job in sorted(self._jobs_in(scale_set.id, ready_state).values(), key=_seq):
            # X-ScaleSetMaxCapacity caps assigned jobs; 0 pauses assignment (assumption, §9.5).
            if scale_set.max_capacity is not None and active >= scale_set.max_capacity:
                return
            self._unindex(job)
            job.state, job.scale_set_assign_time = "assigned", now
            self._index(job)
            active += 1
            self._emit(job, self._event(wire.JobAssigned, job))

    def _dispatch(self, scale_set: ScaleSetRecord, *, now: float) -> None:
        idle = self._idle.get(scale_set.id)
        waiting = self._waiting.get(scale_set.id)
        if not idle or not waiting:
            return
        for runner in sorted(idle.values(), key=lambda r: r.id):
            job = None
            while waiting:
                _, job_id = heapq.heappop(waiting)
                job = self.open_jobs.get(job_id)
                if (
                    job is not None
                    and job.state == "assigned"
                    and job.runner_id is None
                    and job.scale_set_id == scale_set.id
                ):
                    break
                job = None
            if job is None:
                return
            self._runner_out(runner)
            job.runner_id, job.runner_name, job.runner_assign_time = runner.id, runner.name, now
            runner.job_id, runner.status = job.job_id, "busy"
            self._runner_in(runner)
            self.touch()

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`settle` would change something by itself."""
        s = self.settings
        times = [x.last_active + s.session_idle_timeout for x in self.sessions.values() if x.polls_in_flight == 0]
        times += [due[0] for attempts, heap in self._deadlines.items() if (due := self._due(attempts, heap))]
        return min(times) if times else None


def _seq(job: JobRecord) -> int:
    return job.seq


def _requeue(job: JobRecord) -> None:
    job.state, job.scale_set_id, job.runner_id, job.runner_name = "queued", None, None, ""
    job.scale_set_assign_time = job.runner_assign_time = None


def _apply_setting(current: wire.RunnerSetting, patch: wire.RunnerSettingPatch) -> wire.RunnerSetting:
    out = msgspec.structs.replace(current)
    for field in ("disable_update", "ephemeral", "is_elastic"):
        value = getattr(patch, field)
        if value is not msgspec.UNSET:
            setattr(out, field, value)
    return out
