"""CRD structural schema: pruning, defaulting, validation (§4.3 cases 84-88)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from kubernetes_asyncio import client

from tests.fixtures.apiserver import KubeApi

from .conftest import Http, widget, widgets

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.anyio


async def test_unknown_fields_pruned_on_create_patch_put(http: Http, namespace: str) -> None:
    body = widget("p", replicas=1, unknown="x", extra={"anything": {"goes": 1}})
    body["topLevelJunk"] = 1
    status, obj = await http.post(widgets(namespace), body)
    assert status == 201
    assert "unknown" not in obj["spec"] and "topLevelJunk" not in obj
    assert obj["spec"]["extra"] == {"anything": {"goes": 1}}  # x-kubernetes-preserve-unknown-fields
    status, obj = await http.patch(widgets(namespace, "p"), {"spec": {"bogus": True}})
    assert status == 200 and "bogus" not in obj["spec"]
    obj["spec"]["alsoBogus"] = 1
    status, obj = await http.put(widgets(namespace, "p"), obj)
    assert status == 200 and "alsoBogus" not in obj["spec"]


async def test_snake_case_model_dict_loses_fields(http: Http, namespace: str) -> None:
    # model.to_dict() gives snake_case keys; a real server drops them silently.
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="x", uid="u")
    body = widget("snake")
    body["spec"]["labels_map"] = {"a": "b"}
    body["spec"]["extra"] = {"ref": ref.to_dict()}
    obj = await http.create(widgets(namespace), body)
    assert "labels_map" not in obj["spec"]
    assert "api_version" in obj["spec"]["extra"]["ref"]  # preserved subtree keeps whatever it is given


async def test_defaults_applied(http: Http, namespace: str) -> None:
    obj = await http.create(
        widgets(namespace), widget("def", ports=[{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}])
    )
    assert obj["spec"]["mode"] == "Auto"
    assert obj["spec"]["ports"] == [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 53, "protocol": "UDP"}]
    obj = await http.create(widgets(namespace), {**widget("def2"), "spec": {"mode": "Manual"}})
    assert obj["spec"]["mode"] == "Manual" and "ports" not in obj["spec"]  # defaults never create parents


async def test_invalid_types_and_required(http: Http, namespace: str) -> None:
    status, body = await http.post(
        widgets(namespace), widget("bad", replicas="three", ports=[{"protocol": "TCP"}], mode="Sideways")
    )
    assert status == 422 and body["reason"] == "Invalid" and body["details"]["kind"] == "Widget"
    fields = {c["field"] for c in body["details"]["causes"]}
    assert {"spec.replicas", "spec.ports[0].containerPort", "spec.mode"} <= fields
    assert (
        'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string"'
        in body["message"]
    )
    status, body = await http.post(widgets(namespace), widget("neg", replicas=-1))
    assert status == 422


async def test_field_validation_modes(kube_api: KubeApi, namespace: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        url = kube_api.url + widgets(namespace)
        async with s.post(url, json=widget("warn", junk=1)) as resp:
            assert resp.status == 201
            assert resp.headers.getall("Warning") == ['299 - "unknown field \\"spec.junk\\""']
        async with s.post(url, json=widget("strict", junk=1), params={"fieldValidation": "Strict"}) as resp:
            body = await resp.json()
            assert resp.status == 400 and 'strict decoding error: unknown field "spec.junk"' in body["message"]
        async with s.post(url, json=widget("ignore", junk=1), params={"fieldValidation": "Ignore"}) as resp:
            assert resp.status == 201 and "Warning" not in resp.headers


async def test_arc_crds_install_established(http: Http) -> None:
    crd_dir = anyio.Path(REPO / "deploy" / "crds")
    assert [p async for p in crd_dir.glob("*.yaml")], "deploy/crds/ has no CRDs"
    for name in ("autoscalingrunnersets", "ephemeralrunnersets", "ephemeralrunners", "autoscalinglisteners"):
        status, crd = await http.get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}.actions.github.com"
        )
        assert status == 200
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds["Established"] == "True"


@pytest.mark.parametrize(
    "sample",
    [
        "ars-minimal.yaml",
        "ars-dind.yaml",
        "ars-kubernetes.yaml",
        "ars-kubernetes-novolume.yaml",
        "ers.yaml",
        "er.yaml",
        "al.yaml",
    ],
)
async def test_arc_samples_are_accepted_without_unknown_fields(kube_api: KubeApi, namespace: str, sample: str) -> None:
    import aiohttp
    import yaml

    path = anyio.Path(REPO / "tests" / "data" / "arc" / sample)
    assert await path.exists(), f"tests/data/arc/{sample} is missing"
    doc = yaml.safe_load(await path.read_text())
    doc["metadata"]["namespace"] = namespace
    for k in ("uid", "resourceVersion", "creationTimestamp", "generation", "ownerReferences"):
        doc["metadata"].pop(k, None)
    plural = doc["kind"].lower() + "s"
    async with aiohttp.ClientSession() as s:
        url = f"{kube_api.url}/apis/actions.github.com/v1alpha1/namespaces/{namespace}/{plural}"
        async with s.post(url, json=doc, params={"fieldValidation": "Strict"}) as resp:
            body = await resp.json()
            assert resp.status == 201, body
            assert "Warning" not in resp.headers
    assert body["spec"].keys() >= doc["spec"].keys()


async def test_nulls_and_unknown_metadata_are_dropped(http: Http, namespace: str) -> None:
    body = widget("nul", replicas=None, mode=None, image="x")
    body["metadata"]["bogusMeta"] = 1
    status, obj = await http.post(widgets(namespace), body)
    assert status == 201
    assert "replicas" not in obj["spec"] and obj["spec"]["mode"] == "Auto"  # null dropped, then defaulted
    assert "bogusMeta" not in obj["metadata"]
