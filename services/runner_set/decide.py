"""Pure decisions of the runner-set worker (no I/O): everything here is unit-tested without servers.

- :func:`bucket_runners`: ARC's runner buckets (pending, running, finished, failed, deleting) plus revision facts.
- :func:`newer_desired` / :func:`desired_patch`: ordering of listener desired states.
- :func:`plan`: what one reconcile of a live EphemeralRunnerSet should do next.
- :func:`plan_deletion`: what one reconcile of a deleting EphemeralRunnerSet should do next.
- :func:`new_runner`: the EphemeralRunner object to create.
- :func:`desired_status`: the status counts and phase.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import msgspec

from services.runner_set import failures
from services.runner_set.failures import Assessment, FailurePolicy
from shared.api import (
    AutoscalingRunnerSet,
    EphemeralRunner,
    EphemeralRunnerPhase,
    EphemeralRunnerSet,
    EphemeralRunnerSetPhase,
    EphemeralRunnerSetStatus,
    ProxyConfig,
    ProxyServerConfig,
    finished,
    runner_revision,
    status_patch,
)
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    ANNOTATION_INTEGRITY_HASH,
    ANNOTATION_PATCH_ID,
    API_VERSION,
    COMPONENT_RUNNER,
    FINALIZER_EPHEMERAL_RUNNER,
    FINALIZER_RUNNER_REGISTRATION,
    KIND_AUTOSCALING_RUNNER_SET,
    KIND_EPHEMERAL_RUNNER_SET,
    LABEL_COMPONENT,
)
from shared.bus import DesiredState, JobCompleted

# runnerscale: the listener desired state last applied to this ERS's spec.replicas/patchID, as
# JSON {"epoch": <listenerEpoch>, "time": <message time>, "patchId": n, "replicas": n}. It is the
# restart-safe ordering record: a desired state of an older listener epoch never overrides it.
ANNOTATION_APPLIED_DESIRED_STATE = "actions.github.com/applied-desired-state"

# A listener epoch is a NATS KV revision; it only resets if the NATS store is lost. A message
# that is this much newer than the applied one is accepted even from a lower epoch, so a lost
# store heals by itself (a deposed leader stops publishing long before this: lease TTL ~10 s).
EPOCH_RESET_GRACE = dt.timedelta(seconds=120)

# A finished runner whose completion the applied desired state does not (yet) account for is kept
# and counted this long after it finished; then it is reaped as the seeds reap finished runners
# (with the cleanup marker). The listener publishes a desired state right after every JobCompleted,
# so this only matters when the listener is down or the JobCompleted was lost.
FINISHED_HOLD = dt.timedelta(seconds=60)

# ERS annotations that are not copied onto runners.
_NOT_PROPAGATED = frozenset(
    {
        ANNOTATION_APPLIED_DESIRED_STATE,
        ANNOTATION_INTEGRITY_HASH,
        failures.ANNOTATION_FAILURE_BUDGET,
        "kubectl.kubernetes.io/last-applied-configuration",
    }
)


# --- buckets -------------------------------------------------------------------------------------


def created_order(er: EphemeralRunner) -> tuple[dt.datetime, str]:
    """The buckets' order: oldest first (creation time, then name)."""
    ts = er.metadata.creation_timestamp or dt.datetime.min.replace(tzinfo=dt.UTC)
    return (ts, er.metadata.name)


def patch_id_of(er: EphemeralRunner) -> int | None:
    raw = er.metadata.annotations.get(ANNOTATION_PATCH_ID)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


class Bucket(StrEnum):
    """ARC's runner buckets; every runner is in exactly one (:func:`bucket_of`)."""

    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    OUTDATED = "outdated"
    DELETING = "deleting"


def bucket_of(er: EphemeralRunner) -> Bucket:
    """The bucket of one runner: deleting first, else by phase (no phase, or an unknown one: pending)."""
    if er.metadata.is_deleting:
        return Bucket.DELETING
    phase = er.status.phase if er.status else EphemeralRunnerPhase.NONE
    if phase == EphemeralRunnerPhase.RUNNING:
        return Bucket.RUNNING
    if phase == EphemeralRunnerPhase.SUCCEEDED:
        return Bucket.FINISHED
    if phase == EphemeralRunnerPhase.FAILED:
        return Bucket.FAILED
    if phase == EphemeralRunnerPhase.OUTDATED:
        return Bucket.OUTDATED
    return Bucket.PENDING


