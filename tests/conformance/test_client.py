"""kubernetes-asyncio integration: status codes per method, an informer-style list+watch loop."""

from __future__ import annotations

import anyio
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fixtures.apiserver import KubeApi
from tests.support.eventually import eventually

from .conftest import GROUP, widget

pytestmark = pytest.mark.anyio


async def test_methods_never_return_none(kube_client: ApiClient, namespace: str) -> None:
    api = client.CustomObjectsApi(kube_client)
    created = await api.create_namespaced_custom_object(GROUP, "v1", namespace, "widgets", widget("c", replicas=1))
    assert created is not None and created["metadata"]["generation"] == 1
    got = await api.get_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "c")
    got["spec"]["replicas"] = 2
    replaced = await api.replace_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "c", got)
    assert replaced["spec"]["replicas"] == 2
    replaced["status"] = {"phase": "Ready"}
    status = await api.replace_namespaced_custom_object_status(GROUP, "v1", namespace, "widgets", "c", replaced)
    assert status["status"]["phase"] == "Ready"
    patched = await api.patch_namespaced_custom_object(
        GROUP, "v1", namespace, "widgets", "c", [{"op": "replace", "path": "/spec/replicas", "value": 3}]
    )
    assert patched["spec"]["replicas"] == 3
    deleted = await api.delete_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "c")
    assert deleted["status"] == "Success"
    with pytest.raises(ApiException) as exc:
        await api.get_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "c")
    assert exc.value.status == 404


async def _informer(api: client.CustomObjectsApi, namespace: str, cache: dict[str, str], stop: anyio.Event) -> None:
    """List + watch from the list RV, relist on 410, re-watch on EOF (the §3.4 shape)."""
    while not stop.is_set():
        listed = await api.list_namespaced_custom_object(GROUP, "v1", namespace, "widgets", limit=50)
        cache.clear()
        cache.update({i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in listed["items"]})
        rv = listed["metadata"]["resourceVersion"]
        try:
            while not stop.is_set():
                async with watch.Watch() as w:
                    async for ev in w.stream(
                        api.list_namespaced_custom_object,
                        GROUP,
                        "v1",
                        namespace,
                        "widgets",
                        resource_version=rv,
                        allow_watch_bookmarks=True,
                        timeout_seconds=2,
                    ):
                        obj = ev["raw_object"]
                        rv = obj["metadata"]["resourceVersion"]
                        if ev["type"] in ("ADDED", "MODIFIED"):
                            cache[obj["metadata"]["name"]] = rv
                        elif ev["type"] == "DELETED":
                            cache.pop(obj["metadata"]["name"], None)
        except ApiException as exc:
            if exc.status != 410:
                raise


async def test_informer_converges_after_compaction_and_cuts(
    kube_client: ApiClient, namespace: str, kube_api: KubeApi
) -> None:
    control = kube_api.require_emulator()
    api = client.CustomObjectsApi(kube_client)
    cache: dict[str, str] = {}
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_informer, api, namespace, cache, stop)

        async def write(i: int) -> None:
            await api.create_namespaced_custom_object(GROUP, "v1", namespace, "widgets", widget(f"w{i}"))
            await api.patch_namespaced_custom_object(
                GROUP,
                "v1",
                namespace,
                "widgets",
                f"w{i}",
                {"spec": {"replicas": i}},
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]  # _content_type is a keyword the client honours; its stubs omit it
            )
            if i % 3 == 0:
                await api.delete_namespaced_custom_object(GROUP, "v1", namespace, "widgets", f"w{i}")

        async with anyio.create_task_group() as writers:
            for i in range(100):
                writers.start_soon(write, i)
                if i == 40:
                    await control.compact_async()
                if i == 70:
                    await control.cut_watches_async()
        truth = await api.list_namespaced_custom_object(GROUP, "v1", namespace, "widgets")
        expected = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in truth["items"]}
        await eventually(lambda: cache == expected, timeout=20, what="the cache converged", describe=lambda: cache)
        stop.set()
        await control.cut_watches_async()
    assert len(expected) == 66


async def test_leader_election_with_a_lease(kube_client: ApiClient, namespace: str) -> None:
    from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
    from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

    leading = anyio.Event()

    async def started() -> None:
        leading.set()

    async def stopped() -> None:
        return None

    lock = LeaseLock("scale-set-leader", namespace, "replica-a", kube_client)
    config = electionconfig.Config(
        lock, lease_duration=4, renew_deadline=3, retry_period=1, onstarted_leading=started, onstopped_leading=stopped
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(leaderelection.LeaderElection(config).run)
        with anyio.fail_after(10):
            await leading.wait()
        tg.cancel_scope.cancel()
    lease = await client.CoordinationV1Api(kube_client).read_namespaced_lease("scale-set-leader", namespace)
    assert lease.spec.holder_identity == "replica-a" and lease.spec.lease_duration_seconds == 4
