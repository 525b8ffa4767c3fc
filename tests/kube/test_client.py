"""KubeClient transport: environment resolved once (no per-request proxy/netrc lookups) and the
client-side request-rate limit (README "Kubernetes access layer", "Client")."""

from __future__ import annotations

import base64

import aiohttp.client
import anyio
import pytest

from shared.kube import KubeClient
from shared.kube.client import RequestRateLimit
from tests.fixtures.apiserver import KubeApi

pytestmark = pytest.mark.anyio


async def test_requests_do_not_look_up_the_environment(kube_api: KubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp with trust_env=True resolves proxies (and netrc) in a thread on every request."""
    client = await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=10)
    lookups: list[object] = []

    def counting_lookup(url: object) -> object:
        lookups.append(url)
        raise LookupError("no proxy")

    monkeypatch.setattr(aiohttp.client, "get_env_proxy_for_url", counting_lookup)
    async with client:
        for _ in range(5):
            await client.request("GET", "/api/v1/namespaces/default", what="GET namespace default")
    assert lookups == []


async def test_the_proxy_is_resolved_once_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://user:pw@proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with KubeClient.from_url("http://kube.example:8080") as client:
        rest = client._api.rest_client
        assert rest.proxy == "http://proxy.invalid:3128"
        assert rest.proxy_headers["Proxy-Authorization"] == "Basic " + base64.b64encode(b"user:pw").decode()


async def test_rate_limit_allows_a_burst_then_paces() -> None:
    now = [0.0]
    limit = RequestRateLimit(qps=10, burst=3, clock=lambda: now[0])
    assert [limit.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.reserve() == pytest.approx(0.1)
    assert limit.reserve() == pytest.approx(0.2)  # waiters queue up in order
    now[0] = 1.0  # refilled, but never above the burst
    assert [limit.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.reserve() > 0
    assert limit.throttled == 3
    assert RequestRateLimit(qps=0, burst=0).reserve() == 0.0


async def test_requests_are_paced_by_the_client_rate_limit(kube_api: KubeApi) -> None:
    client = await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=10, qps=20, burst=2)
    async with client:
        started = anyio.current_time()
        for _ in range(6):  # 2 from the burst, then 4 at 20/s: at least 0.2 s
            await client.request("GET", "/api/v1/namespaces/default", what="GET namespace default")
        # A lower bound holds at any server speed; how many requests waited does not (a slow answer
        # refills a token), so the exact counts are tested on a fake clock (tests/unit/shared/kube).
        assert anyio.current_time() - started >= 0.19
    assert client.rate_limit.throttled >= 1


async def test_the_unthrottled_view_is_not_paced_and_shares_the_connection(kube_api: KubeApi) -> None:
    """Lease renewals go through ``unthrottled()``: a burst of bulk requests cannot delay them."""
    client = await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=10, qps=0.5, burst=1)
    async with client:
        await client.request("GET", "/api/v1/namespaces/default", what="GET namespace default")  # the burst
        view = client.unthrottled()
        with anyio.fail_after(1.5):  # the throttled client would wait 2 s for its next token
            for _ in range(3):
                await view.request("GET", "/api/v1/namespaces/default", what="GET namespace default")
        await view.close()  # a view does not close the shared connection
        await client.request("GET", "/api/v1/namespaces/default", what="GET namespace default", timeout=5)
    assert view.closed
