"""The auth chain against the simulator: PAT and GitHub App, every scope, refresh rules,
credential errors, and the request headers the service sees."""

from __future__ import annotations

import json

import anyio
import msgspec
import pytest

from shared.actions import (
    ActionsClient,
    ActionsHTTPError,
    AppCredentials,
    AuthenticationError,
    CredentialsError,
    PersonalAccessToken,
    SystemInfo,
)
from tests.contract.conftest import FAST, endpoint_calls, pat_client
from tests.fixtures.actions_sim import ActionsSim

pytestmark = pytest.mark.anyio


def app(sim: ActionsSim, *, installation: bool = True) -> AppCredentials:
    return AppCredentials(
        app_id=str(sim.app_id),
        installation_id=sim.installation_id if installation else 0,
        private_key=sim.app_private_key_pem,
    )


@pytest.mark.parametrize("scope", ["org", "repo", "enterprise"])
async def test_pat_works_for_every_scope(actions_sim: ActionsSim, scope: str) -> None:
    url = {
        "org": actions_sim.config_url(),
        "repo": actions_sim.config_url(actions_sim.org, actions_sim.repo),
        "enterprise": actions_sim.enterprise_config_url(),
    }[scope]
    async with ActionsClient.from_config(
        url, PersonalAccessToken(actions_sim.pat), settings=FAST, environ={}
    ) as client:
        created = await client.create_scale_set(f"set-{scope}")
        got = await client.get_scale_set_by_name(f"set-{scope}")
        assert got is not None and got.id == created.id
    exchange = (await endpoint_calls(actions_sim, "runner_registration"))[0]
    assert exchange.headers["Authorization"].startswith("RemoteAuth")
    assert exchange.path == "/api/v3/actions/runner-registration"


@pytest.mark.parametrize("scope", ["org", "repo"])
@pytest.mark.parametrize("installation", [True, False], ids=["installation-id", "installation-lookup"])
async def test_github_app_works_with_and_without_installation_id(
    actions_sim: ActionsSim, scope: str, installation: bool
) -> None:
    url = actions_sim.config_url() if scope == "org" else actions_sim.config_url(actions_sim.org, actions_sim.repo)
    creds = app(actions_sim, installation=installation)
    async with ActionsClient.from_config(url, creds, settings=FAST, environ={}) as client:
        assert await client.get_scale_set_by_name("absent") is None
    tokens = await endpoint_calls(actions_sim, "access_token")
    assert len(tokens) == 1 and tokens[0].status == 201
    assert tokens[0].path == f"/api/v3/app/installations/{actions_sim.installation_id}/access_tokens"
    assert len(await endpoint_calls(actions_sim, "installation")) == (0 if installation else 1)


def test_github_app_cannot_use_enterprise_scope(actions_sim: ActionsSim) -> None:
    with pytest.raises(CredentialsError, match="enterprise"):
        ActionsClient.from_config(actions_sim.enterprise_config_url(), app(actions_sim), environ={})


async def test_wrong_pat_is_an_authentication_error_tried_once(actions_sim: ActionsSim) -> None:
    wrong = "ghp_wrongwrongwrongwrongwrong0000"
    async with ActionsClient.from_config(
        actions_sim.config_url(), PersonalAccessToken(wrong), settings=FAST, environ={}
    ) as client:
        with pytest.raises(AuthenticationError) as info:
            await client.get_scale_set_by_name("x")
    assert info.value.status in (401, 403)
    assert info.value.github_request_id  # REST diagnostics id is carried for support requests
    assert wrong not in str(info.value)
    assert len(await endpoint_calls(actions_sim, "registration_token")) == 1


