"""Wire shapes of the GitHub Actions scale-set service, as the simulator sends and accepts them.

Field names are exactly the real service's (research/scaleset-api.md §2.2, §3): camelCase, with
two oddities kept on purpose: ``RunnerSetting`` (PascalCase) and ``encodedJITConfig``.
Request structs tolerate unknown fields (the real clients send extra ones) and use ``UNSET`` where
the service must tell "absent or zero" from a value (PATCH applies only non-zero fields).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

ZERO_TIME = "0001-01-01T00:00:00Z"


class Statistics(msgspec.Struct, rename="camel"):
    total_available_jobs: int = 0
    total_acquired_jobs: int = 0
    total_assigned_jobs: int = 0
    total_running_jobs: int = 0
    total_registered_runners: int = 0
    total_busy_runners: int = 0
    total_idle_runners: int = 0


class Label(msgspec.Struct):
    name: str
    type: str = "System"


class RunnerSetting(msgspec.Struct, rename="camel"):
    disable_update: bool = False
    ephemeral: bool = True
    is_elastic: bool = False


class RunnerGroup(msgspec.Struct, rename="camel"):
    id: int
    name: str
    size: int = 0
    is_default_group: bool = False


class ScaleSet(msgspec.Struct, rename="camel"):
    id: int
    name: str
    runner_group_id: int
    runner_group_name: str
    labels: list[Label]
    runner_setting: RunnerSetting = msgspec.field(name="RunnerSetting", default_factory=RunnerSetting)
    created_on: str = ZERO_TIME
    runner_jit_config_url: str = ""
    get_acquirable_jobs_url: str = ""
    acquire_jobs_url: str = ""
    statistics: Statistics = msgspec.field(default_factory=Statistics)
    status: str = "online"
    enabled: bool = True


class RunnerSettingPatch(msgspec.Struct, rename="camel"):
    disable_update: bool | UnsetType = UNSET
    ephemeral: bool | UnsetType = UNSET
    is_elastic: bool | UnsetType = UNSET


class ScaleSetRequest(msgspec.Struct, rename="camel"):
    """Body of A4 (create) and A5 (partial update). Zero values mean "not given"."""

    id: int = 0
    name: str = ""
    runner_group_id: int = 0
    runner_group_name: str = ""
    labels: list[Label] | None = None
    runner_setting: RunnerSettingPatch | None = msgspec.field(name="RunnerSetting", default=None)
    created_on: str | None = None


class Envelope(msgspec.Struct):
    count: int
    value: list[Any]


class SessionRequest(msgspec.Struct, rename="camel"):
    session_id: str = ""  # the library sends the zero UUID; ignored
    owner_name: str = ""


class Session(msgspec.Struct, rename="camel"):
    session_id: str
    owner_name: str
    runner_scale_set: ScaleSet
    message_queue_url: str
    message_queue_access_token: str
    statistics: Statistics


class Message(msgspec.Struct, rename="camel"):
    message_id: int
    message_type: str
    body: str
    statistics: Statistics


class JitRequest(msgspec.Struct, rename="camel"):
    name: str = ""
    work_folder: str = ""


class RunnerReference(msgspec.Struct, rename="camel"):
    id: int
    name: str
    runner_scale_set_id: int
    runner_group_id: int = 1
    runner_group_name: str = "Default"
    created_on: str = ZERO_TIME
    version: str = ""
    enabled: bool = True
    ephemeral: bool = True
    disable_update: bool = True
    status: str = "offline"
    provisioning_state: str = "Provisioned"


class JitConfig(msgspec.Struct):
    runner: RunnerReference
    encoded_jit_config: str = msgspec.field(name="encodedJITConfig")


class ServiceError(msgspec.Struct, rename="camel"):
    """The Actions service's error body: an assembly-qualified .NET exception name and a message."""

    type_name: str
    message: str
    type_key: str = ""
    error_code: int = 0
    event_id: int = 3000
    inner_exception: None = None


def service_error(type_name: str, message: str) -> ServiceError:
    """``typeKey`` is the exception's short name, as .NET services send it."""
    short = type_name.split(",", maxsplit=1)[0].rsplit(".", 1)[-1]
    return ServiceError(type_name=type_name, message=message, type_key=short)


# Job messages (§3.2). One struct per messageType; times are RFC 3339, ZERO_TIME when not applicable.


class _JobMessage(msgspec.Struct, rename="camel", tag_field="messageType"):
    runner_request_id: int
    job_id: str
    repository_name: str
    owner_name: str
    job_workflow_ref: str
    job_display_name: str
    workflow_run_id: int
    event_name: str
    request_labels: list[str]
    queue_time: str = ZERO_TIME
    scale_set_assign_time: str = ZERO_TIME
    runner_assign_time: str = ZERO_TIME
    finish_time: str = ZERO_TIME


class JobAvailable(_JobMessage, tag="JobAvailable"):
    acquire_job_url: str = ""


class JobAssigned(_JobMessage, tag="JobAssigned"):
    pass


class JobStarted(_JobMessage, tag="JobStarted"):
    runner_id: int = 0
    runner_name: str = ""


class JobCompleted(_JobMessage, tag="JobCompleted"):
    result: str = ""
    runner_id: int = 0
    runner_name: str = ""


JobMessage = JobAvailable | JobAssigned | JobStarted | JobCompleted

MESSAGE_TYPE = "RunnerScaleSetJobMessages"

# GitHub REST shapes


class GitHubToken(msgspec.Struct):
    token: str
    expires_at: str


class RunnerRegistrationRequest(msgspec.Struct):
    url: str = ""
    runner_event: str = ""


class RunnerRegistration(msgspec.Struct):
    url: str
    token: str
    token_schema: str = "OAuthAccessToken"


class Account(msgspec.Struct):
    login: str
    id: int
    type: str


class Installation(msgspec.Struct):
    id: int
    app_id: int
    account: Account
    target_type: str
    repository_selection: str = "all"


class GitHubError(msgspec.Struct):
    message: str
    documentation_url: str = "https://docs.github.com/rest"
    status: str = ""
