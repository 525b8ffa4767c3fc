"""The demo's own API calls (as a user with kubectl would make them), and its clean-up on an
existing cluster: what it created goes away again, what was there before stays.

On the emulator nothing of this matters (the emulator is thrown away with the demo). On a real
cluster the demo installs the CRDs it needs, creates its namespaces, and at the end deletes the
AutoscalingRunnerSet while the workers still run (so they remove their own objects and
finalizers, as in production), then removes whatever is left: finalizers nobody will remove any
more, pods no kubelet will confirm, its namespaces and the CRDs it created.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import yaml

from shared.kube import AlreadyExists, KubeClient, KubeError, NotFound

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
ARC = "/apis/actions.github.com/v1alpha1"
ARC_PLURALS = ("autoscalingrunnersets", "autoscalinglisteners", "ephemeralrunnersets", "ephemeralrunners")
# Kinds whose leftovers may carry finalizers once the workers are gone.
RELEASE_PLURALS = (*(f"{ARC}/{{ns}}/{p}" for p in ARC_PLURALS), "/api/v1/{ns}/pods", "/api/v1/{ns}/secrets")
Obj = dict[str, Any]


def namespaced(template: str, namespace: str) -> str:
    return template.replace("{ns}", f"namespaces/{namespace}")


def crd_documents(directory: Path) -> list[Obj]:
    docs = [d for p in sorted(directory.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    if not docs:
        raise RuntimeError(f"no CRDs found in {directory}")
    return docs


def established(crd: Obj) -> bool:
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )


class DemoKube:
    """A handful of JSON calls through the kubeconfig (emulator or real cluster alike)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Obj:
        data = await self.client.request(method, path, what=f"{method} {path}", body=body, **kw)
        return msgspec.json.decode(data) if data else {}

    async def ensure(self, path: str, body: Obj) -> bool:
        """Create; True if this call created it, False if it existed already."""
        try:
            await self._call("POST", path, body)
        except AlreadyExists:
            return False
        return True

    async def request_counts(self) -> list[Obj] | None:
        """The API emulator's request counters (``/_emulator/requests``); None on a real server."""
        try:
            data = await self.client.request("GET", "/_emulator/requests", what="GET /_emulator/requests")
        except KubeError:
            return None
        counts = msgspec.json.decode(data) if data else None
        return counts if isinstance(counts, list) else None

    async def get(self, path: str) -> Obj | None:
        try:
            return await self._call("GET", path)
        except NotFound:
            return None

    async def list_items(self, path: str) -> list[Obj]:
        try:
            return (await self._call("GET", path)).get("items") or []
        except KubeError:
            return []

    async def delete(self, path: str, **query: str) -> None:
        with contextlib.suppress(NotFound):
            await self._call("DELETE", path, query=tuple(query.items()))

    # --- CRDs -------------------------------------------------------------------------------

    async def install_crds(self, docs: list[Obj], timeout: float = 60.0) -> list[str]:
        """Create or replace each CRD (the workers need this schema); wait until all are
        Established. Returns the names this call created (the ones to remove at the end)."""
        created = []
        for doc in docs:
            name = doc["metadata"]["name"]
            if await self.ensure(CRDS, doc):
                created.append(name)
                continue
            current = await self._call("GET", f"{CRDS}/{name}")
            meta = {**doc["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
            await self._call("PUT", f"{CRDS}/{name}", {**doc, "metadata": meta})
        for doc in docs:
            name = doc["metadata"]["name"]

            async def is_established(name: str = name) -> bool:
                return established(await self._call("GET", f"{CRDS}/{name}"))

            if not await self.wait_until(is_established, timeout):
                raise RuntimeError(f"CRD {name} was not Established within {timeout:g} s")
        return created

    # --- clean-up ---------------------------------------------------------------------------

    async def arc_objects(self, namespaces: list[str]) -> int:
        return sum([len(await self.list_items(f"{ARC}/namespaces/{ns}/{p}")) for ns in namespaces for p in ARC_PLURALS])

    async def wait_until(self, check: Callable[[], Any], timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            while True:
                if await check():
                    return True
                await anyio.sleep(0.5)  # bounded poll of an asynchronous change (deletion, establishment)
        return False

    async def release(self, namespace: str) -> int:
        """Drop the finalizers left in ``namespace`` (with the read's resourceVersion) and
        force-delete its pods; returns how many objects needed it."""
        released = 0
        for template in RELEASE_PLURALS:
            path = namespaced(template, namespace)
            for item in await self.list_items(path):
                meta = item.get("metadata") or {}
                if not meta.get("finalizers"):
                    continue
                patch = {"metadata": {"finalizers": None, "resourceVersion": meta.get("resourceVersion")}}
                try:
                    await self._call(
                        "PATCH", f"{path}/{meta['name']}", patch, content_type="application/merge-patch+json"
                    )
                    released += 1
                except KubeError:
                    pass  # gone meanwhile, or changed: the namespace deletion wait below tells
        await self.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds="0")
        return released

    async def delete_and_wait(self, paths: list[str], timeout: float) -> bool:
        """Delete each object and wait until all are gone (namespaces and CRDs go asynchronously)."""
        for path in paths:
            await self.delete(path)

        async def gone() -> bool:
            return all([await self.get(path) is None for path in paths])

        return await self.wait_until(gone, timeout)
