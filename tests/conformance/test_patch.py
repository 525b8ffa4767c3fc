"""Patch types and content types (§4.3 cases 32-43)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from .conftest import GROUP, Http, core, widget, widgets

pytestmark = pytest.mark.anyio

POD = {
    "metadata": {"name": "p"},
    "spec": {
        "containers": [
            {"name": "a", "image": "busybox:1", "env": [{"name": "X", "value": "1"}], "ports": [{"containerPort": 80}]},
            {"name": "b", "image": "busybox:1"},
        ],
        "tolerations": [{"key": "k", "operator": "Exists"}],
    },
}


async def test_dict_patch_with_library_default_content_type_is_400(
    kube_client: ApiClient, http: Http, namespace: str
) -> None:
    await http.create(widgets(namespace), widget("lib", replicas=1))
    api = client.CustomObjectsApi(kube_client)
    with pytest.raises(ApiException) as exc:
        await api.patch_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "lib", {"spec": {"replicas": 2}})
    assert exc.value.status == 400
    assert isinstance(exc.value.body, str)  # the ApiClient decodes it (its stubs say bytes)
    assert (
        "error decoding patch: json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp"
        in exc.value.body
    )


async def test_merge_patch_through_the_client(kube_client: ApiClient, http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("mp", replicas=1, tags=["a", "b"], image="x"))
    api = client.CustomObjectsApi(kube_client)
    obj = await api.patch_namespaced_custom_object(
        GROUP,
        "v1",
        namespace,
        "widgets",
        "mp",
        {"spec": {"replicas": 2, "tags": ["c"], "image": None}},
        _content_type="application/merge-patch+json",  # type: ignore[call-arg]  # _content_type is a keyword the client honours; its stubs omit it
    )
    assert obj["spec"]["replicas"] == 2 and obj["spec"]["tags"] == ["c"] and "image" not in obj["spec"]
    obj = await api.patch_namespaced_custom_object_status(
        GROUP,
        "v1",
        namespace,
        "widgets",
        "mp",
        {"status": {"phase": "Ready"}},
        _content_type="application/merge-patch+json",  # type: ignore[call-arg]  # _content_type is a keyword the client honours; its stubs omit it
    )
    assert obj["status"]["phase"] == "Ready"


async def test_json_patch(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("jp", tags=["a"]))
    ops = [
        {"op": "add", "path": "/spec/tags/-", "value": "b"},
        {"op": "replace", "path": "/spec/mode", "value": "Manual"},
    ]
    status, obj = await http.patch(widgets(namespace, "jp"), ops, "application/json-patch+json")
    assert status == 200 and obj["spec"]["tags"] == ["a", "b"] and obj["spec"]["mode"] == "Manual"
    status, body = await http.patch(
        widgets(namespace, "jp"), [{"op": "remove", "path": "/spec/nothing"}], "application/json-patch+json"
    )
    assert status == 422 and body["reason"] == "Invalid"


async def test_strategic_merge_patch_on_custom_resource_is_415(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("smp"))
    status, body = await http.patch(
        widgets(namespace, "smp"), {"spec": {"replicas": 1}}, "application/strategic-merge-patch+json"
    )
    assert status == 415 and body["reason"] == "UnsupportedMediaType"
    assert body["message"].startswith(
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json"
    )
    assert "strategic" not in body["message"]


async def test_unknown_and_apply_content_types_are_415(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("ct"))
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "ct"}})
    for ctype in ("text/plain", "application/apply-patch+cbor"):
        status, body = await http.patch(widgets(namespace, "ct"), {"spec": {}}, ctype)
        assert status == 415, ctype
        assert body["kind"] == "Status" and body["reason"] == "UnsupportedMediaType"
        assert body["message"] == (
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        )
        status, body = await http.patch(core(namespace, "configmaps", "ct"), {"data": {}}, ctype)
        assert status == 415 and body["message"] == "415: Unsupported Media Type" and body["details"] == {}
    status, body = await http.request(
        "PATCH", widgets(namespace, "ct"), raw=b"", content_type="application/merge-patch+json"
    )
    assert status == 400 and body["message"] == "invalid JSON patch"
    # Server-side apply is served: it needs a field manager.
    status, body = await http.patch(widgets(namespace, "ct"), {"spec": {}}, "application/apply-patch+yaml")
    assert status == 422 and body["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
    )
    assert body["details"] == {
        "group": "meta.k8s.io",
        "kind": "PatchOptions",
        "causes": [
            {
                "reason": "FieldValueRequired",
                "message": "Required value: is required for apply patch",
                "field": "fieldManager",
            }
        ],
    }


async def test_server_side_apply_creates_and_updates(http: Http, namespace: str) -> None:
    apply = "application/apply-patch+yaml"
    path = widgets(namespace, "ssa") + "?fieldManager=conformance"
    doc = f"apiVersion: {GROUP}/v1\nkind: Widget\nmetadata:\n  name: ssa\n  labels: {{a: '1'}}\nspec:\n  replicas: 2\n"
    status, obj = await http.request("PATCH", path, raw=doc.encode(), content_type=apply)
    assert status == 201 and obj["spec"] == {"replicas": 2, "mode": "Auto"} and obj["metadata"]["labels"] == {"a": "1"}
    doc = f"apiVersion: {GROUP}/v1\nkind: Widget\nmetadata:\n  name: ssa\n  labels: {{a: '1'}}\nspec:\n  replicas: 3\n"
    status, obj = await http.request("PATCH", path, raw=doc.encode(), content_type=apply)
    assert status == 200 and obj["spec"]["replicas"] == 3 and obj["metadata"]["generation"] == 2
    # JSON is YAML: an applied configuration may be sent as JSON too.
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"k": "v"}}
    status, obj = await http.request(
        "PATCH",
        core(namespace, "configmaps", "ssa") + "?fieldManager=conformance",
        raw=json.dumps(cm).encode(),
        content_type=apply,
    )
    assert status == 201 and obj["data"] == {"k": "v"}
    status, body = await http.request(
        "PATCH", widgets(namespace, "ssa") + "?fieldManager=c", raw=b"metadata: {name: ssa}", content_type=apply
    )
    assert status == 400 and body["message"] == "invalid object type: /, Kind="
    wrong = f"apiVersion: {GROUP}/v1\nkind: Widget\nmetadata:\n  name: other\n"
    status, body = await http.request(
        "PATCH", widgets(namespace, "ssa") + "?fieldManager=c&force=true", raw=wrong.encode(), content_type=apply
    )
    assert (
        status == 400 and body["message"] == "the name of the object (other) does not match the name on the URL (ssa)"
    )
    status, body = await http.request(
        "PATCH", widgets(namespace, "ssa") + "?force=true", raw=b"{}", content_type="application/merge-patch+json"
    )
    assert status == 422 and body["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be specified for non-apply patch'
    )
    status, body = await http.request(
        "PATCH",
        core(namespace, "configmaps", "dry") + "?fieldManager=c&dryRun=All",
        raw=b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: dry}",
        content_type=apply,
    )
    assert status == 201 and (await http.get(core(namespace, "configmaps", "dry")))[0] == 404


async def test_smp_on_pod_uses_merge_keys(http: Http, namespace: str) -> None:
    await http.create(core(namespace, "pods"), POD)
    smp = "application/strategic-merge-patch+json"
    status, obj = await http.patch(
        core(namespace, "pods", "p"), {"spec": {"containers": [{"name": "a", "image": "busybox:2"}]}}, smp
    )
    assert status == 200
    by_name = {c["name"]: c for c in obj["spec"]["containers"]}
    assert set(by_name) == {"a", "b"}  # b kept: containers merge by name
    assert by_name["a"]["image"] == "busybox:2"
    assert [e["name"] for e in by_name["a"]["env"]] == ["X"]  # untouched lists survive
    # volumeMounts merge by mountPath: the admission-added token mount survives.
    assert any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" for m in by_name["a"]["volumeMounts"])
    # env merges by name (a new entry is appended), which a running pod then refuses as a spec change.
    status, body = await http.patch(
        core(namespace, "pods", "p"),
        {"spec": {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}]}},
        smp,
    )
    assert status == 422 and "pod updates may not change fields" in body["message"]
    status, body = await http.patch(
        core(namespace, "pods", "p"), {"spec": {"containers": [{"name": "z", "image": "x"}]}}, smp
    )
    assert status == 422 and body["message"] == (
        'Pod "p" is invalid: spec.containers: Forbidden: pod updates may not add or remove containers'
    )


async def test_smp_tolerations_are_replaced(http: Http, namespace: str) -> None:
    await http.create(core(namespace, "pods"), POD)
    _, before = await http.get(core(namespace, "pods", "p"))
    tols = before["spec"]["tolerations"] + [{"key": "new", "operator": "Exists"}]
    status, obj = await http.patch(
        core(namespace, "pods", "p"), {"spec": {"tolerations": tols}}, "application/strategic-merge-patch+json"
    )
    assert status == 200 and obj["spec"]["tolerations"] == tols


async def test_smp_finalizers_are_a_set(http: Http, namespace: str) -> None:
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "f", "finalizers": ["x.io/a"]}})
    smp = "application/strategic-merge-patch+json"

    async def patched(patch: dict[str, Any]) -> list[str]:
        status, obj = await http.patch(core(namespace, "configmaps", "f"), {"metadata": patch}, smp)
        assert status == 200, obj
        finalizers: list[str] = obj["metadata"]["finalizers"]
        return finalizers

    # The patch's items come first and keep their order; the stored ones are interleaved by
    # their stored position.
    assert await patched({"finalizers": ["x.io/b"]}) == ["x.io/b", "x.io/a"]
    assert await patched({"finalizers": ["x.io/c", "x.io/a"]}) == ["x.io/c", "x.io/b", "x.io/a"]
    assert await patched({"$deleteFromPrimitiveList/finalizers": ["x.io/b", "x.io/c"]}) == ["x.io/a"]
    assert await patched({"finalizers": ["x.io/d", "x.io/a", "x.io/e"]}) == ["x.io/d", "x.io/a", "x.io/e"]
    assert await patched({"$setElementOrder/finalizers": ["x.io/e", "x.io/g", "x.io/a"], "finalizers": ["x.io/g"]}) == [
        "x.io/d",
        "x.io/e",
        "x.io/g",
        "x.io/a",
    ]
    _, obj = await http.patch(core(namespace, "configmaps", "f"), {"metadata": {"finalizers": ["x.io/c"]}})
    assert obj["metadata"]["finalizers"] == ["x.io/c"]  # merge patch replaces lists
    await http.patch(core(namespace, "configmaps", "f"), {"metadata": {"finalizers": None}})


async def test_smp_patch_directives(http: Http, namespace: str) -> None:
    smp = "application/strategic-merge-patch+json"
    owner = await http.create(core(namespace, "configmaps"), {"metadata": {"name": "o"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": owner["metadata"]["uid"]}
    await http.create(
        core(namespace, "configmaps"),
        {"metadata": {"name": "d", "ownerReferences": [ref]}, "data": {"a": "1", "b": "2"}},
    )
    _, obj = await http.patch(
        core(namespace, "configmaps", "d"),
        {"metadata": {"ownerReferences": [{"uid": ref["uid"], "$patch": "delete"}]}},
        smp,
    )
    assert "ownerReferences" not in obj["metadata"] or obj["metadata"]["ownerReferences"] == []
    _, obj = await http.patch(core(namespace, "configmaps", "d"), {"data": {"$patch": "replace", "c": "3"}}, smp)
    assert obj["data"] == {"c": "3"}
    # Unknown "$" keys are not directives: they are keys like any other.
    status, body = await http.patch(core(namespace, "configmaps", "d"), {"data": {"$bogus": "1"}}, smp)
    assert status == 422 and body["details"]["causes"][0]["field"] == "data[$bogus]"
    assert body["message"].startswith(
        'ConfigMap "d" is invalid: data[$bogus]: Invalid value: "$bogus": a valid config key'
    )
    status, body = await http.patch(core(namespace, "configmaps", "d"), {"data": {"$bogus": 1}}, smp)
    assert status == 422 and body["message"] == (
        ' "" is invalid: patch: Invalid value: "map[data:map[$bogus:1]]": cannot convert int64 to string'
    )
    assert body["details"] == {
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "map[data:map[$bogus:1]]": cannot convert int64 to string',
                "field": "patch",
            }
        ]
    }
    status, same = await http.patch(core(namespace, "configmaps", "d"), {"$bogus": "1"}, smp)
    assert status == 200 and same["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    status, body = await http.patch(core(namespace, "configmaps", "d"), {"data": {"$patch": "bogus"}}, smp)
    assert status == 500 and "reason" not in body
    assert body["message"] == "unknown patch type: bogus in map: map[$patch:bogus]"
    status, body = await http.patch(core(namespace, "configmaps", "d"), {"data": {"$retainKeys": "c"}}, smp)
    assert status == 400 and body["message"] == "invalid patch format of retainKeys"


async def test_smp_owner_references_merge_by_uid(http: Http, namespace: str) -> None:
    o1 = await http.create(core(namespace, "configmaps"), {"metadata": {"name": "o1"}})
    o2 = await http.create(core(namespace, "configmaps"), {"metadata": {"name": "o2"}})

    def ref(o: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}

    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "dep", "ownerReferences": [ref(o1)]}})
    _, obj = await http.patch(
        core(namespace, "configmaps", "dep"),
        {"metadata": {"ownerReferences": [ref(o2)]}},
        "application/strategic-merge-patch+json",
    )
    assert [r["name"] for r in obj["metadata"]["ownerReferences"]] == ["o2", "o1"]


async def test_merge_patch_body_errors(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("bad"))
    for body, kind in (([{"spec": 1}], "array"), ("text", "string")):
        status, err = await http.patch(widgets(namespace, "bad"), body)
        assert status == 400 and err["reason"] == "BadRequest"
        assert err["message"] == (
            f"error decoding patch: json: cannot unmarshal {kind} into Go value of type map[string]interface {{}}"
        )
    status, err = await http.request(
        "PATCH", widgets(namespace, "bad"), raw=b"null", content_type="application/merge-patch+json"
    )
    assert status == 400 and err["message"] == "Invalid JSON Patch"
    for ctype in ("application/merge-patch+json", "application/json-patch+json"):
        status, err = await http.request("PATCH", widgets(namespace, "bad"), raw=b"{not json", content_type=ctype)
        assert status == 400 and err["reason"] == "BadRequest" and err["message"] == "invalid JSON patch"
    status, err = await http.patch(widgets(namespace, "bad"), {"metadata": {"name": "renamed"}})
    assert status == 400 and "does not match the name on the URL" in err["message"]
    status, err = await http.patch(widgets(namespace, "bad"), [1], "application/json-patch+json")
    assert status == 400 and err["message"] == (
        "error decoding patch: json: cannot unmarshal number into Go value of type handlers.jsonPatchOp"
    )
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "bad"}})
    status, err = await http.patch(core(namespace, "configmaps", "bad"), [1], "application/strategic-merge-patch+json")
    assert (
        status == 400 and err["message"] == "json: cannot unmarshal array into Go value of type map[string]interface {}"
    )
