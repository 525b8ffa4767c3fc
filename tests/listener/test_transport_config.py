"""The listener's transport settings come from its config file (issue 6): a custom root CA for an
Actions service with a private certificate (``server_root_ca``), and the proxy (``proxy.*``).

Against the real simulator over HTTPS (``actions_sim_tls``) and a local forward/CONNECT proxy
(``RecordingProxy`` from the Actions client's contract tests).
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from shared.actions import ActionsClient, PersonalAccessToken
from shared.listener_config import ListenerConfig
from shared.log import JsonFormatter
from tests.contract.scripted import RecordingProxy
from tests.fixtures.actions_sim import ActionsSim
from tests.listener.conftest import BusTap, ScaleSet, start_listener, wait_until

pytestmark = pytest.mark.anyio

#: A host name that resolves nowhere: only a proxy that maps it can reach the simulator.
PROXIED_HOST = "actions-sim.runnerscale.test"


class ForwardProxy:
    """A forward proxy for plain-HTTP targets that records every request it carries (not just
    each connection's first, as ``RecordingProxy`` does), so a test can match them one by one
    against what the service saw. It knows ``PROXIED_HOST`` (a name no resolver knows) as
    127.0.0.1, and forwards in origin form with the client's ``Host``, as real proxies do."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (method, absolute target) in arrival order
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession(trust_env=False, auto_decompress=False) as self._upstream:
                task_status.started()
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        host_header = request.headers.get("Host", "")
        target = f"http://{host_header}{request.rel_url}"
        self.requests.append((request.method, target))
        host, _, port = host_header.rpartition(":")
        dial = "127.0.0.1" if host == PROXIED_HOST else host
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._upstream.request(
            request.method,
            f"http://{dial}:{port}{request.rel_url}",
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as upstream:
            body = await upstream.read()
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            return web.Response(status=upstream.status, body=body, headers=out)


_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return resp.status, await resp.text()


async def tls_scale_set(sim: ActionsSim) -> int:
    async with ActionsClient.from_config(sim.config_url(), PersonalAccessToken(sim.pat), root_ca=sim.ca_pem) as client:
        return (await client.create_scale_set("arc-runners")).id


def tls_overrides(sim: ActionsSim, scale_set_id: int, **more: object) -> dict[str, object]:
    return {"configure_url": sim.config_url(), "github_token": sim.pat, "runner_scale_set_id": scale_set_id, **more}


async def test_root_ca_from_the_config_reaches_the_https_service(
    actions_sim_tls: ActionsSim, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    sim = actions_sim_tls
    ss = await tls_scale_set(sim)
    cfg = make_config(min_runners=1, **tls_overrides(sim, ss, server_root_ca=sim.ca_pem))
    await sim.control.enqueue_jobs(count=2, labels=["arc-runners"])
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, cfg, "listener-tls")
        await bus_tap.wait_for(lambda t: t.desired and t.desired[-1].replicas == 3, timeout=15)
        sessions = await sim.control.sessions()
        assert [(s.session_id, s.owner_name) for s in sessions] == [(listener.session_id, "listener-tls")]
        assert await get(f"http://127.0.0.1:{listener.ports['health']}/readyz") == (200, "ok")
        tg.cancel_scope.cancel()


async def test_without_the_root_ca_the_listener_reports_a_tls_failure_and_stays_up(
    actions_sim_tls: ActionsSim,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The system roots do not trust the simulator's CA: the listener logs a clear TLS error (one
    line, no traceback), keeps running (live, not ready) and publishes nothing it did not learn."""
    caplog.set_level(logging.INFO)
    sim = actions_sim_tls
    ss = await tls_scale_set(sim)
    cfg = make_config(**tls_overrides(sim, ss))  # no server_root_ca
    assert cfg.server_root_ca == ""

    def tls_failures() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.name.startswith("services.listener") and "TLS failure" in JsonFormatter().format(r)
        ]

    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, cfg, "listener-noca")
        await wait_until(lambda: len(tls_failures()) >= 2, timeout=10)  # reported, and retried
        assert listener.is_leader and listener.session_id == ""
        status, body = await get(f"http://127.0.0.1:{listener.ports['health']}/readyz")
        assert (status, body) == (503, "leader without a message session")
        assert (await get(f"http://127.0.0.1:{listener.ports['health']}/healthz"))[0] == 200
        tg.cancel_scope.cancel()

    assert await sim.control.sessions() == []
    assert bus_tap.desired == []
    record = tls_failures()[0]
    assert record.levelno >= logging.WARNING
    assert not record.exc_info  # a log line, not a traceback
    line = JsonFormatter().format(record)
    assert "\n" not in line and "Traceback" not in line
    fields: dict[str, Any] = record.__dict__["fields"]  # shared/log.py passes them as `extra`
    assert "TLS failure" in fields["error"] and "127.0.0.1" in fields["error"]
    assert "unable to get local issuer certificate" in fields["error"], fields["error"]  # says why
    assert sim.pat not in "\n".join(JsonFormatter().format(r) for r in caplog.records)


async def test_http_proxy_from_the_config_carries_every_request(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    """The config URL names a host only the proxy can resolve, and every request the service saw
    from the listener (registration, session, long polls, acknowledgements, the session delete)
    is one the proxy carried, one for one."""
    port = actions_sim.url.rsplit(":", 1)[1]
    proxy = ForwardProxy()
    async with anyio.create_task_group() as proxies:
        await proxies.start(proxy.serve)
        cfg = make_config(
            min_runners=0,
            configure_url=f"http://{PROXIED_HOST}:{port}/{actions_sim.org}",
            proxy={"http_proxy": proxy.url, "no_proxy": "localhost"},
        )
        await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
        await actions_sim.control.clear_requests()  # the fixture's own set-up calls went direct
        async with anyio.create_task_group() as tg:
            listener = await start_listener(tg, cfg, "listener-proxied")
            await bus_tap.wait_for(lambda t: t.desired and t.desired[-1].replicas == 2, timeout=15)

            async def acknowledged() -> bool:
                return any(m.acked for m in await actions_sim.control.messages(scale_set.id))

            await wait_until(acknowledged, timeout=15)
            sessions = await actions_sim.control.sessions()
            assert [(s.session_id, s.owner_name) for s in sessions] == [(listener.session_id, "listener-proxied")]
            tg.cancel_scope.cancel()  # a clean stop: the session delete goes through the proxy too
        seen_by_service = [(r.method, r.path) for r in await actions_sim.control.requests()]
        proxies.cancel_scope.cancel()
    assert await actions_sim.control.sessions() == []
    carried = [(method, target.removeprefix(f"http://{PROXIED_HOST}:{port}")) for method, target in proxy.requests]
    assert all(target.startswith(f"http://{PROXIED_HOST}:{port}/") for _, target in proxy.requests), proxy.requests
    # The same requests, one for one (the service logs a long poll when it answers, the proxy
    # when it arrives, so only the order differs).
    assert Counter((m, p.split("?")[0]) for m, p in carried) == Counter(
        (m, p.split("?")[0]) for m, p in seen_by_service
    )
    endpoints = {p.split("?")[0].rsplit("/", 1)[-1] for _, p in carried}
    assert {"registration-token", "runner-registration", "sessions", "message"} <= endpoints, endpoints


async def test_https_proxy_from_the_config_tunnels_to_the_tls_service(
    actions_sim_tls: ActionsSim, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    """``proxy.https_proxy`` with credentials and ``server_root_ca`` together: a CONNECT tunnel
    (``RecordingProxy``), the TLS handshake inside it verified against the configured CA."""
    sim = actions_sim_tls
    ss = await tls_scale_set(sim)
    port = sim.url.rsplit(":", 1)[1]
    proxy = RecordingProxy()
    async with anyio.create_task_group() as proxies:
        await proxies.start(proxy.serve)
        tunnel = f"http://tunnel-user:tunnel-pass-4711@127.0.0.1:{proxy.port}"
        cfg = make_config(
            min_runners=1, proxy={"https_proxy": tunnel}, **tls_overrides(sim, ss, server_root_ca=sim.ca_pem)
        )
        await sim.control.enqueue_jobs(count=1, labels=["arc-runners"])
        async with anyio.create_task_group() as tg:
            await start_listener(tg, cfg, "listener-tunnel")
            await bus_tap.wait_for(lambda t: t.desired and t.desired[-1].replicas == 2, timeout=15)
            tg.cancel_scope.cancel()
        proxies.cancel_scope.cancel()
    assert await sim.control.sessions() == []  # deleted on the way out, through the tunnel
    assert proxy.request_lines, "no connection went through the proxy"
    assert set(proxy.request_lines) == {f"CONNECT 127.0.0.1:{port} HTTP/1.1"}
    expected = "Basic " + base64.b64encode(b"tunnel-user:tunnel-pass-4711").decode()
    assert set(proxy.authorizations) == {expected}