@dataclass(frozen=True)
class Counts:
    """How many runners each bucket holds, and the newest patch ID: all a scale-up, a steady pass
    or a status write needs (``latest_patch_id``: max patch-id annotation over ALL runners,
    deleting included; 0 if none)."""

    pending: int = 0
    running: int = 0
    finished: int = 0
    failed: int = 0
    outdated: int = 0
    deleting: int = 0
    latest_patch_id: int = 0

    def of(self, bucket: Bucket) -> int:
        n: int = getattr(self, bucket.value)
        return n


BucketLists = Callable[[Bucket], list[EphemeralRunner]]


class _BucketList:
    """``Buckets.<bucket>``: that bucket's list, oldest first, asked for on first read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.bucket = Bucket(name)

    def __get__(self, b: Buckets, owner: type | None = None) -> list[EphemeralRunner]:
        return b._list(self.bucket)


class Buckets:
    """ARC's buckets; every runner is in exactly one. Lists are oldest first.

    ``counts`` is always at hand; a bucket's list is asked of ``lists`` the first time a decision
    reads it (then kept), so a decision that needs only counts (scale-up, steady, status counts)
    never sorts or walks the set's runners (README "runner-set worker", the runner index). A list
    read must come from the same synchronous decision that took the buckets: an index answers
    only for the state it had then (:mod:`services.runner_set.index`)."""

    __slots__ = ("_lists", "_source", "counts")

    def __init__(self, counts: Counts, lists: BucketLists) -> None:
        self.counts = counts
        self._source = lists
        self._lists: dict[Bucket, list[EphemeralRunner]] = {}

    def _list(self, bucket: Bucket) -> list[EphemeralRunner]:
        found = self._lists.get(bucket)
        if found is None:
            found = self._source(bucket) if self.counts.of(bucket) else []
            self._lists[bucket] = found
        return found

    pending = _BucketList()
    running = _BucketList()
    finished = _BucketList()
    failed = _BucketList()
    outdated = _BucketList()
    deleting = _BucketList()

    @property
    def latest_patch_id(self) -> int:
        return self.counts.latest_patch_id

    @property
    def scale_total(self) -> int:
        """ARC's currentReplicas: pending + running + failed (failed ones occupy replicas)."""
        c = self.counts
        return c.pending + c.running + c.failed

    @property
    def scale_up_total(self) -> int:
        """What a scale-up compares against: deleting runners count, so they are not double-replaced,
        and so do finished runners still present (the listener may not have accounted for their
        job yet: :func:`finished_state`)."""
        return self.scale_total + self.counts.deleting + self.counts.finished

    @property
    def live(self) -> list[EphemeralRunner]:
        """Every runner not being deleted."""
        return [*self.pending, *self.running, *self.finished, *self.failed, *self.outdated]

    @property
    def all(self) -> list[EphemeralRunner]:
        return [*self.live, *self.deleting]


def bucket_runners(runners: Iterable[EphemeralRunner]) -> Buckets:
    """The buckets of ``runners`` (an authoritative read, or any list): sorted and classified at once."""
    lists: dict[Bucket, list[EphemeralRunner]] = {bucket: [] for bucket in Bucket}
    latest = 0
    for er in sorted(runners, key=created_order):
        pid = patch_id_of(er)
        if pid is not None and pid > latest:
            latest = pid
        lists[bucket_of(er)].append(er)
    counts = Counts(**{bucket.value: len(found) for bucket, found in lists.items()}, latest_patch_id=latest)
    return Buckets(counts, lists.__getitem__)


def has_job(er: EphemeralRunner) -> bool:
    return er.status is not None and er.status.has_job()


def runner_id(er: EphemeralRunner) -> int:
    return er.status.runner_id if er.status else 0


