"""Create/get/list basics, resourceVersion and optimistic concurrency (§4.3 cases 6-23)."""

from __future__ import annotations

import json
import re

import pytest

from tests.fixtures.apiserver import KubeApi

from .conftest import GROUP, Http, core, widget, widgets

pytestmark = pytest.mark.anyio

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
RFC3339_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


async def test_create_custom_resource_sets_system_metadata(http: Http, namespace: str) -> None:
    status, obj = await http.post(widgets(namespace), widget("w1", replicas=1))
    assert status == 201
    meta = obj["metadata"]
    assert UUID.match(meta["uid"])
    assert RFC3339_SECONDS.match(meta["creationTimestamp"])
    assert int(meta["resourceVersion"]) > 0
    assert meta["generation"] == 1
    assert meta["namespace"] == namespace
    assert obj["apiVersion"] == f"{GROUP}/v1" and obj["kind"] == "Widget"


async def test_create_duplicate_is_already_exists(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("dup"))
    status, body = await http.post(widgets(namespace), widget("dup"))
    assert status == 409
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'widgets.{GROUP} "dup" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "dup", "group": GROUP, "kind": "widgets"},
        "code": 409,
    }
    status, body = await http.post(core(namespace, "configmaps"), {"metadata": {"name": "cm"}})
    status, body = await http.post(core(namespace, "configmaps"), {"metadata": {"name": "cm"}})
    assert status == 409 and body["details"] == {"name": "cm", "kind": "configmaps"}
    assert body["message"] == 'configmaps "cm" already exists'


async def test_generate_name(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), {**widget(""), "metadata": {"generateName": "runner-"}})
    name = obj["metadata"]["name"]
    assert re.match(r"^runner-[bcdfghjklmnpqrstvwxz2456789]{5}$", name), name
    long_base = "a" * 64
    obj = await http.create(core(namespace, "configmaps"), {"metadata": {"generateName": long_base}})
    assert obj["metadata"]["name"].startswith("a" * 58) and len(obj["metadata"]["name"]) == 63


async def test_create_with_resource_version_is_500(http: Http, namespace: str) -> None:
    body = widget("rv")
    body["metadata"]["resourceVersion"] = "12"
    status, resp = await http.post(widgets(namespace), body)
    assert status == 500
    assert resp["message"] == "resourceVersion should not be set on objects to be created"


async def test_create_in_missing_namespace_is_404(http: Http) -> None:
    status, body = await http.post(widgets("no-such-ns"), widget("x"))
    assert status == 404
    assert body["message"] == 'namespaces "no-such-ns" not found'
    assert body["details"] == {"name": "no-such-ns", "kind": "namespaces"}


