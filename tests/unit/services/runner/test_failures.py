"""The runner worker's side of the failed-runner rules: too many pod failures make the runner
Failed (not deleted), every Failed runner is stamped with when it failed, and terminal failures
are counted by set and reason (runnerscale_runner_failures_total)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from services.runner import decide
from services.runner.decide import MarkFailed, RunnerSettings
from services.runner.metrics import runner_metrics
from services.runner_set import failures
from shared.api import EphemeralRunner, decode
from shared.api.constants import ANNOTATION_FAILED_AT

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def er(status: dict[str, Any], annotations: dict[str, str] | None = None) -> EphemeralRunner:
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
                "creationTimestamp": "2026-11-29T11:00:00Z",
            },
            "spec": {"githubConfigUrl": "https://github.com/o", "githubConfigSecret": "s", "runnerScaleSetId": 1},
            "status": status,
        },
    )


def test_too_many_pod_failures_marks_failed_instead_of_deleting() -> None:
    six = {f"p{i}": "2026-11-29T11:00:00Z" for i in range(6)}
    r = er({"failures": six})
    assert decide.too_many_failures(r, RunnerSettings())
    d = decide.too_many_failures_decision(r, RunnerSettings())
    assert isinstance(d, MarkFailed) and d.reason == "TooManyPodFailures" and "6 times" in d.message


def test_failed_at_stamp_is_what_the_runner_set_reads() -> None:
    patch = decide.failed_at_patch(NOW)
    stamped = er({"phase": "Failed", "reason": "InvalidPod"}, patch["metadata"]["annotations"])
    # The runner set's module imports the constant without re-exporting it; the test reads it there.
    assert ANNOTATION_FAILED_AT == failures.ANNOTATION_FAILED_AT  # type: ignore[attr-defined]
    assert failures.failed_at(stamped) == NOW
    assert decide.failed_patch("TooManyPodFailures", "m") == {
        "status": {"phase": "Failed", "reason": "TooManyPodFailures", "message": "m", "ready": False}
    }


def test_failure_metric_has_namespace_name_reason() -> None:
    m = runner_metrics()
    m.failures.labels("ns", "set", "InvalidPod").inc()
    assert m.failures.labels("ns", "set", "InvalidPod")._value.get() == 1
    assert "RunnerSucceeded" not in decide.FAILURE_DELETE_REASONS and "PodStartTimeout" in decide.FAILURE_DELETE_REASONS