def is_idle(er: EphemeralRunner) -> bool:
    """Pending, or running without a job."""
    return not has_job(er)


def idle_candidates(b: Buckets) -> list[EphemeralRunner]:
    """Scale-down candidates in ARC's order: pending oldest first, then running oldest first;
    never a runner that is not registered yet (runnerId 0) or that has a job."""
    return [er for er in (*b.pending, *b.running) if runner_id(er) != 0 and not has_job(er)]


def stale_outdated(b: Buckets, applied_revision: int) -> list[EphemeralRunner]:
    """Outdated runners built from a revision older than the applied one: their verdict is about
    a spec that no longer exists, so they are deleted and replaced (README "runner-set worker")."""
    return [er for er in b.outdated if runner_revision(er.metadata) < applied_revision]


def current_outdated(b: Buckets, applied_revision: int) -> list[EphemeralRunner]:
    """Outdated runners at or after the applied revision: they hold the set in the Outdated phase
    and are NOT replaced (a fresh runner of the same spec would report Outdated again, forever)."""
    return [er for er in b.outdated if runner_revision(er.metadata) >= applied_revision]


# --- desired state ordering ----------------------------------------------------------------------


class AppliedDesired(msgspec.Struct, kw_only=True, rename="camel"):
    epoch: int
    time: dt.datetime
    patch_id: int = 0
    replicas: int = 0


def parse_applied_desired(annotations: dict[str, str]) -> AppliedDesired | None:
    raw = annotations.get(ANNOTATION_APPLIED_DESIRED_STATE)
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw, type=AppliedDesired)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # a garbled record is no record: the next desired state is applied


