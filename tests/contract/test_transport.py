"""Transport behaviour against a scripted real HTTP server: retries, waits, deadlines, headers,
the auth chain's refresh rules, protocol errors, TLS roots and proxies."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import itertools
import json
import ssl
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shared.actions import (
    ActionsClient,
    ActionsHTTPError,
    AuthenticationError,
    ClientConfigError,
    DeadlineExceededError,
    EmptyQueueUrlError,
    MessageDecodeError,
    MessageSessionClient,
    PersonalAccessToken,
    ProtocolError,
    RateLimitedError,
    ServiceUnavailableError,
    TokenExpiredError,
    TransportError,
)
from shared.actions.models import MessageSession, ScaleSetStatistics
from tests.contract.conftest import FAST
from tests.contract.scripted import RecordingProxy, ScriptedServer, Step

pytestmark = pytest.mark.anyio

PAT = "ghp_scriptedPAT0000000000000001"
SCALE_SETS = "/tenant/123/_apis/runtime/runnerscalesets/7"
SCALE_SET = {"id": 7, "name": "s", "runnerGroupId": 1, "labels": [{"type": "System", "name": "s"}], "RunnerSetting": {}}


def client_for(server: ScriptedServer, **kwargs: object) -> ActionsClient:
    kwargs.setdefault("settings", FAST)
    kwargs.setdefault("environ", {})  # no proxy or GHES override from the developer's shell
    return ActionsClient.from_config(server.config_url(), PersonalAccessToken(PAT), **kwargs)  # type: ignore[arg-type]


def gaps(server: ScriptedServer, method: str, path: str) -> list[float]:
    times = [r.at for r in server.calls(method, path)]
    return [b - a for a, b in itertools.pairwise(times)]


async def test_5xx_is_retried_four_times_with_doubling_waits(scripted: ScriptedServer) -> None:
    scripted.script("GET", SCALE_SETS, *[Step(500)] * 3, Step(503), Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        got = await client.get_scale_set(7)
        assert got is not None and got.id == 7
    waits = gaps(scripted, "GET", SCALE_SETS)
    assert len(waits) == 4
    for wait, expected in zip(waits, [0.02, 0.04, 0.08, 0.16], strict=True):
        assert wait >= expected * 0.9


async def test_5xx_storm_gives_up_after_five_attempts(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(502, "bad gateway", {"Content-Type": "text/plain"}))
    async with client_for(scripted) as client:
        with pytest.raises(ServiceUnavailableError) as info:
            await client.get_scale_set(7)
    assert len(scripted.calls("GET", SCALE_SETS)) == 5
    assert info.value.status == 502 and "bad gateway" in str(info.value)
    assert f"GET 127.0.0.1:{scripted.port}{SCALE_SETS}" in str(info.value)


@pytest.mark.parametrize("status", [501, 400, 403, 404, 409])
async def test_non_retryable_statuses_are_tried_once(scripted: ScriptedServer, status: int) -> None:
    scripted.default("GET", SCALE_SETS, Step(status, {"typeName": "Some.Exception, X", "message": "no"}))
    async with client_for(scripted) as client:
        with pytest.raises(ActionsHTTPError) as info:
            await client.get_scale_set(7)
    assert info.value.status == status
    assert len(scripted.calls("GET", SCALE_SETS)) == 1


async def test_429_retry_after_replaces_the_backoff(scripted: ScriptedServer) -> None:
    scripted.script("GET", SCALE_SETS, Step(429, None, {"Retry-After": "1"}), Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        await client.get_scale_set(7)
    assert gaps(scripted, "GET", SCALE_SETS)[0] >= 0.95


async def test_retry_after_beyond_the_limit_fails_fast_with_the_hint(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(429, None, {"Retry-After": "3600"}))
    async with client_for(scripted) as client:
        with pytest.raises(RateLimitedError) as info:
            await client.get_scale_set(7)
    assert len(scripted.calls("GET", SCALE_SETS)) == 1
    assert info.value.retry_after == 3600


async def test_dropped_connection_is_retried(scripted: ScriptedServer) -> None:
    scripted.script("GET", SCALE_SETS, Step(drop=True), Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        got = await client.get_scale_set(7)
        assert got is not None and got.name == "s"
    assert len(scripted.calls("GET", SCALE_SETS)) == 2


async def test_slow_attempt_times_out_and_is_retried(scripted: ScriptedServer) -> None:
    scripted.script("GET", SCALE_SETS, Step(200, SCALE_SET, delay=2.0), Step(200, SCALE_SET))
    settings = msgspec.structs.replace(FAST, request_timeout=0.3)
    async with client_for(scripted, settings=settings) as client:
        got = await client.get_scale_set(7)
        assert got is not None and got.id == 7
    assert len(scripted.calls("GET", SCALE_SETS)) == 2


async def test_call_deadline_bounds_all_attempts(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET, delay=3.0))
    async with client_for(scripted, timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError) as info:
            await client.get_scale_set(7)
    assert time.monotonic() - started < 2.0
    assert "deadline" in str(info.value) and SCALE_SETS in str(info.value)


async def test_connection_refused_is_a_transport_error_after_retries() -> None:
    server = ScriptedServer()
    await server.start()
    await server.stop()  # the port is now closed
    async with ActionsClient.from_config(
        server.config_url(), PersonalAccessToken(PAT), settings=FAST, environ={}
    ) as client:
        with pytest.raises(TransportError) as info:
            await client.get_scale_set(7)
    assert "giving up after 5 attempt(s)" in str(info.value)
    assert "registration-token" in str(info.value)


async def test_headers_of_each_request_class(scripted: ScriptedServer) -> None:
    queue_url = f"{scripted.url}/queue/message?sessionKey=abc"
    session = MessageSession(
        session_id="s1", message_queue_url=queue_url, message_queue_access_token="queue-token-xyz123"
    )
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    scripted.default("GET", "/queue/message", Step(202))
    scripted.default("DELETE", "/queue/message/100000005", Step(204))
    async with client_for(scripted) as client:
        await client.get_scale_set(7)
        assert await client.get_message(session, last_message_id=100000004, max_capacity=12) is None
        await client.delete_message(session, 100000005)
    reg = scripted.calls("POST", "/api/v3/orgs/octo-org/actions/runners/registration-token")[0]
    assert reg.headers["Authorization"] == f"Bearer {PAT}"
    assert reg.headers["Content-Type"] == "application/vnd.github.v3+json"
    exchange = scripted.calls("POST", "/api/v3/actions/runner-registration")[0]
    assert exchange.headers["Authorization"] == "RemoteAuth regtoken-abcdef-123456"
    assert json.loads(exchange.body) == {"url": scripted.config_url(), "runner_event": "register"}
    admin = scripted.calls("GET", SCALE_SETS)[0]
    assert admin.query == {"api-version": "6.0-preview"}
    assert admin.headers["Authorization"].startswith("Bearer ey")
    agent = json.loads(admin.headers["User-Agent"])
    assert list(agent) == [
        "system",
        "version",
        "commit_sha",
        "scale_set_id",
        "subsystem",
        "build_version",
        "build_commit_sha",
        "kind",
    ]
    poll = scripted.calls("GET", "/queue/message")[0]
    assert poll.query == {"sessionKey": "abc", "lastMessageId": "100000004"}
    assert poll.headers["X-ScaleSetMaxCapacity"] == "12"
    assert poll.headers["Accept"] == "application/json; api-version=6.0-preview"
    assert poll.headers["Authorization"] == "Bearer queue-token-xyz123"
    ack = scripted.calls("DELETE", "/queue/message/100000005")[0]
    assert ack.query == {"sessionKey": "abc"} and ack.headers["Authorization"] == "Bearer queue-token-xyz123"


async def test_registration_exchange_retries_401_then_succeeds(scripted: ScriptedServer) -> None:
    scripted.script("POST", "/api/v3/actions/runner-registration", Step(401), Step(403))
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        await client.get_scale_set(7)
    assert len(scripted.calls("POST", "/api/v3/actions/runner-registration")) == 3


async def test_registration_exchange_gives_up_with_authentication_error(scripted: ScriptedServer) -> None:
    scripted.default("POST", "/api/v3/actions/runner-registration", Step(401, {"message": "Bad credentials"}))
    async with client_for(scripted) as client:
        with pytest.raises(AuthenticationError):
            await client.get_scale_set(7)
    assert len(scripted.calls("POST", "/api/v3/actions/runner-registration")) == 5


async def test_bad_pat_is_not_retried_and_not_echoed(scripted: ScriptedServer) -> None:
    path = "/api/v3/orgs/octo-org/actions/runners/registration-token"
    scripted.default(
        "POST", path, Step(401, {"message": f"Bad credentials for {PAT}"}, {"X-GitHub-Request-Id": "GH:1"})
    )
    async with client_for(scripted) as client:
        with pytest.raises(AuthenticationError) as info:
            await client.get_scale_set(7)
    assert len(scripted.calls("POST", path)) == 1
    assert PAT not in str(info.value) and info.value.github_request_id == "GH:1"


async def test_admin_token_is_reused_until_near_expiry(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        for _ in range(3):
            await client.get_scale_set(7)
        assert scripted.exchanges == 1
        scripted.admin_ttl = 30  # inside the 60 s margin: every call refreshes
        await client.refresh_admin_token(force=True)
        await client.get_scale_set(7)
        await client.get_scale_set(7)
    assert scripted.exchanges == 4


async def test_failed_refresh_keeps_the_previous_token(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        await client.get_scale_set(7)
        token_before = scripted.calls("GET", SCALE_SETS)[0].headers["Authorization"]
        scripted.default(
            "POST", "/api/v3/orgs/octo-org/actions/runners/registration-token", Step(404, {"message": "Not Found"})
        )
        with pytest.raises(ActionsHTTPError, match="registration token"):
            await client.refresh_admin_token(force=True)
        await client.get_scale_set(7)
    assert scripted.calls("GET", SCALE_SETS)[-1].headers["Authorization"] == token_before


async def test_admin_401_forces_one_refresh_then_gives_up(scripted: ScriptedServer) -> None:
    scripted.script("GET", SCALE_SETS, Step(401), Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        got = await client.get_scale_set(7)
        assert got is not None and got.id == 7
        assert scripted.exchanges == 2
        scripted.default("GET", SCALE_SETS, Step(401))
        with pytest.raises(TokenExpiredError):
            await client.get_scale_set(7)
    assert scripted.exchanges == 3


@pytest.mark.parametrize(
    ("step", "error", "fragment"),
    [
        (Step(201, SCALE_SET), ProtocolError, "unexpected status 201"),
        (Step(200, "{not json"), ProtocolError, "does not match the protocol"),
        (Step(200, {"name": "no id"}), ProtocolError, "`id`"),
        (Step(200, ""), ProtocolError, "empty body"),
    ],
)
async def test_garbled_responses_are_protocol_errors_naming_the_request(
    scripted: ScriptedServer, step: Step, error: type, fragment: str
) -> None:
    scripted.default("POST", "/tenant/123/_apis/runtime/runnerscalesets", step)
    async with client_for(scripted) as client:
        with pytest.raises(error) as info:
            await client.create_scale_set("s")
    assert fragment in str(info.value)
    assert "POST" in str(info.value) and "/_apis/runtime/runnerscalesets" in str(info.value)


async def test_bom_before_json_is_stripped(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(200, b"\xef\xbb\xbf" + json.dumps(SCALE_SET).encode()))
    async with client_for(scripted) as client:
        got = await client.get_scale_set(7)
        assert got is not None and got.id == 7


async def test_poll_204_is_an_error_and_empty_200_is_a_decode_error(scripted: ScriptedServer) -> None:
    session = MessageSession(
        session_id="s1", message_queue_url=f"{scripted.url}/queue/message", message_queue_access_token="qtoken-12345678"
    )
    scripted.script("GET", "/queue/message", Step(204), Step(200, ""))
    async with client_for(scripted) as client:
        with pytest.raises(ProtocolError, match="unexpected status 204"):
            await client.get_message(session, 0, 1)
        with pytest.raises(MessageDecodeError, match="empty body"):
            await client.get_message(session, 0, 1)


async def test_session_without_queue_url_is_rejected(scripted: ScriptedServer) -> None:
    stats = {"totalAssignedJobs": 0}
    scripted.default(
        "POST",
        f"{SCALE_SETS}/sessions",
        Step(
            200,
            {"sessionId": "s1", "messageQueueUrl": "", "messageQueueAccessToken": "t-12345678", "statistics": stats},
        ),
    )
    async with client_for(scripted) as client:
        with pytest.raises(EmptyQueueUrlError):
            await client.create_message_session(7, "me")


async def test_invalid_max_capacity_is_rejected_before_sending(scripted: ScriptedServer) -> None:
    session = MessageSession(
        session_id="s1", message_queue_url=f"{scripted.url}/queue/message", message_queue_access_token="qtoken-12345678"
    )
    async with client_for(scripted) as client:
        with pytest.raises(ValueError, match="max_capacity"):
            await client.get_message(session, 0, -1)
    assert scripted.calls("GET", "/queue/message") == []


def _tls_material(tmp_path: Path) -> tuple[bytes, ssl.SSLContext]:
    """A CA and a leaf for 127.0.0.1; returns (CA PEM, server SSL context)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "runnerscale test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "leaf.pem", tmp_path / "leaf.key"
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return ca.public_bytes(serialization.Encoding.PEM), context


