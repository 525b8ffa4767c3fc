"""The CRDs of deploy/crds/ on both Kubernetes API servers (the emulator and a real control plane):
ARC manifests are accepted and read back unchanged, status patches built from the structs land,
and what the schema forbids is refused."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import yaml

from shared.api import KIND_BY_NAME, EphemeralRunnerSet, EphemeralRunnerSetPhase, decode, status_patch, to_dict
from shared.semantic import semantic_equal
from tests.fixtures.apiserver import KubeApi
from tests.support.paths import TEST_DATA

pytestmark = pytest.mark.anyio

ARC_DATA = TEST_DATA / "arc"
MANIFESTS = [
    "ars-dind.yaml",
    "ars-kubernetes.yaml",
    "ars-kubernetes-novolume.yaml",
    "ars-minimal.yaml",
    "ers.yaml",
    "er.yaml",
    "al.yaml",
]
TIMEOUT = aiohttp.ClientTimeout(total=30)
# Server-owned metadata (and links to owners that do not exist in the test namespace).
_SERVER_META = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


def manifest_for(name: str, namespace: str) -> dict[str, Any]:
    manifest = yaml.safe_load((ARC_DATA / name).read_text())
    manifest.pop("status", None)
    for key in _SERVER_META:
        manifest["metadata"].pop(key, None)
    manifest["metadata"]["namespace"] = namespace
    assert isinstance(manifest, dict)
    return manifest


def collection(manifest: dict[str, Any]) -> str:
    cls = KIND_BY_NAME[manifest["kind"]]
    return f"/apis/actions.github.com/v1alpha1/namespaces/{manifest['metadata']['namespace']}/{cls.PLURAL}"


async def request(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json", "Content-Type": content_type}
    async with session.request(method, url, data=data, headers=headers, timeout=TIMEOUT) as resp:
        text = await resp.text()
        return resp.status, (json.loads(text) if text else None)


@pytest.fixture
async def session(kube_api: KubeApi) -> AsyncIterator[aiohttp.ClientSession]:
    # kube_api.url needs no credentials on either server (a kubectl proxy in front of a real one).
    async with aiohttp.ClientSession(base_url=kube_api.url) as s:
        yield s


@pytest.mark.parametrize("name", MANIFESTS)
async def test_arc_manifest_is_accepted_and_reads_back_unchanged(
    session: aiohttp.ClientSession, namespace: str, name: str
) -> None:
    manifest = manifest_for(name, namespace)
    status, created = await request(session, "POST", collection(manifest), manifest)
    assert status == 201, created
    status, read = await request(session, "GET", f"{collection(manifest)}/{manifest['metadata']['name']}")
    assert status == 200
    obj = decode(KIND_BY_NAME[manifest["kind"]], read)
    assert obj.metadata.resource_version and obj.metadata.uid
    tree = to_dict(obj)
    assert tree["spec"] == manifest["spec"]
    assert semantic_equal(tree["spec"], manifest["spec"])


async def test_status_merge_patch_from_struct_lands_and_nulls_clear(
    session: aiohttp.ClientSession, namespace: str
) -> None:
    manifest = manifest_for("ers.yaml", namespace)
    url = f"{collection(manifest)}/{manifest['metadata']['name']}"
    assert (await request(session, "POST", collection(manifest), manifest))[0] == 201
    ers = decode(EphemeralRunnerSet, (await request(session, "GET", url))[1])
    status = copy.deepcopy(decode(EphemeralRunnerSet, yaml.safe_load((ARC_DATA / "ers.yaml").read_text())).status)
    body = {"metadata": {"resourceVersion": ers.metadata.resource_version}, **status_patch(status)}
    code, patched = await request(session, "PATCH", f"{url}/status", body, "application/merge-patch+json")
    assert code == 200, patched
    ers = decode(EphemeralRunnerSet, patched)
    assert ers.status is not None
    assert ers.status.finished_runner_cleanup_patch_id == 41
    assert ers.status.phase is EphemeralRunnerSetPhase.RUNNING

    assert status is not None
    status.finished_runner_cleanup_patch_id = None  # "cleared when a revision is applied"
    status.applied_actionable_revision = 5
    code, patched = await request(
        session, "PATCH", f"{url}/status", status_patch(status), "application/merge-patch+json"
    )
    assert code == 200, patched
    ers = decode(EphemeralRunnerSet, patched)
    assert ers.status is not None
    assert ers.status.finished_runner_cleanup_patch_id is None
    assert ers.status.applied_actionable_revision == 5


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m["spec"].__setitem__("minRunners", -1), "spec.minRunners"),
        (lambda m: m["spec"].__setitem__("maxRunners", "ten"), "spec.maxRunners"),
    ],
)
async def test_schema_violations_are_refused(
    session: aiohttp.ClientSession, namespace: str, mutate: Callable[[dict[str, Any]], object], field: str
) -> None:
    manifest = manifest_for("ars-minimal.yaml", namespace)
    mutate(manifest)
    status, body = await request(session, "POST", collection(manifest), manifest)
    assert status == 422, body
    assert field in {cause.get("field") for cause in body["details"]["causes"]}


async def test_unknown_spec_fields_are_pruned_but_templates_kept(
    session: aiohttp.ClientSession, namespace: str
) -> None:
    manifest = manifest_for("ars-minimal.yaml", namespace)
    manifest["spec"]["minRunner"] = 2  # a typo
    manifest["spec"]["template"]["spec"]["futurePodField"] = {"x": 1}
    status, created = await request(session, "POST", collection(manifest), manifest)
    assert status == 201
    assert "minRunner" not in created["spec"]
    assert created["spec"]["template"]["spec"]["futurePodField"] == {"x": 1}
