"""Pure decisions of the runner worker: what to do with an EphemeralRunner given its pod.

Every function here is deterministic in its arguments (``now`` is passed in) and does no I/O, so
the whole failure tree of ARC's EphemeralRunner reconciler (README "runner worker") is unit-tested without servers
(tests/unit/services/runner/test_decide.py). The async shell (:mod:`services.runner.reconciler`)
re-reads the objects, calls these, and performs the one write they ask for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar

import msgspec

from services.runner import jobs
from shared.api import EphemeralRunner, EphemeralRunnerStatus
from shared.api.constants import (
    ANNOTATION_FAILED_AT,
    FINALIZER_EPHEMERAL_RUNNER,
    FINALIZER_RUNNER_REGISTRATION,
    RUNNER_CONTAINER_NAME,
    RUNNER_EXIT_CODE_VERSION_DEPRECATED,
)
from shared.bus.messages import JobCompleted
from shared.kube.objects import Pod, kube_time
from shared.settings import InvalidSetting, option

JsonTree = dict[str, Any]

# ARC's backoff by current failure count: index = len(failures).
ARC_FAILURE_BACKOFF: tuple[float, ...] = (0.0, 5.0, 10.0, 20.0, 40.0, 80.0)
ARC_MAX_FAILURES = 5
OUTDATED_MESSAGE = "Runner is deprecated"


# Reasons of runner endings that count in runnerscale_runner_failures_total (everything but success
# and Outdated): Failed phase (InvalidPod, InvalidSpec, TooManyPodFailures) and failure deletions.
FAILURE_DELETE_REASONS = frozenset(
    {"PodFailedWithJob", "PodLostWithJob", "PodStartTimeout", "RunnerHungAfterJob", "RunnerNameTaken", "ExceededQuota"}
)


# Runners that ended after a job: they are not deleted here but marked finished (status Succeeded,
# annotation finished-at) so the runner-set worker keeps counting them until the listener has
# accounted for the job, and never replaces one (README "runner worker", finished runners).
FINISHED_REASONS = frozenset({"RunnerSucceeded", "PodFailedWithJob", "PodLostWithJob", "RunnerHungAfterJob"})


class RunnerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Timing and limits of the runner worker (flags: README "runner worker")."""

    settings_title: ClassVar[str] = "runner"

    failure_backoff: Annotated[
        tuple[float, ...],
        option(
            "--failure-backoff",
            "RUNNERSCALE_RUNNER_FAILURE_BACKOFF",
            "seconds to wait before recreating a failed pod, by failure count, comma-separated (ARC: 0,5,10,20,40,80)",
        ),
    ] = ARC_FAILURE_BACKOFF
    # More failures than this → the ER is deleted (replaced).
    max_failures: Annotated[
        int,
        option(
            "--max-failures",
            "RUNNERSCALE_RUNNER_MAX_FAILURES",
            "pod failures tolerated without a job; one more deletes the EphemeralRunner (ARC: 5)",
        ),
    ] = ARC_MAX_FAILURES
    # Deleting a busy runner: ask the service again after this.
    job_still_running_requeue: Annotated[
        float,
        option(
            "--job-still-running-requeue",
            "RUNNERSCALE_RUNNER_JOB_STILL_RUNNING_REQUEUE",
            "seconds between removal attempts of a deleting runner that still has a job",
        ),
    ] = 30.0
    # Deleting, pod gone, service still says busy: give up after this (0 = never).
    removal_give_up_after: Annotated[
        float,
        option(
            "--removal-give-up-after",
            "RUNNERSCALE_RUNNER_REMOVAL_GIVE_UP_AFTER",
            "seconds after which a deleting runner whose pod is gone is released even if the service still"
            " refuses removal (0 = never)",
        ),
    ] = 600.0
    # A pod not up this long after creation → delete the ER (0 = never).
    pod_start_deadline: Annotated[
        float,
        option(
            "--pod-start-deadline",
            "RUNNERSCALE_RUNNER_POD_START_DEADLINE",
            "seconds a runner pod may stay Pending before its runner is deleted and unregistered (0 = never)",
        ),
    ] = 900.0
    # Runner still up this long after its job completed → delete (0 = never).
    hung_after_job_grace: Annotated[
        float,
        option(
            "--hung-after-job-grace",
            "RUNNERSCALE_RUNNER_HUNG_AFTER_JOB_GRACE",
            "seconds a runner may stay up after the service reported its job completed (0 = never)",
        ),
    ] = 120.0
    # Pod create forbidden by a quota: try again after this ...
    quota_retry: Annotated[
        float,
        option(
            "--quota-retry",
            "RUNNERSCALE_RUNNER_QUOTA_RETRY",
            "seconds between pod creation attempts refused by a ResourceQuota",
        ),
    ] = 30.0
    # ... and delete the ER once it is older than this.
    quota_give_up_after: Annotated[
        float,
        option(
            "--quota-give-up-after",
            "RUNNERSCALE_RUNNER_QUOTA_GIVE_UP_AFTER",
            "age of an EphemeralRunner after which a quota refusal deletes it",
        ),
    ] = 600.0
    exclude_label_prefixes: Annotated[
        tuple[str, ...],
        option(
            "--exclude-label-propagation-prefix",
            "RUNNERSCALE_EXCLUDE_LABEL_PROPAGATION_PREFIXES",
            "label key prefix not copied onto runner pods and secrets (repeatable)",
            metavar="PREFIX",
        ),
    ] = ()
    # Container-hook Secrets (Kubernetes mode: labelled runner-pod=<ER>, no ownerReference) are
    # deleted with their runner only when enabled: it needs `list` on Secrets, which the default
    # RBAC does not grant (README "runner worker", container-hook cleanup).
    cleanup_hook_secrets: Annotated[
        bool,
        option(
            "--cleanup-hook-secrets",
            "RUNNERSCALE_RUNNER_CLEANUP_HOOK_SECRETS",
            "on runner deletion, also delete the Secrets Kubernetes-mode container hooks left in its namespace"
            " (needs list on Secrets: deploy/manifests/optional/rbac-runner-hook-secrets.yaml)",
        ),
    ] = False
    # A new runner pod's Pending phase is not written while it lasts less than this: the runner id
    # waits for the first phase that is not Pending (Running), so a runner that starts normally costs
    # one status write for both (README "runner worker", step 6; 0: Pending with the id at once).
    pending_status_after: Annotated[
        float,
        option(
            "--pending-status-after",
            "RUNNERSCALE_RUNNER_PENDING_STATUS_AFTER",
            "seconds a new runner pod may stay Pending before that phase (with the runner id) is written on"
            " its own; until then both wait for the first phase that is not Pending (0 = at once)",
        ),
    ] = 15.0
    # Job events whose write can ride on a write the runner makes anyway are redelivered after
    # this (README "runner worker", job events): a JobStarted once (its fields go with the
    # runner's next status write, typically Succeeded for a short job), a JobCompleted at most
    # twice (its mark goes with the end-of-life metadata patch).
    job_event_defer: float = 3.0
    already_exists_requeue: float = 5.0  # pod create answered AlreadyExists (a deleting namesake)
    # A finished (Succeeded) runner is the runner-set worker's to delete once the listener has
    # accounted for its job; if it is still there this long after it finished (runner-set worker
    # down), the runner worker deletes it itself (README "runner worker", finished runners).
    finished_release_after: float = 300.0
    runner_exists_requeue: float = 1.0  # JIT name collision resolved: generate again after
    actions_call_timeout: float = 120.0  # outer deadline of one Actions step (the client has its own)

    def __post_init__(self) -> None:
        if not self.failure_backoff:
            raise InvalidSetting("failure_backoff", "needs at least one entry")
        if any(b < 0 for b in self.failure_backoff):
            raise InvalidSetting("failure_backoff", "entries must be >= 0")
        if self.max_failures < 0:
            raise InvalidSetting("max_failures", "must be >= 0")
        for name in (
            "job_still_running_requeue",
            "removal_give_up_after",
            "pod_start_deadline",
            "hung_after_job_grace",
            "quota_retry",
            "quota_give_up_after",
            "pending_status_after",
            "job_event_defer",
        ):
            if getattr(self, name) < 0:
                raise InvalidSetting(name, f"must be >= 0, got {getattr(self, name)}")

    def backoff_for(self, failures: int) -> float:
        """The wait before recreating a pod after ``failures`` failures (last entry repeats)."""
        return self.failure_backoff[min(max(failures, 0), len(self.failure_backoff) - 1)]


