"""PriorityClasses (scheduling.k8s.io/v1) and the Priority admission plugin, as the real server.

Every pod gets ``priority`` and ``preemptionPolicy`` from its ``priorityClassName`` (or the global
default class, or 0); an unknown class is 403 at create. ARC marks such a runner Failed with
reason InvalidPod, so the answer must be the real one.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fixtures.apiserver import KubeApi

from .conftest import Http, core

pytestmark = pytest.mark.anyio

PCS = "/apis/scheduling.k8s.io/v1/priorityclasses"


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {**spec, "containers": [{"name": "c", "image": "busybox"}]}}


@pytest.fixture
async def cleanup_classes(http: Http) -> AsyncIterator[list[str]]:
    """Names of cluster-scoped PriorityClasses a test created; deleted afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        status, body = await http.delete(f"{PCS}/{name}")
        assert status in (200, 404), body


async def test_system_classes_are_served(http: Http) -> None:
    status, body = await http.get(PCS)
    assert status == 200 and body["kind"] == "PriorityClassList"
    by_name = {pc["metadata"]["name"]: pc for pc in body["items"]}
    assert by_name["system-node-critical"]["value"] == 2000001000
    assert by_name["system-cluster-critical"]["value"] == 2000000000
    for name in ("system-node-critical", "system-cluster-critical"):
        assert by_name[name]["preemptionPolicy"] == "PreemptLowerPriority"
        assert by_name[name]["metadata"]["generation"] == 1
        assert "globalDefault" not in by_name[name]
    status, body = await http.delete(f"{PCS}/system-node-critical")
    assert status == 403, body
    assert body["message"] == (
        'priorityclasses.scheduling.k8s.io "system-node-critical" is forbidden: '
        "this is a system priority class and cannot be deleted"
    )


async def test_unknown_priority_class_is_forbidden(http: Http, namespace: str) -> None:
    status, body = await http.post(core(namespace, "pods"), _pod("p", priorityClassName="nope"))
    assert status == 403, body
    assert body["reason"] == "Forbidden"
    assert body["message"] == 'pods "p" is forbidden: no PriorityClass with name nope was found'
    assert body["details"] == {"name": "p", "kind": "pods"}


async def test_priority_is_resolved_from_the_class(http: Http, namespace: str) -> None:
    plain = await http.create(core(namespace, "pods"), _pod("plain"))
    assert plain["spec"]["priority"] == 0 and plain["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    assert "priorityClassName" not in plain["spec"]
    critical = await http.create(core(namespace, "pods"), _pod("crit", priorityClassName="system-cluster-critical"))
    assert critical["spec"]["priority"] == 2000000000
    status, body = await http.post(
        core(namespace, "pods"), _pod("contradicts", priorityClassName="system-node-critical", priority=5)
    )
    assert status == 403, body
    assert body["message"] == (
        'pods "contradicts" is forbidden: the integer value of priority (5) must not be provided in pod spec; '
        "priority admission controller computed 2000001000 from the given PriorityClass name"
    )
    # A value that matches what admission computes is accepted.
    assert (await http.post(core(namespace, "pods"), _pod("zero", priority=0)))[0] == 201


async def test_user_classes_are_validated(http: Http, namespace: str, cleanup_classes: list[str]) -> None:
    name = f"rs-test-{secrets.token_hex(4)}"

    async def create(body: dict[str, Any]) -> tuple[int, Any]:
        return await http.post(PCS, body)

    status, body = await create({"metadata": {"name": name}, "value": 2000000000})
    assert status == 422, body
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: maximum allowed value of a user defined priority is 1000000000",
            "field": "value",
        }
    ]
    status, body = await create({"metadata": {"name": "system-rs-test"}, "value": 1})
    assert status == 422, body
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    assert "priority class names with 'system-' prefix are reserved for system use only" in body["message"]
    status, body = await create({"metadata": {"name": name}, "value": 1, "preemptionPolicy": "Sometimes"})
    assert status == 422, body
    assert body["details"]["causes"][0]["message"] == (
        'Unsupported value: "Sometimes": supported values: "PreemptLowerPriority", "Never"'
    )

    status, created = await create({"metadata": {"name": name}, "value": 7, "preemptionPolicy": "Never"})
    assert status == 201, created
    cleanup_classes.append(name)
    assert created["metadata"]["generation"] == 1
    status, body = await http.patch(f"{PCS}/{name}", {"value": 8})
    assert status == 422, body
    assert body["message"] == (
        f'PriorityClass.scheduling.k8s.io "{name}" is invalid: value: Forbidden: may not be changed in an update.'
    )

    pod = await http.create(core(namespace, "pods"), _pod("p", priorityClassName=name))
    assert (pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]) == (7, "Never")
    status, body = await http.post(
        core(namespace, "pods"), _pod("q", priorityClassName=name, preemptionPolicy="PreemptLowerPriority")
    )
    assert status == 403, body
    assert body["message"] == (
        'pods "q" is forbidden: the string value of PreemptionPolicy (PreemptLowerPriority) must not be provided '
        "in pod spec; priority admission controller computed Never from the given PriorityClass name"
    )


async def test_global_default_class(http: Http, kube_api: KubeApi, namespace: str, cleanup_classes: list[str]) -> None:
    if not kube_api.is_emulator:
        pytest.skip(
            "a cluster-wide default PriorityClass would change every pod that other tests create concurrently "
            "on a shared real cluster; the rule is checked on the emulator only"
        )
    first, second = f"rs-default-{secrets.token_hex(3)}", f"rs-other-{secrets.token_hex(3)}"
    assert (await http.post(PCS, {"metadata": {"name": first}, "value": 10, "globalDefault": True}))[0] == 201
    cleanup_classes.append(first)
    status, body = await http.post(PCS, {"metadata": {"name": second}, "value": 11, "globalDefault": True})
    assert status == 403, body
    assert body["message"] == (
        f'priorityclasses.scheduling.k8s.io "{second}" is forbidden: '
        f"PriorityClass {first} is already marked as default. Only one default can exist"
    )
    pod = await http.create(core(namespace, "pods"), _pod("p"))
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == (first, 10)
