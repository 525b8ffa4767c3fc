"""Fixtures for the kube layer tests: a KubeClient for the API under test (emulator or real
cluster), reader/writer, emulator control, and builders for the objects the tests create."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from services.embedded.apiserver import EmulatorControl
from shared.api import EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSpec, ObjectMeta, OwnerReference
from shared.kube import ApiReader, ApiWriter, KubeClient
from tests.fixtures.apiserver import KubeApi
from tests.support.eventually import eventually as support_eventually


@pytest.fixture
async def kube(kube_api: KubeApi) -> AsyncIterator[KubeClient]:
    client = await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=10)
    async with client:
        yield client


@pytest.fixture
def reader(kube: KubeClient) -> ApiReader:
    return ApiReader(kube)


@pytest.fixture
def writer(kube: KubeClient) -> ApiWriter:
    return ApiWriter(kube)


@pytest.fixture
def control(kube_api: KubeApi) -> Iterator[EmulatorControl]:
    """The emulator's fault-injection handle (skips against a real cluster); reset after the test."""
    ctl = kube_api.require_emulator()
    ctl.clear_faults()
    yield ctl
    ctl.clear_faults()
    ctl.settings(watch_lag_seconds=0)


def ers(namespace: str, name: str, replicas: int = 1, **meta: Any) -> EphemeralRunnerSet:
    return EphemeralRunnerSet(
        metadata=ObjectMeta(name=name, namespace=namespace, **meta),
        spec=EphemeralRunnerSetSpec(
            replicas=replicas,
            patch_id=0,
            ephemeral_runner_spec=EphemeralRunnerSpec(
                github_config_url="https://github.com/org/repo",
                github_config_secret="gh-secret",
                runner_scale_set_id=1,
                spec={"containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest"}]},
            ),
        ),
    )


def pod(namespace: str, name: str, owner: Any = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        ref = OwnerReference(
            api_version=owner.api_version,
            kind=owner.KIND,
            name=owner.metadata.name,
            uid=owner.metadata.uid,
            controller=True,
        )
        meta["ownerReferences"] = [
            {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name, "uid": ref.uid, "controller": True}
        ]
    return {"metadata": meta, "spec": {"containers": [{"name": "runner", "image": "busybox"}]}}


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """:func:`tests.support.eventually.eventually` with this directory's defaults (every 20 ms, 10 s)."""
    return await support_eventually(check, timeout=timeout, interval=0.02, what=what)
