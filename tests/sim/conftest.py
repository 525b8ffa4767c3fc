"""HTTP helpers for the simulator's own tests: a thin raw-HTTP walker of the auth chain.

Deliberately not the project's Actions client (tests/contract covers that): these tests pin the
simulator's wire behaviour byte by byte.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import jwt
import msgspec
import pytest

from tests.fixtures.actions_sim import ActionsSim

API_VERSION = {"api-version": "6.0-preview"}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.raw.removeprefix(b"\xef\xbb\xbf"))


@dataclass
class Service:
    """An admin-authenticated view of one simulator tenant."""

    sim: ActionsSim
    http: aiohttp.ClientSession
    base: str = ""
    admin_token: str = ""

    async def call(
        self,
        method: str,
        url: str,
        *,
        token: str | None = None,
        scheme: str = "Bearer",
        json: Any = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> Reply:
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"{scheme} {token}"
        data = None if json is None else msgspec.json.encode(json)
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        async with self.http.request(method, url, data=data, headers=hdrs, params=params) as resp:
            return Reply(resp.status, dict(resp.headers), await resp.read())

    async def registration_token(self, path: str = "orgs/octo-org", credential: str | None = None) -> Reply:
        url = f"{self.sim.url}/api/v3/{path}/actions/runners/registration-token"
        return await self.call("POST", url, token=credential or self.sim.pat)

    async def exchange(self, config_url: str, registration_token: str) -> Reply:
        return await self.call(
            "POST",
            f"{self.sim.url}/api/v3/actions/runner-registration",
            token=registration_token,
            scheme="RemoteAuth",
            json={"url": config_url, "runner_event": "register"},
        )

    async def login(self, config_url: str | None = None, path: str = "orgs/octo-org") -> None:
        reg = await self.registration_token(path)
        assert reg.status == 201, reg.raw
        reply = await self.exchange(config_url or self.sim.config_url(), reg.json()["token"])
        assert reply.status == 201, reply.raw
        self.base, self.admin_token = reply.json()["url"], reply.json()["token"]

    async def admin(self, method: str, path: str, json: Any = None, **kw: Any) -> Reply:
        return await self.call(method, self.base + path, token=self.admin_token, json=json, params=API_VERSION, **kw)

    async def create_scale_set(self, name: str = "linux", labels: list[str] | None = None) -> dict[str, Any]:
        body = {
            "name": name,
            "runnerGroupId": 1,
            "labels": [{"type": "System", "name": n} for n in (labels or [name])],
            "RunnerSetting": {"disableUpdate": True},
            "createdOn": "0001-01-01T00:00:00Z",
        }
        reply = await self.admin("POST", "_apis/runtime/runnerscalesets", body)
        assert reply.status == 200, reply.raw
        created: dict[str, Any] = reply.json()
        return created

    async def create_session(self, scale_set_id: int, owner: str = "test-host") -> Reply:
        body = {"sessionId": "00000000-0000-0000-0000-000000000000", "ownerName": owner}
        return await self.admin("POST", f"_apis/runtime/runnerscalesets/{scale_set_id}/sessions", body)

    async def poll(self, session: dict[str, Any], *, last: int = 0, capacity: str = "10") -> Reply:
        params = {"lastMessageId": str(last)} if last else None
        return await self.call(
            "GET",
            session["messageQueueUrl"],
            token=session["messageQueueAccessToken"],
            params=params,
            headers={"X-ScaleSetMaxCapacity": capacity, "Accept": "application/json; api-version=6.0-preview"},
        )

    async def ack(self, session: dict[str, Any], message_id: int) -> Reply:
        url, _, query = session["messageQueueUrl"].partition("?")
        return await self.call("DELETE", f"{url}/{message_id}?{query}", token=session["messageQueueAccessToken"])

    async def jit(self, scale_set_id: int, name: str) -> Reply:
        return await self.admin(
            "POST", f"_apis/runtime/runnerscalesets/{scale_set_id}/generatejitconfig", {"name": name, "workFolder": ""}
        )


def app_jwt(sim: ActionsSim, *, key_pem: str | None = None, lifetime: int = 540, iss: str | None = None) -> str:
    now = int(time.time())
    claims = {"iat": now - 60, "exp": now - 60 + lifetime, "iss": iss or str(sim.app_id)}
    return jwt.encode(claims, key_pem or sim.app_private_key_pem, algorithm="RS256")


def job_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    return msgspec.json.decode(message["body"]) if message["body"] else []


@pytest.fixture
async def service(actions_sim: ActionsSim) -> AsyncIterator[Service]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        svc = Service(actions_sim, http)
        await svc.login()
        yield svc
