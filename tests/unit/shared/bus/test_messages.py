"""Message contracts: JSON round trips, strict decoding by subject, typed errors, de-dup ids."""

import datetime as dt
from typing import Any

import msgspec
import pytest

from shared.bus import messages
from shared.bus.errors import MalformedMessage, UnknownSchemaVersion
from shared.bus.messages import (
    DesiredState,
    JobCompleted,
    JobStarted,
    JobStatistics,
    ResourceChanged,
    ResourceRef,
    RevisionApplied,
    RevisionPublished,
)

T = dt.datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=dt.UTC)


def samples() -> list[messages.BusMessage]:
    scale_set = ResourceRef("arc.runners", "my.set")
    ers = ResourceRef("arc.runners", "my.set-abcde")
    job: dict[str, Any] = dict(
        scale_set_id=7,
        scale_set=scale_set,
        runner_name="my.set-abcde-runner-x1",
        runner_id=42,
        job_id="j-1",
        runner_request_id=0,
        workflow_run_id=99,
        workflow_ref="o/r/.github/workflows/ci.yml@refs/heads/main",
        job_display_name="build",
        repository="o/r",
        event_name="push",
        listener_epoch=3,
        time=T,
    )
    return [
        DesiredState(
            scale_set_id=7,
            ers=ers,
            patch_id=2147483647,
            replicas=0,
            listener_epoch=3,
            statistics=JobStatistics(total_assigned_jobs=5, total_running_jobs=2, total_idle_runners=1),
            time=T,
        ),
        JobStarted(**job),
        JobCompleted(**job, result="succeeded"),
        RevisionPublished(ers=ers, revision=4, phase="Outdated", time=T),
        RevisionApplied(ers=ers, revision=4, phase="Running", time=T),
        ResourceChanged(
            resource_kind="AutoscalingListener",
            ref=ResourceRef("ns", "l.1"),
            generation=2,
            resource_version="17",
            time=T,
        ),
    ]


@pytest.mark.parametrize("message", samples(), ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_its_subject(message: messages.BusMessage) -> None:
    subject = messages.subject_for(message)
    data = messages.encode(message)
    assert messages.decode(subject, data) == message
    doc = msgspec.json.decode(data)
    assert doc["kind"] == type(message).__name__
    assert doc["schemaVersion"] == 1
    assert list(doc)[:3] == ["kind", "schemaVersion", "time"]


def test_wire_names_are_camel_case_like_the_actions_statistics() -> None:
    doc = msgspec.json.decode(messages.encode(samples()[0]))
    assert doc["statistics"]["totalAssignedJobs"] == 5
    assert {"scaleSetId", "patchId", "listenerEpoch", "ers"} <= set(doc)


def _desired_subject() -> str:
    return messages.subject_for(samples()[0])


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not a JSON object"),
        (b"not json", "not a JSON object"),
        (b"[1,2]", "not a JSON object"),
        (b'{"kind":"DesiredState"}', "missing schemaVersion"),
        (b'{"schemaVersion":1,"scaleSetId":"seven"}', "Expected `int`"),
        (b'{"schemaVersion":1,"kind":"JobStarted"}', "Invalid value 'JobStarted'"),
        (
            b'{"schemaVersion":1,"scaleSetId":1,"ers":{"namespace":"x","name":"y"},"patchId":1,"replicas":1,"listenerEpoch":1}',
            "body names x/y",
        ),
    ],
)
def test_malformed_bodies_raise_malformed_message_naming_the_subject(data: bytes, problem: str) -> None:
    with pytest.raises(MalformedMessage, match=problem) as err:
        messages.decode(_desired_subject(), data)
    assert err.value.subject == _desired_subject()


@pytest.mark.parametrize("version", [2, 0, "1", 1.5, None])
def test_unknown_schema_versions_are_their_own_error(version: object) -> None:
    body = msgspec.json.decode(messages.encode(samples()[0]))
    body["schemaVersion"] = version
    data = msgspec.json.encode(body)
    expected = MalformedMessage if version is None else UnknownSchemaVersion
    with pytest.raises(expected):
        messages.decode(_desired_subject(), data)


@pytest.mark.parametrize("subject", ["runnerscale.nope.a.b", "elsewhere", "runnerscale.desired.a_zz.b"])
def test_unknown_or_undecodable_subjects_are_malformed(subject: str) -> None:
    with pytest.raises(MalformedMessage):
        messages.decode(subject, messages.encode(samples()[0]))


def test_unknown_fields_from_a_newer_minor_writer_are_ignored() -> None:
    body = msgspec.json.decode(messages.encode(samples()[0]))
    body["somethingNew"] = {"x": 1}
    assert messages.decode(_desired_subject(), msgspec.json.encode(body)) == samples()[0]


def test_only_edges_carry_dedup_ids_and_reassignment_is_a_new_event() -> None:
    started, completed = samples()[1], samples()[2]
    assert messages.dedup_id(samples()[0]) is None
    assert messages.dedup_id(started) == "job-started.7.j-1.42"
    assert messages.dedup_id(completed) == "job-completed.7.j-1.42"
    reassigned = msgspec.structs.replace(started, runner_id=43)
    assert messages.dedup_id(reassigned) != messages.dedup_id(started)
    legacy = msgspec.structs.replace(started, job_id="", runner_request_id=555)
    assert messages.dedup_id(legacy) == "job-started.7.555.42"


def test_a_time_without_a_zone_is_malformed() -> None:
    body = msgspec.json.decode(messages.encode(samples()[0]))
    body["time"] = "2026-11-29T12:00:00"
    with pytest.raises(MalformedMessage, match="time"):
        messages.decode(_desired_subject(), msgspec.json.encode(body))
    body["time"] = "2026-11-29T12:00:00+02:00"
    assert messages.decode(_desired_subject(), msgspec.json.encode(body)).time.utcoffset() == dt.timedelta(hours=2)


def test_encode_refuses_what_consumers_would_reject() -> None:
    naive = msgspec.structs.replace(samples()[0], time=dt.datetime(2026, 1, 1))
    with pytest.raises(MalformedMessage, match="refusing to publish"):
        messages.encode(naive)
    wrong_type = msgspec.structs.replace(samples()[0], replicas="3")
    with pytest.raises(MalformedMessage, match="replicas"):
        messages.encode(wrong_type)