def _time(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def supersedes(epoch: int, time: dt.datetime, applied: AppliedDesired | None) -> bool:
    """May a desired state (``epoch``, ``time``) replace the applied one? A newer listener epoch
    wins; within an epoch the later message wins (the stream is a level); an older epoch never
    wins, unless it is EPOCH_RESET_GRACE newer (the NATS store, and so the epochs, were reset)."""
    if applied is None:
        return True
    t, at = _time(time), _time(applied.time)
    if epoch > applied.epoch:
        return True
    if epoch == applied.epoch:
        return t >= at
    return t > at + EPOCH_RESET_GRACE


def newer_desired(a: DesiredState | None, b: DesiredState | None) -> DesiredState | None:
    """The later of two desired states by (listener epoch, time)."""
    if a is None:
        return b
    if b is None:
        return a
    if (b.listener_epoch, _time(b.time)) >= (a.listener_epoch, _time(a.time)):
        return b
    return a


def desired_problem(msg: DesiredState) -> str | None:
    """Why a desired state cannot be applied (bad input from the bus), or None."""
    if msg.replicas < 0:
        return f"replicas must be >= 0, got {msg.replicas}"
    if msg.patch_id < 0:
        return f"patchId must be >= 0, got {msg.patch_id}"
    if msg.listener_epoch < 0:
        return f"listenerEpoch must be >= 0, got {msg.listener_epoch}"
    return None


def desired_patch(ers: EphemeralRunnerSet, msg: DesiredState) -> dict[str, Any] | None:
    """The merge patch that applies ``msg`` to the ERS, or None (stale, or nothing would change).

    The ERS is written only when what the record says changes: the listener epoch, ``patchID`` or
    ``replicas`` (README "runner-set worker", "Applying desired state"). A later message of the same
    epoch with the same values leaves the record's time where it is; that is safe because a lower
    epoch's messages all predate the first message of the recorded epoch, whose record is written.
    """
    applied = parse_applied_desired(ers.metadata.annotations)
    if not supersedes(msg.listener_epoch, msg.time, applied):
        return None
    record = AppliedDesired(
        epoch=msg.listener_epoch, time=_time(msg.time), patch_id=msg.patch_id, replicas=msg.replicas
    )
    unchanged = ers.spec.replicas == msg.replicas and ers.spec.patch_id == msg.patch_id
    if (
        unchanged
        and applied is not None
        and (applied.epoch, applied.patch_id, applied.replicas) == (record.epoch, record.patch_id, record.replicas)
    ):
        return None
    return {
        "metadata": {"annotations": {ANNOTATION_APPLIED_DESIRED_STATE: msgspec.json.encode(record).decode()}},
        "spec": {"replicas": msg.replicas, "patchID": msg.patch_id},
    }


def max_runners_of(ers: EphemeralRunnerSet, ars: AutoscalingRunnerSet | None) -> int | None:
    """The set's maxRunners, from the AutoscalingRunnerSet that controls the ERS (None: no cap,
    because the ERS has no such owner, the owner is gone or replaced, or it sets no maxRunners)."""
    owner = ers.metadata.controller_reference()
    if ars is None or owner is None or owner.kind != KIND_AUTOSCALING_RUNNER_SET:
        return None
    if owner.uid and ars.metadata.uid and owner.uid != ars.metadata.uid:
        return None
    return ars.spec.max_runners


def clamp_desired(msg: DesiredState, max_runners: int | None) -> DesiredState | None:
    """``msg`` with its replicas lowered to ``max_runners``, or None when it is within it. The
    listener clamps too; this is the runner-set's own guard against any publisher on the bus."""
    if max_runners is None or msg.replicas <= max_runners:
        return None
    return msgspec.structs.replace(msg, replicas=max_runners)


def cap_create(create: int, scale_up_total: int, max_runners: int | None) -> int:
    """Never create runners beyond ``max_runners`` live ones (whatever ``spec.replicas`` says)."""
    if max_runners is None:
        return create
    return max(0, min(create, max_runners - scale_up_total))


# --- plans ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One reconcile's actions, applied in this order by the controller:

    1. ``delete``: delete these runners directly (terminated ones; no service call needed);
    2. ``remove``: remove these idle runners from the Actions service, then delete them, stopping
       after ``remove_count`` successes (``JobStillRunning`` → skip, not counted);
    3. ``create``: create this many runners;
    4. ``status``: status fields to merge-patch (with the read's resourceVersion), or None;
    5. ``publish_applied``: publish RevisionApplied(revision) once the status write succeeded.

    ``requeue`` asks for another reconcile soon (the next step needs post-write data);
    ``requeue_after`` (seconds) for a timed one (a Failed runner's TTL, the end of a backoff).

    Failure rules (:mod:`services.runner_set.failures`), executed before all of the above:
    ``budget.record`` is written first (locked; record before reap), then each runner in ``reap``
    (Failed past its TTL) is removed from the service (best effort; ``JobStillRunning`` keeps
    it), replaced if its uid is in ``replace``, and deleted.
    """

    reason: str
    delete: list[EphemeralRunner] = field(default_factory=list)
    remove: list[EphemeralRunner] = field(default_factory=list)
    remove_count: int = 0
    create: int = 0
    status: dict[str, Any] | None = None
    publish_applied: int | None = None
    requeue: bool = False
    reap: list[EphemeralRunner] = field(default_factory=list)
    replace: list[str] = field(default_factory=list)
    budget: Assessment | None = None
    requeue_after: float | None = None


# Status fields that only count runners: a write of these alone may wait for the set's status
# window (README "runner-set worker", status writes), so a burst of runner changes makes one
# status write per window. Everything else (phase, applied revision, cleanup marker) is written
# in the pass that decides it.
COUNT_FIELDS = frozenset(
    {"currentReplicas", "pendingEphemeralRunners", "runningEphemeralRunners", "failedEphemeralRunners"}
)
STATUS_WINDOW = 1.0  # seconds between two count-only status writes of one set


def status_wait(fields: dict[str, Any] | None, since_last: float | None, window: float = STATUS_WINDOW) -> float:
    """Seconds a status write of ``fields`` waits (0: write now). Only count-only writes wait, and
    only until ``window`` seconds after the set's previous status write (``since_last`` seconds
    ago; None: none yet). The pass that comes back then recomputes the counts from its own read,
    so the stored counts are exact at most one window (plus one pass) after the last change."""
    if not fields or since_last is None or not fields.keys() <= COUNT_FIELDS:
        return 0.0
    return max(0.0, window - since_last)


def next_cleanup_marker(current: int | None, patch_id: int) -> int | None:
    """The finishedRunnerCleanupPatchID to record after reaping finished runners for ``patch_id``:
    always ``patch_id``, even when lower than the current marker. Patch IDs reset to 0 when the
    listener restarts or idles at minRunners and wrap at 2^31-1, so a marker that refused to move
    down (a ``>=`` guard) would sit above every later patch ID and the exact-match suppression
    would never fire again (README "runner-set worker", patch IDs). Returns None when nothing changes."""
    return None if current == patch_id else patch_id


class Finished(StrEnum):
    ACCOUNTED = "accounted"  # the applied desired state was computed after the job completed
    HELD = "held"  # not yet: keep it and count it toward the scale-up total
    EXPIRED = "expired"  # unknown after FINISHED_HOLD (or never stamped): reap it, record the marker


def finished_state(
    er: EphemeralRunner,
    applied: AppliedDesired | None,
    patch_id: int,
    now: dt.datetime,
    heard: finished.JobCompletion | None = None,
) -> tuple[Finished, float]:
    """Whether the listener has accounted for a finished runner's job (README "runner-set worker",
    finished runners), and the seconds left before a held one expires.

    The listener publishes a service message's JobCompleted events before the desired state it
    computes from the same message, both stamped with its clock and epoch; the runner worker copies
    the JobCompleted's time and epoch into the ER's ``job-completed`` mark. So the applied desired
    state accounts for the completion when it is of a later epoch (a new listener starts from fresh
    statistics), or of the same epoch and not older than the completion. Patch ID 0 (nothing
    happened since the listener's previous decision, target at minRunners) accounts for every
    completion. A newer patch ID alone is not enough: one desired state may account for only some
    of several jobs that finished together.

    ``heard``: the same JobCompleted as this worker received it from the bus itself
    (:func:`heard_completion`), used when the runner worker has not written the mark yet: the
    listener's time and epoch are the mark's, only sooner (README "Typed state (new fields)")."""
    if patch_id == 0:
        return Finished.ACCOUNTED, 0.0
    c = finished.job_completion(er.metadata) or heard
    if c is not None and c.at is not None and applied is not None:
        at, t = _time(c.at), _time(applied.time)
        if c.epoch is None:  # an older mark: whole seconds, no epoch
            ok = t >= at + dt.timedelta(seconds=1)
        else:
            ok = applied.epoch > c.epoch or (applied.epoch == c.epoch and t >= at)
        if ok:
            return Finished.ACCOUNTED, 0.0
    done = finished.finished_time(er)
    if done is None:  # Succeeded without the runner worker's stamp (ARC, a user): reaped as the seeds do
        return Finished.EXPIRED, 0.0
    left = (FINISHED_HOLD - (now - done)).total_seconds()
    return (Finished.EXPIRED, 0.0) if left <= 0 else (Finished.HELD, left)


def heard_completion(er: EphemeralRunner, event: JobCompleted) -> finished.JobCompletion | None:
    """The completion a JobCompleted from the bus records for ``er``, or None when the event is not
    provably about this registration: same runner name, the same non-zero runner id (unique at
    the service; a reused runner name is another registration), no other scale set id, and no
    other job recorded on the ER."""
    status = er.status
    if status is None or not status.runner_id or event.runner_id != status.runner_id:
        return None
    if event.runner_name != er.metadata.name:
        return None
    if er.spec.runner_scale_set_id and event.scale_set_id and er.spec.runner_scale_set_id != event.scale_set_id:
        return None
    if status.job_id and event.job_id and status.job_id != event.job_id:
        return None
    if status.job_request_id and event.runner_request_id and status.job_request_id != event.runner_request_id:
        return None
    return finished.JobCompletion(event.job_key(), _time(event.time), event.listener_epoch, event.result)


def scale_up_suppressed(patch_id: int, marker: int | None) -> bool:
    """Scale-up is suppressed while spec.patchID equals the cleanup marker: the gap below
    spec.replicas was opened by reaping finished runners, not by new demand. Patch ID 0
    (authoritative; an idle set at minRunners) is never suppressed."""
    return marker is not None and patch_id != 0 and marker == patch_id


def desired_status(ers: EphemeralRunnerSet, b: Buckets, applied_revision: int) -> dict[str, Any]:
    """Counts and phase. The phase is recomputed in both directions: Outdated while a runner at
    the applied (or a newer) revision reports Outdated, else Running."""
    phase = (
        EphemeralRunnerSetPhase.OUTDATED if current_outdated(b, applied_revision) else EphemeralRunnerSetPhase.RUNNING
    )
    return {
        "currentReplicas": b.scale_total,
        "pendingEphemeralRunners": b.counts.pending,
        "runningEphemeralRunners": b.counts.running,
        "failedEphemeralRunners": b.counts.failed,
        "phase": str(phase),
    }


def status_diff(status: EphemeralRunnerSetStatus | None, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of ``wanted`` that differ from ``status`` (None when nothing differs); a field the
    stored status lacks counts as its zero value."""
    current = status_patch(status or EphemeralRunnerSetStatus())["status"]
    diff = {k: v for k, v in wanted.items() if current.get(k) != v}
    return diff or None


def plan(
    ers: EphemeralRunnerSet,
    b: Buckets,
    now: dt.datetime | None = None,
    policy: FailurePolicy | None = None,
    heard: Mapping[str, finished.JobCompletion] | None = None,
) -> Plan:
    """What one reconcile of a live (not deleting) EphemeralRunnerSet does next.

    ``policy`` None: ARC's rules (Failed runners are kept and count toward replicas forever);
    otherwise the Failed-runner TTL and the failure budget apply at ``now``. ``heard``: the
    completions this worker received from the bus, by runner uid (:func:`heard_completion`)."""
    spec, status = ers.spec, ers.status or EphemeralRunnerSetStatus()
    applied = status.applied_actionable_revision

    # 1. Revision rollout (seeds 001/003): idle and pending runners built from an older revision
    #    are removed (busy ones finish their job on the old spec); terminated ones of the old spec
    #    are deleted. Only then does appliedActionableRevision advance (never backwards), the
    #    cleanup marker is cleared and the phase recomputed against the new revision.
    if spec.actionable_revision > applied:
        target = spec.actionable_revision

        def old(er: EphemeralRunner) -> bool:
            return runner_revision(er.metadata) < target

        # Finished runners of the old spec are left to the finished-runner step (they may still
        # stand for a job the listener has not accounted for); they hold nothing back.
        terminated = [er for er in (*b.failed, *b.outdated) if old(er)]
        idle_old = [er for er in (*b.pending, *b.running) if old(er) and not has_job(er)]
        if terminated or idle_old:
            return Plan(
                "revision-cleanup", delete=terminated, remove=idle_old, remove_count=len(idle_old), requeue=True
            )
        wanted = desired_status(ers, b, target)
        fields = {**wanted, "appliedActionableRevision": target, "finishedRunnerCleanupPatchID": None}
        return Plan("revision-applied", status=fields, publish_applied=target, requeue=True)

    # 2. Stale Outdated runners (reported for an older revision) are deleted; the scaling below replaces them.
    stale = stale_outdated(b, applied)
    if stale:
        return Plan("stale-outdated", delete=stale, requeue=True)

    status_fields = status_diff(status, desired_status(ers, b, applied))

    # 3. Current Outdated runners hold the set in the Outdated phase: no scale-up (a replacement
    #    would be Outdated too); the scale-set worker decides what to do with an Outdated set. When
    #    it parks the set (replicas 0, patch ID 0: no listener), the authoritative scale-down still
    #    applies, so idle registered runners of the parked spec are drained and take no job; busy
    #    ones finish theirs (README "runner-set worker").
    if current_outdated(b, applied):
        drain = 0
        if spec.patch_id == 0 and b.scale_total > spec.replicas:
            drain = b.scale_total - spec.replicas
        remove = idle_candidates(b) if drain else []
        return Plan("outdated-hold", remove=remove, remove_count=drain, status=status_fields)

    # 4. Failed runners (better than ARC): swap those past their TTL for fresh ones (whatever the
    #    patch ID says: a failed runner is lost capacity, not lower demand), and hold all creation
    #    while the set's failure budget is exhausted.
    now = now or dt.datetime.now(dt.UTC)
    if policy is None:
        return _scale(ers, b, status_fields, None, now, heard)
    a = failures.assess(ers, b.failed, _not_failed(b), now, policy)
    if a.expired:
        repl = failures.replacements(a.expired, b.all, spec.replicas, b.scale_up_total)
        return Plan("failed-ttl", reap=a.expired, replace=repl, status=status_fields, budget=a, requeue=True)
    p = _scale(ers, b, status_fields, a.blocked_until, now, heard)
    after = [t for t in (p.requeue_after, a.next_check) if t is not None]
    return replace(p, budget=a, requeue_after=min(after) if after else None)


def _not_failed(b: Buckets) -> Iterator[EphemeralRunner]:
    """The set's pending, running and finished runners, read only if the failure rules look for a
    success (a budget with failures counted): a pass without failures never lists them."""
    yield from b.pending
    yield from b.running
    yield from b.finished


def _scale(
    ers: EphemeralRunnerSet,
    b: Buckets,
    status_fields: dict[str, Any] | None,
    blocked_until: dt.datetime | None,
    now: dt.datetime,
    heard: Mapping[str, finished.JobCompletion] | None = None,
) -> Plan:
    spec, status = ers.spec, ers.status or EphemeralRunnerSetStatus()
    marker = status.finished_runner_cleanup_patch_id

    # 5. Scaling, per ARC's patch-ID protocol (README "runner-set worker"):
    #    patchID 0 = authoritative (up and down); new patchID = up only; same patchID = status only.
    if spec.patch_id != 0 and spec.patch_id == b.latest_patch_id:
        return Plan("patch-already-applied", status=status_fields)
    held_for: float | None = None
    if b.finished:
        # Reap the finished runners the listener has accounted for: spec.replicas no longer counts
        # their jobs, so deleting them opens no gap. The others stay and count toward the scale-up
        # total until it has (or FINISHED_HOLD passed). Reaping one it has not accounted for opens
        # a gap below spec.replicas: record the patch ID it belongs to first (the seeds' marker)
        # and decide scaling on the next reconcile against post-cleanup data.
        applied_desired = parse_applied_desired(ers.metadata.annotations)
        reap: list[EphemeralRunner] = []
        gap = False
        for er in b.finished:
            state, left = finished_state(er, applied_desired, spec.patch_id, now, (heard or {}).get(er.metadata.uid))
            if state is Finished.HELD:
                held_for = left if held_for is None else min(held_for, left)
                continue
            reap.append(er)
            gap = gap or state is Finished.EXPIRED
        if reap:
            fields = dict(status_fields or {})
            new_marker = next_cleanup_marker(marker, spec.patch_id) if gap else None
            if new_marker is not None:
                fields["finishedRunnerCleanupPatchID"] = new_marker
            return Plan("finished-cleanup", delete=reap, status=fields or None, requeue=True)
    create = 0
    if spec.replicas > b.scale_up_total and not scale_up_suppressed(spec.patch_id, marker) and blocked_until is None:
        create = spec.replicas - b.scale_up_total
    remove: list[EphemeralRunner] = []
    count = 0
    if spec.patch_id == 0 and b.scale_total > spec.replicas:
        count = b.scale_total - spec.replicas
        remove = idle_candidates(b)
    reason = (
        "scale-up"
        if create
        else ("scale-down" if count else ("scale-up-suppressed" if spec.replicas > b.scale_up_total else "steady"))
    )
    if blocked_until is not None and spec.replicas > b.scale_up_total and not create:
        reason = "failure-backoff"
    # Deletions and creations wake the set through runner events; a scale-down that fell short
    # (JobStillRunning, unregistered runners) waits for the next runner status change, as in ARC.
    return Plan(
        reason,
        remove=remove,
        remove_count=count,
        create=create,
        status=status_fields,
        requeue=bool(create),
        requeue_after=held_for,
    )


@dataclass(frozen=True)
class DeletionPlan:
    """Deleting ERS: delete terminated runners, remove idle ones from the service then delete
    them; busy runners finish their job. ``remove_finalizer`` once no runner is left at all."""

    delete: list[EphemeralRunner]
    remove: list[EphemeralRunner]
    remove_finalizer: bool
    waiting_for: int  # runners still present (busy, or deletion in progress)


def plan_deletion(b: Buckets) -> DeletionPlan:
    if not b.all:
        return DeletionPlan([], [], True, 0)
    terminated = [*b.finished, *b.failed, *b.outdated]
    idle = [er for er in (*b.pending, *b.running) if not has_job(er)]
    return DeletionPlan(terminated, idle, False, len(b.all))


# --- the runner object ---------------------------------------------------------------------------


def proxy_secret_data(proxy: ProxyConfig, credentials: dict[str, tuple[str, str]]) -> dict[str, str]:
    """ARC's ``ProxyConfig.ToSecretData``: always ``http_proxy``, ``https_proxy``, ``no_proxy``;
    credentials (from each server's credentialSecretRef) as URL user-info; a missing block is ""."""

    def url(server: ProxyServerConfig | None) -> str:
        if server is None or not server.url:
            return ""
        user, password = (
            credentials.get(server.credential_secret_ref, ("", "")) if server.credential_secret_ref else ("", "")
        )
        if not user:
            return server.url
        p = urlsplit(server.url)
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{p.hostname or ''}" + (
            f":{p.port}" if p.port else ""
        )
        return urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))

    return {"http_proxy": url(proxy.http), "https_proxy": url(proxy.https), "no_proxy": ",".join(proxy.no_proxy)}


