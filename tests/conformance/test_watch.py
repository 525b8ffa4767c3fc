"""Watch semantics (§4.3 cases 44-57)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fixtures.apiserver import KubeApi
from tests.support.eventually import eventually

from .conftest import GROUP, Http, core, watch_lines, widget, widgets

pytestmark = pytest.mark.anyio


async def test_watch_without_rv_sends_added_then_live(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("b"))
    await http.create(widgets(namespace), widget("a"))
    events: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        async with http.session.get(http.base + widgets(namespace), params={"watch": "1"}) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
            for _ in range(2):
                line = await resp.content.readline()
                assert line.endswith(b"\n")
                events.append(json.loads(line))
            await http.patch(widgets(namespace, "a"), {"spec": {"replicas": 3}})
            events.append(json.loads(await resp.content.readline()))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
    ]
    assert events[0]["object"]["kind"] == "Widget"


async def test_watch_from_list_rv_sees_only_later_changes(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("x"))
    _, listed = await http.get(widgets(namespace))
    rv = listed["metadata"]["resourceVersion"]
    await http.patch(widgets(namespace, "x"), {"spec": {"replicas": 1}})
    await http.create(widgets(namespace), widget("y"))
    await http.delete(widgets(namespace, "x"))
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": rv}, 3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "x"),
        ("ADDED", "y"),
        ("DELETED", "x"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


async def test_watch_rv_zero_is_like_unset(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("z"))
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": "0"}, 1)
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "z"


async def test_deleted_event_carries_deletion_rv(http: Http, namespace: str) -> None:
    obj = await http.create(widgets(namespace), widget("d"))
    _, listed = await http.get(widgets(namespace))
    await http.delete(widgets(namespace, "d"))
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": listed["metadata"]["resourceVersion"]}, 1)
    deleted = events[0]
    assert deleted["type"] == "DELETED"
    assert int(deleted["object"]["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])
    # Resuming from the DELETED event's RV replays nothing.
    with anyio.move_on_after(1.5):
        after = await watch_lines(
            http,
            widgets(namespace),
            {"resourceVersion": deleted["object"]["metadata"]["resourceVersion"], "timeoutSeconds": "1"},
            1,
        )
        assert after == []


async def test_finalizer_removal_gives_one_deleted_event(http: Http, namespace: str) -> None:
    body = widget("f")
    body["metadata"]["finalizers"] = ["test.runnerscale.dev/hold"]
    await http.create(widgets(namespace), body)
    _, marked = await http.delete(widgets(namespace, "f"))
    rv = marked["metadata"]["resourceVersion"]
    status, resp = await http.patch(widgets(namespace, "f"), {"metadata": {"finalizers": None}})
    assert status == 200 and "finalizers" not in resp["metadata"]
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": rv, "timeoutSeconds": "2"}, 2)
    assert [e["type"] for e in events] == ["DELETED"]
    assert events[0]["object"]["metadata"]["finalizers"] == ["test.runnerscale.dev/hold"]
    status, _ = await http.get(widgets(namespace, "f"))
    assert status == 404


async def test_label_selector_watch_sees_transitions(http: Http, namespace: str) -> None:
    await http.create(widgets(namespace), widget("l"))
    _, listed = await http.get(widgets(namespace))
    rv = listed["metadata"]["resourceVersion"]
    await http.patch(widgets(namespace, "l"), {"metadata": {"labels": {"team": "a"}}})
    await http.patch(widgets(namespace, "l"), {"spec": {"replicas": 2}})
    await http.patch(widgets(namespace, "l"), {"metadata": {"labels": {"team": "b"}}})
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": rv, "labelSelector": "team=a"}, 3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert int(events[2]["object"]["metadata"]["resourceVersion"]) > int(
        events[1]["object"]["metadata"]["resourceVersion"]
    )


async def test_field_selector_watch_by_name(http: Http, namespace: str) -> None:
    _, listed = await http.get(widgets(namespace))
    await http.create(widgets(namespace), widget("other"))
    await http.create(widgets(namespace), widget("mine"))
    events = await watch_lines(
        http,
        widgets(namespace),
        {"resourceVersion": listed["metadata"]["resourceVersion"], "fieldSelector": "metadata.name=mine"},
        1,
    )
    assert events[0]["object"]["metadata"]["name"] == "mine"


async def test_watch_after_compaction_is_410(http: Http, namespace: str, kube_api: KubeApi) -> None:
    control = kube_api.require_emulator()
    obj = await http.create(widgets(namespace), widget("c"))
    await http.patch(widgets(namespace, "c"), {"spec": {"replicas": 1}})
    await control.compact_async()
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": obj["metadata"]["resourceVersion"]}, 2)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["code"] == 410 and status["reason"] == "Expired"
    assert status["message"].startswith(f"too old resource version: {obj['metadata']['resourceVersion']} (")


async def test_client_watch_raises_410(kube_client: ApiClient, http: Http, namespace: str, kube_api: KubeApi) -> None:
    control = kube_api.require_emulator()
    obj = await http.create(widgets(namespace), widget("c2"))
    await http.patch(widgets(namespace, "c2"), {"spec": {"replicas": 1}})
    await control.compact_async()
    api = client.CustomObjectsApi(kube_client)
    with anyio.fail_after(10):
        async with watch.Watch() as w:
            with pytest.raises(ApiException) as exc:
                async for _ in w.stream(
                    api.list_namespaced_custom_object,
                    GROUP,
                    "v1",
                    namespace,
                    "widgets",
                    resource_version=obj["metadata"]["resourceVersion"],
                    timeout_seconds=5,
                ):
                    pass
    assert exc.value.status == 410


async def test_watch_from_old_rv_is_410(http: Http, namespace: str) -> None:
    # A resource's watch history starts when the server starts serving it: RV 1 is too old.
    for path in (widgets(namespace), core(namespace, "configmaps")):
        events = await watch_lines(http, path, {"resourceVersion": "1", "timeoutSeconds": "5"}, 2)
        assert len(events) == 1 and events[0]["type"] == "ERROR", path
        status = events[0]["object"]
        assert status["code"] == 410 and status["reason"] == "Expired" and "details" not in status
        assert status["message"].startswith("too old resource version: 1 (")
        oldest = int(status["message"].removeprefix("too old resource version: 1 (").rstrip(")"))
        assert oldest > 1


async def test_watch_history_window_expires_old_events(http: Http, namespace: str, kube_api: KubeApi) -> None:
    control = kube_api.require_emulator()  # shrinks the watch history window
    before = await control.settings_async()
    obj = await http.create(widgets(namespace), widget("h"))
    await control.settings_async(watch_history_seconds=0, watch_history_min_events=1)
    try:
        await http.patch(widgets(namespace, "h"), {"spec": {"replicas": 1}})
        second = (await http.patch(widgets(namespace, "h"), {"spec": {"replicas": 2}}))[1]
    finally:
        await control.settings_async(
            watch_history_seconds=before["watch_history_seconds"],
            watch_history_min_events=before["watch_history_min_events"],
        )
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": obj["metadata"]["resourceVersion"]}, 2)
    assert [e["type"] for e in events] == ["ERROR"] and events[0]["object"]["code"] == 410
    # Only the newest event is left, so a watch can still start just before it.
    resume = str(int(second["metadata"]["resourceVersion"]) - 1)
    assert (
        events[0]["object"]["message"] == f"too old resource version: {obj['metadata']['resourceVersion']} ({resume})"
    )
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": resume}, 1)
    assert events[0]["type"] == "MODIFIED" and events[0]["object"]["spec"]["replicas"] == 2


async def test_watch_from_future_rv_waits_without_error(http: Http, namespace: str) -> None:
    _, listed = await http.get(widgets(namespace))
    future = str(int(listed["metadata"]["resourceVersion"]) + 1_000_000)
    started = anyio.current_time()
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": future, "timeoutSeconds": "2"}, 1)
    assert events == [] and anyio.current_time() - started >= 1.5  # open until its timeout, no ERROR


async def test_list_from_future_rv_is_504(http: Http, namespace: str) -> None:
    _, listed = await http.get(widgets(namespace))
    future = int(listed["metadata"]["resourceVersion"]) + 1_000_000
    for params in ({"resourceVersion": str(future)}, {"resourceVersion": str(future), "resourceVersionMatch": "Exact"}):
        status, body = await http.get(widgets(namespace), **params)
        assert status == 504, params
        assert body["reason"] == "Timeout"
        assert body["message"].startswith(f"Timeout: Too large resource version: {future}, current: ")
        assert body["details"] == {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }


async def test_bookmarks_only_when_allowed(http: Http, namespace: str, kube_api: KubeApi) -> None:
    _, listed = await http.get(widgets(namespace))
    rv = listed["metadata"]["resourceVersion"]
    # The bookmark before the deadline is due 2 s ahead of it: a watch of 2 s gets none.
    events = await watch_lines(
        http, widgets(namespace), {"resourceVersion": rv, "allowWatchBookmarks": "True", "timeoutSeconds": "2"}, 5
    )
    assert events == []
    events = await watch_lines(http, widgets(namespace), {"resourceVersion": rv, "timeoutSeconds": "4"}, 5)
    assert events == []
    events = await watch_lines(
        http, widgets(namespace), {"resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "4"}, 5
    )
    # A real server may or may not get its bookmark out in time; the emulator sends exactly one.
    assert all(e["type"] == "BOOKMARK" for e in events) and len(events) <= 2
    if kube_api.is_emulator:
        assert len(events) == 1
    for bm in (e["object"] for e in events):
        assert bm == {
            "kind": "Widget",
            "apiVersion": f"{GROUP}/v1",
            "metadata": {"resourceVersion": bm["metadata"]["resourceVersion"]},
        }
        assert int(bm["metadata"]["resourceVersion"]) >= int(rv)


async def test_periodic_bookmarks(http: Http, namespace: str, kube_api: KubeApi) -> None:
    control = kube_api.require_emulator()
    before = await control.settings_async()
    await control.settings_async(bookmark_interval_seconds=0.2)
    try:
        _, listed = await http.get(widgets(namespace))
        events = await watch_lines(
            http,
            widgets(namespace),
            {
                "resourceVersion": listed["metadata"]["resourceVersion"],
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "5",
            },
            3,
        )
        assert [e["type"] for e in events] == ["BOOKMARK"] * 3
    finally:
        await control.settings_async(bookmark_interval_seconds=before["bookmark_interval_seconds"])


async def test_client_stream_with_timeout_stops(kube_client: ApiClient, namespace: str) -> None:
    core_api = client.CoreV1Api(kube_client)
    seen = []
    with anyio.fail_after(10):
        async with watch.Watch() as w:
            async for ev in w.stream(core_api.list_namespaced_config_map, namespace, timeout_seconds=1):
                seen.append(ev["type"])
    assert set(seen) <= {"ADDED"}  # the namespace's kube-root-ca.crt, then the stream ends


async def test_client_stream_reconnects_after_cut_without_loss(
    kube_client: ApiClient, http: Http, namespace: str, kube_api: KubeApi
) -> None:
    control = kube_api.require_emulator()
    api = client.CustomObjectsApi(kube_client)
    _, listed = await http.get(widgets(namespace))
    names: list[str] = []
    with anyio.fail_after(15):
        async with watch.Watch() as w:
            stream = w.stream(
                api.list_namespaced_custom_object,
                GROUP,
                "v1",
                namespace,
                "widgets",
                resource_version=listed["metadata"]["resourceVersion"],
            )
            await http.create(widgets(namespace), widget("r1"))
            ev = await stream.__anext__()
            names.append(ev["object"]["metadata"]["name"])
            assert await control.cut_watches_async() >= 1
            await http.create(widgets(namespace), widget("r2"))
            await http.create(widgets(namespace), widget("r3"))
            while len(names) < 3:
                ev = await stream.__anext__()
                names.append(ev["object"]["metadata"]["name"])
    assert names == ["r1", "r2", "r3"]


async def test_abrupt_cut_surfaces_as_client_error(
    kube_client: ApiClient, http: Http, namespace: str, kube_api: KubeApi
) -> None:
    import aiohttp

    control = kube_api.require_emulator()
    api = client.CustomObjectsApi(kube_client)
    with anyio.fail_after(15):
        async with watch.Watch() as w:
            stream = w.stream(api.list_namespaced_custom_object, GROUP, "v1", namespace, "widgets", timeout_seconds=30)
            await http.create(widgets(namespace), widget("ab"))
            await stream.__anext__()
            assert await control.cut_watches_async(abrupt=True) >= 1
            with pytest.raises(aiohttp.ClientPayloadError):
                await stream.__anext__()


async def test_watch_bool_spellings(http: Http, namespace: str) -> None:
    await http.create(core(namespace, "configmaps"), {"metadata": {"name": "b"}})
    # Anything but 0 or false (any case) is a watch, even "maybe" or an empty value.
    for spelling in ("True", "1", "true", "maybe", "f", ""):
        events = await watch_lines(http, core(namespace, "configmaps"), {"watch": spelling, "timeoutSeconds": "1"}, 1)
        assert events and events[0]["type"] == "ADDED", spelling
    for spelling in ("false", "FALSE", "False", "0"):
        status, body = await http.get(core(namespace, "configmaps"), watch=spelling)
        assert status == 200 and body["kind"] == "ConfigMapList", spelling


async def test_watch_resource_version_must_be_a_number(http: Http, namespace: str) -> None:
    status, body = await http.get(widgets(namespace), watch="true", resourceVersion="abc")
    assert status == 500 and "reason" not in body
    assert body["message"] == 'resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax'


async def test_many_watchers_identical_and_slow_reader_does_not_block(http: Http, namespace: str) -> None:
    _, listed = await http.get(widgets(namespace))
    rv = listed["metadata"]["resourceVersion"]
    # One watcher that never reads.
    async with http.session.get(
        http.base + widgets(namespace), params={"watch": "true", "resourceVersion": rv}
    ) as idle:
        assert idle.status == 200
        with anyio.fail_after(10):
            for i in range(20):
                await http.create(widgets(namespace), widget(f"m{i}"))
        results: list[list[str]] = []

        async def collect() -> None:
            evs = await watch_lines(http, widgets(namespace), {"resourceVersion": rv}, 20)
            results.append([e["object"]["metadata"]["name"] for e in evs])

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(collect)
    assert len(results) == 5 and all(r == results[0] for r in results) and len(results[0]) == 20


async def test_client_disconnect_releases_the_watch(http: Http, namespace: str, kube_api: KubeApi) -> None:
    control = kube_api.require_emulator()
    before = (await control.state_async())["open_watches"]
    async with http.session.get(http.base + widgets(namespace), params={"watch": "true"}) as resp:
        assert resp.status == 200

        async def opened() -> bool:
            return bool((await control.state_async())["open_watches"] > before)

        await eventually(opened, timeout=5, interval=0.02, what="the watch open")

    async def released() -> bool:  # the server notices the disconnect and drops the watcher
        return bool((await control.state_async())["open_watches"] <= before)

    await eventually(released, timeout=10, what="the watch released")
