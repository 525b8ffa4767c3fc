"""The runner worker's pure decisions: ARC's pod outcome table and the
better-than-ARC rules (lost pod with a job, start deadline, hung after job, removal give-up)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from msgspec.structs import replace

from services.runner import decide
from services.runner.decide import (
    CreatePod,
    DeleteRunner,
    MarkFailed,
    MarkOutdated,
    PatchStatus,
    PodOutcome,
    RecordFailure,
    RunnerSettings,
    Wait,
)
from shared.api import EphemeralRunner, decode
from shared.api.constants import ANNOTATION_JOB_COMPLETED
from shared.kube.objects import Pod

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
S = RunnerSettings()


def er(
    status: dict[str, Any] | None = None, annotations: dict[str, str] | None = None, created: datetime = NOW
) -> EphemeralRunner:
    return decode(
        EphemeralRunner,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": {
                "name": "r",
                "namespace": "ns",
                "uid": "er-uid",
                "annotations": annotations or {},
                "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "spec": {
                "githubConfigUrl": "https://github.com/o",
                "githubConfigSecret": "s",
                "runnerScaleSetId": 1,
                "spec": {"containers": [{"name": "runner", "image": "i"}]},
            },
            "status": status or {},
        },
    )


def pod(
    phase: str = "Running",
    runner_state: dict[str, Any] | None = None,
    init_state: dict[str, Any] | None = None,
    uid: str = "pod-1",
    created: datetime = NOW,
    **status: Any,
) -> Pod:
    st: dict[str, Any] = {"phase": phase, **status}
    if runner_state is not None:
        st["containerStatuses"] = [{"name": "runner", "state": runner_state}]
    if init_state is not None:
        st["initContainerStatuses"] = [{"name": "setup", "state": init_state}]
    meta = {"name": "r", "namespace": "ns", "uid": uid, "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return msgspec.json.decode(msgspec.json.encode({"metadata": meta, "status": st}), type=Pod)


def term(code: int, reason: str = "") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason}}


RUNNING = {"running": {"startedAt": "2026-11-29T11:00:00Z"}}


# --- classification ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "outcome"),
    [
        (pod("Failed"), PodOutcome.FAILED_WITHOUT_RUNNER_STATUS),  # evicted, OutOf*, no status
        (pod("Failed", RUNNING), PodOutcome.FAILED_WITHOUT_RUNNER_STATUS),  # failed, runner not terminated
        (pod("Failed", term(0)), PodOutcome.SUCCEEDED),
        (pod("Failed", term(7)), PodOutcome.OUTDATED),
        (pod("Failed", term(1)), PodOutcome.FAILED),
        (pod("Pending", init_state=term(1, "StartError")), PodOutcome.INIT_FAILED),
        (pod("Pending", init_state=term(0)), PodOutcome.NO_RUNNER_STATUS),
        (pod("Running"), PodOutcome.NO_RUNNER_STATUS),
        (pod("Running", RUNNING), PodOutcome.ACTIVE),
        (pod("Pending", {"waiting": {"reason": "ContainerCreating"}}), PodOutcome.ACTIVE),
        (pod("Running", term(7)), PodOutcome.OUTDATED),
        (pod("Running", term(3)), PodOutcome.FAILED),
        (pod("", term(1)), PodOutcome.FAILED),  # ARC test 3: terminated exit 1, pod phase unset
        (pod("Succeeded", term(0)), PodOutcome.SUCCEEDED),
        (pod("Succeeded", RUNNING), PodOutcome.ACTIVE),  # ARC test 20: phase alone never completes
    ],
)
def test_classify_pod(p: Pod, outcome: PodOutcome) -> None:
    assert decide.classify_pod(p) is outcome


# --- decisions on an existing pod --------------------------------------------------------------


def test_exit_0_deletes_the_runner_with_or_without_job() -> None:
    assert isinstance(decide.decide_pod(er(), pod("Failed", term(0)), NOW, S), DeleteRunner)
    assert isinstance(decide.decide_pod(er({"jobId": "1"}), pod("Failed", term(0)), NOW, S), DeleteRunner)


def test_exit_7_marks_outdated() -> None:
    d = decide.decide_pod(er(), pod("Failed", term(7)), NOW, S)
    assert isinstance(d, MarkOutdated)
    assert d.status_patch["status"]["phase"] == "Outdated" and d.status_patch["status"]["reason"] == "Outdated"


@pytest.mark.parametrize(
    "p",
    [
        pod("Failed", term(1)),
        pod("Failed", reason="Evicted", message="low memory"),
        pod("Failed", reason="OutOfpods"),
        pod("Pending", init_state=term(1, "StartError")),
    ],
)
def test_failure_without_job_is_recorded_by_pod_uid(p: Pod) -> None:
    d = decide.decide_pod(er(), p, NOW, S)
    assert isinstance(d, RecordFailure)
    assert d.pod_uid == "pod-1"
    assert d.status_patch is not None
    assert d.status_patch["status"]["failures"] == {"pod-1": "2026-11-29T12:00:00Z"}
    assert d.status_patch["status"]["ready"] is False


def test_evicted_reason_and_message_are_copied() -> None:
    d = decide.decide_pod(er(), pod("Failed", reason="Evicted", message="low memory"), NOW, S)
    assert isinstance(d, DeleteRunner | RecordFailure | MarkFailed)
    assert (d.reason, d.message) == ("Evicted", "low memory")


def test_same_pod_failure_is_not_counted_twice() -> None:
    d = decide.decide_pod(er({"failures": {"pod-1": "2026-11-29T11:59:00Z"}}), pod("Failed", term(1)), NOW, S)
    assert isinstance(d, RecordFailure) and d.status_patch is None


@pytest.mark.parametrize("p", [pod("Failed", term(1)), pod("Failed"), pod("Pending", init_state=term(1))])
def test_failure_with_job_deletes_the_runner(p: Pod) -> None:
    d = decide.decide_pod(er({"jobId": "42"}), p, NOW, S)
    assert isinstance(d, DeleteRunner) and d.reason == "PodFailedWithJob"


def test_no_runner_status_changes_nothing() -> None:
    assert decide.decide_pod(er(), pod("Running"), NOW, replace(S, pod_start_deadline=0)) == Wait(
        None, "no runner container status yet"
    )


def test_running_pod_status_is_copied_once() -> None:
    d = decide.decide_pod(er(), pod("Running", RUNNING, conditions=[{"type": "Ready", "status": "True"}]), NOW, S)
    assert isinstance(d, PatchStatus)
    assert d.status_patch["status"]["phase"] == "Running" and d.status_patch["status"]["ready"] is True
    same = decide.decide_pod(
        er({"phase": "Running", "ready": True}),
        pod("Running", RUNNING, conditions=[{"type": "Ready", "status": "True"}]),
        NOW,
        S,
    )
    assert isinstance(same, Wait)


def test_phase_follows_pod_back_to_pending_once_it_stays_pending() -> None:
    stuck = pod("Pending", {"waiting": {}}, created=NOW - timedelta(seconds=S.pending_status_after))
    d = decide.decide_pod(er({"phase": "Running"}), stuck, NOW, S)
    assert isinstance(d, PatchStatus) and d.status_patch["status"]["phase"] == "Pending"


# --- issue 10: a young Pending pod writes nothing; the runner id waits for Running -----------------


@pytest.mark.parametrize("runner_state", [{"waiting": {"reason": "ContainerCreating"}}, None])
def test_a_young_pending_pod_holds_its_status_until_the_setting_has_passed(runner_state: Any) -> None:
    young = pod("Pending", runner_state, created=NOW - timedelta(seconds=4))
    d = decide.decide_pod(er(), young, NOW, S)
    assert d == Wait(S.pending_status_after - 4, "young Pending pod", hold_status=True)
    later = NOW + timedelta(seconds=S.pending_status_after - 4)
    after = decide.decide_pod(er(), young, later, S)
    assert not (isinstance(after, Wait) and after.hold_status)
    if runner_state is not None:  # a container status: Pending is copied (with the held runner id)
        assert isinstance(after, PatchStatus) and after.status_patch["status"]["phase"] == "Pending"


def test_a_pending_status_is_written_at_once_with_the_setting_zero() -> None:
    d = decide.decide_pod(er(), pod("Pending", {"waiting": {}}), NOW, replace(S, pending_status_after=0))
    assert isinstance(d, PatchStatus) and d.status_patch["status"]["phase"] == "Pending"


def test_the_first_phase_that_is_not_pending_is_written_at_once() -> None:
    d = decide.decide_pod(er(), pod("Running", RUNNING), NOW, S)  # created NOW: as young as it gets
    assert isinstance(d, PatchStatus) and d.status_patch["status"]["phase"] == "Running"


def test_the_pending_hold_never_postpones_the_start_deadline() -> None:
    settings = replace(S, pod_start_deadline=20.0)
    d = decide.decide_pod(er(), pod("Pending", created=NOW - timedelta(seconds=10)), NOW, settings)
    assert d == Wait(5.0, "young Pending pod", hold_status=True)
    d = decide.decide_pod(
        er(), pod("Pending", created=NOW - timedelta(seconds=8)), NOW, replace(settings, pod_start_deadline=10.0)
    )
    assert isinstance(d, Wait) and d.requeue_after == pytest.approx(2.0)
    gone = decide.decide_pod(
        er(), pod("Pending", created=NOW - timedelta(seconds=10)), NOW, replace(settings, pod_start_deadline=10.0)
    )
    assert isinstance(gone, DeleteRunner) and gone.reason == "PodStartTimeout"


def test_a_negative_pending_status_after_is_refused() -> None:
    with pytest.raises(ValueError, match="pending_status_after"):
        RunnerSettings(pending_status_after=-1)


def test_ready_uses_the_last_ready_condition() -> None:
    p = pod("Running", RUNNING, conditions=[{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}])
    assert decide.ready_from_pod(p) is False


# --- the pod is missing ----------------------------------------------------------------------------


def test_missing_pod_is_created() -> None:
    assert decide.decide_missing_pod(er(), NOW, S) == CreatePod()


def test_missing_pod_waits_for_backoff_by_failure_count() -> None:
    failures = {f"p{i}": (NOW - timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ") for i in range(2)}
    d = decide.decide_missing_pod(er({"failures": failures}), NOW, S)
    assert isinstance(d, Wait) and d.requeue_after == pytest.approx(10 - 3)
    assert decide.decide_missing_pod(er({"failures": failures}), NOW + timedelta(seconds=8), S) == CreatePod()


def test_backoff_table_is_arcs_and_configurable() -> None:
    assert [S.backoff_for(n) for n in range(7)] == [0, 5, 10, 20, 40, 80, 80]
    assert RunnerSettings(failure_backoff=(0.0, 0.01)).backoff_for(4) == 0.01
    with pytest.raises(ValueError):
        RunnerSettings(failure_backoff=())


def test_more_than_max_failures_is_too_many() -> None:
    five = {f"p{i}": "2026-11-29T11:00:00Z" for i in range(5)}
    assert not decide.too_many_failures(er({"failures": five}), S)
    assert decide.too_many_failures(er({"failures": {**five, "p5": "2026-11-29T11:00:00Z"}}), S)


def test_pod_lost_with_a_job_deletes_the_runner() -> None:
    d = decide.decide_missing_pod(er({"jobId": "9"}), NOW, S)
    assert isinstance(d, DeleteRunner) and d.reason == "PodLostWithJob"


# --- better than ARC: deadlines ------------------------------------------------------------------


def test_pod_that_never_starts_hits_the_deadline() -> None:
    old = NOW - timedelta(seconds=S.pod_start_deadline + 1)
    d = decide.decide_pod(er(), pod("Pending", uid="p", created=old), NOW, S)
    assert isinstance(d, DeleteRunner) and d.reason == "PodStartTimeout"
    no_hold = replace(S, pending_status_after=0)
    young = decide.decide_pod(er(), pod("Pending", created=NOW - timedelta(seconds=10)), NOW, no_hold)
    assert isinstance(young, Wait) and young.requeue_after == pytest.approx(S.pod_start_deadline - 10)
    # a started runner is never "not started"
    assert not isinstance(decide.decide_pod(er(), pod("Running", RUNNING, created=old), NOW, S), DeleteRunner)
    # disabled
    assert not isinstance(
        decide.decide_pod(er(), pod("Pending", created=old), NOW, replace(S, pod_start_deadline=0)), DeleteRunner
    )


def test_runner_hung_after_job_completed_is_deleted_after_grace() -> None:
    ann = {ANNOTATION_JOB_COMPLETED: "job=42;result=succeeded;at=2026-11-29T11:57:00Z"}
    d = decide.decide_pod(er({"jobId": "42", "phase": "Running"}, ann), pod("Running", RUNNING), NOW, S)
    assert isinstance(d, DeleteRunner) and d.reason == "RunnerHungAfterJob"
    within = decide.decide_pod(
        er({"jobId": "42", "phase": "Running"}, ann), pod("Running", RUNNING), NOW - timedelta(seconds=100), S
    )
    assert isinstance(within, Wait) and within.requeue_after == pytest.approx(40)
    # a completion about another job is not this runner's
    other = {ANNOTATION_JOB_COMPLETED: "job=41;result=succeeded;at=2026-11-29T11:00:00Z"}
    assert isinstance(
        decide.decide_pod(er({"jobId": "42", "phase": "Running"}, other), pod("Running", RUNNING), NOW, S), Wait
    )


def test_quota_retries_then_gives_up() -> None:
    assert decide.quota_decision(er(created=NOW), NOW, S) == Wait(S.quota_retry, "exceeded quota")
    old = decide.quota_decision(er(created=NOW - timedelta(seconds=601)), NOW, S)
    assert isinstance(old, DeleteRunner)


def test_removal_is_abandoned_only_when_the_pod_is_gone_and_time_passed() -> None:
    since = NOW - timedelta(seconds=S.removal_give_up_after + 1)
    assert decide.should_abandon_removal(since, False, NOW, S)
    assert not decide.should_abandon_removal(since, True, NOW, S)
    assert not decide.should_abandon_removal(NOW, False, NOW, S)
    assert not decide.should_abandon_removal(since, False, NOW, replace(S, removal_give_up_after=0))


def test_runner_id_patch_only_when_changed() -> None:
    assert decide.runner_id_patch(er(), 5, "r") == {"status": {"runnerId": 5, "runnerName": "r"}}
    assert decide.runner_id_patch(er({"runnerId": 5, "runnerName": "r"}), 5, "r") is None


def test_finished_runners_are_marked_not_deleted_and_released_only_when_abandoned() -> None:
    """Issue #14: every way a runner ends after its job is a finished runner (status Succeeded);
    the runner-set worker deletes it once the listener accounted for the job. The runner worker
    deletes it itself only after finished_release_after (the runner-set worker is down)."""
    assert {"RunnerSucceeded", "PodFailedWithJob", "PodLostWithJob", "RunnerHungAfterJob"} == decide.FINISHED_REASONS
    patch = decide.finished_patch("PodFailedWithJob", "m", NOW)["status"]
    assert patch["phase"] == "Succeeded" and patch["finishedAt"] == "2026-11-29T12:00:00Z"  # one status patch
    s = RunnerSettings(finished_release_after=300.0)
    t0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert decide.finished_release_wait(t0, t0 + timedelta(seconds=100), s) == 200.0
    assert decide.finished_release_wait(t0, t0 + timedelta(seconds=301), s) == 0.0
    assert decide.finished_release_wait(None, t0, s) == float("inf")  # not ours: the runner-set decides
    assert decide.finished_release_wait(t0, t0, RunnerSettings(finished_release_after=0)) == float("inf")
