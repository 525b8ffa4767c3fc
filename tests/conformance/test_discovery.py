"""Discovery, /version, health and OpenAPI (kube-emulator.md §4.3 cases 1-5)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pytest
from kubernetes_asyncio import client, dynamic
from kubernetes_asyncio.client import ApiClient

from .conftest import GROUP, WIDGETS, Http

pytestmark = pytest.mark.anyio
T = TypeVar("T")


async def test_version_has_all_fields_and_parses(http: Http, kube_client: ApiClient) -> None:
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


async def _until(what: str, check: Callable[[], Awaitable[T | None]], timeout: float = 30.0) -> T:
    """Poll ``check()`` until it returns something truthy; controllers act asynchronously."""
    with anyio.fail_after(timeout):
        while True:
            if result := await check():
                return result
            await anyio.sleep(0.05)  # polling a condition (``what``) under a deadline


async def test_crd_created_at_runtime_is_served_and_removed(http: Http, namespace: str) -> None:
    plural = f"things{namespace.replace('-', '')}"
    name = f"{plural}.runtime.runnerscale.dev"
    crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": "runtime.runnerscale.dev",
            "names": {"kind": plural.capitalize(), "plural": plural},
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
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    things = f"/apis/runtime.runnerscale.dev/v1/namespaces/{namespace}/{plural}"
    created = await http.create(crds, crd)
    try:
        # Names are accepted and the kind served shortly after the create, not by it.
        assert created["status"] == {
            "conditions": None,
            "acceptedNames": {"plural": "", "kind": ""},
            "storedVersions": ["v1"],
        }
        assert created["spec"]["names"]["singular"] == plural and created["spec"]["names"]["listKind"].endswith("List")

        async def established() -> dict[str, Any] | None:
            _, got = await http.get(f"{crds}/{name}")
            conds = {c["type"]: c["status"] for c in got["status"].get("conditions") or []}
            return got if conds.get("Established") == "True" and conds.get("NamesAccepted") == "True" else None

        got = await _until("established", established)
        assert got["status"]["acceptedNames"]["plural"] == plural
        await _until("served", lambda: _status_is(http, things, 200))
        status, groups = await http.get("/apis")
        assert "runtime.runnerscale.dev" in {g["name"] for g in groups["groups"]}
        held = {"apiVersion": "runtime.runnerscale.dev/v1", "kind": crd["spec"]["names"]["kind"], "anything": {"x": 1}}
        await http.create(things, {**held, "metadata": {"name": "a"}})
        await http.create(things, {**held, "metadata": {"name": "held", "finalizers": ["test.runnerscale.dev/hold"]}})
        # DELETE answers with the CRD, marked: a cleanup finalizer holds it while its objects go.
        status, deleting = await http.delete(f"{crds}/{name}")
        assert status == 200 and deleting["kind"] == "CustomResourceDefinition"
        assert deleting["metadata"]["deletionTimestamp"]
        assert "customresourcecleanup.apiextensions.k8s.io" in deleting["metadata"]["finalizers"]
        terminating = next(c for c in deleting["status"]["conditions"] if c["type"] == "Terminating")
        assert terminating["status"] == "True" and terminating["reason"] == "InstanceDeletionPending"

        async def others_gone() -> bool:
            status, listed = await http.get(things)
            return status == 200 and [i["metadata"]["name"] for i in listed["items"]] == ["held"]

        await _until("objects deleted", others_gone)
        status, body = await http.post(things, {**held, "metadata": {"name": "late"}})
        assert status == 403 and body["message"] == (
            f'{plural}.runtime.runnerscale.dev "late" is forbidden: '
            "create not allowed while custom resource definition is terminating"
        )
        await http.patch(f"{things}/held", {"metadata": {"finalizers": None}})
        # Once its objects are gone the kind is no longer served: the catch-all's plain-text 404.
        await _until("CRD gone", lambda: _status_is(http, f"{crds}/{name}", 404))
        await _until("kind unserved", lambda: _status_is(http, things, 404))
        status, body = await http.get(things)
        assert status == 404 and body == "404 page not found\n"
    finally:
        # A failed run must not leave a CRD behind (its held object would keep it terminating).
        await http.patch(f"{things}/held", {"metadata": {"finalizers": None}})
        await http.delete(f"{crds}/{name}")


async def test_crd_names_in_use_are_not_accepted(http: Http, namespace: str) -> None:
    group = f"{namespace.replace('-', '')}.conflict.runnerscale.dev"
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

    def crd(plural: str) -> dict[str, Any]:
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {
                "group": group,
                "names": {"kind": "Thing", "plural": plural},
                "scope": "Namespaced",
                "versions": [
                    {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}}}
                ],
            },
        }

    try:
        await http.create(crds, crd("thingas"))
        await _until("first established", lambda: _established(http, f"{crds}/thingas.{group}"))
        await http.create(crds, crd("thingbs"))  # the same kind in the same group
        rejected = await _until("names refused", lambda: _names_refused(http, f"{crds}/thingbs.{group}"))
        # Singular, kind and list kind all clash; the last one is reported.
        names = rejected["conditions"]
        assert names[0] == {**names[0], "type": "NamesAccepted", "status": "False", "reason": "ListKindConflict"}
        assert names[0]["message"] == '"ThingList" is already in use'
        assert names[1] == {**names[1], "type": "Established", "status": "False", "reason": "NotAccepted"}
        assert rejected["acceptedNames"] == {"plural": "thingbs", "kind": ""}
        assert (await http.get(f"/apis/{group}/v1/namespaces/{namespace}/thingbs"))[0] == 404
    finally:
        for plural in ("thingas", "thingbs"):
            await http.delete(f"{crds}/{plural}.{group}")


async def _established(http: Http, path: str) -> bool:
    _, got = await http.get(path)
    return any(c["type"] == "Established" and c["status"] == "True" for c in got["status"].get("conditions") or [])


async def _names_refused(http: Http, path: str) -> dict[str, Any] | None:
    _, got = await http.get(path)
    conds = got["status"].get("conditions") or []
    return got["status"] if any(c["type"] == "NamesAccepted" and c["status"] == "False" for c in conds) else None


async def _status_is(http: Http, path: str, code: int) -> bool:
    return (await http.get(path))[0] == code


async def test_unknown_resource_is_404_status(http: Http) -> None:
    # Built-in groups answer a NotFound Status...
    for path in ("/api/v1/namespaces/default/nothings", "/api/v9/pods", "/apis/coordination.k8s.io/v9/leases"):
        status, body = await http.get(path)
        assert status == 404, path
        assert body["kind"] == "Status" and body["reason"] == "NotFound"
        assert body["message"] == "the server could not find the requested resource"
    # ...other groups, custom resources' included, fall through to the plain-text catch-all.
    for path in (
        "/apis/nope.example.com/v1/things",
        "/apis/nope.example.com/v1",
        f"/apis/{GROUP}/v9/widgets",
        f"/apis/{GROUP}/v1/nothings",
        f"/apis/{GROUP}/v1/widgets/x",  # a namespaced kind without its namespace
    ):
        async with http.session.get(http.base + path) as resp:
            assert resp.status == 404, path
            assert resp.headers["Content-Type"] == "text/plain; charset=utf-8", path
            assert await resp.text() == "404 page not found\n"


async def test_dynamic_client_resolves_custom_kind(kube_client: ApiClient, namespace: str) -> None:
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
