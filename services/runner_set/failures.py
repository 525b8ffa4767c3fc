"""Pure decisions about failed runners (no I/O, clock passed in): the Failed-runner TTL and the
per-set failure budget. This is where runnerscale departs from ARC, in which Failed
EphemeralRunners count toward ``spec.replicas`` forever.

Two rules, both evaluated on every reconcile of a live EphemeralRunnerSet (ERS):

**TTL.** A Failed runner older than ``failed_runner_ttl`` (counted from the moment it failed) is
*swapped*: removed from the Actions service (best effort; ``RunnerNotFound`` is fine;
``JobStillRunning`` keeps it), a replacement created (unless ``spec.replicas`` no longer wants it),
and the Failed ER deleted. Until then it stays visible (status counts, the runner worker's Event).
The replacement carries ``actions.github.com/replaces-failed-runner: <uid>``, so a crash between
"create replacement" and "delete failed" never creates a second one. The swap ignores the
patch-ID protocol on purpose: a Failed runner is not demand going away, it is capacity lost.

**Failure budget.** When more than ``budget_failures`` runners of the set (built from the current
``spec.actionableRevision``) failed within ``budget_window``, runner *creation* for the set backs
off: level 1 waits ``backoff_base``, each further escalation doubles it, capped at
``backoff_max``. An escalation needs a failure *after* the previous backoff ended (the runners
created after it failed too), so old failures still inside the window do not escalate again by
themselves. While backing off, expired Failed runners are kept (they are the evidence, and a
replacement would fail too). The budget resets when

- a runner of the current revision gets a job (or succeeds) having been created after the first
  failure counted (the spec can run: the failures were environmental), or
- ``spec.actionableRevision`` changes (a fixed spec starts with a fresh budget), or
- a whole window passes after the backoff with no new failure (decay).

**Where the state lives (restart-safe).** Failure *facts* are derived from the Failed ERs present
(their ``actions.github.com/failed-at`` annotation, written by the runner worker right before it
marks the runner Failed). Only what cannot be derived from live objects is kept, in the ERS
annotation ``actions.github.com/runner-failure-budget`` = JSON
``{"revision", "level", "since", "until", "resetAt", "failures": {uid: time}}``, written by the
runner-set worker with the read's ``resourceVersion`` (409 → re-read, decide again):

- the failures of runners already reaped (recorded *before* the reap, so the count survives the
  deletion and a crash between the two; keyed by uid, so nothing is counted twice),
- the backoff level and its end (exponential needs memory; a timestamp, not a timer, so a
  restarted or new replica resumes the same backoff),
- the revision it belongs to (a record of another revision is void: the reset needs no write).

It is on the ERS, not in a worker's memory or NATS, because the ERS is what every replica re-reads
authoritatively before deciding, and an annotation needs no CRD schema change. Deriving everything
from Failed ERs alone is not enough: they are deleted after the TTL, which is shorter than the
window, and the level of an exponential backoff is not a property of any object.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, ClassVar

import msgspec

from shared.api import EphemeralRunner, EphemeralRunnerSet, runner_revision
from shared.api.constants import ANNOTATION_FAILED_AT  # on an ER: when it failed (runner worker)
from shared.backoff import Backoff
from shared.settings import InvalidSetting, option

# On the ERS: the failure budget record (written by the runner-set worker only).
ANNOTATION_FAILURE_BUDGET = "actions.github.com/runner-failure-budget"
# On an ER: the uid of the Failed runner this one replaces (TTL swap; crash-safe idempotence).
ANNOTATION_REPLACES = "actions.github.com/replaces-failed-runner"

MAX_RECORDED = 200  # failures kept in the record at most (newest first); far above any sane budget


class FailurePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The Failed-runner TTL and the failure budget: the runner-set worker's settings (README
    "runner-set worker")."""

    settings_title: ClassVar[str] = "runner-set"

    # 0 = never (ARC keeps Failed runners forever)
    failed_runner_ttl: Annotated[
        float,
        option(
            "--failed-runner-ttl",
            "RUNNERSCALE_FAILED_RUNNER_TTL",
            "seconds a Failed EphemeralRunner is kept (visible, counted) before it is removed and replaced;"
            " 0 = never (ARC) [default 300]",
        ),
    ] = 300.0
    # More failures than this within the window → creation backs off; 0 = no budget.
    budget_failures: Annotated[
        int,
        option(
            "--failure-budget",
            "RUNNERSCALE_FAILURE_BUDGET",
            "runner failures of one set tolerated within --failure-budget-window; one more backs runner creation"
            " off; 0 = no budget [default 5]",
        ),
    ] = 5
    budget_window: Annotated[
        float,
        option(
            "--failure-budget-window",
            "RUNNERSCALE_FAILURE_BUDGET_WINDOW",
            "seconds over which failures are counted [default 600]",
        ),
    ] = 600.0
    backoff_base: Annotated[
        float,
        option(
            "--failure-budget-backoff",
            "RUNNERSCALE_FAILURE_BUDGET_BACKOFF",
            "seconds of the first creation backoff; doubled per escalation [default 30]",
        ),
    ] = 30.0
    backoff_max: Annotated[
        float,
        option(
            "--failure-budget-backoff-max",
            "RUNNERSCALE_FAILURE_BUDGET_BACKOFF_MAX",
            "cap of the creation backoff in seconds [default 600]",
        ),
    ] = 600.0

    def __post_init__(self) -> None:
        if self.failed_runner_ttl < 0:
            raise InvalidSetting("failed_runner_ttl", f"must be >= 0, got {self.failed_runner_ttl}")
        if self.budget_failures < 0:
            raise InvalidSetting("budget_failures", f"must be >= 0, got {self.budget_failures}")
        if self.budget_window <= 0:
            raise InvalidSetting("budget_window", f"must be > 0, got {self.budget_window}")
        if self.backoff_base <= 0:
            raise InvalidSetting("backoff_base", f"must be > 0, got {self.backoff_base}")
        if self.backoff_max < self.backoff_base:
            raise InvalidSetting("backoff_max", "must be >= the first backoff (--failure-budget-backoff)")

    def backoff(self, level: int) -> float:
        """Seconds of creation backoff at ``level`` (1, 2, ...): base·2^(level-1), capped."""
        if level <= 0:
            return 0.0
        return Backoff(base=self.backoff_base, cap=self.backoff_max).delay(level - 1)


