"""Client of the GitHub Actions runner scale set service (github.com, GHE.com and GHES).

    from shared.actions import ActionsClient, PersonalAccessToken, MessageSessionClient

    async with ActionsClient.from_config("https://github.com/my-org", PersonalAccessToken(pat)) as client:
        scale_set = await client.get_scale_set_by_name("my-set") or await client.create_scale_set("my-set")
        async with await MessageSessionClient.create(client, scale_set.id) as session:
            message = await session.get_message(last_message_id=0, max_capacity=10)

See README "Actions service client".
"""

from __future__ import annotations

from shared.actions import errors as _errors
from shared.actions.auth import AppCredentials, Credentials, PersonalAccessToken, credentials_from_secret
from shared.actions.client import API_VERSION, ActionsClient, ClientSettings, SystemInfo, scale_set_labels
from shared.actions.config import ConfigScope, GitHubConfig, parse_config_url
from shared.actions.errors import *  # noqa: F403 - the error hierarchy is part of the public API
from shared.actions.messages import (
    JobAssigned,
    JobAvailable,
    JobCompleted,
    JobMessage,
    JobStarted,
    Message,
    MessageDecodeError,
    decode_message,
)
from shared.actions.models import (
    DEFAULT_RUNNER_GROUP_ID,
    JitRunnerConfig,
    Label,
    MessageSession,
    RunnerGroup,
    RunnerReference,
    RunnerScaleSet,
    RunnerSetting,
    ScaleSetStatistics,
)
from shared.actions.retry import RetryPolicy
from shared.actions.session import MessageSessionClient

__all__ = [
    "API_VERSION",
    "DEFAULT_RUNNER_GROUP_ID",
    "ActionsClient",
    "AppCredentials",
    "ClientSettings",
    "ConfigScope",
    "Credentials",
    "GitHubConfig",
    "JitRunnerConfig",
    "JobAssigned",
    "JobAvailable",
    "JobCompleted",
    "JobMessage",
    "JobStarted",
    "Label",
    "Message",
    "MessageDecodeError",
    "MessageSession",
    "MessageSessionClient",
    "PersonalAccessToken",
    "RetryPolicy",
    "RunnerGroup",
    "RunnerReference",
    "RunnerScaleSet",
    "RunnerSetting",
    "ScaleSetStatistics",
    "SystemInfo",
    "credentials_from_secret",
    "decode_message",
    "parse_config_url",
    "scale_set_labels",
]
__all__ += _errors.__all__