async def test_unknown_installation_is_an_error_naming_the_request(actions_sim: ActionsSim) -> None:
    creds = AppCredentials(
        app_id=str(actions_sim.app_id), installation_id=999999, private_key=actions_sim.app_private_key_pem
    )
    async with ActionsClient.from_config(actions_sim.config_url(), creds, settings=FAST, environ={}) as client:
        with pytest.raises(ActionsHTTPError) as info:
            await client.get_scale_set_by_name("x")
    assert info.value.status in (401, 404)
    assert "/app/installations/999999/access_tokens" in str(info.value)


@pytest.mark.parametrize("endpoint", ["access_token", "registration_token"])
async def test_401_on_token_minting_is_not_retried(actions_sim: ActionsSim, endpoint: str) -> None:
    await actions_sim.control.set_fault(endpoint, status=401, count=None)
    async with ActionsClient.from_config(
        actions_sim.config_url(), app(actions_sim), settings=FAST, environ={}
    ) as client:
        with pytest.raises(AuthenticationError):
            await client.get_scale_set_by_name("x")
    assert len(await endpoint_calls(actions_sim, endpoint)) == 1


@pytest.mark.parametrize("status", [401, 403])
async def test_registration_exchange_is_retried_on_401_and_403(actions_sim: ActionsSim, status: int) -> None:
    await actions_sim.control.set_fault("runner_registration", status=status, count=2)
    async with pat_client(actions_sim) as client:
        assert await client.get_scale_set_by_name("x") is None
    statuses = [r.status for r in await endpoint_calls(actions_sim, "runner_registration")]
    assert statuses[:2] == [status, status] and len(statuses) == 3 and statuses[2] in (200, 201)


async def test_admin_token_is_refreshed_within_the_margin(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(admin_token_ttl=3600)
    async with pat_client(actions_sim) as client:
        for _ in range(3):
            await client.get_scale_set_by_name("x")
        assert len(await endpoint_calls(actions_sim, "runner_registration")) == 1
        # A token that expires within 60 s is replaced before the next call.
        await actions_sim.control.configure(admin_token_ttl=30)
        await client.refresh_admin_token(force=True)
        await client.get_scale_set_by_name("x")
        await client.get_scale_set_by_name("x")
    assert len(await endpoint_calls(actions_sim, "runner_registration")) == 4


async def test_expired_admin_token_401_triggers_one_refresh(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        await client.get_scale_set_by_name("x")
        await actions_sim.control.advance_clock(3 * 3600)  # every token the sim issued is now expired
        assert await client.get_scale_set_by_name("x") is None
    statuses = [r.status for r in await endpoint_calls(actions_sim, "get_scale_set_by_name")]
    assert statuses == [200, 401, 200]
    assert len(await endpoint_calls(actions_sim, "runner_registration")) == 2


async def test_failed_refresh_keeps_the_old_token(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        await client.get_scale_set_by_name("x")
        await actions_sim.control.set_fault("registration_token", status=404, count=None)
        with pytest.raises(ActionsHTTPError) as info:
            await client.refresh_admin_token(force=True)
        assert info.value.status == 404
        assert await client.get_scale_set_by_name("x") is None  # the old admin token still works


async def test_user_agent_is_the_system_info_document(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client:
        scale_set = await client.create_scale_set("ua")
        client.set_system_info(
            msgspec.structs.replace(client.system_info, scale_set_id=scale_set.id, subsystem="listener")
        )
        await client.get_scale_set(scale_set.id)
    agent = json.loads((await endpoint_calls(actions_sim, "get_scale_set"))[0].headers["User-Agent"])
    assert agent == json.loads(SystemInfo(scale_set_id=scale_set.id, subsystem="listener").user_agent())
    admin = (await endpoint_calls(actions_sim, "get_scale_set"))[0]
    assert "api-version=6.0-preview" in admin.query
    assert admin.headers["Authorization"].startswith("Bearer")


async def test_concurrent_first_calls_share_one_refresh(actions_sim: ActionsSim) -> None:
    async with pat_client(actions_sim) as client, anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(client.get_scale_set_by_name, f"set-{i}")
    assert len(await endpoint_calls(actions_sim, "runner_registration")) == 1
