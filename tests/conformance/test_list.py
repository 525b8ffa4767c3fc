"""List selectors and pagination (§4.3 cases 58-65)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from .conftest import GROUP, Http, core, widget, widgets

pytestmark = pytest.mark.anyio


async def _labelled(http: Http, ns: str) -> None:
    for name, labels in (
        ("a", {"env": "prod", "tier": "web"}),
        ("b", {"env": "dev"}),
        ("c", {"tier": "db"}),
        ("d", {}),
    ):
        body = widget(name)
        if labels:
            body["metadata"]["labels"] = labels
        await http.create(widgets(ns), body)


async def _names(http: Http, path: str, **params: str) -> list[str]:
    status, body = await http.get(path, **params)
    assert status == 200, body
    return [i["metadata"]["name"] for i in body["items"]]


async def test_label_selector_operators(http: Http, namespace: str) -> None:
    await _labelled(http, namespace)
    path = widgets(namespace)
    assert await _names(http, path, labelSelector="env=prod") == ["a"]
    assert await _names(http, path, labelSelector="env==prod") == ["a"]
    assert await _names(http, path, labelSelector="env!=prod") == ["b", "c", "d"]  # absent key matches
    assert await _names(http, path, labelSelector="env in (prod,dev)") == ["a", "b"]
    assert await _names(http, path, labelSelector="env notin (prod)") == ["b", "c", "d"]
    assert await _names(http, path, labelSelector="tier") == ["a", "c"]
    assert await _names(http, path, labelSelector="!tier") == ["b", "d"]
    assert await _names(http, path, labelSelector="env=prod,tier=web") == ["a"]
    status, body = await http.get(path, labelSelector="env in prod")
    assert status == 400 and body["reason"] == "BadRequest"


async def test_pod_field_selectors(http: Http, namespace: str) -> None:
    for name, node in (("p1", "node-a"), ("p2", "")):
        spec = {"containers": [{"name": "c", "image": "busybox"}]}
        if node:
            spec["nodeName"] = node
        await http.create(core(namespace, "pods"), {"metadata": {"name": name}, "spec": spec})
    await http.patch(core(namespace, "pods", "p1", "status"), {"status": {"phase": "Running"}})
    path = core(namespace, "pods")
    assert await _names(http, path, fieldSelector="status.phase=Running") == ["p1"]
    assert await _names(http, path, fieldSelector="spec.nodeName=") == ["p2"]
    assert await _names(http, path, fieldSelector="spec.nodeName=node-a,status.phase!=Pending") == ["p1"]
    assert await _names(http, "/api/v1/pods", fieldSelector=f"metadata.namespace={namespace}") == ["p1", "p2"]
    assert await _names(http, path, fieldSelector="metadata.namespace!=" + namespace) == []


async def test_unsupported_field_selector_messages(http: Http, namespace: str) -> None:
    status, body = await http.get(core(namespace, "pods"), fieldSelector="spec.foo=x")
    assert status == 400 and body["message"] == "field label not supported: spec.foo"
    status, body = await http.get(widgets(namespace), fieldSelector="spec.foo=x")
    assert status == 400
    assert body["message"] == '"spec.foo" is not a known field selector: only "metadata.name", "metadata.namespace"'


async def test_pagination_is_a_consistent_snapshot(http: Http, namespace: str) -> None:
    for i in range(5):
        await http.create(widgets(namespace), widget(f"w{i}"))
    _, p1 = await http.get(widgets(namespace), limit="2")
    assert [i["metadata"]["name"] for i in p1["items"]] == ["w0", "w1"]
    assert p1["metadata"]["remainingItemCount"] == 3
    await http.create(widgets(namespace), widget("w2a"))  # created between pages: not in this list
    await http.delete(widgets(namespace, "w3"))  # deleted between pages: still in this list
    _, p2 = await http.get(widgets(namespace), limit="2", **{"continue": p1["metadata"]["continue"]})
    assert [i["metadata"]["name"] for i in p2["items"]] == ["w2", "w3"]
    assert p2["metadata"]["remainingItemCount"] == 1
    assert p2["metadata"]["resourceVersion"] == p1["metadata"]["resourceVersion"]
    _, p3 = await http.get(widgets(namespace), limit="2", **{"continue": p2["metadata"]["continue"]})
    assert [i["metadata"]["name"] for i in p3["items"]] == ["w4"] and "continue" not in p3["metadata"]


async def test_pagination_with_selector(http: Http, namespace: str) -> None:
    for i in range(4):
        body = widget(f"s{i}")
        body["metadata"]["labels"] = {"keep": "yes" if i != 1 else "no"}
        await http.create(widgets(namespace), body)
    _, p1 = await http.get(widgets(namespace), limit="2", labelSelector="keep=yes")
    assert [i["metadata"]["name"] for i in p1["items"]] == ["s0", "s2"]
    assert "remainingItemCount" not in p1["metadata"]
    _, p2 = await http.get(
        widgets(namespace), limit="2", labelSelector="keep=yes", **{"continue": p1["metadata"]["continue"]}
    )
    assert [i["metadata"]["name"] for i in p2["items"]] == ["s3"]


async def test_bad_and_expired_continue_tokens(http: Http, namespace: str, kube_api) -> None:
    status, body = await http.get(widgets(namespace), limit="1", **{"continue": "garbage!!"})
    assert status == 400 and body["message"].startswith("invalid continue token")
    control = kube_api.require_emulator()
    for i in range(3):
        await http.create(widgets(namespace), widget(f"e{i}"))
    _, p1 = await http.get(widgets(namespace), limit="1")
    await http.patch(widgets(namespace, "e2"), {"spec": {"replicas": 1}})
    await control.compact_async()
    status, body = await http.get(widgets(namespace), limit="1", **{"continue": p1["metadata"]["continue"]})
    assert status == 410 and body["reason"] == "Expired"


async def test_list_across_namespaces_sorted(http: Http, namespace: str) -> None:
    other = namespace + "-b"
    await http.create("/api/v1/namespaces", {"metadata": {"name": other}})
    try:
        await http.create(widgets(other), widget("a"))
        await http.create(widgets(namespace), widget("z"))
        _, body = await http.get(f"/apis/{GROUP}/v1/widgets")
        keys = [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in body["items"]]
        assert keys == sorted(keys) and (namespace, "z") in keys and (other, "a") in keys
    finally:
        await http.delete(f"/api/v1/namespaces/{other}")


async def test_client_pagination_round_trip(kube_client, http: Http, namespace: str) -> None:
    for i in range(5):
        await http.create(core(namespace, "configmaps"), {"metadata": {"name": f"cm{i}"}})
    api = client.CoreV1Api(kube_client)
    names, token = [], None
    while True:
        page = await api.list_namespaced_config_map(namespace, limit=2, _continue=token)
        names += [i.metadata.name for i in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == ["cm0", "cm1", "cm2", "cm3", "cm4", "kube-root-ca.crt"]


async def test_client_set_based_selector(kube_client, http: Http, namespace: str) -> None:
    await _labelled(http, namespace)
    api = client.CustomObjectsApi(kube_client)
    listed = await api.list_namespaced_custom_object(
        GROUP, "v1", namespace, "widgets", label_selector="env in (prod,dev),tier notin (db)"
    )
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a", "b"]
