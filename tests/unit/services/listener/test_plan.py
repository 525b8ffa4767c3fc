"""Pure message planning: what one long-poll message turns into on the bus."""

from __future__ import annotations

from typing import Any

import msgspec

from services.listener.loop import Identity, plan_effects
from services.listener.plan import plan_message
from services.listener.scaling import ScalerState
from shared.actions.messages import decode_message
from shared.actions.models import ScaleSetStatistics
from shared.bus import messages as bus

IDENT = Identity(
    scale_set_id=7,
    scale_set=bus.ResourceRef(namespace="ns", name="arc"),
    ers=bus.ResourceRef(namespace="ns", name="arc"),
    min_runners=1,
    max_runners=4,
)


def message(message_id: int, events: list[dict[str, Any]], assigned: int) -> bytes:
    return msgspec.json.encode(
        {
            "messageId": message_id,
            "messageType": "RunnerScaleSetJobMessages",
            "body": msgspec.json.encode(events).decode(),
            "statistics": {"totalAssignedJobs": assigned, "totalRunningJobs": 1},
        }
    )


JOB = {"jobId": "j1", "ownerName": "octo", "repositoryName": "app", "jobWorkflowRef": "octo/app/.github/workflows/ci.yml@refs/heads/main",
       "jobDisplayName": "build", "workflowRunId": 99, "eventName": "push"}  # fmt: skip
STARTED = {"messageType": "JobStarted", "runnerName": "arc-r1", "runnerId": 11, **JOB}
COMPLETED = {"messageType": "JobCompleted", "runnerName": "arc-r1", "runnerId": 11, "result": "succeeded", **JOB}


def test_events_dedupe_and_acquire_ids() -> None:
    events = [
        STARTED, STARTED, COMPLETED,
        {"messageType": "JobAvailable", "runnerRequestId": 5, **JOB},
        {"messageType": "JobAvailable", "runnerRequestId": 5, **JOB},
        {"messageType": "JobAvailable", "runnerRequestId": 0, "jobId": "j2"},
    ]  # fmt: skip
    plan = plan_message(
        decode_message(message(100, events, 2)), newest_seen_id=0, latest_statistics=ScaleSetStatistics()
    )
    assert (len(plan.started), len(plan.completed), plan.acquire_request_ids, plan.stale, plan.dirty) == (
        1,
        1,
        (5,),
        False,
        True,
    )


def test_effects_carry_job_facts_epoch_and_a_fresh_patch() -> None:
    plan = plan_message(
        decode_message(message(100, [STARTED, COMPLETED], 2)), newest_seen_id=0, latest_statistics=ScaleSetStatistics()
    )
    # A previous decision (seq 3, target 3) exists; the batch is dirty, so the patch ID is fresh.
    events, scaler, decision = plan_effects(IDENT, plan, 42, ScalerState(target=3, patch_seq=3))
    started, completed, desired = events
    assert isinstance(started, bus.JobStarted) and isinstance(completed, bus.JobCompleted)
    assert (started.runner_name, started.runner_id, started.job_id, started.repository) == (
        "arc-r1",
        11,
        "j1",
        "octo/app",
    )
    assert (started.workflow_ref, started.workflow_run_id, started.listener_epoch) == (JOB["jobWorkflowRef"], 99, 42)
    assert completed.result == "succeeded"
    assert isinstance(desired, bus.DesiredState)
    assert (desired.replicas, desired.patch_id, desired.listener_epoch) == (3, 4, 42)
    assert desired.statistics.total_assigned_jobs == 2 and desired.ers == IDENT.ers
    assert (scaler.patch_seq, scaler.dirty, decision.replicas) == (4, False, 3)


def test_stale_message_scales_on_the_newer_statistics() -> None:
    newer = decode_message(message(200, [], 3))
    older = decode_message(message(150, [STARTED], 1))
    plan = plan_message(older, newest_seen_id=200, latest_statistics=newer.statistics)
    assert plan.stale and plan.statistics.total_assigned_jobs == 3 and len(plan.started) == 1
    _, _, decision = plan_effects(IDENT, plan, 1, ScalerState())
    assert decision.replicas == 4  # min 1 + 3, capped at 4: not 1 + 1 from the stale snapshot
