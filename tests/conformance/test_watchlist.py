"""Streaming lists (WatchList): what client-go's informers send first, and what they wait for.

``watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true``:
ADDED for the current state, then a BOOKMARK annotated ``k8s.io/initial-events-end: "true"``
carrying the list's resourceVersion, then live events. The answers below are the real server's.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from .conftest import Http, core, widget, widgets

pytestmark = pytest.mark.anyio

STREAM = {
    "watch": "true",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
}
END = "k8s.io/initial-events-end"


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": name}}


async def _events_until(
    http: Http, path: str, params: dict[str, str], stop: Any, timeout: float = 15.0, after_open: Any = None
) -> list[dict[str, Any]]:
    """Read events until ``stop(events)`` is true (or the stream ends); ``after_open`` runs once
    the first bookmark arrived, to make a live change."""
    events: list[dict[str, Any]] = []
    with anyio.fail_after(timeout):
        async with http.session.get(http.base + path, params=params) as resp:
            assert resp.status == 200, await resp.text()
            while not stop(events):
                line = await resp.content.readline()
                if not line:
                    break
                events.append(json.loads(line))
                if after_open is not None and events[-1]["type"] == "BOOKMARK":
                    await after_open()
                    after_open = None
    return events


def _is_end(e: dict[str, Any]) -> bool:
    return e["type"] == "BOOKMARK" and (e["object"]["metadata"].get("annotations") or {}).get(END) == "true"


@pytest.mark.parametrize("kind", ["configmaps", "widgets"])
async def test_initial_events_then_end_bookmark_then_live(http: Http, namespace: str, kind: str) -> None:
    def path(name: str = "") -> str:
        return widgets(namespace, name) if kind == "widgets" else core(namespace, "configmaps", name)

    def body(name: str) -> dict[str, Any]:
        if kind == "widgets":
            w = widget(name)
            w["metadata"]["labels"] = {"set": "a"}
            return w
        return _cm(name, set="a")

    for name in ("b", "a"):
        await http.create(path(), body(name))
    other = body("other")
    other["metadata"]["labels"] = {"set": "b"}
    await http.create(path(), other)

    async def live_change() -> None:
        await http.create(path(), body("c"))

    events = await _events_until(
        http,
        path(),
        {**STREAM, "labelSelector": "set=a"},
        lambda ev: any(e["type"] == "ADDED" and e["object"]["metadata"]["name"] == "c" for e in ev),
        after_open=live_change,
    )
    kinds = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert kinds == [("ADDED", "a"), ("ADDED", "b"), ("BOOKMARK", None), ("ADDED", "c")], kinds
    bookmark = events[2]["object"]
    assert _is_end(events[2])
    assert set(bookmark["metadata"]) == {"resourceVersion", "annotations"}
    assert bookmark["kind"] == ("Widget" if kind == "widgets" else "ConfigMap")
    initial_rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events[:2]]
    # The bookmark carries the list's RV: not older than any initial object, older than live events.
    assert int(bookmark["metadata"]["resourceVersion"]) >= max(initial_rvs)
    assert int(events[3]["object"]["metadata"]["resourceVersion"]) > int(bookmark["metadata"]["resourceVersion"])


@pytest.mark.parametrize("rv", ["0", "1", "current"])
async def test_not_older_than_any_rv_sends_the_current_state(http: Http, namespace: str, rv: str) -> None:
    await http.create(core(namespace, "configmaps"), _cm("x"))
    _, listed = await http.get(core(namespace, "configmaps"))
    rv_value = listed["metadata"]["resourceVersion"] if rv == "current" else rv
    # RV 1 is long compacted on a real server; with NotOlderThan that is no 410: the current
    # state is newer than it.
    events = await _events_until(
        http, core(namespace, "configmaps"), {**STREAM, "resourceVersion": rv_value}, lambda ev: any(map(_is_end, ev))
    )
    names = [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"]
    assert "x" in names and "kube-root-ca.crt" in names
    assert [e["type"] for e in events] == ["ADDED"] * len(names) + ["BOOKMARK"]


async def test_without_bookmarks_there_is_no_end_marker(http: Http, namespace: str) -> None:
    await http.create(core(namespace, "configmaps"), _cm("x"))
    params = {**STREAM, "allowWatchBookmarks": "false", "timeoutSeconds": "2"}
    events = await _events_until(http, core(namespace, "configmaps"), params, lambda ev: False)
    assert {e["type"] for e in events} == {"ADDED"}
    assert "x" in [e["object"]["metadata"]["name"] for e in events]


async def test_send_initial_events_false_starts_at_now(http: Http, namespace: str) -> None:
    await http.create(core(namespace, "configmaps"), _cm("old"))

    events: list[dict[str, Any]] = []
    params = {**STREAM, "sendInitialEvents": "false", "timeoutSeconds": "10"}
    with anyio.fail_after(15):
        async with http.session.get(http.base + core(namespace, "configmaps"), params=params) as resp:
            assert resp.status == 200
            # The stream is open (headers are flushed before any event): a change now is live.
            await http.create(core(namespace, "configmaps"), _cm("new"))
            while not events or events[-1]["type"] == "BOOKMARK":
                events.append(json.loads(await resp.content.readline()))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"] == [
        ("ADDED", "new")
    ]


async def test_future_rv_times_out_with_an_error_event(http: Http, namespace: str) -> None:
    _, listed = await http.get(core(namespace, "configmaps"))
    future = str(int(listed["metadata"]["resourceVersion"]) + 1_000_000)
    started = time.monotonic()
    events = await _events_until(
        http,
        core(namespace, "configmaps"),
        {**STREAM, "resourceVersion": future, "timeoutSeconds": "8"},
        bool,
    )
    assert time.monotonic() - started >= 2.5  # the server waits ~3 s for its cache to catch up
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["code"] == 504 and status["reason"] == "Timeout"
    assert status["message"].startswith(f"Timeout: Too large resource version: {future}, current: ")


SIE_NEEDS_MATCH = (
    "FieldValueForbidden",
    "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
    "resourceVersionMatch",
)
MATCH_NEEDS_SIE = (
    "FieldValueForbidden",
    "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
    "resourceVersionMatch",
)
EXACT_UNSUPPORTED = (
    "FieldValueNotSupported",
    'Unsupported value: "Exact": supported values: "NotOlderThan"',
    "resourceVersionMatch",
)


@pytest.mark.parametrize(
    ("params", "causes"),
    [
        ({"watch": "true", "sendInitialEvents": "true"}, [SIE_NEEDS_MATCH]),
        ({"watch": "true", "resourceVersionMatch": "NotOlderThan"}, [MATCH_NEEDS_SIE]),
        (
            {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "Exact"},
            [SIE_NEEDS_MATCH, EXACT_UNSUPPORTED],
        ),
        (
            {"sendInitialEvents": "true"},
            [("FieldValueForbidden", "Forbidden: sendInitialEvents is forbidden for list", "sendInitialEvents")],
        ),
    ],
    ids=["sie-without-match", "match-without-sie", "exact", "sie-on-a-list"],
)
async def test_list_options_validation(
    http: Http, namespace: str, params: dict[str, str], causes: list[tuple[str, str, str]]
) -> None:
    status, body = await http.get(core(namespace, "configmaps"), **params, timeoutSeconds="1")
    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert body["details"] == {
        "group": "meta.k8s.io",
        "kind": "ListOptions",
        "causes": [{"reason": r, "message": m, "field": f} for r, m, f in causes],
    }
    shown = [f"{f}: {m}" for _, m, f in causes]
    joined = shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: {joined}'


@pytest.mark.parametrize("value", ["", "maybe", "1"])
async def test_send_initial_events_is_true_unless_false_or_zero(http: Http, namespace: str, value: str) -> None:
    events = await _events_until(
        http, core(namespace, "configmaps"), {**STREAM, "sendInitialEvents": value}, lambda ev: any(map(_is_end, ev))
    )
    assert [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"] == ["kube-root-ca.crt"]


async def test_malformed_resource_version_is_500_before_the_stream(http: Http, namespace: str) -> None:
    status, body = await http.get(core(namespace, "configmaps"), **STREAM, resourceVersion="abc")
    assert status == 500, body
    assert body["message"] == 'resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax'
    assert "reason" not in body
