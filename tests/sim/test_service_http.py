"""The simulated Actions service and GitHub REST surface, over HTTP."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from services.embedded.actions_sim.settings import generate_private_key_pem
from tests.fixtures.actions_sim import ActionsSim
from tests.sim.conftest import Service, app_jwt, job_events
from tests.support.eventually import eventually

pytestmark = pytest.mark.anyio


# -- GitHub REST: credentials, registration tokens, the exchange ---------------------------------


@pytest.mark.parametrize(
    ("path", "config"),
    [
        ("orgs/octo-org", "/octo-org"),
        ("repos/octo-org/octo-repo", "/octo-org/octo-repo"),
        ("enterprises/octo-enterprise", "/enterprises/octo-enterprise"),
    ],
)
async def test_pat_auth_chain_for_every_scope(service: Service, path: str, config: str) -> None:
    reg = await service.registration_token(path)
    assert reg.status == 201
    assert reg.headers["X-GitHub-Request-Id"]
    assert set(reg.json()) >= {"token", "expires_at"}
    reply = await service.exchange(service.sim.url + config, reg.json()["token"])
    assert reply.status == 201
    body = reply.json()
    assert body["url"].startswith(service.sim.url + "/_services/pipelines/") and body["url"].endswith("/")
    _header, payload, _ = body["token"].split(".")
    assert isinstance(msgspec.json.decode(_b64(payload))["exp"], int)
    groups = await service.call(
        "GET", body["url"] + "_apis/runtime/runnergroups/", token=body["token"], params={"groupName": "default"}
    )
    assert groups.status == 200
    assert groups.json() == {"count": 1, "value": [{"id": 1, "name": "Default", "size": 0, "isDefaultGroup": True}]}
    assert groups.headers["ActivityId"]


def _b64(segment: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


async def test_bad_credentials_and_unknown_scopes_are_rejected(service: Service) -> None:
    assert (await service.registration_token(credential="ghp_wrong")).status == 401
    assert (await service.registration_token("orgs/nobody")).status == 404
    reg = await service.registration_token("orgs/octo-org")
    wrong_scope = await service.exchange(service.sim.config_url("octo-org", "octo-repo"), reg.json()["token"])
    assert wrong_scope.status == 404
    assert (await service.exchange(service.sim.config_url(), "AREGnotissued")).status == 401


async def test_github_app_jwt_is_verified_before_an_installation_token(service: Service) -> None:
    sim = service.sim
    url = f"{sim.url}/api/v3/app/installations/{sim.installation_id}/access_tokens"
    good = await service.call("POST", url, token=app_jwt(sim))
    assert good.status == 201
    install_token = good.json()["token"]
    assert (await service.call("POST", url, token=app_jwt(sim, iss=sim.client_id))).status == 201
    other_key = generate_private_key_pem()
    assert (await service.call("POST", url, token=app_jwt(sim, key_pem=other_key))).status == 401
    assert (await service.call("POST", url, token=app_jwt(sim, lifetime=660))).status == 401
    assert (await service.call("POST", url, token=app_jwt(sim, iss="999"))).status == 401
    unknown = f"{sim.url}/api/v3/app/installations/1/access_tokens"
    assert (await service.call("POST", unknown, token=app_jwt(sim))).status == 404

    lookup = await service.call("GET", f"{sim.url}/api/v3/orgs/octo-org/installation", token=app_jwt(sim))
    assert lookup.status == 200 and lookup.json()["id"] == sim.installation_id

    # The installation token works for its org, not for the enterprise (apps cannot do enterprise).
    assert (await service.registration_token("orgs/octo-org", credential=install_token)).status == 201
    assert (await service.registration_token("enterprises/octo-enterprise", credential=install_token)).status == 403


async def test_expired_admin_token_gets_401(service: Service) -> None:
    assert (await service.admin("GET", "_apis/runtime/runnerscalesets")).status == 200
    await service.sim.control.advance_clock(3600)
    reply = await service.admin("GET", "_apis/runtime/runnerscalesets")
    assert reply.status == 401
    assert "VssUnauthorizedException" in reply.json()["typeName"]
    assert service.admin_token not in reply.raw.decode()


async def test_admin_token_is_bound_to_its_tenant(service: Service) -> None:
    own_base = service.base
    await service.login(service.sim.config_url("octo-org", "octo-repo"), path="repos/octo-org/octo-repo")
    assert own_base != service.base
    reply = await service.call("GET", own_base + "_apis/runtime/runnerscalesets", token=service.admin_token)
    assert reply.status == 401


# -- scale sets, runner groups, runners ---------------------------------------------------------


async def test_scale_set_crud_and_lookup(service: Service) -> None:
    created = await service.create_scale_set("linux", ["linux", "x64"])
    assert created["id"] == 1 and created["runnerGroupName"] == "Default"
    assert created["RunnerSetting"]["disableUpdate"] is True
    assert set(created["statistics"]) == {
        "totalAvailableJobs",
        "totalAcquiredJobs",
        "totalAssignedJobs",
        "totalRunningJobs",
        "totalRegisteredRunners",
        "totalBusyRunners",
        "totalIdleRunners",
    }
    dup = await service.admin("POST", "_apis/runtime/runnerscalesets", {"name": "linux", "runnerGroupId": 1})
    assert dup.status == 409
    by_name = await service.admin("GET", "_apis/runtime/runnerscalesets")
    assert by_name.json()["count"] == 1
    found = await service.call(
        "GET",
        service.base + "_apis/runtime/runnerscalesets",
        token=service.admin_token,
        params={"runnerGroupId": "1", "name": "linux", "api-version": "6.0-preview"},
    )
    assert found.json()["count"] == 1 and found.json()["value"][0]["id"] == created["id"]
    none = await service.call(
        "GET",
        service.base + "_apis/runtime/runnerscalesets",
        token=service.admin_token,
        params={"runnerGroupId": "1", "name": "other"},
    )
    assert none.json() == {"count": 0, "value": []}

    patched = await service.admin(
        "PATCH",
        f"_apis/runtime/runnerscalesets/{created['id']}",
        {"name": "linux-renamed", "RunnerSetting": {}, "createdOn": "0001-01-01T00:00:00Z"},
    )
    assert patched.status == 200 and patched.json()["name"] == "linux-renamed"
    assert [lb["name"] for lb in patched.json()["labels"]] == ["linux", "x64"]

    assert (await service.admin("DELETE", f"_apis/runtime/runnerscalesets/{created['id']}")).status == 204
    gone = await service.admin("GET", f"_apis/runtime/runnerscalesets/{created['id']}")
    assert gone.status == 404 and "RunnerScaleSetNotFoundException" in gone.json()["typeName"]


async def test_bad_request_bodies_name_the_request_and_field(service: Service) -> None:
    reply = await service.admin("POST", "_apis/runtime/runnerscalesets", {"name": "x", "runnerGroupId": "one"})
    assert reply.status == 400
    assert "create runner scale set" in reply.json()["message"] and "runnerGroupId" in reply.json()["message"]
    no_name = await service.admin("POST", "_apis/runtime/runnerscalesets", {"runnerGroupId": 1})
    assert no_name.status == 400 and "name" in no_name.json()["message"]


async def test_custom_labels_dropped_in_ghes_without_custom_labels(service: Service) -> None:
    await service.sim.control.configure(drop_custom_labels=True)
    created = await service.create_scale_set("linux", ["linux", "gpu"])
    assert created["labels"] == [{"name": "linux", "type": "System"}]


async def test_runner_registration_lookup_and_removal(service: Service) -> None:
    ss = await service.create_scale_set()
    jit = await service.jit(ss["id"], "runner-1")
    assert jit.status == 200
    runner = jit.json()["runner"]
    assert runner["name"] == "runner-1" and runner["runnerScaleSetId"] == ss["id"]
    assert jit.json()["encodedJITConfig"]
    again = await service.jit(ss["id"], "runner-1")
    assert again.status == 409 and "AgentExistsException" in again.json()["typeName"]

    by_id = await service.admin("GET", f"_apis/distributedtask/pools/0/agents/{runner['id']}")
    assert by_id.status == 200 and by_id.json()["name"] == "runner-1"
    by_name = await service.call(
        "GET",
        service.base + "_apis/distributedtask/pools/0/agents",
        token=service.admin_token,
        params={"agentName": "runner-1"},
    )
    assert by_name.json()["count"] == 1
    assert (await service.admin("DELETE", f"_apis/distributedtask/pools/0/agents/{runner['id']}")).status == 204
    missing = await service.admin("GET", f"_apis/distributedtask/pools/0/agents/{runner['id']}")
    assert missing.status == 404 and "AgentNotFoundException" in missing.json()["typeName"]
    # As the service: removing a runner that is gone is 404 AgentNotFoundException (clients treat
    # it as "already removed", so a retry after a lost 204 is no permanent failure).
    removed_again = await service.admin("DELETE", f"_apis/distributedtask/pools/0/agents/{runner['id']}")
    assert removed_again.status == 404 and "AgentNotFoundException" in removed_again.json()["typeName"]


# -- sessions and the message queue -------------------------------------------------------------


async def test_one_live_session_per_scale_set(service: Service) -> None:
    ss = await service.create_scale_set()
    first = await service.create_session(ss["id"])
    assert first.status == 200
    session = first.json()
    assert session["statistics"] is not None and session["runnerScaleSet"]["id"] == ss["id"]
    second = await service.create_session(ss["id"], owner="other-host")
    assert second.status == 409
    assert second.json()["typeName"] == (
        "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException, GitHub.Actions.Runtime.WebApi"
    )
    assert second.json()["message"] == "The actions runner scaleset linux already has an active session."

    session_path = f"_apis/runtime/runnerscalesets/{ss['id']}/sessions/{session['sessionId']}"
    refreshed = await service.admin("PATCH", session_path)
    assert refreshed.status == 200
    assert refreshed.json()["messageQueueAccessToken"] != session["messageQueueAccessToken"]

    path = f"_apis/runtime/runnerscalesets/{ss['id']}/sessions/{session['sessionId']}"
    assert (await service.admin("DELETE", path)).status == 204
    assert (await service.admin("DELETE", path)).status == 404
    assert (await service.create_session(ss["id"])).status == 200
    unknown = await service.create_session(999)
    assert unknown.status == 404 and "RunnerScaleSetNotFoundException" in unknown.json()["typeName"]


async def test_long_poll_returns_202_after_the_configured_wait(service: Service) -> None:
    await service.sim.control.configure(poll_wait=0.4)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    started = anyio.current_time()
    reply = await service.poll(session)
    elapsed = anyio.current_time() - started
    assert reply.status == 202 and reply.raw == b""
    assert 0.35 <= elapsed < 5


async def poll_in_flight(service: Service) -> bool:
    return bool((await service.sim.control.sessions())[0].polls_in_flight)


async def test_a_message_arriving_during_the_poll_returns_at_once(service: Service) -> None:
    await service.sim.control.configure(poll_wait=30)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    replies = []

    async def poll() -> None:
        replies.append(await service.poll(session))

    with anyio.fail_after(10):  # far below the 30 s hold: the poll must end early
        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await eventually(lambda: poll_in_flight(service), interval=0.01, what="the poll held by the service")
            await service.sim.control.enqueue_jobs(count=2, labels=["linux"])
    [reply] = replies
    assert reply.status == 200
    message = reply.json()
    assert message["messageType"] == "RunnerScaleSetJobMessages"
    assert isinstance(message["body"], str)
    events = job_events(message)
    assert [e["messageType"] for e in events] == ["JobAssigned", "JobAssigned"]
    assert message["statistics"]["totalAssignedJobs"] == 2
    assert isinstance(events[0]["jobId"], str) and events[0]["runnerRequestId"] > 0


async def test_ack_stops_redelivery_and_last_message_id_skips(service: Service) -> None:
    await service.sim.control.configure(poll_wait=0.1)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.enqueue_jobs(labels=["linux"])
    first = (await service.poll(session)).json()
    assert first["messageId"] > 100_000_000
    assert (await service.poll(session)).json()["messageId"] == first["messageId"]  # unacked: redelivered
    assert (await service.poll(session, last=first["messageId"])).status == 202
    assert (await service.ack(session, first["messageId"])).status == 204
    assert (await service.poll(session)).status == 202


async def test_bad_capacity_header_is_400_text_plain(service: Service) -> None:
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    reply = await service.poll(session, capacity="-1")
    assert reply.status == 400 and reply.headers["Content-Type"].startswith("text/plain")


async def test_capacity_header_limits_assignment(service: Service) -> None:
    await service.sim.control.configure(poll_wait=0.2)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    assert (await service.poll(session, capacity="1")).status == 202
    await service.sim.control.enqueue_jobs(count=3, labels=["linux"])
    message = (await service.poll(session, capacity="1")).json()
    assert message["statistics"]["totalAssignedJobs"] == 1
    assert len(job_events(message)) == 1


async def test_expired_queue_token_is_401_and_refresh_fixes_it(service: Service) -> None:
    await service.sim.control.configure(queue_token_ttl=60, session_idle_timeout=10_000)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.advance_clock(120)
    assert (await service.poll(session)).status == 401
    await service.login()  # the admin token expired as well
    session_path = f"_apis/runtime/runnerscalesets/{ss['id']}/sessions/{session['sessionId']}"
    refreshed = await service.admin("PATCH", session_path)
    await service.sim.control.configure(poll_wait=0.1)
    assert (await service.poll(refreshed.json())).status == 202


async def test_evicted_session_and_vanished_scale_set_answer_404(service: Service) -> None:
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.evict_session(session["sessionId"])
    assert (await service.poll(session)).status == 404
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.delete_scale_set(ss["id"])
    assert (await service.poll(session)).status == 404
    assert (await service.create_session(ss["id"])).status == 404
    assert (await service.jit(ss["id"], "r")).status == 404


async def test_ghes_flow_acquire_jobs_with_the_queue_token(service: Service) -> None:
    await service.sim.control.configure(mode="ghes")
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.enqueue_jobs(count=2, labels=["linux"])
    message = (await service.poll(session)).json()
    available = job_events(message)
    assert [e["messageType"] for e in available] == ["JobAvailable"] * 2
    assert message["statistics"]["totalAvailableJobs"] == 2
    assert available[0]["acquireJobUrl"] == service.base + f"_apis/runtime/runnerscalesets/{ss['id']}/acquirejobs"
    await service.ack(session, message["messageId"])
    ids = [e["runnerRequestId"] for e in available]
    url = service.base + f"_apis/runtime/runnerscalesets/{ss['id']}/acquirejobs"
    with_admin = await service.call("POST", url, token=service.admin_token, json=ids)
    assert with_admin.status == 401  # J1 takes the message-queue token, not the admin token
    acquired = await service.call("POST", url, token=session["messageQueueAccessToken"], json=[*ids, 1])
    assert acquired.status == 200 and acquired.json() == {"count": 2, "value": ids}
    assigned = (await service.poll(session, last=message["messageId"])).json()
    assert [e["messageType"] for e in job_events(assigned)] == ["JobAssigned"] * 2
    assert assigned["statistics"]["totalAssignedJobs"] == 2


async def test_zero_runner_request_id_mode(service: Service) -> None:
    await service.sim.control.configure(zero_runner_request_id=True)
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await service.sim.control.enqueue_jobs(labels=["linux"])
    [event] = job_events((await service.poll(session)).json())
    assert event["runnerRequestId"] == 0 and event["jobId"]


async def test_request_log_keeps_headers_but_not_credentials(service: Service, actions_sim: ActionsSim) -> None:
    ss = await service.create_scale_set()
    session = (await service.create_session(ss["id"])).json()
    await actions_sim.control.configure(poll_wait=0.1)
    await service.poll(session, capacity="7")
    polls = [r for r in await actions_sim.control.requests() if r.endpoint == "get_message"]
    assert polls[-1].headers["X-ScaleSetMaxCapacity"] == "7"
    assert polls[-1].headers["Authorization"] == "Bearer"
    registration = [r for r in await actions_sim.control.requests() if r.endpoint == "runner_registration"]
    assert registration[0].headers["Authorization"] == "RemoteAuth"


async def test_https_with_a_custom_root_ca(actions_sim_tls: ActionsSim) -> None:
    import ssl

    import aiohttp

    sim = actions_sim_tls
    assert sim.url.startswith("https://")
    context = ssl.create_default_context(cadata=sim.ca_pem)
    async with aiohttp.ClientSession() as http:
        svc = Service(sim, http)
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await svc.registration_token()  # the system roots do not know the simulator's CA
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
        svc = Service(sim, http)
        await svc.login()
        assert svc.base.startswith("https://")
        assert (await svc.admin("GET", "_apis/runtime/runnergroups/")).status == 200
    assert len(await sim.control.requests()) == 3


async def test_absolute_form_request_from_a_proxy_gets_urls_with_the_real_port(actions_sim: ActionsSim) -> None:
    """A forward proxy may send `POST http://127.0.0.1:PORT/...`; the service URL handed back must
    keep the port, or every later call goes to port 80."""
    import json as _json
    from urllib.parse import urlsplit

    import aiohttp
    import anyio

    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{actions_sim.url}/api/v3/orgs/{actions_sim.org}/actions/runners/registration-token",
            headers={"Authorization": f"Bearer {actions_sim.pat}"},
        ) as r,
    ):
        assert r.status == 201
        reg_token = (await r.json())["token"]
    base = urlsplit(actions_sim.url)
    body = _json.dumps({"url": actions_sim.config_url(), "runner_event": "register"}).encode()
    request = (
        f"POST {actions_sim.url}/api/v3/actions/runner-registration HTTP/1.1\r\n"
        f"Host: {base.hostname}\r\nAuthorization: RemoteAuth {reg_token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    assert base.hostname is not None and base.port is not None, actions_sim.url
    with anyio.fail_after(10):
        stream = await anyio.connect_tcp(base.hostname, base.port)
        async with stream:
            await stream.send(request)
            raw = b""
            try:
                while True:
                    raw += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert b" 201 " in head.split(b"\r\n")[0], head
    url = _json.loads(payload)["url"]
    assert urlsplit(url).port == base.port, url
