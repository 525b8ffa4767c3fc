"""Wire types of the Actions scale-set service, with the service's exact JSON field names.

Field names follow the service (camelCase, except ``RunnerSetting`` and ``encodedJITConfig``,
which are spelled as the service spells them). Unknown fields are ignored on decode, so a newer
service stays compatible. Request bodies are separate types, so what we send is explicit
(README "Actions service client").
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Final

import msgspec
from msgspec import UNSET, UnsetType, field

__all__ = [
    "DEFAULT_RUNNER_GROUP_ID",
    "DEFAULT_RUNNER_GROUP_NAME",
    "RUNNER_SCALE_SET_JOB_MESSAGES",
    "ZERO_TIME",
    "AcquirableJob",
    "ActionsServiceAdmin",
    "JitRunnerConfig",
    "JitRunnerRequest",
    "Label",
    "MessageEnvelope",
    "MessageSession",
    "RegistrationExchange",
    "RunnerGroup",
    "RunnerReference",
    "RunnerScaleSet",
    "RunnerScaleSetRequest",
    "RunnerSetting",
    "ScaleSetStatistics",
    "SessionRequest",
    "TokenResponse",
]

ZERO_TIME: Final = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
# ARC and the reference example never look the default group up: it is always id 1.
DEFAULT_RUNNER_GROUP_ID: Final = 1
DEFAULT_RUNNER_GROUP_NAME: Final = "default"
RUNNER_SCALE_SET_JOB_MESSAGES: Final = "RunnerScaleSetJobMessages"


class _Wire(msgspec.Struct, rename="camel", kw_only=True, frozen=True):
    """Base: camelCase on the wire, keyword construction."""


class ScaleSetStatistics(_Wire, frozen=True):
    """``RunnerScaleSetStatistic``: counts as seen by the service when the message was sent."""

    total_available_jobs: int = 0
    total_acquired_jobs: int = 0
    total_assigned_jobs: int = 0
    total_running_jobs: int = 0
    total_registered_runners: int = 0
    total_busy_runners: int = 0
    total_idle_runners: int = 0


class Label(_Wire, frozen=True):
    name: str
    type: str = "System"


class RunnerSetting(_Wire, frozen=True, omit_defaults=True):
    """Go omits false booleans here, so an update sends ``"RunnerSetting": {}``."""

    disable_update: bool = False
    ephemeral: bool | UnsetType = UNSET
    is_elastic: bool | UnsetType = UNSET


class RunnerGroup(_Wire, frozen=True):
    id: int
    name: str = ""
    size: int = 0
    is_default_group: bool = False


class RunnerScaleSet(_Wire, frozen=True):
    id: int
    name: str = ""
    runner_group_id: int = 0
    runner_group_name: str = ""
    labels: list[Label] = []
    runner_setting: RunnerSetting = field(default_factory=RunnerSetting, name="RunnerSetting")
    created_on: dt.datetime | None = None
    runner_jit_config_url: str = ""
    statistics: ScaleSetStatistics | None = None


class RunnerScaleSetRequest(_Wire, frozen=True, omit_defaults=False):
    """Body of create (A4) and update (A5). Unset fields are not sent; ``RunnerSetting`` and
    ``createdOn`` are always sent, as the reference client does (Go zero values)."""

    name: str | UnsetType = UNSET
    runner_group_id: int | UnsetType = UNSET
    labels: list[Label] | UnsetType = UNSET
    runner_setting: RunnerSetting = field(default_factory=RunnerSetting, name="RunnerSetting")
    created_on: dt.datetime = ZERO_TIME


class RunnerReference(_Wire, frozen=True):
    """A registered runner ("agent"). The real service sends more fields; these are the ones
    callers need."""

    id: int
    name: str = ""
    runner_scale_set_id: int = 0
    runner_group_id: int = 0
    runner_group_name: str = ""
    version: str = ""
    enabled: bool | None = None
    ephemeral: bool | None = None
    status: str = ""
    created_on: dt.datetime | None = None


class JitRunnerRequest(_Wire, frozen=True):
    name: str
    work_folder: str = ""


class JitRunnerConfig(_Wire, frozen=True):
    runner: RunnerReference
    encoded_jit_config: str = field(name="encodedJITConfig")

    def __repr__(self) -> str:  # the config embeds runner credentials: never print it
        return f"JitRunnerConfig(runner={self.runner!r}, encoded_jit_config='[redacted]')"


class SessionRequest(_Wire, frozen=True):
    owner_name: str
    # The reference client sends the zero UUID (Go's omitempty keeps fixed-size arrays).
    session_id: str = str(uuid.UUID(int=0))


class MessageSession(_Wire, frozen=True):
    """``RunnerScaleSetSession``."""

    session_id: str
    owner_name: str = ""
    runner_scale_set: RunnerScaleSet | None = None
    message_queue_url: str = ""
    message_queue_access_token: str = ""
    statistics: ScaleSetStatistics | None = None

    def __repr__(self) -> str:
        return (
            f"MessageSession(session_id={self.session_id!r}, owner_name={self.owner_name!r}, "
            f"message_queue_url={self.message_queue_url!r}, message_queue_access_token='[redacted]', "
            f"statistics={self.statistics!r})"
        )


class AcquirableJob(_Wire, frozen=True):
    """Legacy J2 item; kept for decoding only."""

    runner_request_id: int = 0
    message_type: str = ""
    acquire_job_url: str = ""
    repository_name: str = ""
    owner_name: str = ""
    job_workflow_ref: str = ""
    event_name: str = ""
    request_labels: list[str] = []


class TokenResponse(msgspec.Struct, frozen=True):
    """G1 installation token / G2 registration token: ``{token, expires_at}`` (snake_case: REST)."""

    token: str
    expires_at: dt.datetime | None = None

    def __repr__(self) -> str:
        return f"TokenResponse(token='[redacted]', expires_at={self.expires_at!r})"


class RegistrationExchange(msgspec.Struct, frozen=True):
    """G3 request body."""

    url: str
    runner_event: str = "register"


class ActionsServiceAdmin(msgspec.Struct, frozen=True):
    """G3 response: the Actions service base URL and the admin token."""

    url: str = ""
    token: str = ""

    def __repr__(self) -> str:
        return f"ActionsServiceAdmin(url={self.url!r}, token='[redacted]')"


class MessageEnvelope(_Wire, frozen=True):
    """Q1 200 body before the inner ``body`` string is decoded (see ``shared.actions.messages``)."""

    message_id: int
    message_type: str = ""
    body: str = ""
    statistics: ScaleSetStatistics | None = None


class ListEnvelope(msgspec.Struct, frozen=True):
    """``{"count": n, "value": [...]}``; the count is trusted over the array's length."""

    count: int = 0
    value: list[msgspec.Raw] = []


class AcquiredJobs(msgspec.Struct, frozen=True):
    count: int = 0
    value: list[int] = []
