"""Issue 10: a runner that exited 0 after its job ends with ONE metadata patch — its finalizers
removed and, when the JobCompleted was heard, the ``job-completed`` mark — and never where its
deletion still has work (unregister, container-hook leftovers)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.runner import decide, jobs
from shared.api import EphemeralRunner, decode
from shared.api.constants import (
    ANNOTATION_JOB_COMPLETED,
    ENV_RUNNER_CONTAINER_HOOKS,
    FINALIZER_EPHEMERAL_RUNNER,
    FINALIZER_RUNNER_REGISTRATION,
)
from shared.bus.messages import JobCompleted
from tests.unit.services.runner.test_jobs import er as job_er
from tests.unit.services.runner.test_jobs import ev

OWN = [FINALIZER_EPHEMERAL_RUNNER, FINALIZER_RUNNER_REGISTRATION]
FINISHED = {"runnerId": 10, "jobId": "j1", "phase": "Succeeded", "reason": "RunnerSucceeded"}


def er(
    status: dict[str, Any] | None = None,
    finalizers: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    hooks: bool = False,
) -> EphemeralRunner:
    """test_jobs' runner, finished by default, with finalizers and a runner container."""
    data = msgspec.json.decode(
        msgspec.json.encode(job_er(FINISHED if status is None else status, annotations=annotations))
    )
    data["metadata"]["finalizers"] = OWN if finalizers is None else finalizers
    runner: dict[str, Any] = {"name": "runner", "image": "i"}
    if hooks:
        runner["env"] = [{"name": ENV_RUNNER_CONTAINER_HOOKS, "value": "/hooks/index.js"}]
    data["spec"]["spec"] = {"containers": [runner]}
    return decode(EphemeralRunner, data)


def completed(**over: Any) -> JobCompleted:
    e = ev(JobCompleted, **over)
    assert isinstance(e, JobCompleted)
    return e


def test_exit_0_after_a_job_drops_both_finalizers_and_keeps_foreign_ones() -> None:
    assert decide.release_patch(er(finalizers=["example.com/keep", *OWN])) == {
        "metadata": {"finalizers": ["example.com/keep"]}
    }


def test_the_heard_completion_rides_in_the_same_patch() -> None:
    event = completed()
    patch = decide.release_patch(er(), event)
    assert patch == {
        "metadata": {"finalizers": [], "annotations": {ANNOTATION_JOB_COMPLETED: jobs.completion_value(event)}}
    }
    # the patch is a merge patch a real server takes: plain JSON
    assert msgspec.json.decode(msgspec.json.encode(patch)) == patch


def test_a_mark_already_written_is_not_written_again() -> None:
    event = completed()
    marked = er(annotations={ANNOTATION_JOB_COMPLETED: jobs.completion_value(event)})
    assert decide.release_patch(marked, event) == {"metadata": {"finalizers": []}}


@pytest.mark.parametrize(
    "event",
    [completed(job_id="another-job"), completed(runner_id=99), completed(runner_name="r2")],
    ids=["other job", "other registration", "other runner"],
)
def test_a_completion_about_something_else_adds_no_mark(event: JobCompleted) -> None:
    assert decide.release_patch(er(), event) == {"metadata": {"finalizers": []}}


@pytest.mark.parametrize(
    "status",
    [
        {**FINISHED, "jobId": ""},  # exited 0 without a job: registration not provably gone
        {**FINISHED, "reason": "PodFailedWithJob"},  # the deletion must unregister
        {**FINISHED, "reason": "PodLostWithJob"},
        {**FINISHED, "phase": "Running", "reason": ""},  # not finished
    ],
)
def test_no_release_where_the_deletion_still_has_to_unregister(status: dict[str, Any]) -> None:
    assert decide.release_patch(er(status), completed()) is None


def test_no_release_with_container_hooks_their_leftovers_are_cleaned_on_deletion() -> None:
    assert decide.release_patch(er(hooks=True), completed()) is None


def test_no_patch_once_the_finalizers_are_gone_a_mark_alone_is_the_job_handlers() -> None:
    assert decide.release_patch(er(finalizers=[]), completed()) is None
    assert decide.release_patch(er(finalizers=["example.com/keep"]), completed()) is None


def test_exit_0_seen_before_succeeded_is_written_releases_first() -> None:
    running = {**FINISHED, "phase": "Running", "reason": ""}
    assert decide.release_patch(er(running), exited_0=True) == {"metadata": {"finalizers": []}}
    # ... but never for a runner without a job: its registration may still be there
    assert decide.release_patch(er({**running, "jobId": ""}), exited_0=True) is None