# The runner worker's own finalizers (the runner-set creates the ER with both).
OWN_FINALIZERS = (FINALIZER_EPHEMERAL_RUNNER, FINALIZER_RUNNER_REGISTRATION)


# --- pod outcome (ARC's outcome table) -------------------------------------------------------------------


class PodOutcome(StrEnum):
    FAILED_WITHOUT_RUNNER_STATUS = "FailedWithoutRunnerStatus"  # evicted, OutOf*, died before start
    SUCCEEDED = "Succeeded"  # runner exited 0
    OUTDATED = "Outdated"  # runner exited 7: version deprecated
    FAILED = "Failed"  # runner exited non-zero
    INIT_FAILED = "InitContainerFailed"  # an init container exited non-zero
    NO_RUNNER_STATUS = "NoRunnerStatus"  # nothing known about the runner container yet
    ACTIVE = "Active"  # runner container waiting or running


def classify_pod(pod: Pod) -> PodOutcome:
    """ARC's outcome table, first match wins."""
    status = pod.status
    cs = status.container(RUNNER_CONTAINER_NAME)
    terminated = cs.state.terminated if cs is not None else None
    if status.phase == "Failed":
        if terminated is None:
            return PodOutcome.FAILED_WITHOUT_RUNNER_STATUS
        return _by_exit_code(terminated.exit_code)
    for init in status.init_container_statuses:
        if init.state.terminated is not None and init.state.terminated.exit_code != 0:
            return PodOutcome.INIT_FAILED
    if cs is None:
        return PodOutcome.NO_RUNNER_STATUS
    if terminated is None:
        return PodOutcome.ACTIVE
    return _by_exit_code(terminated.exit_code)


