"""Deletion, finalizers, garbage collection and namespaces (§4.3 cases 66-83)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.fixtures.apiserver import OWNED_LABEL, KubeApi, release_and_delete_namespace
from tests.support.eventually import eventually

from .conftest import GROUP, Http, core, widget, widgets

pytestmark = pytest.mark.anyio
HOLD = "test.runnerscale.dev/hold"


async def wait_gone(http: Http, path: str, timeout: float = 10) -> None:
    async def gone() -> bool:
        return (await http.get(path))[0] == 404

    await eventually(gone, timeout=timeout, interval=0.02, what=f"{path} gone")


async def deletion_timestamp(http: Http, path: str) -> str | None:
    stamp: str | None = (await http.get(path))[1]["metadata"].get("deletionTimestamp")
    return stamp


async def wait_found(http: Http, path: str, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while True:
            if (await http.get(path))[0] == 200:
                return
            await anyio.sleep(0.02)  # polling a condition under a deadline


def ref(owner: dict[str, Any], block: bool = False) -> dict[str, Any]:
    r = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }
    if block:
        r["blockOwnerDeletion"] = True
    return r


async def test_delete_responses(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("d"))
    status, body = await http.delete(widgets(namespace, "d"))
    assert status == 200
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "d", "group": GROUP, "kind": "widgets", "uid": obj["metadata"]["uid"]},
    }
    await http.create(
        core(namespace, "pods"),
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    )
    status, body = await http.delete(core(namespace, "pods", "p"))
    assert status == 200 and body["kind"] == "Pod" and body["metadata"]["name"] == "p"
    status, body = await http.delete(widgets(namespace, "d"))
    assert status == 404


async def test_delete_with_finalizer_marks_then_removal_deletes(http: Http, namespace: str) -> None:
    body = widget("f")
    body["metadata"]["finalizers"] = [HOLD]
    await http.create(widgets(namespace), body)
    status, obj = await http.delete(widgets(namespace, "f"))
    assert status == 200 and obj["metadata"]["deletionTimestamp"] and obj["metadata"]["deletionGracePeriodSeconds"] == 0
    status, got = await http.get(widgets(namespace, "f"))
    assert status == 200
    status, err = await http.patch(
        widgets(namespace, "f"), {"metadata": {"finalizers": [HOLD, "test.runnerscale.dev/new"]}}
    )
    assert status == 422 and err["details"]["causes"][0]["reason"] == "FieldValueForbidden"
    # A custom resource gets the same cause twice (two metadata checks run), the message once.
    assert len(err["details"]["causes"]) == 2 and err["details"]["causes"][0] == err["details"]["causes"][1]
    assert err["message"].count("no new finalizers") == 1
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "f", "finalizers": [HOLD]}})
    await http.delete(core(namespace, "configmaps", "f"))
    status, cm_err = await http.patch(
        core(namespace, "configmaps", "f"), {"metadata": {"finalizers": [HOLD, "test.runnerscale.dev/new"]}}
    )
    await http.patch(core(namespace, "configmaps", "f"), {"metadata": {"finalizers": None}})
    assert status == 422 and len(cm_err["details"]["causes"]) == 1  # built-ins list it once
    assert (
        'no new finalizers can be added if the object is being deleted, found new finalizers []string{"test.runnerscale.dev/new"}'
        in err["message"]
    )
    status, same = await http.patch(widgets(namespace, "f"), {"metadata": {"deletionTimestamp": None}})
    assert status == 200 and same["metadata"]["deletionTimestamp"] == obj["metadata"]["deletionTimestamp"]
    got["metadata"]["finalizers"] = []
    got["metadata"]["resourceVersion"] = same["metadata"]["resourceVersion"]
    status, _resp = await http.put(widgets(namespace, "f"), got)
    assert status == 200
    status, _ = await http.get(widgets(namespace, "f"))
    assert status == 404


async def test_delete_options_body_beats_query(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("o"))
    status, obj = await http.delete(
        widgets(namespace, "o"), {"propagationPolicy": "Orphan"}, propagationPolicy="Background"
    )
    assert status == 200 and "orphan" in obj["metadata"]["finalizers"]  # marked, GC will finish
    await wait_gone(http, widgets(namespace, "o"))


async def test_graceful_pod_deletion(http: Http, namespace: str) -> None:
    spec = {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "node-a"}
    await http.create(core(namespace, "pods"), {"metadata": {"name": "g"}, "spec": spec})
    status, pod = await http.delete(core(namespace, "pods", "g"))
    assert status == 200 and pod["metadata"]["deletionGracePeriodSeconds"] == 30
    assert pod["metadata"]["generation"] == 2
    status, _ = await http.get(core(namespace, "pods", "g"))
    assert status == 200
    status, _ = await http.delete(core(namespace, "pods", "g"), gracePeriodSeconds="0")
    assert status == 200
    status, _ = await http.get(core(namespace, "pods", "g"))
    assert status == 404
    await http.create(
        core(namespace, "pods"),
        {"metadata": {"name": "u"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    )
    await http.delete(core(namespace, "pods", "u"))
    assert (await http.get(core(namespace, "pods", "u")))[0] == 404  # never scheduled: removed at once


async def test_background_gc_deletes_dependents(http: Http, namespace: str) -> None:
    owner = await http.create(widgets(namespace), widget("owner"))
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "dep", "ownerReferences": [ref(owner)]}})
    body = widget("held")
    body["metadata"].update(ownerReferences=[ref(owner)], finalizers=[HOLD])
    await http.create(widgets(namespace), body)
    await http.delete(widgets(namespace, "owner"))
    assert (await http.get(widgets(namespace, "owner")))[0] == 404  # owner gone at once
    await wait_gone(http, core(namespace, "configmaps", "dep"))
    await eventually(lambda: deletion_timestamp(http, widgets(namespace, "held")), timeout=10, interval=0.02)
    await http.patch(widgets(namespace, "held"), {"metadata": {"finalizers": None}})
    await wait_gone(http, widgets(namespace, "held"))


async def test_foreground_deletion_waits_for_blocking_dependents(http: Http, namespace: str) -> None:
    owner = await http.create(widgets(namespace), widget("fg"))
    body = widget("child")
    body["metadata"].update(ownerReferences=[ref(owner, block=True)], finalizers=[HOLD])
    await http.create(widgets(namespace), body)
    status, marked = await http.delete(widgets(namespace, "fg"), propagationPolicy="Foreground")
    assert status == 200 and "foregroundDeletion" in marked["metadata"]["finalizers"]
    await eventually(lambda: deletion_timestamp(http, widgets(namespace, "child")), timeout=10, interval=0.02)
    assert (await http.get(widgets(namespace, "fg")))[0] == 200  # still blocked by the child
    await http.patch(widgets(namespace, "child"), {"metadata": {"finalizers": None}})
    await wait_gone(http, widgets(namespace, "fg"))


async def wait_collector_saw_configmaps(http: Http, namespace: str, owner: dict[str, Any]) -> None:
    """Return once the garbage collector has seen every ConfigMap created so far in ``namespace``.

    A real collector orphans only the dependents already in its graph: one its informer has not
    seen yet when the owner is deleted is later collected as dangling. Its informer delivers events
    in order, so a probe created now with a dangling owner (a wrong uid) being collected proves
    the earlier ConfigMaps were seen.
    """
    dangling = ref(owner)
    dangling["uid"] = "00000000-0000-4000-8000-00000000beef"
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "gc-probe", "ownerReferences": [dangling]}})
    await wait_gone(http, core(namespace, "configmaps", "gc-probe"), timeout=30)


async def test_orphan_deletion_keeps_dependents(http: Http, namespace: str) -> None:
    owner = await http.create(widgets(namespace), widget("or"))
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "kept", "ownerReferences": [ref(owner)]}})
    await wait_collector_saw_configmaps(http, namespace, owner)
    status, marked = await http.delete(widgets(namespace, "or"), {"propagationPolicy": "Orphan"})
    assert "orphan" in marked["metadata"]["finalizers"]
    await wait_gone(http, widgets(namespace, "or"))
    status, cm = await http.get(core(namespace, "configmaps", "kept"))
    assert status == 200 and not cm["metadata"].get("ownerReferences")


async def test_two_owners_one_deleted(http: Http, namespace: str) -> None:
    a = await http.create(widgets(namespace), widget("oa"))
    b = await http.create(widgets(namespace), widget("ob"))
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "two", "ownerReferences": [ref(a), ref(b)]}})
    await http.delete(widgets(namespace, "oa"))

    async def one_owner_left() -> bool:
        return len((await http.get(core(namespace, "configmaps", "two")))[1]["metadata"]["ownerReferences"]) == 1

    await eventually(one_owner_left, timeout=10, interval=0.02, what="one owner reference left")
    _, cm = await http.get(core(namespace, "configmaps", "two"))
    assert cm["metadata"]["ownerReferences"][0]["name"] == "ob"


async def test_reference_with_wrong_uid_is_collected(http: Http, namespace: str) -> None:
    owner = await http.create(widgets(namespace), widget("real"))
    wrong = ref(owner)
    wrong["uid"] = "00000000-0000-4000-8000-000000000000"
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "orphaned", "ownerReferences": [wrong]}})
    await wait_gone(http, core(namespace, "configmaps", "orphaned"))


async def test_namespace_deletion(http: Http, namespace: str, kube_api: KubeApi) -> None:
    ns = namespace + "-del"
    try:
        await http.create("/api/v1/namespaces", {"metadata": {"name": ns, "labels": {OWNED_LABEL: "true"}}})
        # Controllers add the default ServiceAccount and the root CA ConfigMap shortly after.
        await wait_found(http, core(ns, "serviceaccounts", "default"))
        await wait_found(http, core(ns, "configmaps", "kube-root-ca.crt"))
        body = widget("w")
        body["metadata"]["finalizers"] = [HOLD]
        await http.create(widgets(ns), body)
        await http.create(core(ns, "configmaps"), {"metadata": {"name": "c"}})
        status, marked = await http.delete(f"/api/v1/namespaces/{ns}")
        assert status == 200 and marked["status"]["phase"] == "Terminating"
        assert marked["metadata"]["deletionTimestamp"] and "deletionGracePeriodSeconds" not in marked["metadata"]
        status, err = await http.post(core(ns, "configmaps"), {"metadata": {"name": "late"}})
        assert status == 403 and err["reason"] == "Forbidden"
        assert (
            err["message"]
            == f'configmaps "late" is forbidden: unable to create new content in namespace {ns} because it is being terminated'
        )
        assert err["details"]["causes"] == [
            {
                "reason": "NamespaceTerminating",
                "message": f"namespace {ns} is being terminated",
                "field": "metadata.namespace",
            }
        ]
        # The namespace controller takes seconds on a real cluster.
        await wait_gone(http, core(ns, "configmaps", "c"), timeout=60)
        # Held by the widget's finalizer: the namespace controller says so in its conditions.
        held_by_widget = f"Some resources are remaining: widgets.{GROUP} has 1 resource instances"
        with anyio.fail_after(60):
            while True:
                status, held = await http.get(f"/api/v1/namespaces/{ns}")
                assert status == 200
                conditions = {c["type"]: c for c in held["status"].get("conditions") or []}
                if conditions.get("NamespaceContentRemaining", {}).get("message") == held_by_widget:
                    break
                await anyio.sleep(0.05)  # polling a condition under a deadline
        assert conditions["NamespaceContentRemaining"]["status"] == "True"
        assert conditions["NamespaceFinalizersRemaining"]["message"] == (
            f"Some content in the namespace has finalizers remaining: {HOLD} in 1 resource instances"
        )
        assert conditions["NamespaceDeletionContentFailure"]["status"] == "False"
        await http.patch(widgets(ns, "w"), {"metadata": {"finalizers": None}})
        await wait_gone(http, f"/api/v1/namespaces/{ns}", timeout=60)
    finally:
        release_and_delete_namespace(kube_api, ns)  # a failed run leaves nothing behind


async def test_default_namespace_cannot_be_deleted(http: Http) -> None:
    status, body = await http.delete("/api/v1/namespaces/default")
    assert status == 403 and body["reason"] == "Forbidden"


async def test_deletecollection(http: Http, namespace: str) -> None:
    for i in range(3):
        body = widget(f"dc{i}")
        body["metadata"]["labels"] = {"batch": "x" if i < 2 else "y"}
        await http.create(widgets(namespace), body)
    status, body = await http.delete(widgets(namespace), labelSelector="batch=x")
    assert status == 200
    _, left = await http.get(widgets(namespace))
    assert [i["metadata"]["name"] for i in left["items"]] == ["dc2"]


async def test_a_sweep_costs_what_changed_not_the_whole_store(http: Http, namespace: str, kube_api: KubeApi) -> None:
    """Emulator only: the collector keeps an owner index up to date per commit, so a sweep never
    walks every stored object (at N >= 1,000 a full rebuild per sweep dominated the emulator)."""
    kube_api.require_emulator("the in-process collector")
    owner = await http.create(widgets(namespace), widget("idx-owner"))
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "idx-dep", "ownerReferences": [ref(owner)]}})

    def forbid_full_walks(emu: Any) -> None:
        def walk() -> Any:
            raise AssertionError("a garbage-collection sweep walked the whole store")

        emu.store.all_objects = walk

    def allow_full_walks(emu: Any) -> None:
        del emu.store.all_objects

    kube_api.call(forbid_full_walks)
    try:
        await http.delete(widgets(namespace, "idx-owner"))
        await wait_gone(http, core(namespace, "configmaps", "idx-dep"))
        assert kube_api.call(lambda emu: emu.controllers.run_once()) is False
    finally:
        kube_api.call(allow_full_walks)
