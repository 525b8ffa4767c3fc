"""List selectors and pagination (§4.3 cases 58-65)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient

from tests.fixtures.apiserver import KubeApi

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
    assert body["message"] == "unable to parse requirement: found 'prod' expected: '('"
    assert await _names(http, path, labelSelector="env in ()") == []  # "()" is the empty value


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("=x", "found '=', expected: !, identifier, or 'end of string'"),
        ("env=a,", "found '', expected: identifier after ','"),
        ("env in (a", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("env x", "unable to parse requirement: found 'x', expected: in, notin, =, ==, !=, gt, lt"),
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        (
            "x>a",
            "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer",
        ),
    ],
)
async def test_label_selector_errors(http: Http, namespace: str, selector: str, message: str) -> None:
    status, body = await http.get(widgets(namespace), labelSelector=selector)
    assert status == 400 and body["reason"] == "BadRequest" and body["message"] == message


async def test_label_selector_numeric_comparisons(http: Http, namespace: str) -> None:
    for name, size in (("s", "1"), ("m", "5"), ("l", "9"), ("x", "big")):
        body = widget(name)
        body["metadata"]["labels"] = {"size": size}
        await http.create(widgets(namespace), body)
    assert await _names(http, widgets(namespace), labelSelector="size>1,size<9") == ["m"]


async def test_pod_field_selectors(http: Http, namespace: str) -> None:
    for name, node in (("p1", "node-a"), ("p2", "")):
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
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
    assert status == 400 and body["message"] == "field label not supported: spec.foo"
    status, body = await http.get(widgets(namespace), fieldSelector="metadata.name")
    assert status == 400 and body["message"] == "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
    status, body = await http.get(widgets(namespace), fieldSelector="metadata.name=a=b")
    assert status == 400 and body["message"] == "invalid field selector: unescaped character in value: 61"
    status, body = await http.get(widgets(namespace), fieldSelector=" metadata.name=a")
    assert status == 400 and body["message"] == "field label not supported:  metadata.name"  # nothing is trimmed


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
    assert [i["metadata"]["name"] for i in p3["items"]] == ["w4"]
    # Custom resource lists always carry "continue" (empty on the last page); built-in lists omit it.
    assert p3["metadata"]["continue"] == "" and "remainingItemCount" not in p3["metadata"]
    _, whole = await http.get(widgets(namespace))
    assert whole["metadata"]["continue"] == ""
    _, cms = await http.get(core(namespace, "configmaps"))
    assert "continue" not in cms["metadata"]


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


def _token(doc: str) -> str:
    return base64.urlsafe_b64encode(doc.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("garbage!!", "illegal base64 data at input byte 7"),
        ("abcde", "illegal base64 data at input byte 4"),
        (_token("{"), "unexpected end of JSON input"),
        (_token("[1]"), "json: cannot unmarshal array into Go value of type storage.continueToken"),
        (_token('{"v":1}'), "json: cannot unmarshal number into Go struct field continueToken.v of type string"),
        (_token('{"v":"x"}'), "server does not recognize this encoded version x"),
        (_token('{"v":"meta.k8s.io/v1"}'), "incorrect encoded start resourceVersion (version meta.k8s.io/v1)"),
        (_token('{"v":"meta.k8s.io/v1","rv":5}'), "encoded start key empty (version meta.k8s.io/v1)"),
        (_token('{"v":"meta.k8s.io/v1","rv":5,"start":"../x"}'), "../x"),
    ],
)
async def test_malformed_continue_tokens(http: Http, namespace: str, token: str, why: str) -> None:
    status, body = await http.get(widgets(namespace), limit="1", **{"continue": token})
    assert status == 400 and body["reason"] == "BadRequest"
    assert body["message"] == f"invalid continue token: continue key is not valid: {why}"


async def test_bad_and_expired_continue_tokens(http: Http, namespace: str, kube_api: KubeApi) -> None:
    for i in range(2):
        await http.create(widgets(namespace), widget(f"t{i}"))
    _, p1 = await http.get(widgets(namespace), limit="1")
    token = p1["metadata"]["continue"]
    status, body = await http.get(widgets(namespace), limit="1", resourceVersion="5", **{"continue": token})
    assert status == 400 and body["message"] == "specifying resource version is not allowed when using continue"
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
        keys = [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in body["items"]]
        # Storage-key order: "<namespace>/<name>" compared as one string, so "t-x-b/a" < "t-x/z".
        assert keys == sorted(keys)
        assert keys.index(f"{other}/a") < keys.index(f"{namespace}/z")
        _, page = await http.get(f"/apis/{GROUP}/v1/widgets", limit="1")
        names = [i["metadata"]["name"] for i in page["items"]]
        while page["metadata"]["continue"]:
            _, page = await http.get(
                f"/apis/{GROUP}/v1/widgets", limit="1", **{"continue": page["metadata"]["continue"]}
            )
            names += [i["metadata"]["name"] for i in page["items"]]
        assert len(names) == len(keys)  # paging walks the same order
    finally:
        await http.delete(f"/api/v1/namespaces/{other}")


async def test_list_resource_version_options(http: Http, namespace: str) -> None:
    for i in range(3):
        await http.create(widgets(namespace), widget(f"r{i}"))
    _, before = await http.get(widgets(namespace))
    await http.create(widgets(namespace), widget("r3"))
    await http.patch(widgets(namespace, "r0"), {"spec": {"replicas": 7}})
    # resourceVersion=0 is served whole, as from the watch cache: limit is ignored.
    status, body = await http.get(widgets(namespace), limit="2", resourceVersion="0")
    assert status == 200 and len(body["items"]) == 4 and body["metadata"]["continue"] == ""
    # Exact: the list as it was at that resourceVersion.
    rv = before["metadata"]["resourceVersion"]
    status, body = await http.get(widgets(namespace), resourceVersion=rv, resourceVersionMatch="Exact")
    assert status == 200 and body["metadata"]["resourceVersion"] == rv
    assert [(i["metadata"]["name"], i["spec"].get("replicas")) for i in body["items"]] == [
        ("r0", None),
        ("r1", None),
        ("r2", None),
    ]
    status, body = await http.get(widgets(namespace), resourceVersion=rv, resourceVersionMatch="NotOlderThan")
    assert status == 200 and len(body["items"]) == 4


@pytest.mark.parametrize(
    ("params", "causes"),
    [
        (
            {"resourceVersionMatch": "NotOlderThan"},
            [
                (
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            ],
        ),
        (
            {"resourceVersionMatch": "Exact", "resourceVersion": "0"},
            [("FieldValueForbidden", 'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"')],
        ),
        (
            {"resourceVersionMatch": "Bogus", "resourceVersion": "5"},
            [("FieldValueNotSupported", 'Unsupported value: "Bogus": supported values: "Exact", "NotOlderThan", ""')],
        ),
    ],
)
async def test_list_options_are_validated(
    http: Http, namespace: str, params: dict[str, str], causes: list[tuple[str, str]]
) -> None:
    status, body = await http.get(widgets(namespace), **params)
    assert status == 422 and body["reason"] == "Invalid"
    assert body["details"] == {
        "group": "meta.k8s.io",
        "kind": "ListOptions",
        "causes": [{"reason": r, "message": m, "field": "resourceVersionMatch"} for r, m in causes],
    }
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: {causes[0][1]}'


async def test_malformed_list_parameters(http: Http, namespace: str) -> None:
    status, body = await http.get(widgets(namespace), resourceVersion="abc")
    assert status == 400 and body["message"] == (
        'invalid resource version: resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax'
    )
    status, body = await http.get(widgets(namespace), limit="abc")
    assert status == 400 and body["message"] == 'strconv.ParseInt: parsing "abc": invalid syntax'
    status, body = await http.get(widgets(namespace), limit="-1")
    assert status == 200  # a negative limit means no limit


async def test_client_pagination_round_trip(kube_client: ApiClient, http: Http, namespace: str) -> None:
    for i in range(5):
        await http.create(core(namespace, "configmaps"), {"metadata": {"name": f"cm{i}"}})
    api = client.CoreV1Api(kube_client)
    names: list[str] = []
    token: str | None = None
    while True:
        # The client leaves a None query parameter out; its stubs ask for a str.
        page = await api.list_namespaced_config_map(namespace, limit=2, _continue=token)  # type: ignore[arg-type]
        names += [i.metadata.name for i in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == ["cm0", "cm1", "cm2", "cm3", "cm4", "kube-root-ca.crt"]


async def test_client_set_based_selector(kube_client: ApiClient, http: Http, namespace: str) -> None:
    await _labelled(http, namespace)
    api = client.CustomObjectsApi(kube_client)
    listed = await api.list_namespaced_custom_object(
        GROUP, "v1", namespace, "widgets", label_selector="env in (prod,dev),tier notin (db)"
    )
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a", "b"]