def _by_exit_code(code: int) -> PodOutcome:
    if code == 0:
        return PodOutcome.SUCCEEDED
    if code == RUNNER_EXIT_CODE_VERSION_DEPRECATED:
        return PodOutcome.OUTDATED
    return PodOutcome.FAILED


def failure_reason(pod: Pod, outcome: PodOutcome) -> tuple[str, str]:
    """(reason, message) describing a pod failure for status and Events."""
    status = pod.status
    if status.reason or status.message:
        return status.reason or outcome.value, status.message
    cs = status.container(RUNNER_CONTAINER_NAME)
    if outcome is PodOutcome.INIT_FAILED:
        for init in status.init_container_statuses:
            t = init.state.terminated
            if t is not None and t.exit_code != 0:
                return t.reason or "InitContainerFailed", f"init container {init.name!r} exited with code {t.exit_code}"
    if cs is not None and cs.state.terminated is not None:
        t = cs.state.terminated
        return t.reason or "Error", f"runner container exited with code {t.exit_code}"
    return outcome.value, f"pod phase {status.phase or 'unknown'} without a runner container status"


# --- decisions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeleteRunner:
    """Delete the ER (its deletion path removes the runner from the service and the pod)."""

    reason: str
    message: str


@dataclass(frozen=True)
class RecordFailure:
    """No job: record the failed pod (status patch, unless already recorded) and delete the pod."""

    pod_uid: str
    reason: str
    message: str
    status_patch: JsonTree | None


@dataclass(frozen=True)
class MarkFailed:
    """Terminal failure without a job: annotate ``failed-at``, status phase Failed with this reason,
    remove from the service (best effort). The runner-set worker replaces it after its TTL."""

    reason: str
    message: str


@dataclass(frozen=True)
class MarkOutdated:
    status_patch: JsonTree


@dataclass(frozen=True)
class PatchStatus:
    status_patch: JsonTree
    requeue_after: float | None = None


@dataclass(frozen=True)
class CreatePod:
    pass


@dataclass(frozen=True)
class Wait:
    """Nothing to write now; look again after ``requeue_after`` (None: on the next event).
    ``hold_status``: not even a runner id registered in this pass (a young Pending pod: the id
    waits for the first phase that is not Pending, :func:`pending_status_wait`)."""

    requeue_after: float | None = None
    why: str = ""
    hold_status: bool = False


Decision = DeleteRunner | RecordFailure | MarkFailed | MarkOutdated | PatchStatus | CreatePod | Wait


def _status(er: EphemeralRunner) -> EphemeralRunnerStatus:
    return er.status if er.status is not None else EphemeralRunnerStatus()