async def test_create_consistency_errors(http: Http, namespace: str) -> None:
    body = widget("x")
    body["metadata"]["namespace"] = "other"
    status, resp = await http.post(widgets(namespace), body)
    assert status == 400 and resp["reason"] == "BadRequest"
    assert resp["message"] == "the namespace of the provided object does not match the namespace sent on the request"
    nokind = {"apiVersion": f"{GROUP}/v1", "metadata": {"name": "nokind"}}
    status, resp = await http.post(widgets(namespace), nokind)
    sent = json.dumps(nokind)  # the body exactly as the test client sends it
    assert status == 400 and resp["message"] == (
        f"the object provided is unrecognized (must be of type Widget): Object 'Kind' is missing in '{sent}' ({sent[:30]} ...)"
    )
    status, resp = await http.post(widgets(namespace), {**widget("wk"), "kind": "Gadget"})
    assert status == 422 and resp["message"] == (
        f'Gadget.{GROUP} "wk" is invalid: kind: Invalid value: "Gadget": must be Widget'
    )
    status, resp = await http.request("POST", widgets(namespace), raw=b"{x")
    assert status == 400 and resp["message"] == (
        "the object provided is unrecognized (must be of type Widget): couldn't get version/kind; "
        "json parse error: invalid character 'x' looking for beginning of object key string ({x)"
    )
    status, resp = await http.post(
        core(namespace, "configmaps"), {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
    )
    assert status == 400 and resp["message"] == (
        'Secret in version "v1" cannot be handled as a ConfigMap: converting (v1.Secret) to (core.ConfigMap): unknown conversion'
    )
    status, resp = await http.post(widgets(namespace), widget("Bad_Name"))
    assert status == 422 and resp["reason"] == "Invalid"
    assert resp["details"]["causes"][0]["field"] == "metadata.name"
    status, resp = await http.post(widgets(namespace), {**widget("x"), "apiVersion": f"{GROUP}/v2"})
    assert status == 400 and "does not match the expected API version" in resp["message"]


async def test_name_and_generate_name_errors(http: Http, namespace: str) -> None:
    status, body = await http.post(widgets(namespace), {**widget(""), "metadata": {}})
    assert status == 422 and body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'Widget.{GROUP} "" is invalid: metadata.name: Required value: name or generateName is required',
        "reason": "Invalid",
        "details": {
            "group": GROUP,
            "kind": "Widget",
            "causes": [
                {
                    "reason": "FieldValueRequired",
                    "message": "Required value: name or generateName is required",
                    "field": "metadata.name",
                }
            ],
        },
        "code": 422,
    }
    status, body = await http.post(core(namespace, "configmaps"), {"metadata": {"generateName": "Upper-"}})
    assert status == 422
    generated = body["details"]["name"]
    assert re.match(r"^Upper-[bcdfghjklmnpqrstvwxz2456789]{5}$", generated)
    subdomain = (
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
        "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": f'Invalid value: "Upper-": {subdomain}',
            "field": "metadata.generateName",
        },
        {
            "reason": "FieldValueInvalid",
            "message": f'Invalid value: "{generated}": {subdomain}',
            "field": "metadata.name",
        },
    ]
    status, body = await http.post(core(namespace, "configmaps"), {"metadata": {"name": "ok", "generateName": "fine-"}})
    assert status == 201 and body["metadata"]["name"] == "ok"  # a valid generateName beside a name is kept
    status, body = await http.post(
        core(namespace, "configmaps"), {"metadata": {"name": "fin", "finalizers": ["nodomain"]}}
    )
    assert status == 422 and body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "nodomain": name is neither a standard finalizer name nor is it fully qualified',
            "field": "metadata.finalizers[0]",
        }
    ]


async def test_get_missing_is_404_with_plural_kind(http: Http, namespace: str) -> None:
    status, body = await http.get(widgets(namespace, "missing"))
    assert status == 404
    assert body["details"] == {"name": "missing", "group": GROUP, "kind": "widgets"}
    assert body["message"] == f'widgets.{GROUP} "missing" not found'
    status, body = await http.get(core(namespace, "pods", "missing"))
    assert body["details"] == {"name": "missing", "kind": "pods"}  # no group for core
    assert body["message"] == 'pods "missing" not found'


async def test_list_shapes(http: Http, namespace: str) -> None:
    status, empty = await http.get(widgets(namespace))
    assert status == 200 and empty["kind"] == "WidgetList" and empty["items"] == []
    await http.create(widgets(namespace), widget("a"))
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "c"}, "data": {"k": "v"}})
    _, crs = await http.get(widgets(namespace))
    assert crs["items"][0]["kind"] == "Widget" and crs["items"][0]["apiVersion"] == f"{GROUP}/v1"
    _, cms = await http.get(core(namespace, "configmaps"))
    assert cms["kind"] == "ConfigMapList" and cms["apiVersion"] == "v1"
    assert all("kind" not in i and "apiVersion" not in i for i in cms["items"])
    # The list RV is the global counter at read time, not the newest item's RV.
    await http.create(core(namespace, "secrets"), {"metadata": {"name": "s"}})
    _, again = await http.get(widgets(namespace))
    assert int(again["metadata"]["resourceVersion"]) > int(crs["items"][0]["metadata"]["resourceVersion"])


async def test_resource_version_is_global_and_increments_by_one(http: Http, namespace: str, kube_api: KubeApi) -> None:
    control = kube_api.require_emulator()  # a real cluster has concurrent writers: RVs are not consecutive
    await control.settings_async(gc_paused=True)  # no background writes from earlier tests' cleanup
    try:
        a = await http.create(widgets(namespace), widget("g1"))
        b = await http.create(core(namespace, "configmaps"), {"metadata": {"name": "g2"}})
        c = await http.create(core(namespace, "secrets"), {"metadata": {"name": "g3"}})
    finally:
        await control.settings_async(gc_paused=False)
    rvs = [int(o["metadata"]["resourceVersion"]) for o in (a, b, c)]
    assert rvs[1] == rvs[0] + 1 and rvs[2] == rvs[1] + 1