class BudgetRecord(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    revision: int = 0
    level: int = 0
    since: dt.datetime | None = None  # start of the current/last backoff
    until: dt.datetime | None = None  # end of the current/last backoff
    reset_at: dt.datetime | None = None  # failures before this are not counted (a success reset)
    failures: dict[str, dt.datetime] = {}  # ER uid -> failed at (within the window when written)


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def parse_record(annotations: dict[str, str]) -> BudgetRecord | None:
    raw = annotations.get(ANNOTATION_FAILURE_BUDGET)
    if not raw:
        return None
    try:
        rec = msgspec.json.decode(raw, type=BudgetRecord)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # garbled: no record (a fresh budget), rewritten on the next change
    return BudgetRecord(
        revision=rec.revision,
        level=max(0, rec.level),
        since=_utc(rec.since) if rec.since else None,
        until=_utc(rec.until) if rec.until else None,
        reset_at=_utc(rec.reset_at) if rec.reset_at else None,
        failures={k: _utc(v) for k, v in rec.failures.items()},
    )


def encode_record(rec: BudgetRecord) -> str:
    return msgspec.json.encode(rec).decode()


def failed_at_annotation(when: dt.datetime) -> str:
    return _utc(when).isoformat()


def failed_at(er: EphemeralRunner) -> dt.datetime | None:
    """When a Failed runner failed: the runner worker's ``failed-at`` annotation; for runners
    failed without one (older versions, ARC), the latest of its creation and its last pod failure
    (a lower bound); None when nothing is known (never expires, never counted)."""
    raw = er.metadata.annotations.get(ANNOTATION_FAILED_AT)
    if raw:
        try:
            return _utc(dt.datetime.fromisoformat(raw.replace("Z", "+00:00")))
        except ValueError:
            pass
    candidates = [
        t for t in (er.metadata.creation_timestamp, er.status.last_failure() if er.status else None) if t is not None
    ]
    return _utc(max(_utc(t) for t in candidates)) if candidates else None


def replaced_uids(runners: Iterable[EphemeralRunner]) -> set[str]:
    return {v for er in runners if (v := er.metadata.annotations.get(ANNOTATION_REPLACES))}


@dataclass(frozen=True)
class Assessment:
    """What the failure rules say for one reconcile."""

    record: str | None = None  # new annotation value to write (locked) before any other action
    blocked_until: dt.datetime | None = None  # creation blocked until then (None: allowed)
    expired: list[EphemeralRunner] = field(default_factory=list)  # Failed runners to swap now
    next_check: float | None = None  # seconds until a Failed runner expires / the backoff ends
    failures: int = 0  # failures counted in the window
    level: int = 0  # backoff level after this decision
    escalated: bool = False
    reset: str = ""  # why the budget was reset ("" = not reset)
    message: str = ""  # Event text for an escalation or a reset


def _job_or_done(er: EphemeralRunner) -> bool:
    if er.status is None:
        return False
    return er.status.has_job() or str(er.status.phase) == "Succeeded"


def assess(
    ers: EphemeralRunnerSet,
    failed: list[EphemeralRunner],
    others: Iterable[EphemeralRunner],
    now: dt.datetime,
    policy: FailurePolicy,
) -> Assessment:
    """Apply the TTL and budget rules. ``failed``: the set's Failed runners (not deleting);
    ``others``: every other runner of the set (to see successes), iterated at most once and only
    while failures are counted or a backoff level is held (it may be lazy: a pass without
    failures never lists the set's runners)."""
    now = _utc(now)
    revision = ers.spec.actionable_revision
    stored = parse_record(ers.metadata.annotations)
    rec = stored if stored is not None and stored.revision == revision else BudgetRecord(revision=revision)
    window = dt.timedelta(seconds=policy.budget_window)
    horizon = now - window

    def counts(at: dt.datetime) -> bool:
        return at > horizon and (rec.reset_at is None or at >= rec.reset_at)

    # Failures in the window: those recorded (reaped already) and the Failed runners present.
    present = {
        er.metadata.uid: at
        for er in failed
        if runner_revision(er.metadata) >= revision and (at := failed_at(er)) is not None
    }
    counted = {uid: at for uid, at in {**rec.failures, **present}.items() if counts(at)}

    level, since, until, reset_at = rec.level, rec.since, rec.until, rec.reset_at
    write = False
    reset = ""
    message = ""
    escalated = False

    # Decay: a whole window after the backoff without a new failure.
    if until is not None and now >= until + window and not any(at >= until for at in counted.values()):
        level, since, until = 0, None, None

    # Success: a current-revision runner got a job, created after the first failure counted.
    if counted or level:
        first = min(counted.values(), default=since)
        for er in others:
            created = er.metadata.creation_timestamp
            if (
                runner_revision(er.metadata) >= revision
                and _job_or_done(er)
                and created is not None
                and first is not None
                and _utc(created) >= first
            ):
                reset = "RunnerSucceeded"
                message = f"runner {er.metadata.name} got a job: failure budget reset ({len(counted)} failure(s) forgiven, backoff level {level} cleared)"
                level, since, until, reset_at, counted = 0, None, None, now, {}
                write = True
                break
    if stored is not None and stored.revision != revision and stored.level:
        reset = reset or "RevisionChanged"
        message = message or f"actionable revision {revision}: failure budget of revision {stored.revision} discarded"
        write = True

    blocked = until if until is not None and now < until else None
    if (
        blocked is None
        and policy.budget_failures > 0
        and len(counted) > policy.budget_failures
        and (until is None or any(at >= until for at in counted.values()))
    ):
        level += 1
        delay = policy.backoff(level)
        since, until = now, now + dt.timedelta(seconds=delay)
        blocked = until
        escalated = True
        write = True
        message = (
            f"{len(counted)} runners failed within {policy.budget_window:g}s (budget {policy.budget_failures}):"
            f" not creating runners for {delay:g}s (backoff level {level}); fix the runner spec (a new revision resets this)"
        )

    expired: list[EphemeralRunner] = []
    next_check: float | None = None
    if policy.failed_runner_ttl > 0 and blocked is None:
        ttl = dt.timedelta(seconds=policy.failed_runner_ttl)
        for er in failed:
            at = failed_at(er)
            if at is None:
                continue
            if now - at >= ttl:
                expired.append(er)
            else:
                left = (at + ttl - now).total_seconds()
                next_check = left if next_check is None else min(next_check, left)
    if blocked is not None:
        left = (blocked - now).total_seconds()
        next_check = left if next_check is None else min(next_check, left)

    # Record before reap: a counted failure about to be deleted must be in the record first.
    if any(er.metadata.uid in counted and er.metadata.uid not in rec.failures for er in expired):
        write = True

    record = None
    if write:
        newest = dict(sorted(counted.items(), key=lambda kv: kv[1], reverse=True)[:MAX_RECORDED])
        record = encode_record(
            BudgetRecord(revision=revision, level=level, since=since, until=until, reset_at=reset_at, failures=newest)
        )
    return Assessment(
        record=record,
        blocked_until=blocked,
        expired=expired,
        next_check=next_check,
        failures=len(counted),
        level=level,
        escalated=escalated,
        reset=reset,
        message=message,
    )


def replacements(
    expired: list[EphemeralRunner], all_runners: list[EphemeralRunner], replicas: int, scale_up_total: int
) -> list[str]:
    """UIDs of expired Failed runners to create a replacement for: not already replaced (a
    replacement survives a crash before the delete), and only while ``replicas`` wants them
    (everything but the expired runners counts, replacements already made included)."""
    done = replaced_uids(all_runners)
    room = max(0, replicas - (scale_up_total - len(expired)))
    needed = [er.metadata.uid for er in expired if er.metadata.uid not in done]
    return needed[:room]