def too_many_failures(er: EphemeralRunner, settings: RunnerSettings) -> bool:
    return len(_status(er).failures) > settings.max_failures


def failure_patch(pod_uid: str, now: datetime, reason: str, message: str) -> JsonTree:
    """Status merge patch recording one failed pod (keyed by UID: re-observing it is a no-op)."""
    return {"status": {"failures": {pod_uid: kube_time(now)}, "ready": False, "reason": reason, "message": message}}


def outdated_patch() -> JsonTree:
    return {"status": {"phase": "Outdated", "reason": "Outdated", "message": OUTDATED_MESSAGE, "ready": False}}


def _on_failure(er: EphemeralRunner, pod: Pod, outcome: PodOutcome, now: datetime) -> Decision:
    reason, message = failure_reason(pod, outcome)
    status = _status(er)
    if status.has_job():
        # ARC: a runner that failed while it had a job is not retried; the set replaces it.
        return DeleteRunner(
            "PodFailedWithJob",
            f"pod {pod.metadata.name} failed while running job {status.job_id}: {reason}: {message}".rstrip(": "),
        )
    uid = pod.metadata.uid
    patch = None if uid in status.failures else failure_patch(uid, now, reason, message)
    return RecordFailure(uid, reason, message, patch)


def ready_from_pod(pod: Pod) -> bool:
    """The status of the pod's Ready condition (the last one listed when there are several)."""
    ready = False
    for cond in pod.status.conditions:
        if cond.type == "Ready":
            ready = cond.status == "True"
    return ready


def run_status_patch(er: EphemeralRunner, pod: Pod) -> JsonTree | None:
    """ARC's ``updateRunStatusFromPod``: copy phase and readiness of a live pod, None when unchanged.

    A Succeeded or Failed pod phase is never copied: only the runner's exit completes a runner.
    """
    phase = pod.status.phase
    if phase in ("Succeeded", "Failed"):
        return None
    status = _status(er)
    ready = ready_from_pod(pod)
    if status.phase == phase and status.ready == ready:
        return None
    return {"status": {"phase": phase, "ready": ready, "reason": pod.status.reason, "message": pod.status.message}}


def _seconds_since(then: datetime | None, now: datetime) -> float | None:
    if then is None:
        return None
    return (now - then).total_seconds()


def _start_deadline(
    er: EphemeralRunner, pod: Pod, now: datetime, settings: RunnerSettings
) -> DeleteRunner | float | None:
    """DeleteRunner when the pod has not come up within the deadline; else the seconds left."""
    if settings.pod_start_deadline <= 0 or _status(er).has_job():
        return None
    if pod.status.phase not in ("", "Pending"):
        return None
    cs = pod.status.container(RUNNER_CONTAINER_NAME)
    if cs is not None and (cs.state.running is not None or cs.state.terminated is not None):
        return None
    age = _seconds_since(pod.metadata.creation_timestamp, now)
    if age is None:
        return None
    if age >= settings.pod_start_deadline:
        return DeleteRunner(
            "PodStartTimeout",
            f"pod {pod.metadata.name} did not start within {settings.pod_start_deadline:g}s (phase {pod.status.phase or 'Pending'})",
        )
    return settings.pod_start_deadline - age


def _hung_after_job(
    er: EphemeralRunner, pod: Pod, now: datetime, settings: RunnerSettings
) -> DeleteRunner | float | None:
    """Better than ARC (ARC#4603): the service said the job completed, yet the runner has not
    exited within the grace period → the runner is hung; delete it so the slot comes back."""
    if settings.hung_after_job_grace <= 0:
        return None
    done = jobs.completed_at(er)
    if done is None:
        return None
    elapsed = (now - done).total_seconds()
    if elapsed >= settings.hung_after_job_grace:
        return DeleteRunner(
            "RunnerHungAfterJob",
            f"job {_status(er).job_id} completed {elapsed:.0f}s ago but runner pod {pod.metadata.name} is still up",
        )
    return settings.hung_after_job_grace - elapsed


