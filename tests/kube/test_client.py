"""KubeClient transport: environment resolved once (no per-request proxy/netrc lookups) and the
client-side request-rate limit (README "Kubernetes access layer", "Client")."""

from __future__ import annotations

import base64
import json
import re

import aiohttp.client
import anyio
import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from shared.kube import KubeClient, NotFound
from shared.kube.client import RequestRateLimit, request_labels, user_agent_for
from shared.kube.metrics import kube_client_metrics
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


# --- User-Agent and request metrics (issue 10: requests per process, measured) ------------------

AGENT = user_agent_for("test")


def test_the_user_agent_names_program_version_platform_and_client() -> None:
    assert re.fullmatch(r"runnerscale-test/\d+\.\d+\.\d+\S* \([a-z0-9]+/[a-z0-9_]+\) kubernetes-asyncio/\S+", AGENT)
    assert user_agent_for().startswith("runnerscale/")


async def test_every_request_carries_the_user_agent(kube_api: KubeApi, namespace: str) -> None:
    """On the emulator: its request counts by agent (what the benches read)."""
    control = kube_api.require_emulator("the request counts by User-Agent")
    control.reset_request_counts()
    async with await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=10, user_agent=AGENT) as client:
        await client.request("GET", f"/api/v1/namespaces/{namespace}/configmaps", what="list configmaps")
        await client.request("GET", f"/api/v1/namespaces/{namespace}/configmaps", what="list configmaps")
    rows = [r for r in control.request_counts() if (r["verb"], r["resource"]) == ("list", "configmaps")]
    assert rows[0]["agents"] == {AGENT: 2}


async def test_the_real_server_sees_the_user_agent(kube_api: KubeApi, namespace: str) -> None:
    """On a real server: a write without ``fieldManager`` is recorded in managedFields under the
    User-Agent's program (kube-apiserver's default manager; the emulator tracks no managedFields).
    The object has data: a write that sets no field leaves no managedFields entry."""
    if kube_api.is_emulator:  # its twin above checks the agent on the emulator, by its request counts
        pytest.skip("emulator: tracks no managedFields; a real API server records the User-Agent there")
    async with await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=10, user_agent=AGENT) as client:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent"}, "data": {"k": "v"}}
        created = json.loads(
            await client.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", what="create", body=body)
        )
    assert [m["manager"] for m in created["metadata"]["managedFields"]] == ["runnerscale-test"]


def test_request_labels_come_from_a_fixed_set() -> None:
    ns = "/api/v1/namespaces/n"
    ers = "/apis/actions.github.com/v1alpha1/namespaces/n/ephemeralrunners"
    assert request_labels("GET", f"{ns}/pods/p") == ("get", "pods")
    assert request_labels("GET", f"{ns}/pods") == ("list", "pods")
    assert request_labels("GET", "/api/v1/pods", [("watch", "true")]) == ("watch", "pods")
    assert request_labels("POST", f"{ns}/secrets") == ("create", "secrets")
    assert request_labels("PATCH", f"{ers}/r/status") == ("patch", "ephemeralrunners/status")
    assert request_labels("PUT", "/apis/coordination.k8s.io/v1/namespaces/n/leases/l") == ("update", "leases")
    assert request_labels("DELETE", f"{ers}/r") == ("delete", "ephemeralrunners")
    assert request_labels("DELETE", f"{ns}/pods") == ("deletecollection", "pods")
    assert request_labels("GET", "/api/v1/namespaces/n") == ("get", "namespaces")
    assert request_labels("GET", f"{ns}/widgets-{12345}") == ("list", "other")  # unknown plurals: one label
    assert request_labels("GET", "/version") == ("get", "other")


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_requests_and_rate_limit_waits_are_counted_in_the_given_registry(
    kube_api: KubeApi, namespace: str
) -> None:
    registry = CollectorRegistry()
    metrics = kube_client_metrics(registry)
    assert kube_client_metrics(registry) is metrics  # one set per registry (a process's clients share it)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    async with await KubeClient.from_kubeconfig(
        kube_api.kubeconfig, request_timeout=10, qps=20, burst=2, metrics=metrics
    ) as client:
        for _ in range(4):  # 2 from the burst, 2 wait for a token
            await client.request("GET", pods, what="list pods")
        with pytest.raises(NotFound):
            await client.request("GET", f"{pods}/absent", what="get pod")
        await client.unthrottled().request("GET", pods, what="list pods")  # counted, not paced
        async with client.stream(pods, what="watch pods", query=[("watch", "true")], read_timeout=5):
            pass
    total = "runnerscale_kube_requests_total"
    assert _sample(registry, total, verb="list", resource="pods", code="200") == 5
    assert _sample(registry, total, verb="get", resource="pods", code="404") == 1
    assert _sample(registry, total, verb="watch", resource="pods", code="200") == 1
    wait = "runnerscale_kube_rate_limiter_wait_seconds"
    assert _sample(registry, f"{wait}_count") == 6  # every paced request, 0-second waits included
    assert _sample(registry, f"{wait}_bucket", le="0.0") <= 4  # at least the 2 past the burst waited
    assert _sample(registry, f"{wait}_sum") > 0
    assert _sample(REGISTRY, total, verb="list", resource="pods", code="200") == 0  # no global pollution