async def test_custom_root_ca_is_trusted_and_its_absence_is_a_tls_error(tmp_path: Path) -> None:
    ca_pem, server_context = _tls_material(tmp_path)
    server = ScriptedServer()
    await server.start(ssl_context=server_context)
    try:
        server.default("GET", SCALE_SETS, Step(200, SCALE_SET))
        async with client_for(server, root_ca=ca_pem) as client:
            got = await client.get_scale_set(7)
            assert got is not None and got.id == 7
            assert client.debug_info()["has_root_ca"] is True
        before = len(server.requests)
        async with client_for(server) as client:
            with pytest.raises(TransportError, match="TLS"):
                await client.get_scale_set(7)
        assert len(server.requests) == before
    finally:
        await server.stop()


def test_invalid_root_ca_is_a_config_error() -> None:
    with pytest.raises(ClientConfigError, match="root CA"):
        ActionsClient.from_config("https://github.com/org", PersonalAccessToken(PAT), root_ca="not a pem", environ={})


async def test_explicit_proxy_carries_the_requests(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    proxy = RecordingProxy()
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        async with client_for(scripted, proxy=proxy.url) as client:
            await client.get_scale_set(7)
            assert client.debug_info()["has_proxy"] is True
        tg.cancel_scope.cancel()
    # The proxy logs each connection's first request line; aiohttp reuses the proxied connection.
    assert proxy.request_lines and "/registration-token" in proxy.request_lines[0]
    assert all(line.split(" ")[1].startswith(scripted.url) for line in proxy.request_lines)


async def test_environment_proxy_and_no_proxy(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    proxy = RecordingProxy()
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        async with client_for(scripted, environ={"HTTP_PROXY": proxy.url}) as client:
            await client.get_scale_set(7)
            assert client.debug_info()["has_proxy"] is True
        via_proxy = len(proxy.request_lines)
        async with client_for(
            scripted, environ={"HTTP_PROXY": proxy.url, "NO_PROXY": "example.com,127.0.0.1"}
        ) as client:
            await client.get_scale_set(7)
        tg.cancel_scope.cancel()
    assert via_proxy >= 1
    assert len(proxy.request_lines) == via_proxy


async def test_netrc_entry_for_the_host_does_not_clash_with_our_authorization(
    scripted: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password netrc-password-123\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        got = await client.get_scale_set(7)
        assert got is not None and got.id == 7
    assert scripted.calls("GET", SCALE_SETS)[0].headers["Authorization"].startswith("Bearer ")


async def test_queue_token_in_url_query_never_reaches_error_text(scripted: ScriptedServer) -> None:
    secret = "sessionsecret-in-query-0099"
    session = MessageSession(
        session_id="s1",
        message_queue_url=f"{scripted.url}/queue/message?sig={secret}",
        message_queue_access_token="qtoken-abcdefgh",
    )
    scripted.default("GET", "/queue/message", Step(400, "capacity rejected", {"Content-Type": "text/plain"}))
    async with client_for(scripted) as client:
        with pytest.raises(ActionsHTTPError) as info:
            await client.get_message(session, 0, 3)
    assert secret not in str(info.value) and "qtoken-abcdefgh" not in str(info.value)
    assert "capacity rejected" in str(info.value)


async def test_deadline_covers_the_token_refresh_too(scripted: ScriptedServer) -> None:
    # A slow auth chain and a slow call each fit the deadline; together they must not.
    scripted.default(
        "POST",
        "/api/v3/orgs/octo-org/actions/runners/registration-token",
        Step(201, {"token": "regtoken-abcdef-1"}, delay=0.4),
    )
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET, delay=0.4))
    async with client_for(scripted, timeout=0.6) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            await client.get_scale_set(7)
    assert time.monotonic() - started < 1.0


async def test_https_proxy_tunnels_tls_with_the_custom_root(tmp_path: Path) -> None:
    ca_pem, server_context = _tls_material(tmp_path)
    server = ScriptedServer()
    await server.start(ssl_context=server_context)
    proxy = RecordingProxy()
    try:
        server.default("GET", SCALE_SETS, Step(200, SCALE_SET))
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve)
            tunnel = f"http://u:tunnel-pass-77@127.0.0.1:{proxy.port}"
            environ = {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": tunnel}  # lower case wins
            async with client_for(server, root_ca=ca_pem, environ=environ) as client:
                got = await client.get_scale_set(7)
                assert got is not None and got.id == 7
            tg.cancel_scope.cancel()
    finally:
        await server.stop()
    assert proxy.request_lines[0] == f"CONNECT 127.0.0.1:{server.port} HTTP/1.1"
    assert proxy.authorizations[0] == "Basic " + base64.b64encode(b"u:tunnel-pass-77").decode()


async def test_proxy_credentials_go_in_proxy_authorization(scripted: ScriptedServer) -> None:
    scripted.default("GET", SCALE_SETS, Step(200, SCALE_SET))
    proxy = RecordingProxy()
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        async with client_for(scripted, proxy=f"http://user:proxy-pass-0042@127.0.0.1:{proxy.port}") as client:
            await client.get_scale_set(7)
        tg.cancel_scope.cancel()
    assert proxy.request_lines and "proxy-pass-0042" not in proxy.request_lines[0]
    assert proxy.authorizations[0] == "Basic " + base64.b64encode(b"user:proxy-pass-0042").decode()


async def test_list_and_null_shapes(scripted: ScriptedServer) -> None:
    lists = "/tenant/123/_apis/runtime/runnerscalesets"
    scripted.script(
        "GET",
        lists,
        Step(200, {"count": 0, "value": [SCALE_SET]}),  # the count is trusted over the array
        Step(200, {"count": 2, "value": [SCALE_SET, SCALE_SET]}),
    )
    scripted.default("GET", SCALE_SETS, Step(200, "null"))
    async with client_for(scripted) as client:
        assert await client.get_scale_set_by_name("s") is None
        with pytest.raises(ProtocolError, match="2 scale sets named 's'"):
            await client.get_scale_set_by_name("s")
        assert await client.get_scale_set(7) is None
    query = scripted.calls("GET", lists)[0].query
    assert query == {"runnerGroupId": "1", "name": "s", "api-version": "6.0-preview"}


async def test_create_and_update_bodies(scripted: ScriptedServer) -> None:
    scripted.default("POST", "/tenant/123/_apis/runtime/runnerscalesets", Step(200, SCALE_SET))
    scripted.default("PATCH", SCALE_SETS, Step(200, SCALE_SET))
    async with client_for(scripted) as client:
        await client.create_scale_set("s", runner_group_id=3)
        await client.update_scale_set(7, runner_group_id=4)
        with pytest.raises(ClientConfigError, match="name and labels are both empty"):
            await client.create_scale_set("")
    create = json.loads(scripted.calls("POST", "/tenant/123/_apis/runtime/runnerscalesets")[0].body)
    assert create == {
        "name": "s",
        "runnerGroupId": 3,
        "labels": [{"name": "s", "type": "System"}],
        "RunnerSetting": {"disableUpdate": True},
        "createdOn": "0001-01-01T00:00:00Z",
    }
    update = json.loads(scripted.calls("PATCH", SCALE_SETS)[0].body)
    assert update == {"runnerGroupId": 4, "RunnerSetting": {}, "createdOn": "0001-01-01T00:00:00Z"}


async def test_runaway_body_is_a_protocol_error(scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.actions import http

    monkeypatch.setattr(http, "MAX_BODY_BYTES", 1000)
    scripted.default("GET", SCALE_SETS, Step(200, b"x" * 5000))
    async with client_for(scripted) as client:
        with pytest.raises(ProtocolError, match="exceeds 1000 bytes"):
            await client.get_scale_set(7)
    assert len(scripted.calls("GET", SCALE_SETS)) == 1


async def test_concurrent_queue_401s_share_one_session_refresh(scripted: ScriptedServer) -> None:
    def session_doc(token: str) -> dict[str, Any]:
        return {
            "sessionId": "s1",
            "ownerName": "me",
            "messageQueueUrl": f"{scripted.url}/queue/message",
            "messageQueueAccessToken": token,
            "statistics": {},
        }

    scripted.default("PATCH", f"{SCALE_SETS}/sessions/s1", Step(200, session_doc("queue-token-new-000002")))
    # Both calls are in flight with the old token when their 401s arrive.
    scripted.script("GET", "/queue/message", Step(401, delay=0.2), Step(202))
    scripted.script("POST", f"{SCALE_SETS}/acquirejobs", Step(401, delay=0.2), Step(200, {"count": 1, "value": [5]}))
    async with client_for(scripted) as client:
        session = MessageSessionClient(
            client,
            7,
            MessageSession(
                session_id="s1",
                message_queue_url=f"{scripted.url}/queue/message",
                message_queue_access_token="queue-token-old-000001",
                statistics=ScaleSetStatistics(),
            ),
        )
        results: dict[str, object] = {}

        async def poll() -> None:
            results["poll"] = await session.get_message(0, max_capacity=1)

        async def acquire() -> None:
            results["acquire"] = await session.acquire_jobs([5])

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            tg.start_soon(acquire)
    assert results == {"poll": None, "acquire": [5]}
    assert len(scripted.calls("PATCH", f"{SCALE_SETS}/sessions/s1")) == 1
    retried = [r.headers["Authorization"] for r in scripted.calls("GET", "/queue/message")]
    assert retried == ["Bearer queue-token-old-000001", "Bearer queue-token-new-000002"]