def decide_pod(er: EphemeralRunner, pod: Pod, now: datetime, settings: RunnerSettings) -> Decision:
    """What to do about an existing runner pod (ARC's outcome table, plus the start deadline)."""
    outcome = classify_pod(pod)
    if outcome is PodOutcome.SUCCEEDED:
        return DeleteRunner("RunnerSucceeded", f"runner container of pod {pod.metadata.name} exited 0")
    if outcome is PodOutcome.OUTDATED:
        return MarkOutdated(outdated_patch())
    if outcome in (PodOutcome.FAILED, PodOutcome.FAILED_WITHOUT_RUNNER_STATUS, PodOutcome.INIT_FAILED):
        return _on_failure(er, pod, outcome, now)
    if pod.metadata.is_deleting:
        return Wait(why="pod is being deleted")
    deadline = _start_deadline(er, pod, now, settings)
    if isinstance(deadline, DeleteRunner):
        return deadline
    hung = _hung_after_job(er, pod, now, settings)
    if isinstance(hung, DeleteRunner):
        return hung
    if hung is not None:
        deadline = hung if deadline is None else min(deadline, hung)
    hold = pending_status_wait(pod, now, settings)
    if hold is not None:
        return Wait(hold if deadline is None else min(deadline, hold), "young Pending pod", hold_status=True)
    if outcome is PodOutcome.NO_RUNNER_STATUS:
        return Wait(deadline, "no runner container status yet")
    patch = run_status_patch(er, pod)
    if patch is None:
        return Wait(deadline, "status up to date")
    return PatchStatus(patch, deadline)


def pending_status_wait(pod: Pod, now: datetime, settings: RunnerSettings) -> float | None:
    """Seconds until a Pending runner pod's phase is written on its own; None: write it now (the
    pod has been Pending for ``pending_status_after``, the setting is 0) or the pod is not Pending.

    A runner pod normally leaves Pending within seconds, and its first phase that is not Pending
    is written with the runner id in one status patch; only a pod that stays Pending (no node, an
    image pull) has that phase shown on its own, so a user sees why it is not running."""
    if settings.pending_status_after <= 0 or pod.status.phase not in ("", "Pending"):
        return None
    age = _seconds_since(pod.metadata.creation_timestamp, now)
    if age is None:
        return None
    left = settings.pending_status_after - age
    return left if left > 0 else None


def decide_missing_pod(er: EphemeralRunner, now: datetime, settings: RunnerSettings) -> Decision:
    """The pod ``<ER name>`` does not exist: create it, unless that would be wrong.

    Better than ARC: a runner that had a job and lost its pod is deleted (and thereby removed from
    the service) instead of getting a new pod for a spent JIT config.
    """
    status = _status(er)
    if status.has_job():
        return DeleteRunner("PodLostWithJob", f"the runner pod disappeared while running job {status.job_id}")
    last = status.last_failure()
    if last is not None:
        wait = settings.backoff_for(len(status.failures))
        elapsed = _seconds_since(last, now) or 0.0
        if elapsed < wait:
            return Wait(wait - elapsed, "failure backoff")
    return CreatePod()


def quota_decision(er: EphemeralRunner, now: datetime, settings: RunnerSettings) -> Decision:
    """Pod create forbidden by a ResourceQuota: retry, and give the slot back after a while."""
    age = _seconds_since(er.metadata.creation_timestamp, now)
    if age is not None and age >= settings.quota_give_up_after:
        return DeleteRunner(
            "ExceededQuota", f"pod creation forbidden by a quota for more than {settings.quota_give_up_after:g}s"
        )
    return Wait(settings.quota_retry, "exceeded quota")


def finished_patch(reason: str, message: str, now: datetime) -> JsonTree:
    """Status of a runner that ended after its job (or exited 0): ARC's Succeeded ("finished")
    phase; ``reason`` says how it ended (RunnerSucceeded, PodFailedWithJob, ...); ``finishedAt``
    in the same patch (README "Typed state (new fields)")."""
    return {
        "status": {
            "phase": "Succeeded",
            "reason": reason,
            "message": message,
            "ready": False,
            "finishedAt": kube_time(now),
        }
    }


def registration_gone(er: EphemeralRunner) -> bool:
    """The service has provably dropped this runner's registration: it exited 0 after a job, and
    an ephemeral runner deregisters when its one job ends, so a removal could only answer
    ``AgentNotFound`` (README "runner worker", deletion)."""
    status = _status(er)
    return status.phase == "Succeeded" and status.reason == "RunnerSucceeded" and status.has_job()


def pod_terminal(pod: Pod) -> bool:
    """The pod runs nothing any more (phase Succeeded or Failed)."""
    return pod.status.phase in ("Succeeded", "Failed")


