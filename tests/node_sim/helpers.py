"""Helpers for the node simulator tests: an in-process node sim, raw API access, waits."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import anyio

from services.embedded.node_sim.kube import KubeRest
from services.embedded.node_sim.node import NodeSim, NodeSimConfig
from tests.support.eventually import eventually

Obj = dict[str, Any]


class Kubeconfig(Protocol):
    """What the node sim needs of an API server: a kubeconfig (``KubeApi``, or a private TLS one)."""

    @property
    def kubeconfig(self) -> Path: ...


def node_config(kube_api: Kubeconfig, namespace: str, tmp_path: Path, **overrides: Any) -> NodeSimConfig:
    """Fast knobs for tests: short retries, backoffs and grace cap."""
    base: dict[str, Any] = dict(
        kubeconfig=str(kube_api.kubeconfig),
        namespace=namespace,
        state_dir=str(tmp_path / "node-state"),
        retry_interval=0.2,
        restart_backoff_base=0.2,
        restart_backoff_max=1.0,
        max_grace_seconds=5.0,
    )
    base.update(overrides)
    return NodeSimConfig(**base)


class Lines:
    """Collects the node sim's forwarded process output."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


@asynccontextmanager
async def running_node(config: NodeSimConfig, output: Callable[[str], None] | None = None) -> AsyncIterator[NodeSim]:
    node = NodeSim(config, output=output or Lines())
    async with anyio.create_task_group() as tg:
        await tg.start(node.run)
        with anyio.fail_after(10):
            await node.synced.wait()
        yield node
        tg.cancel_scope.cancel()


async def create(kube: KubeRest, namespace: str, plural: str, body: Obj) -> Obj:
    return await kube.request("POST", f"/api/v1/namespaces/{namespace}/{plural}", body=body)


async def create_secret(kube: KubeRest, namespace: str, name: str, data: dict[str, str]) -> Obj:
    enc = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return await create(kube, namespace, "secrets", {"metadata": {"name": name}, "data": enc})


def pod_body(
    name: str,
    *,
    containers: list[Obj],
    restart_policy: str = "Always",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Obj:
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": containers, "restartPolicy": restart_policy, **spec},
    }


async def wait_pod(
    kube: KubeRest, namespace: str, name: str, predicate: Callable[[Obj], bool], timeout: float = 15.0, what: str = ""
) -> Obj:
    """The pod once ``predicate`` holds for it (:func:`tests.support.eventually.eventually`)."""
    last: Obj | None = None

    async def holds() -> Obj | None:
        nonlocal last
        last = await kube.get("pods", namespace, name)
        return last if last is not None and predicate(last) else None

    pod = await eventually(
        holds,
        timeout=timeout,
        what=f"pod {namespace}/{name}: {what or 'condition'}",
        describe=lambda: last and last.get("status"),
    )
    assert pod is not None  # eventually() returns a truthy value
    return pod


async def wait_gone(kube: KubeRest, namespace: str, name: str, timeout: float = 15.0) -> None:
    async def gone() -> bool:
        return await kube.get("pods", namespace, name) is None

    await eventually(gone, timeout=timeout, what=f"pod {namespace}/{name} gone")


async def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """:func:`tests.support.eventually.eventually` with this directory's default deadline."""
    return await eventually(predicate, timeout=timeout, what=what)


def phase(pod: Obj) -> str:
    value: str = (pod.get("status") or {}).get("phase", "")
    return value


def cstatus(pod: Obj, name: str | None = None) -> Obj:
    statuses: list[Obj] = (pod.get("status") or {}).get("containerStatuses") or []
    for s in statuses:
        if name is None or s.get("name") == name:
            return s
    return {}


def conditions(pod: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
