"""metadata.generation and the /status subresource (§4.3 cases 24-31)."""

from __future__ import annotations

import pytest

from .conftest import GROUP, Http, core, gadgets, widget, widgets

pytestmark = pytest.mark.anyio


async def test_spec_change_bumps_generation_metadata_does_not(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("gen", replicas=1))
    _, obj = await http.patch(widgets(namespace, "gen"), {"spec": {"replicas": 2}})
    assert obj["metadata"]["generation"] == 2
    _, obj = await http.patch(
        widgets(namespace, "gen"),
        {"metadata": {"labels": {"a": "b"}, "annotations": {"x": "y"}, "finalizers": ["test.runnerscale.dev/f"]}},
    )
    assert obj["metadata"]["generation"] == 2
    _, obj = await http.patch(widgets(namespace, "gen"), {"metadata": {"finalizers": None, "generation": 99}})
    assert obj["metadata"]["generation"] == 2  # clients can never set it


async def test_status_on_main_endpoint_is_ignored(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("st", replicas=1))
    _, obj = await http.patch(widgets(namespace, "st"), {"status": {"phase": "Running"}})
    assert "status" not in obj and obj["metadata"]["generation"] == 1
    _, obj = await http.patch(widgets(namespace, "st"), {"spec": {"replicas": 5}, "status": {"phase": "Running"}})
    assert "status" not in obj and obj["metadata"]["generation"] == 2 and obj["spec"]["replicas"] == 5


async def test_status_subresource_changes_only_status(http: Http, namespace: str) -> None:
    created = await http.create(widgets(namespace), widget("sub", replicas=1))
    patch = {"metadata": {"labels": {"x": "y"}}, "spec": {"replicas": 9}, "status": {"phase": "Ready", "ready": 1}}
    status, obj = await http.patch(widgets(namespace, "sub", "status"), patch)
    assert status == 200
    assert obj["status"] == {"phase": "Ready", "ready": 1}
    assert obj["spec"]["replicas"] == 1 and "labels" not in obj["metadata"]
    assert obj["metadata"]["generation"] == 1
    assert int(obj["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    status, got = await http.get(widgets(namespace, "sub", "status"))
    assert status == 200 and got["status"]["phase"] == "Ready"


async def test_status_put_with_stale_rv_conflicts(http: Http, namespace: str) -> None:
    created = await http.create(widgets(namespace), widget("sput"))
    await http.patch(widgets(namespace, "sput"), {"spec": {"replicas": 3}})
    created["status"] = {"phase": "X"}
    status, body = await http.put(widgets(namespace, "sput", "status"), created)
    assert status == 409 and body["reason"] == "Conflict"


async def test_create_drops_status(http: Http, namespace: str) -> None:
    body = widget("cs")
    body["status"] = {"phase": "Fake"}
    obj = await http.create(widgets(namespace), body)
    assert "status" not in obj


async def test_kind_without_status_subresource(http: Http, namespace: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gadget",
        "metadata": {"name": "g"},
        "spec": {"size": 1},
        "status": {"phase": "A"},
    }
    obj = await http.create(gadgets(namespace), body)
    assert obj["status"] == {"phase": "A"}  # an ordinary field without the subresource
    status, _ = await http.patch(gadgets(namespace, "g") + "/status", {"status": {"phase": "B"}})
    assert status == 404
    _, obj = await http.patch(gadgets(namespace, "g"), {"status": {"phase": "B"}})
    assert obj["metadata"]["generation"] == 2  # a status change bumps generation here


async def test_first_deletion_marking_bumps_generation_once(http: Http, namespace: str) -> None:
    body = widget("fin")
    body["metadata"]["finalizers"] = ["test.runnerscale.dev/hold"]
    await http.create(widgets(namespace), body)
    status, obj = await http.delete(widgets(namespace, "fin"))
    assert status == 200 and obj["metadata"]["generation"] == 2 and obj["metadata"]["deletionTimestamp"]
    status, again = await http.delete(widgets(namespace, "fin"))
    assert status == 200 and again["metadata"]["generation"] == 2
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    await http.patch(widgets(namespace, "fin"), {"metadata": {"finalizers": None}})


async def test_pod_status_and_generation(http: Http, namespace: str) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
        "status": {"phase": "Running"},
    }
    obj = await http.create(core(namespace, "pods"), pod)
    assert obj["status"]["phase"] == "Pending" and obj["metadata"]["generation"] == 1
    _, obj = await http.patch(core(namespace, "pods", "p"), {"status": {"phase": "Running"}})
    assert obj["status"]["phase"] == "Pending"
    _, obj = await http.patch(
        core(namespace, "pods", "p", "status"),
        {"metadata": {"labels": {"l": "v"}}, "spec": {"activeDeadlineSeconds": 5}, "status": {"phase": "Running"}},
    )
    assert obj["status"]["phase"] == "Running" and obj["metadata"]["labels"] == {"l": "v"}
    assert "activeDeadlineSeconds" not in obj["spec"] and obj["metadata"]["generation"] == 1
    smp = "application/strategic-merge-patch+json"
    # A merge patch would replace the container list and drop admission's token mount: 422.
    status, _ = await http.patch(
        core(namespace, "pods", "p"), {"spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}}
    )
    assert status == 422
    _, obj = await http.patch(
        core(namespace, "pods", "p"), {"spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}}, smp
    )
    assert obj["metadata"]["generation"] == 2 and obj["spec"]["containers"][0]["image"] == "busybox:1.37"


async def test_pod_spec_is_mostly_immutable(http: Http, namespace: str) -> None:
    await http.create(
        core(namespace, "pods"),
        {"metadata": {"name": "im"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    )
    status, body = await http.patch(core(namespace, "pods", "im"), {"spec": {"restartPolicy": "Never"}})
    assert status == 422 and body["details"]["kind"] == "Pod"
    assert "pod updates may not change fields other than" in body["message"]
