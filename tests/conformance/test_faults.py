"""Fault injection and request metrics (emulator only: skipped against a real cluster)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp.http
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from services.embedded.apiserver import EmulatorControl, FaultRule
from tests.fixtures.apiserver import KubeApi

from .conftest import GROUP, Http, watch_lines, widget, widgets

pytestmark = pytest.mark.anyio


@pytest.fixture
def control(kube_api: KubeApi) -> Iterator[EmulatorControl]:
    ctl = kube_api.require_emulator()
    ctl.clear_faults()
    yield ctl
    ctl.clear_faults()
    ctl.settings(watch_lag_seconds=0)


async def test_injected_conflict_is_count_limited_and_scoped(
    http: Http, namespace: str, control: EmulatorControl
) -> None:
    await http.create(widgets(namespace), widget("a"))
    await http.create(widgets(namespace), widget("b"))
    control.add_fault(
        action="error", code=409, verb="patch", resource="widgets", namespace=namespace, name="a", times=2
    )
    for _ in range(2):
        status, body = await http.patch(widgets(namespace, "a"), {"spec": {"replicas": 1}})
        assert status == 409 and body["reason"] == "Conflict"
    status, _ = await http.patch(widgets(namespace, "b"), {"spec": {"replicas": 1}})
    assert status == 200
    status, _ = await http.patch(widgets(namespace, "a"), {"spec": {"replicas": 1}})
    assert status == 200
    assert control.faults() == []


async def test_injected_429_has_retry_after(kube_api: KubeApi, namespace: str, control: EmulatorControl) -> None:
    import aiohttp

    control.add_fault(FaultRule(action="error", code=429, verb="list", resource="configmaps", retry_after_seconds=2))
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{kube_api.url}/api/v1/namespaces/{namespace}/configmaps") as resp,
    ):
        body = await resp.json()
        assert resp.status == 429 and resp.headers["Retry-After"] == "2"
        assert body["reason"] == "TooManyRequests" and body["details"]["retryAfterSeconds"] == 2


async def test_injected_500_through_the_client(
    kube_client: ApiClient, namespace: str, control: EmulatorControl
) -> None:
    control.add_fault(action="error", code=500, verb="create", resource="pods", times=1)
    api = client.CoreV1Api(kube_client)
    # A plain dict body: the client sends it as it is (its stubs ask for a V1Pod).
    pod: Any = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    with pytest.raises(ApiException) as exc:
        await api.create_namespaced_pod(namespace, pod)
    assert exc.value.status == 500
    created = await api.create_namespaced_pod(namespace, pod)
    assert created.metadata.name == "x"


async def test_injected_latency(http: Http, namespace: str, control: EmulatorControl) -> None:
    control.add_fault(action="latency", delay_seconds=0.3, verb="get", resource="widgets", times=1)
    await http.create(widgets(namespace), widget("slow"))
    start = time.monotonic()
    status, _ = await http.get(widgets(namespace, "slow"))
    assert status == 200 and time.monotonic() - start >= 0.3


async def test_dropped_watch_stream(http: Http, namespace: str, control: EmulatorControl) -> None:
    for i in range(3):
        await http.create(widgets(namespace), widget(f"d{i}"))
    control.add_fault(action="drop_watch", resource="widgets", namespace=namespace, after_events=1)
    import aiohttp

    with pytest.raises(aiohttp.ClientPayloadError):
        await watch_lines(http, widgets(namespace), {}, 3)


async def test_watch_lag_knob(http: Http, namespace: str, control: EmulatorControl) -> None:
    _, listed = await http.get(widgets(namespace))
    control.settings(watch_lag_seconds=0.4)
    await http.create(widgets(namespace), widget("lag"))
    start = time.monotonic()
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": listed["metadata"]["resourceVersion"]}, 1)
    assert events[0]["object"]["metadata"]["name"] == "lag"
    # The event was committed before the watch opened, so its delivery is due 0.4 s after commit.
    assert time.monotonic() - start >= 0.2


async def test_bad_fault_rule_is_rejected(control: EmulatorControl) -> None:
    from services.embedded.apiserver.control import ControlError

    with pytest.raises(ControlError, match="code must be an HTTP error status"):
        control.add_fault(action="error", code=200)
    with pytest.raises(ControlError, match="400"):
        control._call("POST", "/_emulator/faults", {"action": "explode"})


async def test_request_counter_and_metrics(http: Http, namespace: str, control: EmulatorControl) -> None:
    control.reset_request_counts()
    await http.create(widgets(namespace), widget("m"))
    await http.patch(widgets(namespace, "m", "status"), {"status": {"phase": "x"}})
    await http.get(widgets(namespace))
    rows = {(r["verb"], r["resource"], r["subresource"]): r["count"] for r in control.request_counts()}
    assert rows[("create", "widgets", "")] == 1
    assert rows[("patch", "widgets", "status")] == 1
    assert rows[("list", "widgets", "")] == 1
    assert (await http.get(widgets(namespace, "absent")))[0] == 404
    statuses = {(r["verb"], r["resource"], r["subresource"]): r["statuses"] for r in control.request_counts()}
    assert statuses[("create", "widgets", "")] == {"201": 1}
    assert statuses[("get", "widgets", "")] == {"404": 1}  # the burst bench counts conflicts this way
    # ... and by User-Agent (the benches split requests per process this way); the fields above stay.
    agents = {(r["verb"], r["resource"], r["subresource"]): r["agents"] for r in control.request_counts()}
    assert agents[("create", "widgets", "")] == {aiohttp.http.SERVER_SOFTWARE: 1}  # aiohttp's default agent
    assert agents[("get", "widgets", "")] == {aiohttp.http.SERVER_SOFTWARE: 1}
    status, text = await http.get("/metrics")
    assert status == 200
    assert (
        f'apiserver_request_total{{code="200",group="{GROUP}",resource="widgets",subresource="status",verb="patch"}}'
        in text
    )


async def test_watch_counts_count_what_the_streams_sent(http: Http, namespace: str, control: EmulatorControl) -> None:
    """Issue 10: the burst bench counts watch traffic per runner (events, writes, bytes)."""
    control._call("DELETE", "/_emulator/watch-counts")
    await http.create(widgets(namespace), widget("w1"))
    await http.create(widgets(namespace), widget("w2"))
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": "0"}, 2)
    assert len(events) == 2
    [row] = [r for r in control._call("GET", "/_emulator/watch-counts") if r["resource"] == "widgets"]
    assert row["watches"] == 1 and row["events"] == 2 and 1 <= row["writes"] <= 2
    assert row["bytes"] == sum(len(json.dumps(e, separators=(",", ":"))) + 1 for e in events)
    control._call("DELETE", "/_emulator/watch-counts")
    assert control._call("GET", "/_emulator/watch-counts") == []


async def test_python_hooks_in_process(kube_api: KubeApi, http: Http, namespace: str) -> None:
    if kube_api.background is None:
        pytest.skip("needs the in-process emulator")
    await http.create(widgets(namespace), widget("hook"))
    rv = kube_api.call(lambda emu: emu.store.rv)
    assert kube_api.call(lambda emu: emu.compact()) == rv
    rule = kube_api.call(
        lambda emu: emu.faults.add(FaultRule(action="error", code=503, verb="get", resource="widgets", name="hook"))
    )
    status, body = await http.get(widgets(namespace, "hook"))
    assert status == 503 and body["reason"] == "ServiceUnavailable"
    assert kube_api.call(lambda emu: emu.faults.remove(rule.id)) is False  # spent after one use


async def test_control_state_gc_and_crd_install(
    kube_api: KubeApi, http: Http, namespace: str, control: EmulatorControl
) -> None:
    state = control.state()
    assert state["resource_version"] > 0 and state["objects"] > 0
    assert "watch_lag_seconds" in state["settings"]
    crd = (
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: ctlthings.control.runnerscale.dev\n"
        "spec:\n  group: control.runnerscale.dev\n  names: {kind: CtlThing, plural: ctlthings}\n  scope: Namespaced\n"
        "  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]\n"
    )
    assert control._call("POST", "/_emulator/crds", None) == {"installed": []}
    import aiohttp

    async with aiohttp.ClientSession() as s, s.post(f"{kube_api.url}/_emulator/crds", data=crd) as resp:
        assert (await resp.json()) == {"installed": ["ctlthings.control.runnerscale.dev"]}
    status, _ = await http.get(f"/apis/control.runnerscale.dev/v1/namespaces/{namespace}/ctlthings")
    assert status == 200
    control.settings(gc_paused=True)
    try:
        owner = await http.create(widgets(namespace), widget("gc-owner"))
        ref = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "name": "gc-owner", "uid": owner["metadata"]["uid"]}
        await http.create(
            f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "gc-dep", "ownerReferences": [ref]}}
        )
        await http.delete(widgets(namespace, "gc-owner"))
        assert (await http.get(f"/api/v1/namespaces/{namespace}/configmaps/gc-dep"))[0] == 200  # paused
        assert control.run_gc() is True
        assert (await http.get(f"/api/v1/namespaces/{namespace}/configmaps/gc-dep"))[0] == 404
    finally:
        control.settings(gc_paused=False)


async def test_dropped_watch_before_any_event(http: Http, namespace: str, control: EmulatorControl) -> None:
    import aiohttp

    control.add_fault(action="drop_watch", verb="watch", resource="widgets", namespace=namespace, after_events=0)
    with pytest.raises(aiohttp.ClientPayloadError):
        await watch_lines(http, widgets(namespace), {"timeoutSeconds": "5"}, 1)
