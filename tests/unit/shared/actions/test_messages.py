"""Decoding the long-poll message: double-encoded body, typed job messages, tolerance rules."""

from __future__ import annotations

import json

import pytest

from shared.actions import (
    JobAssigned,
    JobAvailable,
    JobCompleted,
    JobStarted,
    MessageDecodeError,
    ProtocolError,
    decode_message,
)

STATS = {
    "totalAvailableJobs": 1,
    "totalAcquiredJobs": 0,
    "totalAssignedJobs": 3,
    "totalRunningJobs": 1,
    "totalRegisteredRunners": 2,
    "totalBusyRunners": 1,
    "totalIdleRunners": 1,
}


def envelope(body: object, **overrides: object) -> bytes:
    doc = {
        "messageId": 100000001,
        "messageType": "RunnerScaleSetJobMessages",
        "body": body if isinstance(body, str) else json.dumps(body),
        "statistics": STATS,
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


def test_all_four_job_types_in_service_order() -> None:
    body = [
        {"messageType": "JobAvailable", "runnerRequestId": 11, "acquireJobUrl": "https://x/acquire"},
        {"messageType": "JobAssigned", "runnerRequestId": 0, "jobId": "j-1"},
        {"messageType": "JobStarted", "jobId": "j-1", "runnerId": 5, "runnerName": "r-5"},
        {"messageType": "JobCompleted", "jobId": "j-1", "runnerId": 5, "runnerName": "r-5", "result": "succeeded"},
    ]
    message = decode_message(envelope(body))
    assert message.message_id == 100000001
    assert message.statistics.total_assigned_jobs == 3
    assert [type(j) for j in message.jobs] == [JobAvailable, JobAssigned, JobStarted, JobCompleted]
    assert message.available[0].runner_request_id == 11 and message.available[0].acquire_job_url == "https://x/acquire"
    assert message.started[0].runner_name == "r-5"
    assert message.completed[0].result == "succeeded"
    assert message.assigned[0].job_key == "j-1"
    assert message.available[0].job_key == "11"


def test_empty_body_is_a_statistics_only_message() -> None:
    message = decode_message(envelope(""))
    assert message.jobs == () and message.statistics.total_running_jobs == 1


def test_unknown_inner_types_are_skipped_and_reported() -> None:
    message = decode_message(envelope([{"messageType": "JobRerouted"}, {"messageType": "JobAssigned", "jobId": "a"}]))
    assert [j.job_id for j in message.jobs] == ["a"]
    assert message.skipped_types == ("JobRerouted",)


def test_bom_before_envelope_is_stripped() -> None:
    assert decode_message(b"\xef\xbb\xbf" + envelope([])).message_id == 100000001


def test_times_tolerate_seven_fraction_digits_offsets_and_go_zero_time() -> None:
    body = [
        {
            "messageType": "JobAssigned",
            "jobId": "a",
            "queueTime": "2026-01-01T00:00:00.1234567Z",
            "scaleSetAssignTime": "2026-01-01T05:30:00+05:30",
            "runnerAssignTime": "0001-01-01T00:00:00Z",
        }
    ]
    job = decode_message(envelope(body)).jobs[0]
    assert job.queue_time is not None and job.queue_time.microsecond == 123457
    assert job.scale_set_assign_time is not None
    offset = job.scale_set_assign_time.utcoffset()
    assert offset is not None and offset.total_seconds() == 19800
    assert job.runner_assign_time is None and job.finish_time is None


def test_large_message_ids_are_64_bit() -> None:
    assert decode_message(envelope([], messageId=2**40)).message_id == 2**40


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "empty body"),
        (b"not json", "envelope is invalid"),
        (envelope([], messageType="SomethingElse"), "unsupported messageType"),
        (
            json.dumps({"messageId": 1, "messageType": "RunnerScaleSetJobMessages", "body": ""}).encode(),
            "no statistics",
        ),
        (envelope("{not an array"), "not a JSON array"),
        (envelope([1, 2]), "is not an object"),
        (envelope([{"messageType": "JobStarted", "runnerId": "five"}]), "JobStarted [0]"),
        (envelope([{"messageType": "JobAssigned", "jobId": 12}]), "JobAssigned [0]"),
        (json.dumps({"messageType": "RunnerScaleSetJobMessages"}).encode(), "messageId"),
    ],
)
def test_garbled_messages_raise_typed_errors_naming_the_request(data: bytes, fragment: str) -> None:
    with pytest.raises(MessageDecodeError) as info:
        decode_message(data, request="GET broker/message")
    assert fragment in str(info.value)
    assert "GET broker/message" in str(info.value)
    assert isinstance(info.value, ProtocolError)
