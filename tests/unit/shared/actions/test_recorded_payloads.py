"""Recorded service payloads (tests/data/actions/) decode into the client's structs: this pins
the real field names (``RunnerSetting``, ``encodedJITConfig``, camelCase, snake_case REST)."""

from __future__ import annotations

import json
from typing import TypeVar

import msgspec

from shared.actions import JitRunnerConfig, JobAvailable, MessageSession, RunnerScaleSet, decode_message
from shared.actions.models import (
    AcquirableJob,
    AcquiredJobs,
    ActionsServiceAdmin,
    Label,
    ListEnvelope,
    RunnerGroup,
    RunnerReference,
    RunnerScaleSetRequest,
    RunnerSetting,
    SessionRequest,
    TokenResponse,
)
from tests.support.paths import TEST_DATA

T = TypeVar("T")
DATA = TEST_DATA / "actions"


def load(name: str, typ: type[T]) -> T:
    return msgspec.json.decode((DATA / name).read_bytes(), type=typ)


def test_rest_token_payloads() -> None:
    assert load("access_token.json", TokenResponse).token.startswith("ghs_")
    reg = load("registration_token.json", TokenResponse)
    assert reg.expires_at is not None
    offset = reg.expires_at.utcoffset()
    assert offset is not None and offset.total_seconds() == -8 * 3600
    admin = load("runner_registration.json", ActionsServiceAdmin)
    assert admin.url.endswith("/tenant/123/") and admin.token.count(".") == 2


def test_scale_set_payload_field_names() -> None:
    scale_set = load("scale_set.json", RunnerScaleSet)
    assert (scale_set.id, scale_set.name, scale_set.runner_group_id, scale_set.runner_group_name) == (
        7,
        "my-set",
        1,
        "Default",
    )
    assert scale_set.runner_setting.disable_update is True
    assert [lb.name for lb in scale_set.labels] == ["my-set", "linux"]
    assert scale_set.statistics is not None and scale_set.statistics.total_assigned_jobs == 2
    assert scale_set.created_on is not None and scale_set.created_on.microsecond == 123457
    assert scale_set.runner_jit_config_url.endswith("/generatejitconfig")


def test_list_envelopes() -> None:
    groups = load("runner_groups.json", ListEnvelope)
    assert groups.count == 1 and msgspec.json.decode(groups.value[0], type=RunnerGroup).name == "gpu"
    assert load("runner_groups_empty.json", ListEnvelope).count == 0
    assert load("acquire_jobs.json", AcquiredJobs).value == [101, 102]
    jobs = load("acquirable_jobs.json", ListEnvelope)
    assert msgspec.json.decode(jobs.value[0], type=AcquirableJob).runner_request_id == 101
    runners = load("runners_by_name.json", ListEnvelope)
    assert msgspec.json.decode(runners.value[0], type=RunnerReference).runner_scale_set_id == 7


def test_jit_config_spelling() -> None:
    config = load("jit_config.json", JitRunnerConfig)
    assert config.encoded_jit_config == "eyIucnVubmVyIjoiZXhhbXBsZSJ9"
    assert config.runner.id == 123 and config.runner.ephemeral is True
    assert "eyIucnVubmVy" not in repr(config)
    runner = load("runner.json", RunnerReference)
    assert runner.status == "online" and runner.version == "2.330.0"


def test_session_payload() -> None:
    session = load("session.json", MessageSession)
    assert session.message_queue_url.endswith("/scalesets/message")
    assert session.statistics is not None and session.runner_scale_set is not None and session.runner_scale_set.id == 7
    assert session.message_queue_access_token not in repr(session)


def test_recorded_message_decodes_with_unknown_type_skipped() -> None:
    message = decode_message((DATA / "message.json").read_bytes())
    assert message.message_id == 100000171
    assert [type(j).__name__ for j in message.jobs] == ["JobAvailable", "JobAssigned", "JobStarted", "JobCompleted"]
    assert message.skipped_types == ("JobSomethingNew",)
    available = message.jobs[0]
    assert isinstance(available, JobAvailable) and available.scale_set_assign_time is None
    assert message.jobs[1].job_id == message.jobs[2].job_id and message.jobs[1].runner_request_id == 0
    assert decode_message((DATA / "message_stats_only.json").read_bytes()).jobs == ()


def test_request_bodies_match_the_reference_client_shape() -> None:
    create = RunnerScaleSetRequest(
        name="x", runner_group_id=1, labels=[Label(name="x")], runner_setting=RunnerSetting(disable_update=True)
    )
    assert json.loads(msgspec.json.encode(create)) == {
        "name": "x",
        "runnerGroupId": 1,
        "labels": [{"name": "x", "type": "System"}],
        "RunnerSetting": {"disableUpdate": True},
        "createdOn": "0001-01-01T00:00:00Z",
    }
    assert json.loads(msgspec.json.encode(RunnerScaleSetRequest(runner_group_id=2))) == {
        "runnerGroupId": 2,
        "RunnerSetting": {},
        "createdOn": "0001-01-01T00:00:00Z",
    }
    assert json.loads(msgspec.json.encode(SessionRequest(owner_name="host"))) == {
        "ownerName": "host",
        "sessionId": "00000000-0000-0000-0000-000000000000",
    }
