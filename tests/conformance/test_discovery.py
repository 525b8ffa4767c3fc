"""Discovery, /version, health and OpenAPI (kube-emulator.md §4.3 cases 1-5)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client, dynamic

from .conftest import GROUP, WIDGETS, Http

pytestmark = pytest.mark.anyio


async def test_version_has_all_fields_and_parses(http: Http, kube_client) -> None:
    status, body = await http.get("/version")
    assert status == 200
    for key in (
        "major",
        "minor",
        "gitVersion",
        "gitCommit",
        "gitTreeState",
        "buildDate",
        "goVersion",
        "compiler",
        "platform",
    ):
        assert body[key], key
    info = await client.VersionApi(kube_client).get_code()
    assert info.major == "1"


async def test_core_and_group_discovery(http: Http) -> None:
    status, api = await http.get("/api")
    assert status == 200 and api["kind"] == "APIVersions" and api["versions"] == ["v1"]
    status, groups = await http.get("/apis")
    assert status == 200 and groups["kind"] == "APIGroupList"
    names = {g["name"] for g in groups["groups"]}
    assert {GROUP, "coordination.k8s.io", "rbac.authorization.k8s.io", "apiextensions.k8s.io"} <= names
    status, group = await http.get(f"/apis/{GROUP}")
    assert status == 200 and group["kind"] == "APIGroup" and group["preferredVersion"]["version"] == "v1"
    status, res = await http.get(WIDGETS)
    assert status == 200 and res["kind"] == "APIResourceList" and res["groupVersion"] == f"{GROUP}/v1"
    by_name = {r["name"]: r for r in res["resources"]}
    assert by_name["widgets"]["kind"] == "Widget" and by_name["widgets"]["namespaced"] is True
    assert by_name["widgets"]["singularName"] == "widget" and by_name["widgets"]["shortNames"] == ["wdg"]
    assert by_name["widgets/status"]["verbs"] == ["get", "patch", "update"]
    assert "gadgets/status" not in by_name  # no status subresource declared
    status, v1 = await http.get("/api/v1")
    core = {r["name"] for r in v1["resources"]}
    assert {"pods", "pods/status", "secrets", "configmaps", "serviceaccounts", "namespaces", "events"} <= core


async def test_arc_crds_are_served(http: Http) -> None:
    status, res = await http.get("/apis/actions.github.com/v1alpha1")
    assert status == 200
    names = {r["name"] for r in res["resources"]}
    assert {
        "ephemeralrunners",
        "ephemeralrunners/status",
        "autoscalingrunnersets",
        "ephemeralrunnersets",
        "autoscalinglisteners",
    } <= names


async def test_crd_created_at_runtime_is_served_and_removed(http: Http, namespace: str) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"things{namespace.replace('-', '')}.runtime.runnerscale.dev"},
        "spec": {
            "group": "runtime.runnerscale.dev",
            "names": {"kind": "Thing", "plural": f"things{namespace.replace('-', '')}"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    plural = crd["spec"]["names"]["plural"]
    created = await http.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    conds = {c["type"]: c["status"] for c in created["status"]["conditions"]}
    assert conds["Established"] == "True" and conds["NamesAccepted"] == "True"
    status, _ = await http.get(f"/apis/runtime.runnerscale.dev/v1/namespaces/{namespace}/{plural}")
    assert status == 200
    status, groups = await http.get("/apis")
    assert "runtime.runnerscale.dev" in {g["name"] for g in groups["groups"]}
    await http.create(
        f"/apis/runtime.runnerscale.dev/v1/namespaces/{namespace}/{plural}",
        {"apiVersion": "runtime.runnerscale.dev/v1", "kind": "Thing", "metadata": {"name": "a"}, "anything": {"x": 1}},
    )
    status, _ = await http.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
    assert status == 200
    status, body = await http.get(f"/apis/runtime.runnerscale.dev/v1/namespaces/{namespace}/{plural}")
    assert status == 404 and body["message"] == "the server could not find the requested resource"


async def test_unknown_resource_is_404_status(http: Http) -> None:
    for path in (
        "/apis/nope.example.com/v1/things",
        "/api/v1/namespaces/default/nothings",
        f"/apis/{GROUP}/v9/widgets",
    ):
        status, body = await http.get(path)
        assert status == 404, path
        assert body["kind"] == "Status" and body["reason"] == "NotFound"
        assert body["message"] == "the server could not find the requested resource"


async def test_dynamic_client_resolves_custom_kind(kube_client, namespace: str) -> None:
    dyn = await dynamic.DynamicClient(kube_client)
    widgets = await dyn.resources.get(api_version=f"{GROUP}/v1", kind="Widget")
    listed = await widgets.get(namespace=namespace)
    assert listed.kind == "WidgetList" and listed.items == []


async def test_health_endpoints(http: Http) -> None:
    for path in ("/healthz", "/livez", "/readyz"):
        status, body = await http.get(path)
        assert status == 200 and body == "ok"


async def test_openapi_v3_declares_server_side_field_validation(http: Http) -> None:
    status, index = await http.get("/openapi/v3")
    assert status == 200
    url = index["paths"][f"apis/{GROUP}/v1"]["serverRelativeURL"]
    status, doc = await http.get(url.split("?")[0])
    assert status == 200
    ops = doc["paths"][f"/apis/{GROUP}/v1/namespaces/{{namespace}}/widgets/{{name}}"]["patch"]
    assert ops["x-kubernetes-group-version-kind"] == {"group": GROUP, "version": "v1", "kind": "Widget"}
    assert "fieldValidation" in {p["name"] for p in ops["parameters"]}
