"""Job events → EphemeralRunner status, as pure functions: fill-only, order-insensitive."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest

from services.runner import jobs
from shared.api import EphemeralRunner, decode, finished
from shared.api.constants import ANNOTATION_JOB_COMPLETED
from shared.bus import ResourceRef
from shared.bus.messages import JobCompleted, JobStarted

T = datetime(2026, 11, 29, 12, 0, 5, tzinfo=UTC)


def er(
    status: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> EphemeralRunner:
    return decode(
        EphemeralRunner,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": {
                "name": "r1",
                "namespace": "ns",
                "labels": labels or {"actions.github.com/scale-set-name": "set"},
                "annotations": annotations or {},
            },
            "spec": {"githubConfigUrl": "https://github.com/o", "githubConfigSecret": "s", "runnerScaleSetId": 3},
            "status": status or {"runnerId": 10},
        },
    )


def ev(cls: type[JobStarted] | type[JobCompleted] = JobStarted, **over: Any) -> jobs.JobEvent:
    base: dict[str, Any] = dict(
        scale_set_id=3,
        scale_set=ResourceRef("ns", "set"),
        runner_name="r1",
        runner_id=10,
        job_id="j1",
        runner_request_id=100,
        workflow_run_id=200,
        workflow_ref="o/r/.github/workflows/x.yml@refs/heads/main",
        job_display_name="build",
        repository="o/r",
        time=T,
    )
    if cls is JobCompleted:
        base["result"] = "succeeded"
    base.update(over)
    return cls(**base)


FIELDS = {
    "jobRequestId": 100,
    "jobId": "j1",
    "jobRepositoryName": "o/r",
    "workflowRunId": 200,
    "jobWorkflowRef": "o/r/.github/workflows/x.yml@refs/heads/main",
    "jobDisplayName": "build",
}


def apply(runner: EphemeralRunner, patch: dict[str, Any] | None) -> EphemeralRunner:
    if patch is None:
        return runner
    from shared.api import to_dict

    tree = to_dict(runner)
    tree.setdefault("status", {}).update(patch.get("status", {}))
    tree["metadata"].setdefault("annotations", {}).update(patch.get("metadata", {}).get("annotations", {}))
    return decode(EphemeralRunner, tree)


def test_started_sets_arcs_status_fields() -> None:
    assert jobs.job_status_patch(er(), ev()) == {"status": FIELDS}


def test_zero_values_are_left_out() -> None:
    patch = jobs.job_status_patch(er(), ev(runner_request_id=0, workflow_run_id=0, job_display_name=""))
    assert patch is not None
    assert (
        "jobRequestId" not in patch["status"]
        and "workflowRunId" not in patch["status"]
        and "jobDisplayName" not in patch["status"]
    )


def test_repeat_is_a_no_op() -> None:
    once = apply(er(), jobs.job_status_patch(er(), ev()))
    assert jobs.job_status_patch(once, ev()) is None


def test_another_job_is_not_recorded_over_the_first() -> None:
    once = apply(er(), jobs.job_status_patch(er(), ev()))
    assert jobs.conflicting_job(once, ev(job_id="j2"))
    assert jobs.job_status_patch(once, ev(job_id="j2")) is None
    assert jobs.completion_patch(once, ev(JobCompleted, job_id="j2")) is None


def test_missing_fields_of_the_same_job_are_filled() -> None:
    partial = apply(er(), {"status": {"jobId": "j1"}})
    assert jobs.job_status_patch(partial, ev()) == {"status": {k: v for k, v in FIELDS.items() if k != "jobId"}}


@pytest.mark.parametrize(
    "order", list(itertools.permutations(["started", "completed", "started-again", "completed-again"]))
)
def test_any_order_converges_to_the_same_state(order: tuple[str, ...]) -> None:
    events = {
        "started": ev(),
        "started-again": ev(),
        "completed": ev(JobCompleted),
        "completed-again": ev(JobCompleted, time=datetime(2026, 11, 29, 12, 9, tzinfo=UTC)),
    }
    runner = er()
    for name in order:
        e = events[name]
        runner = apply(runner, jobs.job_status_patch(runner, e))
        runner = apply(runner, jobs.completion_patch(runner, e))
    assert {k: getattr(runner.status, a) for k, a in jobs._ATTR.items()} == FIELDS
    value = runner.metadata.annotations[ANNOTATION_JOB_COMPLETED]
    assert value.startswith("job=j1;result=succeeded;at=")
    assert jobs.completed_at(runner) is not None


def test_started_never_writes_the_completion_mark() -> None:
    assert jobs.completion_patch(er(), ev()) is None


def test_completion_mark_round_trip() -> None:
    runner = apply(er(), jobs.job_status_patch(er(), ev(JobCompleted)))
    runner = apply(runner, jobs.completion_patch(runner, ev(JobCompleted)))
    assert jobs.completed_at(runner) == T.replace(microsecond=0)
    assert jobs.parse_completion("garbage") == ("", None)


def test_completion_mark_keeps_the_listener_time_and_epoch() -> None:
    """The runner-set worker compares them with the applied desired state (issue #14)."""
    t = T.replace(microsecond=123456)
    runner = apply(er(), jobs.job_status_patch(er(), ev(JobCompleted)))
    runner = apply(runner, jobs.completion_patch(runner, ev(JobCompleted, time=t, listener_epoch=7)))
    c = finished.job_completion(runner.metadata)
    assert c is not None and (c.job, c.at, c.epoch, c.result) == ("j1", t, 7, "succeeded")
    assert jobs.completed_at(runner) == t
    # a mark written before the epoch existed still parses (whole seconds, no epoch)
    old = finished.parse_completion("job=j1;result=failed;at=2026-11-29T12:00:05Z")
    assert (old.at, old.epoch) == (T, None)


@pytest.mark.parametrize(
    ("runner", "event"),
    [
        (er(), ev(runner_name="r2")),
        (er(labels={"actions.github.com/scale-set-name": "other"}), ev()),
        (er(), ev(scale_set_id=4)),
        (er(), ev(runner_id=11)),
    ],
)
def test_mismatches(runner: EphemeralRunner, event: jobs.JobEvent) -> None:
    assert jobs.mismatch(runner, event) is not None


def test_match_when_runner_id_not_yet_known() -> None:
    assert jobs.mismatch(er(status={}), ev()) is None


def test_with_job_is_the_runner_as_the_job_patch_will_leave_it() -> None:
    runner = er({"runnerId": 10, "phase": "Running"})
    patch = jobs.job_status_patch(runner, ev(JobStarted))
    assert patch is not None
    seen = jobs.with_job(runner, patch["status"])
    assert seen.status is not None and seen.status.has_job()
    assert (seen.status.job_id, seen.status.job_request_id, seen.status.job_display_name) == ("j1", 100, "build")
    assert seen.status.runner_id == 10 and seen.status.phase == "Running"
    assert jobs.job_status_patch(seen, ev(JobStarted)) is None  # nothing left to write
    assert runner.status is not None and not runner.status.has_job()  # the original is untouched
