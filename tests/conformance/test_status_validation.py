"""The status subresource is validated like the main endpoint, and validation ratchets.

A ``/status`` write is checked against the status schema (the real server validates the status
on its own there, so messages name paths relative to ``status``). On any update, a value the
write did not change never fails it, even if the schema became stricter after it was stored
(CRDValidationRatcheting, GA since 1.33): controllers keep working across CRD upgrades.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.fixtures.apiserver import KubeApi

from .conftest import Http, widget, widgets

pytestmark = pytest.mark.anyio


def _type_cause(field: str, name: str, actual: str, want: str) -> dict[str, str]:
    return {
        "reason": "FieldValueTypeInvalid",
        "message": f'Invalid value: "{actual}": {name} in body must be of type {want}: "{actual}"',
        "field": field,
    }


async def test_status_patch_with_a_wrong_type_is_422(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("w", replicas=1))
    status, body = await http.patch(widgets(namespace, "w", "status"), {"status": {"ready": "abc"}})
    assert status == 422, body
    cause = _type_cause("status.ready", "ready", "string", "integer")
    assert body["details"] == {
        "name": "w",
        "group": "conformance.runnerscale.dev",
        "kind": "Widget",
        "causes": [cause],
    }
    assert body["message"] == f'Widget.conformance.runnerscale.dev "w" is invalid: status.ready: {cause["message"]}'
    _, stored = await http.get(widgets(namespace, "w"))
    assert "status" not in stored  # nothing was written


async def test_status_put_reports_every_problem(http: Http, namespace: str) -> None:
    created = await http.create(widgets(namespace), widget("w", replicas=1))
    created["status"] = {"phase": 5, "ready": "abc"}
    status, body = await http.put(widgets(namespace, "w", "status"), created)
    assert status == 422, body
    causes = sorted(body["details"]["causes"], key=lambda c: c["field"])
    assert causes == [
        _type_cause("status.phase", "phase", "integer", "string"),
        _type_cause("status.ready", "ready", "string", "integer"),
    ]


async def test_valid_status_write_then_spec_write(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("w", replicas=1))
    status, body = await http.patch(widgets(namespace, "w", "status"), {"status": {"ready": 3, "phase": "Up"}})
    assert status == 200, body
    assert body["status"] == {"ready": 3, "phase": "Up"}
    assert body["metadata"]["generation"] == 1
    status, body = await http.patch(widgets(namespace, "w"), {"spec": {"replicas": 2}})
    assert status == 200, body
    assert body["status"] == {"ready": 3, "phase": "Up"} and body["metadata"]["generation"] == 2


# --- ratcheting, with a CRD whose schema is tightened after objects were stored -----------------

LOOSE = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: ratchets.GROUP}
spec:
  group: GROUP
  names: {kind: Ratchet, plural: ratchets, singular: ratchet, listKind: RatchetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              label: {type: string}
              entries:
                type: array
                items: {type: object, properties: {val: {type: integer}}}
          status:
            type: object
            properties:
              phase: {type: string}
              count: {type: integer}
"""


def _tight(text: str) -> str:
    return (
        text.replace("size: {type: integer}", "size: {type: integer, maximum: 10}")
        .replace("phase: {type: string}", "phase: {type: string, enum: [A, B]}")
        .replace("val: {type: integer}", "val: {type: integer, maximum: 5}")
    )


def _call(kube_api: KubeApi, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
    req = urllib.request.Request(
        kube_api.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": ctype, "Accept": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def ratchet_crd(kube_api: KubeApi) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh CRD (unique group, so a failed run leaves nothing that breaks the next one);
    deleted afterwards."""
    group = f"r{secrets.token_hex(4)}.conformance.runnerscale.dev"
    doc = yaml.safe_load(LOOSE.replace("GROUP", group))
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    _call(kube_api, "POST", crds, doc)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _call(kube_api, "GET", f"/apis/{group}/v1/ratchets")
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # bounded poll: a real server serves a new CRD ~0.2 s later
        yield group, doc
    finally:
        try:
            _call(kube_api, "DELETE", f"{crds}/ratchets.{group}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


def _tighten(kube_api: KubeApi, group: str, namespace: str) -> None:
    """Replace the CRD's schema with the strict one and wait until the server enforces it."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    current = _call(kube_api, "GET", f"{crds}/ratchets.{group}")
    current["spec"]["versions"] = yaml.safe_load(_tight(LOOSE.replace("GROUP", group)))["spec"]["versions"]
    _call(kube_api, "PUT", f"{crds}/ratchets.{group}", current)
    probe = {"apiVersion": f"{group}/v1", "kind": "Ratchet", "metadata": {"name": "probe"}, "spec": {"size": 50}}
    deadline = time.monotonic() + 30
    while True:
        try:
            _call(kube_api, "POST", f"/apis/{group}/v1/namespaces/{namespace}/ratchets?dryRun=All", probe)
        except urllib.error.HTTPError as exc:
            if exc.code == 422:
                return
            raise
        if time.monotonic() > deadline:
            raise AssertionError("the tightened schema was not enforced within 30 s")
        time.sleep(0.1)  # bounded poll: a real server swaps the schema asynchronously


async def test_unchanged_invalid_values_do_not_fail_a_write(
    http: Http, kube_api: KubeApi, namespace: str, ratchet_crd: tuple[str, dict[str, Any]]
) -> None:
    group, _ = ratchet_crd
    base = f"/apis/{group}/v1/namespaces/{namespace}/ratchets"
    obj = {
        "apiVersion": f"{group}/v1",
        "kind": "Ratchet",
        "metadata": {"name": "r1"},
        "spec": {"size": 50, "label": "a", "entries": [{"val": 9}, {"val": 1}]},
    }
    assert (await http.post(base, obj))[0] == 201
    status, body = await http.patch(f"{base}/r1/status", {"status": {"phase": "Zed", "count": 1}})
    assert status == 200, body
    _tighten(kube_api, group, namespace)

    # A write that leaves the now-invalid values alone passes, on either endpoint.
    status, body = await http.patch(f"{base}/r1", {"spec": {"label": "b"}})
    assert status == 200, body
    assert body["spec"]["size"] == 50 and body["status"]["phase"] == "Zed"
    status, body = await http.patch(f"{base}/r1/status", {"status": {"count": 2}})
    assert status == 200, body
    assert body["status"] == {"phase": "Zed", "count": 2}

    # Changing an invalid value to another invalid value fails, with the usual causes.
    status, body = await http.patch(f"{base}/r1", {"spec": {"size": 60}})
    assert status == 422, body
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 60: spec.size in body should be less than or equal to 10",
            "field": "spec.size",
        }
    ]
    status, body = await http.patch(f"{base}/r1/status", {"status": {"phase": "Q"}})
    assert status == 422, body
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueNotSupported",
            "message": 'Unsupported value: "Q": supported values: "A", "B"',
            "field": "status.phase",
        }
    ]

    # An atomic list correlates only as a whole: touching one item re-validates all of them.
    status, body = await http.patch(f"{base}/r1", {"spec": {"entries": [{"val": 9}, {"val": 2}]}})
    assert status == 422, body
    assert [c["field"] for c in body["details"]["causes"]] == ["spec.entries[0].val"]
    status, body = await http.patch(f"{base}/r1", {"spec": {"entries": None}})
    assert status == 200, body
    assert "entries" not in body["spec"]