async def test_put_with_current_and_stale_resource_version(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("put", replicas=1))
    stale = obj["metadata"]["resourceVersion"]
    obj["spec"]["replicas"] = 2
    status, updated = await http.put(widgets(namespace, "put"), obj)
    assert status == 200 and updated["spec"]["replicas"] == 2
    assert int(updated["metadata"]["resourceVersion"]) > int(stale)
    obj["spec"]["replicas"] = 3  # obj still carries the stale RV
    status, body = await http.put(widgets(namespace, "put"), obj)
    assert status == 409
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'Operation cannot be fulfilled on widgets.{GROUP} "put": the object has been modified; please apply your changes to the latest version and try again',
        "reason": "Conflict",
        "details": {"name": "put", "group": GROUP, "kind": "widgets"},
        "code": 409,
    }


async def test_put_without_resource_version(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("norv", replicas=1))
    del obj["metadata"]["resourceVersion"]
    status, body = await http.put(widgets(namespace, "norv"), obj)
    assert status == 422
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'widgets.{GROUP} "norv" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update',
        "reason": "Invalid",
        "details": {
            "name": "norv",
            "group": GROUP,
            "kind": "widgets",
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": "Invalid value: 0: must be specified for an update",
                    "field": "metadata.resourceVersion",
                }
            ],
        },
        "code": 422,
    }
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    status, cm = await http.put(core(namespace, "configmaps", "cm"), {"metadata": {"name": "cm"}, "data": {"a": "2"}})
    assert status == 200 and cm["data"] == {"a": "2"}  # built-ins allow unconditional update


async def test_merge_patch_with_stale_resource_version_conflicts(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("mp", replicas=1))
    rv = obj["metadata"]["resourceVersion"]
    status, _ = await http.patch(widgets(namespace, "mp"), {"spec": {"replicas": 2}})
    assert status == 200
    status, body = await http.patch(
        widgets(namespace, "mp"), {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 3}}
    )
    assert status == 409 and body["reason"] == "Conflict"
    status, body = await http.patch(widgets(namespace, "mp"), {"spec": {"replicas": 4}})  # no RV: never conflicts
    assert status == 200 and body["spec"]["replicas"] == 4


async def test_json_patch_test_op_with_stale_rv_is_422(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("jp", replicas=1))
    await http.patch(widgets(namespace, "jp"), {"spec": {"replicas": 2}})
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/replicas", "value": 5},
    ]
    status, body = await http.patch(widgets(namespace, "jp"), ops, "application/json-patch+json")
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"] == "the server rejected our request due to an error in our request"
    assert body["details"] == {}  # the JSON patch library's own text is not passed on


async def test_put_with_uid_of_recreated_object_conflicts(http: Http, namespace: str) -> None:
    old = await http.create(widgets(namespace), widget("re"))
    await http.delete(widgets(namespace, "re"))
    new = await http.create(widgets(namespace), widget("re"))
    old["metadata"]["resourceVersion"] = new["metadata"]["resourceVersion"]
    status, body = await http.put(widgets(namespace, "re"), old)
    assert status == 409 and body["reason"] == "Conflict"
    assert (
        f"Precondition failed: UID in precondition: {old['metadata']['uid']}, UID in object meta: {new['metadata']['uid']}"
        in body["message"]
    )