def finished_release_wait(finished: datetime | None, now: datetime, settings: RunnerSettings) -> float:
    """Seconds until a finished runner still present is deleted by the runner worker itself
    (0: now). Without a finished-at stamp (a Succeeded runner not finished by this worker) the
    runner-set worker alone decides: never."""
    if finished is None or settings.finished_release_after <= 0:
        return float("inf")
    return max(0.0, settings.finished_release_after - (now - finished).total_seconds())


def failed_patch(reason: str, message: str) -> JsonTree:
    return {"status": {"phase": "Failed", "reason": reason, "message": message, "ready": False}}


def invalid_pod_patch(message: str) -> JsonTree:
    return failed_patch("InvalidPod", message)


def invalid_spec_patch(message: str) -> JsonTree:
    return failed_patch("InvalidSpec", message)


def failed_at_patch(now: datetime) -> JsonTree:
    """Metadata merge patch stamping when the runner failed (written before the Failed status)."""
    return {"metadata": {"annotations": {ANNOTATION_FAILED_AT: now.astimezone(UTC).isoformat()}}}


def too_many_failures_decision(er: EphemeralRunner, settings: RunnerSettings) -> Decision:
    """More pod failures than ``max_failures`` without a job. ARC deletes the ER (and the set
    replaces it at once, a churn nobody counts); here it becomes Failed (reason
    TooManyPodFailures): visible in the set's status and counted by its failure budget, and
    replaced by the runner-set worker after --failed-runner-ttl."""
    failures = len(_status(er).failures)
    return MarkFailed(
        "TooManyPodFailures", f"the runner pod failed {failures} times (more than {settings.max_failures})"
    )


def should_abandon_removal(
    deleting_since: datetime | None, pod_alive: bool, now: datetime, settings: RunnerSettings
) -> bool:
    """Deleting ER, service keeps answering JobStillRunning: stop waiting once the pod is gone and
    ``removal_give_up_after`` has passed (the service drops offline ephemeral runners itself)."""
    if pod_alive or settings.removal_give_up_after <= 0:
        return False
    waited = _seconds_since(deleting_since, now)
    return waited is not None and waited >= settings.removal_give_up_after


def pod_created_patch(er: EphemeralRunner, runner_id: JsonTree | None) -> JsonTree | None:
    """The status patch after creating the pod: the runner id registered in the same pass (if
    any) and phase Pending, not ready; None when status already says exactly that."""
    status = _status(er)
    fields: JsonTree = dict(runner_id or {})
    if status.phase != "Pending" or status.ready:
        fields.update({"phase": "Pending", "ready": False})
    return {"status": fields} if fields else None


def release_patch(er: EphemeralRunner, event: JobCompleted | None = None, *, exited_0: bool = False) -> JsonTree | None:
    """The end-of-life metadata patch of a runner that exited 0 after its job: both finalizers
    removed (its registration is provably gone, :func:`registration_gone`; pod and Secret go by
    owner-reference garbage collection) and, when ``event`` is its job's JobCompleted and the ER
    lacks the mark, the ``job-completed`` mark. ``exited_0``: the pod's runner just exited 0 and
    the Succeeded status is not written yet (the patch goes first, so the runner-set, which deletes
    only finished runners, never deletes it in between). None when it does not apply: another
    ending (the deletion must unregister), container hooks configured (the deletion cleans what
    they left), or the finalizers are gone already (a mark alone is the job handler's write)."""
    gone = registration_gone(er) or (exited_0 and _status(er).has_job())
    if not gone or er.spec.has_container_hook_configured():
        return None
    finalizers = er.metadata.finalizers
    if not any(f in finalizers for f in OWN_FINALIZERS):
        return None
    meta: JsonTree = {"finalizers": [f for f in finalizers if f not in OWN_FINALIZERS]}
    if event is not None and jobs.mismatch(er, event) is None:
        mark = jobs.completion_patch(er, event)
        if mark is not None:
            meta["annotations"] = mark["metadata"]["annotations"]
    return {"metadata": meta}


def runner_id_patch(er: EphemeralRunner, runner_id: int, runner_name: str) -> JsonTree | None:
    status = _status(er)
    if status.runner_id == runner_id and status.runner_name == runner_name:
        return None
    return {"status": {"runnerId": runner_id, "runnerName": runner_name}}