def new_runner(ers: EphemeralRunnerSet, proxy_secret: str = "", replaces: str = "") -> dict[str, Any]:
    """The EphemeralRunner to create (as ARC's resource builder makes it) as a JSON tree: generateName
    ``<ers>-runner-``, owner = the ERS (controller), ARC's labels with component ``runner``, the ERS
    annotations plus ``patch-id`` and ``actionable-revision``, ephemeralRunnerMetadata as the base,
    both runner finalizers pre-set, spec = the ERS's ephemeralRunnerSpec verbatim."""
    meta = ers.metadata
    extra = ers.spec.ephemeral_runner_metadata
    labels = {**(extra.labels if extra else {}), **meta.labels, LABEL_COMPONENT: COMPONENT_RUNNER}
    annotations = {
        **(extra.annotations if extra else {}),
        **{k: v for k, v in meta.annotations.items() if k not in _NOT_PROPAGATED},
        ANNOTATION_PATCH_ID: str(ers.spec.patch_id),
        ANNOTATION_ACTIONABLE_REVISION: str(ers.spec.actionable_revision),
        **({failures.ANNOTATION_REPLACES: replaces} if replaces else {}),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "EphemeralRunner",
        "metadata": {
            "generateName": f"{meta.name}-runner-",
            "namespace": meta.namespace,
            "labels": labels,
            "annotations": annotations,
            "finalizers": [FINALIZER_EPHEMERAL_RUNNER, FINALIZER_RUNNER_REGISTRATION],
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND_EPHEMERAL_RUNNER_SET,
                    "name": meta.name,
                    "uid": meta.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            **msgspec.to_builtins(ers.spec.ephemeral_runner_spec),
            **({"proxySecretRef": proxy_secret} if proxy_secret else {}),
        },
    }


def owned_by(runners: Sequence[EphemeralRunner], ers: EphemeralRunnerSet) -> list[EphemeralRunner]:
    """Runners whose controlling owner is this ERS (by uid)."""
    out = []
    for er in runners:
        ref = er.metadata.controller_reference()
        if ref is not None and ref.kind == KIND_EPHEMERAL_RUNNER_SET and ref.uid == ers.metadata.uid:
            out.append(er)
    return out