async def test_noop_writes_keep_resource_version(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("noop", replicas=1))
    status, same = await http.patch(widgets(namespace, "noop"), {"spec": {"replicas": 1}})
    assert status == 200 and same["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    status, same = await http.put(widgets(namespace, "noop"), obj)
    assert status == 200 and same["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


async def test_delete_preconditions(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("pre"))
    rv, uid = obj["metadata"]["resourceVersion"], obj["metadata"]["uid"]
    status, body = await http.delete(widgets(namespace, "pre"), {"preconditions": {"resourceVersion": "1"}})
    assert status == 409 and body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'Operation cannot be fulfilled on Widget.{GROUP} "pre": the ResourceVersion in the precondition (1) '
        f"does not match the ResourceVersion in record ({rv}). The object might have been modified",
        "reason": "Conflict",
        "details": {"name": "pre", "group": GROUP, "kind": "Widget"},
        "code": 409,
    }
    wrong = "00000000-0000-4000-8000-000000000000"
    status, body = await http.delete(
        widgets(namespace, "pre"), {"preconditions": {"uid": wrong, "resourceVersion": "1"}}
    )
    assert status == 409 and body["message"] == (  # the uid is checked first
        f'Operation cannot be fulfilled on Widget.{GROUP} "pre": the UID in the precondition ({wrong}) does not '
        f"match the UID in record ({uid}). The object might have been deleted and then recreated"
    )
    cm = await http.create(core(namespace, "configmaps"), {"metadata": {"name": "pre"}})
    status, body = await http.delete(core(namespace, "configmaps", "pre"), {"preconditions": {"resourceVersion": "1"}})
    assert status == 409 and body["details"] == {"name": "pre", "kind": "ConfigMap"}
    assert body["message"].startswith('Operation cannot be fulfilled on ConfigMap "pre": the ResourceVersion')
    assert cm["metadata"]["resourceVersion"] in body["message"]
    status, _ = await http.delete(
        widgets(namespace, "pre"), {"preconditions": {"resourceVersion": obj["metadata"]["resourceVersion"]}}
    )
    assert status == 200


async def test_order_of_errors(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("order", replicas=1))
    await http.patch(widgets(namespace, "order"), {"spec": {"replicas": 2}})
    obj["spec"]["replicas"] = "not a number"  # stale RV and invalid content: the RV check wins
    status, _ = await http.put(widgets(namespace, "order"), obj)
    assert status == 409
    status, _ = await http.patch(
        widgets(namespace, "absent"), [{"op": "remove", "path": "/nope"}], "application/json-patch+json"
    )
    assert status == 404


async def test_put_name_mismatch_is_400(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("nm"))
    obj["metadata"]["name"] = "other"
    status, body = await http.put(widgets(namespace, "nm"), obj)
    assert status == 400
    assert body["message"] == "the name of the object (other) does not match the name on the URL (nm)"


async def test_wrong_body_content_type_is_415(http: Http, namespace: str) -> None:
    status, body = await http.request("POST", widgets(namespace), widget("ct"), content_type="text/plain")
    assert status == 415 and body["reason"] == "UnsupportedMediaType"
    assert body["message"].startswith(
        "the body of the request was in an unknown format - accepted media types include: application/json"
    )


async def test_dry_run_writes_nothing(http: Http, namespace: str) -> None:
    status, obj = await http.post(widgets(namespace), widget("dry", replicas=1), dryRun="All")
    assert status == 201 and obj["metadata"]["name"] == "dry" and obj["spec"]["mode"] == "Auto"
    assert (await http.get(widgets(namespace, "dry")))[0] == 404
    real = await http.create(widgets(namespace), widget("dry", replicas=1))
    status, obj = await http.request(
        "PATCH",
        widgets(namespace, "dry"),
        {"spec": {"replicas": 5}},
        "application/merge-patch+json",
        params={"dryRun": "All"},
    )
    assert status == 200 and obj["spec"]["replicas"] == 5
    status, obj = await http.delete(widgets(namespace, "dry"), {"dryRun": ["All"]})
    assert status == 200
    _, stored = await http.get(widgets(namespace, "dry"))
    assert (
        stored["spec"]["replicas"] == 1 and stored["metadata"]["resourceVersion"] == real["metadata"]["resourceVersion"]
    )
    for method, kind in (("POST", "CreateOptions"), ("PATCH", "PatchOptions"), ("DELETE", "DeleteOptions")):
        path = widgets(namespace) if method == "POST" else widgets(namespace, "dry")
        # (A DELETE with a body takes its options from the body only.)
        body = widget("dry2") if method == "POST" else {} if method == "PATCH" else None
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        status, err = await http.request(method, path, body, ctype, params={"dryRun": "Some"})
        assert status == 422 and err["reason"] == "Invalid", method
        assert (
            err["message"]
            == f'{kind}.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["Some"]: supported values: "All"'
        )
        assert err["details"] == {
            "group": "meta.k8s.io",
            "kind": kind,
            "causes": [
                {
                    "reason": "FieldValueNotSupported",
                    "message": 'Unsupported value: ["Some"]: supported values: "All"',
                    "field": "dryRun",
                }
            ],
        }
    status, err = await http.delete(widgets(namespace, "dry"), {"dryRun": ["All", "Some"]})
    assert status == 422 and 'Unsupported value: ["All","Some"]' in err["message"]
    status, err = await http.post(widgets(namespace), widget("dry3"), fieldValidation="Bogus")
    assert status == 422 and err["details"]["kind"] == "CreateOptions"
    assert err["details"]["causes"] == [
        {
            "reason": "FieldValueNotSupported",
            "message": 'Unsupported value: "Bogus": supported values: "", "Ignore", "Strict", "Warn"',
            "field": "fieldValidation",
        }
    ]
