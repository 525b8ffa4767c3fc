"""Shared pieces of the black-box conformance suite: a raw HTTP client for ``kube_api.url`` and
the suite's test CRDs (installed once per session over the API, so a real cluster works too)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.fixtures import realkube
from tests.fixtures.apiserver import KubeApi

DATA = Path(__file__).parent / "data"
GROUP = "conformance.runnerscale.dev"
WIDGETS = f"/apis/{GROUP}/v1"


def widgets(ns: str, name: str = "", sub: str = "") -> str:
    path = f"{WIDGETS}/namespaces/{ns}/widgets"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def gadgets(ns: str, name: str = "") -> str:
    return f"{WIDGETS}/namespaces/{ns}/gadgets" + (f"/{name}" if name else "")


def core(ns: str, plural: str, name: str = "", sub: str = "") -> str:
    path = f"/api/v1/namespaces/{ns}/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


class Http:
    """A thin JSON client over aiohttp; every call has a timeout and returns (status, body)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        async with self.session.request(method, self.base + path, data=data, headers=headers, params=params) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except json.JSONDecodeError:
                return resp.status, text

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        return await self.request("GET", path, params=params or None)

    async def post(self, path: str, body: Any, **params: str) -> tuple[int, Any]:
        return await self.request("POST", path, body, params=params or None)

    async def put(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.request("PUT", path, body)

    async def patch(self, path: str, body: Any, content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        return await self.request("PATCH", path, body, content_type=content_type)

    async def delete(self, path: str, body: Any = None, **params: str) -> tuple[int, Any]:
        return await self.request("DELETE", path, body, params=params or None)

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        status, obj = await self.post(path, body)
        assert status == 201, (status, obj)
        created: dict[str, Any] = obj
        return created


@pytest.fixture(scope="session", autouse=True)
def test_crds(kube_api: KubeApi) -> Iterator[None]:
    """Install the suite's CRDs once (created or replaced, then Established), and remove the ones
    it created at the end, so a real cluster keeps nothing."""
    raw = realkube.RawKube(kube_api.url)
    created = realkube.apply_crds(raw, [d for d in yaml.safe_load_all((DATA / "crds.yaml").read_text()) if d])
    # A real server publishes a new CRD's OpenAPI a few seconds after it is Established.
    for plural in ("widgets", "gadgets"):
        _wait_for_garbage_collector(raw, plural)
    _wait_for_openapi(
        raw,
        f"apis/{GROUP}/v1",
        [f"/apis/{GROUP}/v1/namespaces/{{namespace}}/{p}/{{name}}" for p in ("widgets", "gadgets")],
    )
    yield
    realkube.delete_crds(raw, created)


def _wait_for_garbage_collector(raw: realkube.RawKube, plural: str, timeout: float = 90.0) -> None:
    """A real garbage collector picks up a new CRD's kind at its next discovery sync (every 30 s);
    until then orphan and foreground deletions of that kind stall. Probe: an orphaning delete of
    a throw-away object completes only once the collector watches the kind."""
    path = f"{WIDGETS}/namespaces/default/{plural}/gc-probe"
    kind = plural.removesuffix("s").capitalize()
    raw.request(
        "POST",
        f"{WIDGETS}/namespaces/default/{plural}",
        {"apiVersion": f"{GROUP}/v1", "kind": kind, "metadata": {"name": "gc-probe"}, "spec": {}},
    )
    raw.request("DELETE", path, {"propagationPolicy": "Orphan"})
    deadline = time.monotonic() + timeout
    while raw.request("GET", path)[0] != 404:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the garbage collector did not pick up {plural} within {timeout} s")
        time.sleep(0.2)  # bounded poll: discovery sync is periodic


def _wait_for_openapi(raw: realkube.RawKube, group_version: str, paths: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status, index = raw.request("GET", "/openapi/v3")
        entry = (index or {}).get("paths", {}).get(group_version) if status == 200 else None
        if entry is not None:
            status, doc = raw.request("GET", entry["serverRelativeURL"].split("?")[0])
            if status == 200 and all(p in doc.get("paths", {}) for p in paths):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the OpenAPI v3 document of {group_version} lacks {paths} after {timeout} s")
        time.sleep(0.2)  # bounded poll: publication is asynchronous


@pytest.fixture
async def http(kube_api: KubeApi, test_crds: None) -> AsyncIterator[Http]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield Http(session, kube_api.url)


async def watch_lines(
    http: Http, path: str, params: dict[str, str], count: int, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Open a watch and collect ``count`` events (or fewer if the stream ends)."""
    import anyio

    events: list[dict[str, Any]] = []
    with anyio.fail_after(timeout):
        async with http.session.get(http.base + path, params={"watch": "true", **params}) as resp:
            assert resp.status == 200
            while len(events) < count:
                line = await resp.content.readline()
                if not line:
                    break
                events.append(json.loads(line))
    return events
